"""Print the public names of ``torch`` and ``torch.Tensor`` that tilewise lacks.

Run from the repository root: ``PYTHONPATH=$PWD python tests/torch_api_coverage.py [--all]``.
Names are grouped as out of scope (complex, sparse, quantized, named tensors, TorchScript, vendor backends,
deprecated or internal), belonging to another area of the API (linalg, nn layers and losses, recurrent
layers, fft and windows, autocast), or missing: what training code may call and tilewise does not have.
``--all`` lists the names of every group, not only the missing ones.
"""

from __future__ import annotations

import re
import sys

import torch

import tilewise

OUT_OF_SCOPE = re.compile(
    r"(complex|conj|real$|imag$|angle|polar|view_as_real|view_as_complex|^is_neg$|resolve_neg|chalf|cfloat|cdouble"
    r"|sparse|coalesce|indices|crow_|ccol_|col_|row_indices|values|dense_dim|to_dense|smm$|spmm|saddmm|hspmm|dsmm"
    r"|hsmm|quantiz|q_|qscheme|int_repr|dequantize|fake_quant|fbgemm|obs_fake|^name$|names|refine_names|align_"
    r"|cudnn|miopen|mkldnn|is_vulkan|nested|padded_tensor|_copy$|^sym_|Storage$|Type$|^is_(ipu|xla|xpu|mps|mtia|maia"
    r"|meta|mkldnn|quantized|sparse|sparse_csr|coalesced|set_to|distributed|inference)$|^(ipu|xpu|mtia)$"
    r"|autocast|deterministic|anomaly|warn_always|num_threads|num_interop|flush_denormal|printoptions"
    r"|default_tensor_type|float32_matmul|_ir|ir_|type_comment|unify_type|fork$|wait$|vmap|while_loop|^cond$"
    r"|storage|record_stream|share_memory|is_shared|reinforce|volatile|output_nr|grad_dtype|module_load"
    r"|const_data_ptr|dim_order|hash_tensor|layout|memory_format|classproperty|thread_safe|compiled_with"
    r"|prepare_multiprocessing|profiler_|get_file_path|get_device_module|from_file|is_storage|typename"
    r"|^symeig$|^eig$|^lstsq$|^solve$|^matrix_rank$|^chain_matmul$|^range$|^map2?_$|^apply_$|^new$|^resize"
    r"|segment_reduce|slice_inverse|nonzero_static|empty_quantized|^unsafe_|^split_with_sizes"
    r"|^[A-Z](?!.*Tensor$)|^parse_schema$|^choose_qparams|^to_dlpack$|^is_inference_mode_enabled$|^get_default_device$|^can_cast$|^native_|^norm_except_dim$"
    r"|^frobenius_norm$|^nuclear_norm$|^alias_copy$|^sspaddmm$)")
OTHER_AREA = re.compile(
    r"(cholesky|^det$|logdet|slogdet|inverse|pinverse|^qr$|^svd|^lu|geqrf|orgqr|ormqr|triangular_solve"
    r"|matrix_exp|matrix_power|lobpcg|pca_lowrank|^mv$|vdot|tensordot|^dist$|pdist|cdist|cov$|corrcoef"
    r"|batch_norm|instance_norm|group_norm|layer_norm|conv|pool|dropout|embedding|bilinear|pairwise_distance"
    r"|loss$|kl_div|ctc|margin|prelu|rrelu|hardshrink|threshold_|celu_|selu_|relu_|channel_shuffle|pixel"
    r"|affine_grid|grid_sampler|constant_pad|lstm|gru|rnn|stft|istft|window$|GradScaler|^Event$|^Stream$"
    r"|histogramdd|^histogram$|^OutOfMemoryError$|^AcceleratorError$|BufferDict|ModuleDict|ParameterDict"
    r"|bartlett|blackman|hamming|hann|kaiser)")


def missing(namespace, have) -> list[str]:
    return sorted(n for n in dir(namespace) if not n.startswith("_") and not hasattr(have, n)
                  and (namespace is not torch or callable(getattr(namespace, n))))


def classify(names: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {"out of scope": [], "other area": [], "missing": []}
    for n in names:
        group = "out of scope" if OUT_OF_SCOPE.search(n) else "other area" if OTHER_AREA.search(n) else "missing"
        groups[group].append(n)
    return groups


def main(show_all: bool) -> None:
    for title, namespace, have in (("torch", torch, tilewise), ("torch.Tensor", torch.Tensor, tilewise.Tensor)):
        names = missing(namespace, have)
        groups = classify(names)
        counts = ", ".join(f"{k}: {len(v)}" for k, v in groups.items())
        print(f"{title}: {len(names)} public names absent from tilewise ({counts})")
        for group, members in groups.items():
            if show_all or group == "missing":
                print(f"  {group}: {' '.join(members)}")


if __name__ == "__main__":
    main("--all" in sys.argv)
