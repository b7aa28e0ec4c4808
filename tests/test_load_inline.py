"""``tilewise.cuda.load_inline`` / ``load``: compile_only on any machine (PTX, SASS, registers, diagnostics),
launches on a GPU (cuda-marked), and the kernels of a custom operator in ``explain``."""

import numpy as np
import pytest

import tilewise as tw
from tilewise.codegen.toolchain import nvrtc_available

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")

SOURCE = r"""
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void fill(double* out, double value, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
template <typename T> __global__ void copy(const T* a, T* b, int n) {
    int i = threadIdx.x;
    if (i < n) b[i] = a[i];
}
template __global__ void copy<float>(const float*, float*, int);
"""


def _compiled(functions=None):
    return tw.cuda.load_inline("ext_test", SOURCE, functions, compile_only=True, arch="sm_90")


def test_compile_only_gives_ptx_sass_and_registers():
    m = _compiled()
    assert sorted(m.kernels) == ["axpy", "fill"]  # templates are named with their arguments
    assert ".visible .entry axpy(" in m.ptx and ".entry fill(" in m.ptx
    assert "FFMA" in m.axpy.sass and ".text.fill" not in m.axpy.sass  # its own function of the cubin
    assert m.axpy.registers > 0 and m.fill.shared_bytes == 0
    assert "registers/thread" in m.explain() and "kernel axpy: SASS (sm_90)" in m.explain()


def test_template_instances_by_name():
    m = _compiled(["copy<float>"])
    kernel = m.kernels["copy<float>"]
    assert kernel.lowered_name.startswith("_Z") and kernel.lowered_name in m.ptx
    assert "LDG" in kernel.sass


def test_compile_only_cannot_launch():
    with pytest.raises(RuntimeError, match="compile_only=True"):
        _compiled().axpy(1, 2, 1.0, 3, grid=1, block=32)


def test_syntax_error_quotes_the_line():
    broken = 'extern "C" __global__ void f(float* x) {\n    x[0] = 1.0f\n}\n'
    with pytest.raises(RuntimeError) as err:
        tw.cuda.load_inline("broken_ext", broken, compile_only=True, arch="sm_90")
    text = str(err.value)
    assert "broken_ext.cu(3): error" in text and '> 3 | }' in text and "  2 |     x[0] = 1.0f" in text


def test_load_from_file_names_the_file(tmp_path):
    header = tmp_path / "scale.cuh"
    header.write_text("#define SCALE 3.0f\n")
    path = tmp_path / "kernels.cu"
    path.write_text('#include "scale.cuh"\nextern "C" __global__ void s(float* x) { x[0] *= SCALE; }\n'
                    'extern "C" __global__ void bad(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(RuntimeError, match=r"kernels\.cu\(3\): error: identifier \"undefined_name\" is undefined"):
        tw.cuda.load("file_ext", path, compile_only=True, arch="sm_90")
    path.write_text('#include "scale.cuh"\nextern "C" __global__ void s(float* x) { x[0] *= SCALE; }\n')
    assert "mul.f32" in tw.cuda.load("file_ext", path, compile_only=True, arch="sm_90").ptx


def test_unknown_function_and_cpp_sources():
    with pytest.raises(ValueError, match=r"no __global__ function named \['nope'\]"):
        _compiled(["nope"])
    with pytest.raises(ValueError, match="cpp_sources"):
        tw.cuda.load_inline("x", SOURCE, cpp_sources="int f();", compile_only=True)


def test_explain_shows_a_custom_operators_kernels():
    module = _compiled(["axpy"])

    @tw.library.custom_op("ext_test::axpy", mutates_args=())
    def axpy(x: tw.Tensor, y: tw.Tensor, a: float) -> tw.Tensor:
        return a * x + y

    axpy.register_fake(lambda x, y, a: tw.empty_like(y))
    axpy.launched(module)
    text = str(tw.explain(lambda x, y: axpy(x, y, 2.0), tw.randn(4), tw.randn(4), repeats=1))
    assert "ext_test::axpy kernel axpy: SASS (sm_90)" in text and ".entry axpy(" in text


# ---------------------------------------------------------------------------- on a GPU

@pytest.mark.cuda
def test_launch_on_the_current_stream_matches_numpy():
    m = tw.cuda.load_inline("ext_run", SOURCE, ["axpy", "fill"])
    n = 1000
    x, y = np.random.default_rng(0).standard_normal((2, n)).astype(np.float32)
    tx, ty = tw.tensor(x, device="cuda"), tw.tensor(y, device="cuda")
    stream = tw.cuda.Stream()
    with tw.cuda.stream(stream):
        m.axpy(tx, ty, 2.5, n, grid=(n + 255) // 256, block=256)
    stream.synchronize()
    np.testing.assert_allclose(ty.cpu().numpy(), 2.5 * x.astype(np.float64) + y, rtol=1e-5, atol=1e-6)  # one fma
    out = tw.empty(n, dtype=tw.float64, device="cuda")
    m.fill(out, 0.25, n, grid=(n + 127) // 128, block=128)
    np.testing.assert_array_equal(out.cpu().numpy(), np.full(n, 0.25))
    assert m.axpy.registers == m.axpy.function.attributes().num_regs


@pytest.mark.cuda
def test_launch_refuses_a_cpu_tensor():
    m = tw.cuda.load_inline("ext_run", SOURCE, ["axpy"])
    with pytest.raises(ValueError, match="argument 0 is a tensor on cpu"):
        m.axpy(tw.ones(4), tw.ones(4, device="cuda"), 1.0, 4, grid=1, block=32)


@pytest.mark.cuda
def test_custom_operator_over_a_cuda_kernel_compiles_as_one_step():
    m = tw.cuda.load_inline("ext_run", SOURCE, ["axpy"])

    @tw.library.custom_op("ext_run::axpy", mutates_args=(), device_types="cuda")
    def axpy(x: tw.Tensor, y: tw.Tensor, a: float) -> tw.Tensor:
        out = y.clone()
        m.axpy(x, out, a, x.numel(), grid=(x.numel() + 255) // 256, block=256)
        return out

    axpy.register_fake(lambda x, y, a: tw.empty_like(y))
    x, y = tw.randn(300, device="cuda"), tw.randn(300, device="cuda")
    fn = tw.compile(lambda x, y: axpy(x.exp(), y, 3.0).relu())
    np.testing.assert_allclose(fn(x, y).cpu().numpy(), (3.0 * x.exp() + y).relu().cpu().numpy(), rtol=1e-5)
    assert "ext_run" in axpy.modules
    (program,) = fn.programs()
    assert sum(getattr(s, "op", None) is axpy.op for s in program.steps) == 1
