#!/usr/bin/env bash
# The main job on the bundled model: models/gpt2-tiny.onnx (a 2-layer
# GPT-2-style training graph exported by PyTorch) is summarised, compiled for
# the CPU into build/demo/ (with the memory report), and trained for 300 steps
# on the text of the GPL-3 (a file every Debian machine has), tokenized
# byte-level by `fastllm-opt data`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out="$build/demo"
"$root/scripts/build.sh" >/dev/null

"$build/bin/fastllm-opt" import "$root/models/gpt2-tiny.onnx" \
  --bind-dim batch=8 --bind-dim seq=64 --summary --no-ir
echo
"$build/bin/fastllm-opt" compile "$root/models/gpt2-tiny.onnx" -o "$out" \
  --batch-size 8 --seq-len 64 --report
echo
text=/usr/share/common-licenses/GPL-3
"$build/bin/fastllm-opt" data "$text" -o "$out/gpl3.tok" --overwrite
"$out/train" --data "$out/gpl3.tok" --steps 300 --lr 3e-3 --lr-schedule cosine \
  --warmup-steps 20 --metrics "$out/metrics.jsonl" "$@"
