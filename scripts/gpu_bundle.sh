#!/usr/bin/env bash
# Packs every GPU check of the CUDA target into one folder for a GPU machine
# that cannot build or run fastllm-opt (no LLVM 19 there), e.g. the
# workplace's device machine:
#
#   scripts/gpu_bundle.sh .gpu [--no-bench]   # here: build, compile, pack
#   bash .gpu/run.sh                          # there, from the repo root
#
# DIR must be a folder of the repository's root (it travels with the working
# tree; keep it out of git, e.g. `echo /.gpu/ >> .git/info/exclude`). It
# holds run.sh and bundle.tar.xz (xz: about 12 MB instead of 80, within what
# the device tool carries), which run.sh unpacks into a temporary folder:
#   bin/    the CUDA kernel and device tests and the generated-step smoke
#   e2e/    test/EndToEnd/cuda_vs_cpu.py --prepare: the GPT-2/Llama CUDA binaries
#           (fp32, bf16), their weights and tokens, the CPU target's losses
#   bench/  bench/gpu_bench.py --prepare: the GPT-2 124M binary and plan
#           (weights are made there from the plan)
#   lib/    the shared libraries those binaries load that are neither CUDA's
#           nor the C runtime's (Open MPI's, libomp, OpenBLAS); one process
#           without mpirun never initialises MPI, so they only need loading
#   run.sh  runs everything (bench/gpu_profile.py too: the benchmark's step
#           kernel by kernel under ncu) with those libraries and NCCL (PyTorch's pip
#           package there) on the library path; prints one line per check
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
py=/usr/bin/python3 # Debian's python3 with python3-torch and python3-onnx
out=${1:?usage: scripts/gpu_bundle.sh DIR [--no-bench]}
bench=1
[[ "${2:-}" == "--no-bench" ]] && bench=0
tool=$build/bin/fastllm-opt

"$root/scripts/build.sh" >/dev/null
rm -rf "$out"
mkdir -p "$out"
final=$(cd "$out" && pwd)
out=$(mktemp -d /tmp/gpu-bundle-XXXXXX) # assembled here, then packed
mkdir -p "$out/bin" "$out/lib"
for t in fastllm-cuda-kernel-tests fastllm-cuda-device-tests \
  fastllm-cuda-generated-smoke; do
  cp "$build/bin/$t" "$out/bin/"
done
"$py" "$root/test/EndToEnd/cuda_vs_cpu.py" --tool "$tool" --prepare "$out/e2e" |
  grep -v "bytes, export"
if ((bench)); then
  "$py" "$root/bench/gpu_bench.py" --tool "$tool" --prepare "$out/bench"
fi

# The libraries: each binary's dependencies outside the CUDA toolkit and the
# C/C++ runtime (which the GPU machine has, in versions at least as new).
binaries=("$out"/bin/* "$out"/e2e/*/train)
((bench)) && binaries+=("$out/bench/run/train")
for b in "${binaries[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
  libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | \
    libgcc_s.so* | libstdc++.so*) ;;
  *) [[ "$lib" == /usr/local/cuda* ]] || cp -L "$lib" "$out/lib/" ;;
  esac
done
tar -C "$out" -cJf "$final/bundle.tar.xz" .
rm -rf "$out"
out=$final
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Every GPU check of the CUDA target, on what scripts/gpu_bundle.sh packed:
# bash DIR/run.sh from the repository root, with $PYTHON (python3 by
# default) one with PyTorch on CUDA. Logs go to $OUT when it is set (the
# device tool), else to DIR/logs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3} # one with PyTorch on CUDA
logs=${OUT:-$(cd "$(dirname "$0")" && pwd)/logs}
mkdir -p "$logs"
here=$(mktemp -d /tmp/fastllm-gpu-XXXXXX)
tar -C "$here" -xJf "$(dirname "$0")/bundle.tar.xz"
nccl=$("$py" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi -L || echo "run.sh: nvidia-smi lists no GPU"
for b in "$here"/bin/* "$here"/e2e/*/train "$here"/bench/run/train; do
  [[ -x $b ]] && ldd "$b" | grep "not found" | sed "s|^|missing for $(basename "$(dirname "$b")")/$(basename "$b"): |"
done
summary=()
check() { # NAME LOG COMMAND...
  local name=$1 log=$2
  shift 2
  echo "== $name"
  if "$@" >"$logs/$log" 2>&1; then summary+=("PASS $name"); else summary+=("FAIL $name (see $log)"); fi
  tail -n 15 "$logs/$log"
}
check "generated-step smoke" smoke.log "$here/bin/fastllm-cuda-generated-smoke"
check "CUDA kernels vs CPU" kernels.log "$here/bin/fastllm-cuda-kernel-tests"
check "CUDA device code vs CPU" device.log "$here/bin/fastllm-cuda-device-tests"
check "training vs CPU and PyTorch" e2e.log "$py" "$root/test/EndToEnd/cuda_vs_cpu.py" --from "$here/e2e"
if [[ -d $here/bench ]]; then
  check "GPT-2 124M benchmark" bench.log "$py" "$root/bench/gpu_bench.py" --from "$here/bench"
  check "GPT-2 124M step, kernel by kernel (ncu)" profile.log "$py" "$root/bench/gpu_profile.py" \
    --from "$here/bench" --csv "$logs/step_kernels.csv"
fi
echo
printf '%s\n' "${summary[@]}"
[[ "${summary[*]}" != *FAIL* ]]
EOF
chmod +x "$out/run.sh"
du -sh "$out"/*
echo "gpu_bundle: $out is ready: bash $(realpath --relative-to="$root" "$out")/run.sh there"
