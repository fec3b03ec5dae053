#!/usr/bin/env bash
# Runs every test of fastllm-opt: lit (IR, frontend, errors), the real-export
# import tests, ONNX's own operator tests, and a bounded fuzzing run of the
# importer. Installs and builds what is missing first. The last line is
# `N passed, N failed, N skipped`; the exit status is non-zero on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
py=/usr/bin/python3 # Debian's python3 with python3-torch and python3-onnx
fuzz_seconds=${FUZZ_SECONDS:-30}

"$root/scripts/build.sh" || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

passed=0 failed=0 skipped=0
add() { passed=$((passed + $1)); failed=$((failed + $2)); skipped=$((skipped + ${3:-0})); }
logdir="$build/test-logs"
mkdir -p "$logdir"
# Adds the counts of a script's closing line `PREFIX: P passed, F failed[,
# S skipped]` in LOG; a missing line (the script crashed) is one failure.
tally() {
  local line
  line=$(grep -E "^$2: [0-9]+ passed" "$1" | tail -1)
  if [[ -z "$line" ]]; then add 0 1; return; fi
  local p f s
  p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
  s=0
  [[ "$line" == *skipped* ]] && s=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$line")
  add "$p" "$f" "$s"
}

echo "== lit"
"$py" /usr/lib/llvm-19/build/utils/lit/lit.py -s "$build/test" \
  2>&1 | tee "$logdir/lit.log"
count() { grep -E "^ *$1 *: " "$logdir/lit.log" | sed -E 's/.*: *([0-9]+).*/\1/' | head -1; }
lp=$(count Passed) lf=$(count Failed) lu=$(count Unsupported)
lx=$(count "Unexpectedly Passed") lt=$(count "Timed Out")
add "${lp:-0}" "$(( ${lf:-0} + ${lx:-0} + ${lt:-0} ))" "${lu:-0}"
[[ -n "$lp$lf" ]] || add 0 1 # lit itself failed to run

echo "== unit tests (ctest)"
(cd "$build" && ctest --output-on-failure) 2>&1 | tee "$logdir/ctest.log"
line=$(grep -E "tests passed, [0-9]+ tests failed out of" "$logdir/ctest.log" | tail -1)
if [[ -n "$line" ]]; then
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  bad=$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$line")
  # GPU tests without a GPU: GTEST_SKIP, which ctest lists as (Skipped).
  ctest_skipped=$(grep -cE "^[[:space:]]*[0-9]+ - .*\(Skipped\)$" "$logdir/ctest.log" || true)
  add "$((total - bad - ctest_skipped))" "$bad" "$ctest_skipped"
else
  add 0 1
fi

echo "== real PyTorch exports"
"$py" "$root/test/export_import_test.py" --tool "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/exports.log"
tally "$logdir/exports.log" "export import tests"

echo "== end to end: compiled training vs PyTorch"
"$py" "$root/test/e2e/train_vs_pytorch.py" --tool "$build/bin/fastllm-opt" \
  2>&1 | grep -v "bytes, export" | tee "$logdir/e2e-train.log"
tally "$logdir/e2e-train.log" "e2e train tests"

echo "== data parallelism (ZeRO-1/2/3, mpirun) vs one rank and PyTorch"
"$py" "$root/test/e2e/data_parallel.py" "$build/bin/fastllm-opt" \
  2>&1 | grep -v "bytes, export" | tee "$logdir/data-parallel.log"
tally "$logdir/data-parallel.log" "data parallel tests"

echo "== the CUDA target: nvcc builds; on a GPU, training equals the CPU target"
"$py" "$root/test/e2e/cuda_vs_cpu.py" --tool "$build/bin/fastllm-opt" \
  2>&1 | grep -v "bytes, export" | tee "$logdir/cuda.log"
tally "$logdir/cuda.log" "cuda tests"

echo "== the CUDA target on CPUs (--cuda-emulation): fp32, bf16, dp 2 ZeRO-1/2/3, a killed rank"
"$py" "$root/test/e2e/cuda_emulation.py" "$build/bin/fastllm-opt" \
  2>&1 | grep -E "^(PASS|FAIL|[a-z0-9]+: [0-9]+ s|cuda emulation)" \
  | tee "$logdir/cuda-emulation.log"
tally "$logdir/cuda-emulation.log" "cuda emulation tests"

echo "== a killed or hung rank ends the job, naming a rank"
"$py" "$root/test/e2e/kill_rank.py" "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/kill-rank.log"
tally "$logdir/kill-rank.log" "kill rank tests"

echo "== models written and exported as users do (default init, dedup, tied head) vs PyTorch"
"$py" "$root/test/e2e/user_exports.py" "$build/bin/fastllm-opt" \
  2>&1 | grep -E "^(PASS|FAIL|figures|user export)" | tee "$logdir/user-exports.log"
tally "$logdir/user-exports.log" "user export tests"

echo "== hostile names: no injected code, names survive byte for byte"
"$py" "$root/test/e2e/hostile_names.py" "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/hostile-names.log"
tally "$logdir/hostile-names.log" "hostile names tests"

echo "== hostile ONNX: refused with exit code 1 and a message, in bounded time and memory"
"$py" "$root/test/e2e/hostile_onnx.py" --tool "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/hostile-onnx.log" | grep -E "^(FAIL|total time|hostile onnx)"
tally "$logdir/hostile-onnx.log" "hostile onnx tests"

echo "== training-run safety: outputs, skipped steps, signals, checkpoint folder"
"$py" "$root/test/e2e/run_safety.py" "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/run-safety.log"
tally "$logdir/run-safety.log" "run safety tests"

echo "== dropout: the same masks on any dp, grad-accum and ZeRO stage, and PyTorch's losses with them"
"$py" "$root/test/e2e/dropout.py" "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/dropout.log"
tally "$logdir/dropout.log" "dropout tests"

echo "== gradient rules vs PyTorch autograd"
"$py" "$root/test/e2e/gradcheck.py" --tool "$build/bin/fastllm-opt" \
  2>&1 | tee "$logdir/gradcheck.log" | grep -E "^(FAIL|gradcheck)"
tally "$logdir/gradcheck.log" "gradcheck"

echo "== ONNX operator tests (libonnx-testdata)"
"$py" "$root/test/onnx_node_tests.py" --tool "$build/bin/fastllm-opt" \
  >"$logdir/onnx-node.log" 2>&1
tail -n 25 "$logdir/onnx-node.log"
tally "$logdir/onnx-node.log" "onnx node tests"

echo "== fuzzing the importer (${fuzz_seconds}s)"
if [[ -x "$build/bin/fastllm-import-fuzzer" ]]; then
  corpus=$(mktemp -d)
  # Text seeds (the ONNX text parser) and binary ones with external data.
  cp "$root"/test/Frontend/*.onnxtext "$corpus"/ 2>/dev/null
  "$py" "$root/tools/fuzz/make_seeds.py" "$corpus"
  for t in add matmul_2d gather_0 softmax_axis_1 layer_normalization_2d_axis0 slice; do
    f=/usr/share/libonnx-testdata/data/node/test_$t/model.onnx
    [[ -f $f ]] && cp "$f" "$corpus/$t.onnx"
  done
  if "$build/bin/fastllm-import-fuzzer" -max_total_time="$fuzz_seconds" \
      -rss_limit_mb=4096 -timeout=20 -seed=1 -print_final_stats=1 "$corpus" \
      >"$logdir/fuzz.log" 2>&1; then
    grep -E "stat::number_of_executed_units" "$logdir/fuzz.log"
    echo "PASS fuzz"; add 1 0
  else
    tail -n 30 "$logdir/fuzz.log"; echo "FAIL fuzz (log: $logdir/fuzz.log)"; add 0 1
  fi
  rm -rf "$corpus"
else
  echo "SKIP fuzz: no fastllm-import-fuzzer (needs clang's libFuzzer)"; add 0 0 1
fi

echo
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[[ $failed -eq 0 ]]
