"""Writes ``tilewise/data/torch_api.json``: the public names of torch's namespaces that training code uses, which
``python -m tilewise coverage`` counts (tilewise never imports torch, so the list is recorded here, from the
installed torch, and shipped as data).

    python tests/torch_api_names.py        # rewrite the file from the installed torch
    python tests/torch_api_names.py --check  # exit 1 if the file differs from what the installed torch gives

Each namespace lists names that count (``names``) and names left out with the reason (``excluded``): complex,
sparse, quantized and named-tensor APIs, TorchScript/JIT and symbolic-shape internals, other accelerators'
entry points, and functional ``*_copy`` variants meant for graph export. The rules are the regular expressions
below, so what is left out can be read in one place.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.utils.parametrizations  # noqa: F401 — the submodules whose names are recorded
import torch.nn.utils.parametrize  # noqa: F401
import torch.nn.utils.prune  # noqa: F401

OUT = Path(__file__).resolve().parent.parent / "tilewise" / "data" / "torch_api.json"

EXCLUDE = [  # (reason, pattern on the name)
    ("complex numbers", r"(?i)complex|conj|view_as_real|^polar$|^is_neg$|resolve_neg|^imag$|^real$|^isreal$"),
    ("sparse tensors", r"sparse|coo|csr|csc|bsr|bsc|^(h|s|d)?s?mm$|spmm|hspmm|sspaddmm|saddmm|to_dense|indices|"
                       r"^values$|^_?nnz$|^dense_dim$|^sparse_dim$|coalesce"),
    ("quantized tensors", r"quant|^q_|qscheme|fake_|int_repr|per_channel|per_tensor|choose_qparams|^QU?Int|fbgemm"),
    ("named tensors", r"rename|refine_names|align_to|align_as|^names$|has_names"),
    ("nested tensors", r"nested"),
    ("TorchScript, FX and symbolic shapes", r"ir_module|parse_ir|parse_schema|type_comment|unify_type_list|^Sym|"
                                            r"^sym_|^fork$|^wait$|Script|JIT|classproperty|"
                                            r"^compiled_with_cxx11_abi$|^get_file_path$|while_loop|^cond$"),
    ("backend internals", r"mkldnn|miopen|cudnn_|^native_|^batch_norm_(stats|elemt|gather|backward|update)|"
                          r"xla|ipu|vulkan|mtia|hpu|^prepare_multiprocessing_environment$|profiler_allow|"
                          r"autocast_(increment|decrement)_nesting|^hash_tensor$|thread_safe_generator|"
                          r"slice_inverse|^segment_reduce$|^unsafe_|^FatalError$|^is_distributed$"),
    ("functional copies for graph export", r"_copy$"),
    ("legacy typed storages", r"^(BFloat16|Bool|Byte|Char|Double|Float|Half|Int|Long|Short)Storage$|StorageBase$"),
]
_EXCLUDE = [(reason, re.compile(pattern)) for reason, pattern in EXCLUDE]

_DATAPIPES = re.compile(r"DataPipe|datapipe|DFIter|DataChunk|runtime_validation|argument_validation|"
                        r"guaranteed_datapipes_determinism|non_deterministic|^graph$|graph_settings")
_HELPERS = {"boolean_dispatch", "has_torch_function", "has_torch_function_unary", "has_torch_function_variadic",
            "handle_torch_function", "assert_int_or_pair", "BroadcastingList1", "BroadcastingList2",
            "BroadcastingList3", "GRID_SAMPLE_INTERPOLATION_MODES", "GRID_SAMPLE_PADDING_MODES", "ScalingType",
            "SwizzleType", "Tensor", "bind", "PackedSequence_"}

DISTRIBUTION_BASICS = ["Distribution", "Normal", "Bernoulli", "Categorical", "OneHotCategorical", "Uniform", "Beta",
                       "Gamma", "Dirichlet", "Exponential", "Laplace", "LogNormal", "MultivariateNormal", "Poisson",
                       "Binomial", "Independent", "TransformedDistribution", "kl_divergence", "register_kl"]

BACKEND_FLAGS = ["cuda.matmul.allow_tf32", "cuda.matmul.allow_fp16_reduced_precision_reduction",
                 "cuda.matmul.allow_bf16_reduced_precision_reduction", "cuda.is_built", "cuda.flash_sdp_enabled",
                 "cuda.enable_flash_sdp", "cuda.mem_efficient_sdp_enabled", "cuda.enable_mem_efficient_sdp",
                 "cuda.math_sdp_enabled", "cuda.enable_math_sdp", "cuda.sdp_kernel", "cudnn.enabled",
                 "cudnn.benchmark", "cudnn.deterministic", "cudnn.allow_tf32", "cudnn.is_available", "cudnn.version",
                 "mps.is_available", "mps.is_built", "cpu.get_cpu_capability", "opt_einsum.is_available"]


def excluded_reason(name: str) -> str | None:
    return next((reason for reason, pattern in _EXCLUDE if pattern.search(name)), None)


def _defined_in(obj, prefix: str) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith(prefix)


def torch_names() -> list[str]:
    out = []
    for name in dir(torch):
        obj = getattr(torch, name)
        if name.startswith("_") or inspect.ismodule(obj) or not callable(obj):
            continue
        if type(obj).__name__ == "pybind11_type" and name not in ("Generator", "Size", "Stream", "Event"):
            continue  # TorchScript's IR classes (Graph, Node, ...), bound from C++
        out.append(name)
    return out


def tensor_names() -> list[str]:
    return [n for n in dir(torch.Tensor) if not n.startswith("_")]


def module_names(module, prefix: str, keep=lambda name, obj: True) -> list[str]:
    return [n for n in dir(module) if not n.startswith("_") and n not in _HELPERS
            and not inspect.ismodule(getattr(module, n)) and _defined_in(getattr(module, n), prefix)
            and keep(n, getattr(module, n))]


def nn_names() -> list[str]:
    """Module classes, and the other classes nn defines (Parameter, Buffer, ...)."""
    return module_names(torch.nn, "torch.nn", lambda n, o: inspect.isclass(o) and n != "Container")


def namespaces() -> dict[str, list[str]]:
    from torch.optim import lr_scheduler

    return {
        "torch": torch_names(),
        "Tensor": tensor_names(),
        "nn": nn_names(),
        "nn.functional": module_names(torch.nn.functional, "torch.nn.functional", lambda n, o: callable(o)),
        "nn.init": module_names(torch.nn.init, "torch.nn.init", lambda n, o: inspect.isfunction(o)),
        "nn.utils": module_names(torch.nn.utils, "torch.nn.utils", lambda n, o: callable(o)),
        "nn.utils.rnn": module_names(torch.nn.utils.rnn, "torch.nn.utils.rnn", lambda n, o: callable(o)),
        "nn.utils.prune": module_names(torch.nn.utils.prune, "torch.nn.utils.prune", lambda n, o: callable(o)),
        "nn.utils.parametrize": module_names(torch.nn.utils.parametrize, "torch.nn.utils.parametrize",
                                             lambda n, o: callable(o)),
        "nn.utils.parametrizations": module_names(torch.nn.utils.parametrizations, "torch.nn.utils.parametrizations",
                                                  lambda n, o: callable(o)),
        "optim": module_names(torch.optim, "torch.optim", lambda n, o: inspect.isclass(o)),
        "optim.lr_scheduler": module_names(lr_scheduler, "torch.optim.lr_scheduler",
                                           lambda n, o: inspect.isclass(o) and n not in ("Optimizer",)),
        "utils.data": module_names(torch.utils.data, "torch.utils.data",
                                   lambda n, o: callable(o) and not _DATAPIPES.search(n)),
        "amp": module_names(torch.amp, "torch.amp", lambda n, o: callable(o)),
        "cuda": module_names(torch.cuda, "torch.cuda", lambda n, o: callable(o)),
        "backends": list(BACKEND_FLAGS),
        "linalg": module_names(torch.linalg, "torch", lambda n, o: callable(o)),
        "fft": module_names(torch.fft, "torch", lambda n, o: callable(o)),
        "distributions": list(DISTRIBUTION_BASICS),
        "testing": module_names(torch.testing, "torch.testing", lambda n, o: callable(o)),
    }


def build() -> dict:
    spaces = {}
    for space, names in namespaces().items():
        kept, excluded = [], {}
        for name in sorted(set(names)):
            reason = excluded_reason(name.rsplit(".", 1)[-1])
            if reason:
                excluded[name] = reason
            else:
                kept.append(name)
        spaces[space] = {"names": kept, "excluded": excluded}
    return {"torch_version": torch.__version__.split("+")[0], "rules": dict(EXCLUDE), "namespaces": spaces}


def main(argv: list[str]) -> int:
    data = json.dumps(build(), indent=1, sort_keys=True) + "\n"
    if "--check" in argv:
        same = OUT.exists() and OUT.read_text() == data
        print(f"{OUT}: {'up to date' if same else 'differs from the installed torch'}")
        return 0 if same else 1
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(data)
    tmp.replace(OUT)
    print(f"wrote {OUT}: " + ", ".join(f"{k} {len(v['names'])}" for k, v in json.loads(data)["namespaces"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
