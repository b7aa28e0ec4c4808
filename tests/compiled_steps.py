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


def qkv_attention_step(framework, proj, batch: int, length: int, heads: int, dim: int):
    """A causal self-attention step over one packed QKV projection ``proj``: the loss of the attention's output,
    backward, and the projection's weight gradient (cleared after it is read); returns (loss, gradient)."""
    functional = framework.nn.functional

    def step(x):
        qkv = proj(x).view(batch, length, 3, heads, dim).permute(2, 0, 3, 1, 4)
        y = functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        loss = y.float().square().mean()
        loss.backward()
        grad = proj.weight.grad.clone()
        proj.zero_grad()
        return loss, grad

    return step
