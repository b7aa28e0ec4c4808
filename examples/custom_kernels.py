"""One's own kernels as tilewise operators: a fused RMSNorm, forward and backward, in CUDA C (and in Triton where
it is installed), registered with ``tilewise.library.custom_op``, differentiable, inside a compiled training step.

On a machine without a GPU the same operators run numpy kernels registered for the CPU, and the CUDA C is still
compiled (NVRTC needs no GPU) so its PTX, SASS and registers can be read.

    python examples/custom_kernels.py [--steps 20] [--device cuda]
"""

import argparse

import numpy as np

import tilewise as tw
from tilewise.library import custom_op

RMS_NORM_CUDA = r"""
// one block per row; blockDim.x is a multiple of 32
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? partial[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        if (lane == 0) partial[0] = v;
    }
    __syncthreads();
    float total = partial[0];
    __syncthreads();
    return total;
}

extern "C" __global__ void rms_norm_forward(const float* __restrict__ x, const float* __restrict__ w,
                                            float* __restrict__ y, float* __restrict__ rstd, int cols, float eps) {
    const long long base = (long long)blockIdx.x * cols;
    float sum = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = x[base + c]; sum += v * v; }
    const float r = rsqrtf(block_sum(sum) / cols + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[base + c] = x[base + c] * r * w[c];
}

// dx = r * dy * w - x * r^3 / cols * sum(dy * w * x);  dw += dy * x * r (summed over rows)
extern "C" __global__ void rms_norm_backward(const float* __restrict__ dy, const float* __restrict__ x,
                                             const float* __restrict__ w, const float* __restrict__ rstd,
                                             float* __restrict__ dx, float* __restrict__ dw, int cols) {
    const long long base = (long long)blockIdx.x * cols;
    const float r = rstd[blockIdx.x];
    float dot = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dot += dy[base + c] * w[c] * x[base + c];
    const float k = r * r * r * block_sum(dot) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        dx[base + c] = r * dy[base + c] * w[c] - k * x[base + c];
        atomicAdd(&dw[c], dy[base + c] * x[base + c] * r);
    }
}
"""
BLOCK = 256


# ---------------------------------------------------------------------------- the operators

@custom_op("ext::rms_norm", mutates_args=())
def rms_norm(x: tw.Tensor, weight: tw.Tensor, eps: float) -> tuple[tw.Tensor, tw.Tensor]:
    """(y, rstd) with y = x * rsqrt(mean(x^2, -1) + eps) * weight; the CPU kernel (numpy)."""
    a = x.numpy().astype(np.float32)
    rstd = 1.0 / np.sqrt((a * a).mean(-1) + eps)
    return tw.from_numpy(a * rstd[..., None] * weight.numpy()), tw.from_numpy(rstd.astype(np.float32))


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1])


@custom_op("ext::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: tw.Tensor, x: tw.Tensor, weight: tw.Tensor,
                      rstd: tw.Tensor) -> tuple[tw.Tensor, tw.Tensor]:
    """(dx, dweight) of rms_norm; the CPU kernel (numpy)."""
    dy, a, w, r = grad.numpy(), x.numpy(), weight.numpy(), rstd.numpy()[..., None]
    dot = (dy * w * a).sum(-1, keepdims=True)
    dx = r * dy * w - a * r ** 3 * dot / a.shape[-1]
    dw = (dy * a * r).reshape(-1, a.shape[-1]).sum(0)
    return tw.from_numpy(dx.astype(np.float32)), tw.from_numpy(dw.astype(np.float32))


@rms_norm_backward.register_fake
def _(grad, x, weight, rstd):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, grad, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = rms_norm_backward(grad, x, weight, rstd)
    return dx, dweight, None


rms_norm.register_autograd(_backward, setup_context=_setup_context)


def register_cuda_kernels(module) -> None:
    """The CUDA kernels of both operators: one launch each, on the current stream."""
    @rms_norm.register_kernel("cuda")
    def _(x, weight, eps):
        x, cols = x.contiguous(), x.shape[-1]
        y, rstd = tw.empty_like(x), tw.empty(x.shape[:-1], device=x.device)
        module.rms_norm_forward(x, weight.contiguous(), y, rstd, cols, eps, grid=x.numel() // cols, block=BLOCK)
        return y, rstd

    @rms_norm_backward.register_kernel("cuda")
    def _(grad, x, weight, rstd):
        x, cols = x.contiguous(), x.shape[-1]
        dx, dw = tw.empty_like(x), tw.zeros(cols, device=x.device)
        module.rms_norm_backward(grad.contiguous(), x, weight.contiguous(), rstd.contiguous(), dx, dw, cols,
                                 grid=x.numel() // cols, block=BLOCK)
        return dx, dw


def reference_rms_norm(x, weight, eps):
    """The same function from tilewise operators (the compiler fuses it; autograd differentiates it)."""
    return x * (x * x).mean(-1, keepdim=True).add(eps).rsqrt() * weight


# ---------------------------------------------------------------------------- Triton, where installed

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def rms_norm_triton_kernel(x_ptr, w_ptr, y_ptr, cols, eps, BLOCK_COLS: tl.constexpr):  # noqa: N803 — Triton's
        row = tl.program_id(0)
        offsets = tl.arange(0, BLOCK_COLS)
        mask = offsets < cols
        x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
        tl.store(y_ptr + row * cols + offsets, x * r * tl.load(w_ptr + offsets, mask=mask), mask=mask)


def triton_rms_norm_forward():
    """The forward as a Triton kernel behind ``triton_op`` (None without Triton)."""
    if triton is None:
        return None

    @tw.library.triton_op("ext::rms_norm_triton", mutates_args=())
    def rms_norm_triton(x: tw.Tensor, weight: tw.Tensor, eps: float) -> tw.Tensor:
        x, cols = x.contiguous(), x.shape[-1]
        y = tw.empty_like(x)
        tw.library.wrap_triton(rms_norm_triton_kernel)[(x.numel() // cols,)](
            x, weight, y, cols, eps, BLOCK_COLS=triton.next_power_of_2(cols))
        return y

    rms_norm_triton.register_fake(lambda x, weight, eps: tw.empty_like(x))
    return rms_norm_triton


# ---------------------------------------------------------------------------- a compiled training step

class Block(tw.nn.Module):
    def __init__(self, width: int, norm):
        super().__init__()
        self.up = tw.nn.Linear(width, 4 * width)
        self.down = tw.nn.Linear(4 * width, width)
        self.weight = tw.nn.Parameter(tw.ones(width))
        self.norm = norm

    def forward(self, x):
        return x + self.down(tw.nn.functional.gelu(self.up(self.norm(x, self.weight))))


def train(norm, device: str, steps: int, width: int = 64, seed: int = 0) -> list[float]:
    tw.manual_seed(seed)
    model = Block(width, norm).to(device)
    optimizer = tw.optim.AdamW(model.parameters(), lr=1e-3)
    data = tw.randn(32, width, device=device)
    target = tw.randn(32, width, device=device)

    @tw.compile
    def step(x, y):
        loss = tw.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return [step(data, target).item() for _ in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    args = parser.parse_args()

    from tilewise.codegen.toolchain import nvrtc_available

    if nvrtc_available():  # compiled here even without a GPU: PTX, SASS and registers
        on_gpu = args.device == "cuda"
        module = tw.cuda.load_inline("rms_norm", RMS_NORM_CUDA, ["rms_norm_forward", "rms_norm_backward"],
                                     compile_only=not on_gpu, arch=None if on_gpu else "sm_90")
        for kernel in module.kernels.values():
            print(f"{kernel.describe()}, {kernel.shared_bytes} B shared/block, "
                  f"{len(kernel.sass.splitlines())} lines of SASS")
        rms_norm.launched(module)  # explain shows its PTX and SASS beside the generated kernels
        if args.device == "cuda":
            register_cuda_kernels(module)

    x = tw.randn(8, 64, dtype=tw.float32, device=args.device, requires_grad=True)
    w = tw.rand(64, device=args.device, requires_grad=True)
    y, _ = rms_norm(x, w, 1e-6)
    (y * y).sum().backward()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (reference_rms_norm(xr, wr, 1e-6) ** 2).sum().backward()
    print(f"rms_norm vs its decomposition: forward {float((y - reference_rms_norm(xr, wr, 1e-6)).abs().max()):.2e}, "
          f"d/dx {float((x.grad - xr.grad).abs().max()):.2e}, d/dweight {float((w.grad - wr.grad).abs().max()):.2e}")

    def custom(x, weight):
        return rms_norm(x, weight, 1e-6)[0]

    losses = train(custom, args.device, args.steps)
    reference = train(lambda x, weight: reference_rms_norm(x, weight, 1e-6), args.device, args.steps)
    print(f"compiled training step, custom rms_norm: loss {losses[0]:.4f} -> {losses[-1]:.4f}; with the "
          f"decomposed one: {reference[0]:.4f} -> {reference[-1]:.4f}")

    if args.device == "cuda":
        triton_norm = triton_rms_norm_forward()
        if triton_norm is not None:
            x = tw.randn(64, 1000, device="cuda")
            w = tw.rand(1000, device="cuda")
            difference = float((triton_norm(x, w, 1e-6) - rms_norm(x, w, 1e-6)[0]).abs().max())
            print(f"Triton rms_norm vs the CUDA C one: largest difference {difference:.2e}")


if __name__ == "__main__":
    main()
