#!/usr/bin/env bash
# Everything the CUDA target needs a GPU for, in one go (for a machine that
# has one; see the device notes in the issue tracker):
#   1. the generated-step smoke test (one micro-batch, fp32 and bf16),
#   2. the CUDA kernels and device code against the CPU's (ctest label cuda),
#   3. test/EndToEnd/cuda_vs_cpu.py (training vs the CPU target and PyTorch,
#      GPU memory vs the plan),
#   4. bench/gpu_bench.py (GPT-2 124M tokens/s, MFU, memory vs PyTorch),
#      unless --no-bench.
# Builds first (scripts/build.sh). Ends with the lines of each step's result.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bench=1
[[ "${1:-}" == "--no-bench" ]] && bench=0
py=/usr/bin/python3

"$root/scripts/build.sh" >/dev/null || { echo "gpu_check: the build failed"; exit 1; }
nvidia-smi -L || { echo "gpu_check: no GPU here (nvidia-smi)"; exit 1; }

summary=()
run() { # NAME COMMAND...
  local name=$1
  shift
  echo "== $name"
  if "$@"; then summary+=("PASS $name"); else summary+=("FAIL $name"); fi
}
run "generated-step smoke" "$build/bin/fastllm-cuda-generated-smoke"
run "CUDA kernels and device vs CPU" \
  bash -c "cd '$build' && ctest -L '^cuda$' --output-on-failure"
run "training vs CPU and PyTorch" \
  "$py" "$root/test/EndToEnd/cuda_vs_cpu.py" --tool "$build/bin/fastllm-opt"
if ((bench)); then
  run "GPT-2 124M benchmark" "$py" "$root/bench/gpu_bench.py" --tool "$build/bin/fastllm-opt"
fi
echo
printf '%s\n' "${summary[@]}"
[[ "${summary[*]}" != *FAIL* ]]
