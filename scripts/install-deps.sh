#!/usr/bin/env bash
# Installs the Debian packages fastllm-opt needs (docs/DESIGN.md section 7).
# Idempotent and quiet when everything is already there; needs root (or sudo)
# only when something is missing.
set -euo pipefail

packages=(
  cmake ninja-build ccache
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  clang-19 lld-19 libclang-rt-19-dev
  libonnx-dev libprotobuf-dev protobuf-compiler
  libopenblas-dev libopenmpi-dev openmpi-bin
  libgtest-dev libomp-19-dev libboost-context-dev
  python3-torch python3-onnx python3-numpy libonnx-testdata
  libcli11-dev nlohmann-json3-dev libsentencepiece-dev sentencepiece python3-matplotlib
  pkgconf qemu-user
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
