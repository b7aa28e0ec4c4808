"""The small transformer-like stack the sharding tests train: Linear/LayerNorm blocks with dim-0 sizes that
do not split evenly over two ranks."""

import tilewise as tw
from tilewise.distributed.fsdp import fully_shard

WIDTH = 7  # odd, and 3 * WIDTH + 1 rows in the first Linear: dim-0 sizes that do not split evenly over 2 ranks


class Block(tw.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = tw.nn.LayerNorm(WIDTH)
        self.fc1 = tw.nn.Linear(WIDTH, 3 * WIDTH + 1)
        self.fc2 = tw.nn.Linear(3 * WIDTH + 1, WIDTH)

    def forward(self, x):
        return x + self.fc2(tw.nn.functional.gelu(self.fc1(self.norm(x))))


class Stack(tw.nn.Module):
    def __init__(self, depth: int = 3):
        super().__init__()
        self.embed = tw.nn.Linear(5, WIDTH)
        self.blocks = tw.nn.ModuleList([Block() for _ in range(depth)])
        self.norm = tw.nn.LayerNorm(WIDTH)
        self.head = tw.nn.Linear(WIDTH, 3)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def stack() -> Stack:
    tw.manual_seed(0)
    return Stack()


def shard(model: Stack, **kwargs) -> Stack:
    for block in model.blocks:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def batch(step: int):
    tw.manual_seed(1000 + step)
    return tw.randn(8, 5), tw.randn(8, 3)
