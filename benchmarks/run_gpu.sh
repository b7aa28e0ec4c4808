#!/usr/bin/env bash
# Run the GPU half of the test suite and every GPU benchmark, writing logs to LOGDIR.
#   bash benchmarks/run_gpu.sh LOGDIR [quick]
set -uo pipefail
log=${1:?usage: run_gpu.sh LOGDIR [quick]}
mkdir -p "$log"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)"
} | tee "$log/env.txt"
timeout 240 python3 -m pytest -q -p no:warnings -m cuda --maxfail=30 tests 2>&1 | tee "$log/cuda_tests.log" | tail -15
timeout 150 python3 benchmarks/cuda_eager.py ${2:+--quick} --json "$log/eager.json" 2>&1 | tee "$log/eager.log" | tail -45
timeout 120 python3 benchmarks/gpt_train_step.py 2>&1 | tee "$log/gpt_step.log"
timeout 300 python3 benchmarks/compiled_cuda.py ${2:+--quick} --append "$log/compiled_cuda.md" 2>&1 | tee "$log/compiled_cuda.log" | tail -12
timeout 240 python3 benchmarks/gpt_train_step.py --compile ${2:+--quick} 2>&1 | tee "$log/gpt_step_compiled.log" | tail -16
timeout 240 python3 benchmarks/gpt_train_step.py --compile --optimizer sgd ${2:+--quick} 2>&1 | tee "$log/gpt_step_compiled_sgd.log" | tail -16
timeout 90 python3 -m tilewise demo --device cuda --steps 300 --out "$log/demo" 2>&1 | tail -12 | tee "$log/demo.log"
timeout 120 python3 benchmarks/custom_ops.py 2>&1 | tee "$log/custom_ops.log"
