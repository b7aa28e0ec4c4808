"""A training step to look at with ``python -m tilewise explain examples/explain_step.py:train_step`` (or
``tilewise.explain(train_step, *ARGS)``): a two-layer MLP, cross-entropy, SGD with momentum. ``ARGS`` gives the
call's arguments."""

import tilewise as tw
from tilewise import nn

tw.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10))
optimizer = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


ARGS = (tw.randn(128, 256), tw.randint(0, 10, (128,)))
