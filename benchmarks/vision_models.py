"""Two vision models written the way people write them for PyTorch: ResNet-50 as torchvision builds it, and a small
UNet for per-pixel classification.

This file is one source for both libraries: it imports ``tilewise as torch``, and with ``tilewise`` replaced by
``torch`` in its import lines (``vision_train_step.models_for``) it is a PyTorch program, so the benchmark and the
tests run the same model code on each side and copy one side's initial weights into the other.

* ``resnet50()``: torchvision's ``resnet50(weights=None)`` module for module and parameter name for name
  (Bottleneck blocks [3, 4, 6, 3] with the stride on the 3x3 convolution, a 7x7/2 stem, max pooling, batch norm,
  in-place ReLU and residual add, adaptive average pooling, a 1000-way head, Kaiming-normal convolutions, batch
  norm weights 1 and biases 0, ``zero_init_residual`` off). ``ResNet(Bottleneck, layers, base_planes=...)``
  builds the same network with fewer blocks or narrower stages for quick checks.
* ``UNet``: a 3x3 convolution pair (GroupNorm, SiLU) per level, max pooling down, 2x2 stride-2 transposed
  convolutions up, skip connections joined with ``torch.cat``, and a 1x1 convolution to per-pixel class logits.
"""

from __future__ import annotations

import tilewise as torch
import tilewise.nn as nn


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], num_classes: int = 1000, base_planes: int = 64) -> None:
        super().__init__()
        self.inplanes = base_planes
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, base_planes, layers[0])
        self.layer2 = self._make_layer(block, base_planes * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, base_planes * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, base_planes * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base_planes * 8 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)


class DoubleConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, groups: int = 8) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.GroupNorm(groups, out_channels),
            nn.SiLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.GroupNorm(groups, out_channels),
            nn.SiLU(inplace=True),
        )

    def forward(self, x):
        return self.block(x)


class Down(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x):
        return self.conv(self.pool(x))


class Up(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x, skip):
        x = self.up(x)
        return self.conv(torch.cat([skip, x], dim=1))


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 21, base: int = 32, depth: int = 4) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.inc = DoubleConv(in_channels, widths[0])
        self.downs = nn.ModuleList([Down(widths[i], widths[i + 1]) for i in range(depth)])
        self.ups = nn.ModuleList([Up(widths[i + 1], widths[i]) for i in reversed(range(depth))])
        self.outc = nn.Conv2d(widths[0], num_classes, kernel_size=1)

    def forward(self, x):
        x = self.inc(x)
        skips = []
        for down in self.downs:
            skips.append(x)
            x = down(x)
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)
