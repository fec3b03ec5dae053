#!/usr/bin/env bash
# Runs every test of fastllm-opt: lit (test/IR, Passes, Frontend, Codegen and
# Train, and the Python harnesses of test/EndToEnd and test/Import: real
# PyTorch exports, ONNX's operator tests, training vs PyTorch, data
# parallelism, the CUDA target, hostile input...), the unit tests (ctest), and
# bounded fuzzing runs of the importer and of the runtime's file readers.
# Installs and builds what is missing
# first. A harness is one lit test and its cases are micro-results of it
# (test/lit_harness.py); here each case counts as one test. The last line is
# `N passed, N failed, N skipped`; the exit status is non-zero on any
# failure. Before it, every skipped test is listed under the reason it gave
# (scripts/skipped_by_reason.py).
# Logs: build/test-logs/ (lit.log, lit.json, ctest.log, ctest.xml, fuzz.log,
# fuzz-readers.log);
# a harness's whole output: build/test/<Folder>/Output/<harness>.py.log.
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
rm -f "$logdir/fuzz.skipped"

echo "== lit (the harnesses one at a time, their cases as micro-results)"
rm -f "$logdir/lit.json"
"$py" /usr/lib/llvm-19/build/utils/lit/lit.py -v -o "$logdir/lit.json" "$build/test" \
  2>&1 | tee "$logdir/lit.log"
# Counts from lit's JSON report: a test with micro-results (a harness) counts
# as its cases, plus one failure if it failed while no case did; any other
# test counts as itself. Prints `P F S`, or nothing without a report.
lit_counts=$("$py" - "$logdir/lit.json" <<'EOF'
import collections, json, sys
try:
    tests = json.load(open(sys.argv[1]))["tests"]
except (OSError, ValueError, KeyError):
    sys.exit(0)
PASSED, FAILED, SKIPPED = 0, 1, 2
kind = {"PASS": PASSED, "FLAKYPASS": PASSED, "XFAIL": PASSED,
        "UNSUPPORTED": SKIPPED, "SKIPPED": SKIPPED}  # anything else failed

def split(name):
    """(test, is a micro-result): 'SUITE :: PATH:CASE' is one of 'SUITE :: PATH'."""
    suite, _, path = name.partition(" :: ")
    if ":" in path:
        return suite + " :: " + path.split(":", 1)[0], True
    return name, False

cases = collections.defaultdict(lambda: [0, 0, 0])
for t in tests:
    test, micro = split(t["name"])
    if micro:
        cases[test][kind.get(t["code"], FAILED)] += 1
total = [0, 0, 0]
for t in tests:
    test, micro = split(t["name"])
    if micro:
        continue
    counts = list(cases.get(test, [0, 0, 0]))
    if test not in cases:
        counts[kind.get(t["code"], FAILED)] += 1
    else:
        if kind.get(t["code"], FAILED) == FAILED and not counts[FAILED]:
            counts[FAILED] += 1
        print("  %s: %d passed, %d failed, %d skipped" % (test, *counts), file=sys.stderr)
    total = [a + b for a, b in zip(total, counts)]
print(*total)
EOF
)
if [[ -n "$lit_counts" ]]; then
  read -r lp lf ls <<<"$lit_counts"
  echo "lit, each harness case counted: $lp passed, $lf failed, $ls skipped"
  add "$lp" "$lf" "$ls"
else
  echo "lit wrote no report ($logdir/lit.json)"; add 0 1
fi

echo "== unit tests (ctest)"
rm -f "$logdir/ctest.xml"
(cd "$build" && ctest --output-on-failure --output-junit "$logdir/ctest.xml") 2>&1 |
  tee "$logdir/ctest.log"
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

# fuzz NAME BINARY SECONDS RSS_MB CORPUS: one bounded libFuzzer run, one
# test; the log goes to $logdir/NAME.log, the corpus is removed after.
fuzz() {
  local name=$1 binary=$2 seconds=$3 rss=$4 corpus=$5
  if "$binary" -max_total_time="$seconds" -rss_limit_mb="$rss" -timeout=20 \
      -seed=1 -print_final_stats=1 "$corpus" >"$logdir/$name.log" 2>&1; then
    grep -E "stat::number_of_executed_units" "$logdir/$name.log"
    echo "PASS $name"; add 1 0
  else
    tail -n 30 "$logdir/$name.log"; echo "FAIL $name (log: $logdir/$name.log)"; add 0 1
  fi
  rm -rf "$corpus"
}

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
  fuzz fuzz "$build/bin/fastllm-import-fuzzer" "$fuzz_seconds" 4096 "$corpus"
else
  echo "SKIP fuzz: no fastllm-import-fuzzer (needs clang's libFuzzer)"; add 0 0 1
  echo "fuzz: no fastllm-import-fuzzer (needs clang's libFuzzer)" >"$logdir/fuzz.skipped"
fi

reader_seconds=${READER_FUZZ_SECONDS:-20}
echo "== fuzzing the runtime's file readers: manifests, safetensors, token files, metrics lines (${reader_seconds}s)"
if [[ -x "$build/bin/fastllm-reader-fuzzer" ]]; then
  corpus=$(mktemp -d)
  "$py" "$root/tools/fuzz/make_reader_seeds.py" "$corpus"
  fuzz fuzz-readers "$build/bin/fastllm-reader-fuzzer" "$reader_seconds" 2048 "$corpus"
else
  echo "SKIP fuzz-readers: no fastllm-reader-fuzzer (needs clang's libFuzzer)"; add 0 0 1
  echo "fuzz-readers: no fastllm-reader-fuzzer (needs clang's libFuzzer)" >>"$logdir/fuzz.skipped"
fi

echo
"$py" "$root/scripts/skipped_by_reason.py" "$logdir/lit.json" "$logdir/ctest.xml" \
  "$logdir/fuzz.skipped"

echo
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[[ $failed -eq 0 ]]
