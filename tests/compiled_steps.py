"""What the programs written against ``torch`` wrap their steps in when a test runs them compiled."""

from __future__ import annotations


def compiled_if(framework, compiled: bool):
    """``framework.compile`` around the step a program marks, when ``compiled`` and the framework is tilewise; the
    torch reference always runs eagerly."""
    return framework.compile if compiled and framework.__name__ == "tilewise" else (lambda fn: fn)


def classifier_step(model, opt, loss_fn):
    """The plain training step the compiled-loop tests run: zero the gradients, the loss of ``model(x)`` against
    ``y``, backward, the optimizer's step; returns the loss."""
    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step
