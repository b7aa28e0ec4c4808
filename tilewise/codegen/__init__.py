"""Code generation: the kernel IR, its schedules, the C-family renderers and the toolchain.

[Note: code generation layer] Everything that turns "what a kernel computes" into a binary lives here, below
both its users: the eager CUDA backend (``backends.cuda.kernels``: one kernel per operator specialisation)
and the compiler (``compiler``: one kernel per fused group). It imports neither of them. Both hand it kernel
IR and get their CUDA C from the same scheduler and renderer: the compiler's kernels have literal sizes and
strides (one per shape), the eager pointwise and reduction kernels symbolic ones, by-value arguments of the
kernel (one per specialisation, see [Note: symbolic sizes]); the eager plans pass what they decided from the
actual sizes (block size, strategy, splitting) as ``schedule.Knobs``.
- ``kernel_ir``: what a kernel computes (nests of loads, reductions and stores over an iteration domain);
- ``schedule``: how a target runs it (thread mapping, vector width, reduction strategy), with the tuning
  candidates ``mode="max-autotune"`` measures;
- ``render``: the C-style renderer and its two languages (``c``, ``cuda``), which render scalar
  expressions, and the kernel renderers for each target (``kernel_c``, ``kernel_cuda``);
- ``toolchain``: C through the host compiler, CUDA C through NVRTC to PTX and cubin, the kernel cache, SASS.
"""
