#!/usr/bin/env bash
# The main job on the bundled model: models/gpt2-tiny.onnx (a 2-layer
# GPT-2-style training graph exported by PyTorch) is summarised, compiled for
# the CPU into build/demo/ (with the memory report and its chart), and
# trained for 300 steps on the text of the GPL-3 (a file every Debian machine
# has), tokenized byte-level by `fastllm-opt data` with a validation split.
# It leaves four pictures and a trace in build/demo/ (listed at the end).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out="$build/demo"
bin="$build/bin"
"$root/scripts/build.sh" >/dev/null
model="$root/models/gpt2-tiny.onnx"

"$bin/fastllm-opt" import "$model" --bind-dim batch=8 --bind-dim seq=64 \
  --summary --no-ir
echo
"$bin/fastllm-opt" compile "$model" -o "$out" --batch-size 8 --seq-len 64 \
  --report --report-chart
# The same model on 2 ranks at ZeRO 1, 2 and 3 (plans only), side by side.
for z in 1 2 3; do
  "$bin/fastllm-opt" compile "$model" -o "$out/zero$z" --batch-size 4 \
    --seq-len 64 --dp 2 --zero-stage $z --emit mlir
done
"$bin/fastllm-plot" memory "$out"/zero{1,2,3}/plan.json \
  -o "$out/memory-zero.png" --overwrite >/dev/null
echo
text=/usr/share/common-licenses/GPL-3
"$bin/fastllm-opt" data "$text" -o "$out/gpl3.tok" --val-fraction 0.1 \
  --val-output "$out/gpl3-val.tok" --overwrite
"$out/train" --data "$out/gpl3.tok" --val-data "$out/gpl3-val.tok" \
  --eval-every 50 --eval-steps 4 --steps 300 --lr 3e-3 --lr-schedule cosine \
  --warmup-steps 20 --log-every 25 --metrics "$out/metrics.jsonl" --overwrite "$@"
"$bin/fastllm-plot" metrics "$out/metrics.jsonl" -o "$out/loss.png" \
  --overwrite >/dev/null
echo
# Two ranks with ZeRO-3, traced: the weights' all-gathers and the gradients'
# reduce-scatters the compiler overlaps with the layers' compute.
"$bin/fastllm-opt" compile "$model" -o "$out/zero3-run" --batch-size 4 \
  --seq-len 64 --dp 2 --zero-stage 3
mpi=(mpirun --oversubscribe -np 2)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
"${mpi[@]}" "$out/zero3-run/train" --data "$out/gpl3.tok" --steps 12 \
  --lr 3e-3 --log-every 4 --trace "$out/trace.json" --trace-steps 10-11 --overwrite
"$bin/fastllm-plot" trace "$out/trace.json" -o "$out/trace.png" \
  --overwrite >/dev/null
echo
echo "pictures: $out/loss.png (loss, validation loss, lr, gradient norm)"
echo "          $out/memory.png (this plan's memory per rank)"
echo "          $out/memory-zero.png (the model on 2 ranks at ZeRO 1, 2, 3)"
echo "          $out/trace.png (the trace's timeline)"
echo "trace:    $out/trace.json (2 ranks, ZeRO-3, steps 10-11: compute and"
echo "          collectives on their own tracks; open it in https://ui.perfetto.dev)"
