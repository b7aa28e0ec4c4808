"""The classic MNIST convolutional network trainer (two convolutions, max pooling, dropout, two linear layers,
log-softmax with the NLL loss; Adadelta with a StepLR schedule; a train and a test function per epoch), on
generated 28x28 digit images so that it needs no download: each image is a digit's strokes drawn with a random
offset, thickness and noise from a generator seeded by the image's index.

    python examples/train_mnist_cnn.py --epochs 3

Written against torch's API: with ``tilewise`` replaced by ``torch`` in the imports it runs under PyTorch.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_run_flags  # noqa: E402

import tilewise as torch  # noqa: E402
import tilewise.nn as nn  # noqa: E402
import tilewise.nn.functional as F  # noqa: E402
import tilewise.optim as optim  # noqa: E402
from tilewise.optim.lr_scheduler import StepLR  # noqa: E402
from tilewise.utils.data import DataLoader, Dataset  # noqa: E402

# Seven-segment strokes of each digit: (row0, col0, row1, col1) in a 5x3 grid.
_SEGMENTS = {"a": (0, 0, 0, 2), "b": (0, 2, 2, 2), "c": (2, 2, 4, 2), "d": (4, 0, 4, 2), "e": (2, 0, 4, 0),
             "f": (0, 0, 2, 0), "g": (2, 0, 2, 2)}
_DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def draw_digit(label: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = np.zeros((28, 28), dtype=np.float32)
    top, left, scale = rng.integers(3, 7), rng.integers(5, 11), rng.uniform(3.6, 4.4)
    width = rng.integers(1, 3)
    for seg in _DIGITS[label]:
        r0, c0, r1, c1 = _SEGMENTS[seg]
        for t in np.linspace(0, 1, 24):
            r = int(top + (r0 + (r1 - r0) * t) * scale)
            c = int(left + (c0 + (c1 - c0) * t) * scale)
            image[max(r, 0):r + width, max(c, 0):c + width] = 1.0
    image += rng.normal(0, 0.15, image.shape).astype(np.float32)
    return np.clip(image, 0, 1)


class Digits(Dataset):
    def __init__(self, size: int, offset: int) -> None:
        self.size, self.offset = size, offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        label = (i * 7 + self.offset) % 10
        image = (draw_digit(label, self.offset + i) - 0.1307) / 0.3081  # MNIST's normalisation
        return torch.from_numpy(image[None]), label


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, device, loader, optimizer, epoch, step, max_steps):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        if step >= max_steps:
            break
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        step += 1
        print(f"step {step} loss {loss.item():.6f} (epoch {epoch}, batch {batch_idx})", flush=True)
    return step


def test(model, device, loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(loader.dataset)
    print(f"val loss {test_loss:.6f} accuracy {correct}/{len(loader.dataset)}", flush=True)
    return test_loss


def main(argv=None) -> int:
    parser = add_run_flags(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--test-size", type=int, default=1000)
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    train_loader = DataLoader(Digits(args.train_size, 0), batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(Digits(args.test_size, 10**6), batch_size=1000)

    model = Net()
    if args.save_init:
        torch.save(model.state_dict(), args.save_init)
        return 0
    ckpt_path = os.path.join(args.out, "mnist_cnn.pt")
    checkpoint = torch.load(ckpt_path, weights_only=True) if args.resume else None
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    elif args.init_from:
        model.load_state_dict(torch.load(args.init_from, weights_only=True))
    model = model.to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    step, first_epoch = 0, 1
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        step, first_epoch = checkpoint["step"], checkpoint["epoch"] + 1
    if args.eval_only:
        test(model, device, test_loader)
        return 0
    for epoch in range(first_epoch, args.epochs + 1):
        if step >= args.steps:
            break
        step = train(model, device, train_loader, optimizer, epoch, step, args.steps)
        test(model, device, test_loader)
        scheduler.step()
        os.makedirs(args.out, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": step, "epoch": epoch}, ckpt_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
