#!/usr/bin/env bash
# The main job on the bundled model: import models/gpt2-tiny.onnx (a 2-layer
# GPT-2-style training graph exported by PyTorch) for batch 4 x seq 64, print
# a summary and the IR (weights elided in the printout).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/scripts/build.sh" >/dev/null
exec "$build/bin/fastllm-opt" import "$root/models/gpt2-tiny.onnx" \
  --bind-dim batch=4 --bind-dim seq=64 --summary \
  --mlir-elide-resource-strings-if-larger=64 "$@"
