"""SparseAdam: Adam's update restricted to the rows a sparse gradient touches.

tilewise has no sparse tensors, so no gradient reaching this optimizer is sparse: ``nn.Embedding`` and
``nn.EmbeddingBag`` refuse ``sparse=True`` at their first lookup, and ``step`` refuses a dense gradient with
torch's own message, pointing at ``optim.Adam``. The constructor checks its arguments as torch's does, so a script
fails where torch's would, and not at an attribute lookup.
"""

from __future__ import annotations

from tilewise.autograd.grad_mode import enable_grad
from tilewise.optim.optimizer import Optimizer, check_betas, check_lr
from tilewise.tensor import Tensor


class SparseAdam(Optimizer):
    """torch.optim.SparseAdam: it updates only from sparse gradients, which tilewise does not produce; use
    ``tilewise.optim.Adam`` with dense embeddings.

    >>> import tilewise as torch
    >>> table = torch.nn.Embedding(4, 2)
    >>> optimizer = torch.optim.SparseAdam(table.parameters(), lr=1e-2)
    >>> table(torch.tensor([1, 3])).sum().backward()
    >>> optimizer.step()
    Traceback (most recent call last):
    ...
    RuntimeError: SparseAdam does not support dense gradients, please consider Adam instead
    """

    def __init__(self, params, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        check_lr(lr)
        if not 0.0 < lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        check_betas(betas)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize))
        complex_params = [[g, k] for g, group in enumerate(self.param_groups)
                          for k, p in enumerate(group["params"]) if p.is_complex()]
        if complex_params:
            raise ValueError(f"Complex params at indices {complex_params}: SparseAdam does not support complex "
                             "parameters")

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        if any(p.grad is not None for group in self.param_groups for p in group["params"]):
            raise RuntimeError("SparseAdam does not support dense gradients, please consider Adam instead")
        return loss
