#!/usr/bin/env bash
# The main job on the bundled model: models/gpt2-tiny.onnx (a 2-layer
# GPT-2-style training graph exported by PyTorch) is summarised, compiled for
# the CPU into build/demo/ (with the memory report), and trained for 300 steps
# on the byte-level text of the GPL-3 (a file every Debian machine has).
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
/usr/bin/python3 -c "import array,sys; array.array('H', list(open(sys.argv[1], 'rb').read())).tofile(open(sys.argv[2], 'wb'))" \
  "$text" "$out/gpl3.u16"
"$out/train" --data "$out/gpl3.u16" --steps 300 --lr 3e-3 --lr-schedule cosine \
  --warmup-steps 20 --metrics "$out/metrics.jsonl" "$@"
