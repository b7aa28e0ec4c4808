"""AdaptiveLogSoftmaxWithLoss: the adaptive softmax of Grave et al. for large vocabularies.

Frequent classes (the shortlist) and one entry per cluster of rarer classes share the head softmax; a sample
whose target lies in a cluster adds the log-probability of its class within that cluster, computed by that
cluster's smaller projection for those samples only, as torch does. Choosing the samples reads the targets, so
the forward is eager code (a compiled function that calls it breaks its graph there).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from itertools import pairwise

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.container import ModuleList, Sequential
from tilewise.nn.modules.linear import Linear
from tilewise.nn.modules.module import Module
from tilewise.ops.creation import full, zeros
from tilewise.tensor import Tensor

_ASMoutput = namedtuple("_ASMoutput", ["output", "loss"])


def _check_cutoffs(cutoffs: list, n_classes: int) -> None:
    if len(cutoffs) == 0:
        raise ValueError("cutoffs should be a sequence of length larger than 0")
    if cutoffs != sorted(cutoffs) or min(cutoffs) <= 0 or max(cutoffs) > n_classes - 1 or \
            len(set(cutoffs)) != len(cutoffs) or any(int(c) != c for c in cutoffs):
        raise ValueError("cutoffs should be a sequence of unique, positive integers sorted in an increasing order, "
                         "where each value is between 1 and n_classes-1")


def _check_batch(input: Tensor, target: Tensor) -> None:
    if target.dim() == 1:
        if input.size(0) != target.size(0):
            raise RuntimeError("Input and target should have the same size in the batch dimension.")
        if input.dim() != 2:
            raise RuntimeError(f"1D target tensor expects 2D input tensors, but found inputs with size "
                               f"{list(input.shape)}")
    elif target.dim() == 0:
        if input.dim() != 1:
            raise RuntimeError(f"0D target tensor expects 1D input tensors, but found inputs with size "
                               f"{list(input.shape)}")
    else:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")


class AdaptiveLogSoftmaxWithLoss(Module):
    def __init__(self, in_features: int, n_classes: int, cutoffs: Sequence[int], div_value: float = 4.0,
                 head_bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        cutoffs = list(cutoffs)
        _check_cutoffs(cutoffs, n_classes)
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.n_classes = in_features, n_classes
        self.cutoffs = cutoffs + [n_classes]
        self.div_value, self.head_bias = div_value, head_bias
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        self.head = Linear(in_features, self.head_size, bias=head_bias, **factory)
        self.tail = ModuleList()
        for i in range(self.n_clusters):
            hidden = int(in_features // (div_value ** (i + 1)))
            size = self.cutoffs[i + 1] - self.cutoffs[i]
            self.tail.append(Sequential(Linear(in_features, hidden, bias=False, **factory),
                                        Linear(hidden, size, bias=False, **factory)))

    def reset_parameters(self) -> None:
        self.head.reset_parameters()
        for to_hidden, to_output in self.tail:
            to_hidden.reset_parameters()
            to_output.reset_parameters()

    def forward(self, input_: Tensor, target_: Tensor) -> _ASMoutput:
        _check_batch(input_, target_)
        batched = target_.dim() > 0
        input = input_ if batched else input_.unsqueeze(0)
        target = target_ if batched else target_.unsqueeze(0)
        if target.numel() and (bool((target < 0).any()) or bool((target >= self.n_classes).any())):
            raise RuntimeError(f"Target values should be in [0, {self.n_classes - 1}], but values in range "
                               f"[{target.min().item()}, {target.max().item()}] were found. ")
        output = zeros((target.shape[0],), dtype=input.dtype, device=input.device)
        head_index = target
        for i, (low, high) in enumerate(pairwise(self.cutoffs)):
            rows = ((target >= low) & (target < high)).nonzero().reshape(-1)
            if rows.numel() == 0:
                continue
            cluster_logprob = F.log_softmax(self.tail[i](input.index_select(0, rows)), dim=1)
            local = cluster_logprob.gather(1, (target.index_select(0, rows) - low).unsqueeze(1)).squeeze(1)
            output = output.index_put((rows,), local)
            cluster = full((rows.numel(),), self.shortlist_size + i, dtype=target.dtype, device=target.device)
            head_index = head_index.index_put((rows,), cluster)
        head_logprob = F.log_softmax(self.head(input), dim=1)
        output = output + head_logprob.gather(1, head_index.unsqueeze(1)).squeeze(1)
        loss = (-output).mean()
        return _ASMoutput(output if batched else output.squeeze(0), loss)

    def _get_full_log_prob(self, input: Tensor, head_output: Tensor) -> Tensor:
        from tilewise.ops.registry import call

        head_logprob = F.log_softmax(head_output, dim=1)
        parts = [head_logprob[:, :self.shortlist_size]]
        for i in range(self.n_clusters):
            cluster_logprob = F.log_softmax(self.tail[i](input), dim=1)
            parts.append(cluster_logprob + head_logprob[:, self.shortlist_size + i].unsqueeze(1))
        return call("cat", parts, 1)

    def log_prob(self, input: Tensor) -> Tensor:
        """Log-probabilities of every class, (N, n_classes)."""
        return self._get_full_log_prob(input, self.head(input))

    def predict(self, input: Tensor) -> Tensor:
        """The most likely class of each sample; the full distribution is computed only for samples whose head
        prediction is a cluster."""
        head_output = self.head(input)
        output = head_output.argmax(1)
        not_in_shortlist = output >= self.shortlist_size
        if not bool(not_in_shortlist.any()):
            return output
        if bool(not_in_shortlist.all()):
            return self._get_full_log_prob(input, head_output).argmax(1)
        log_prob = self._get_full_log_prob(input[not_in_shortlist], head_output[not_in_shortlist])
        output[not_in_shortlist] = log_prob.argmax(1)
        return output
