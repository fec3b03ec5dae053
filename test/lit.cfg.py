# -*- Python -*-
import os
import platform
import shutil
import subprocess
import sys

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "FASTLLM"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".onnxtext", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.fastllm_obj_root, "test")

# The Python harnesses' test format (test/lit_harness.py), which the
# lit.local.cfg of test/EndToEnd and test/Import select. It must be an
# importable module: lit hands tests to its worker processes by pickling.
sys.path.insert(0, config.test_source_root)

# What the tools and harnesses read from the environment besides lit's
# defaults: the host compiler and nvcc `compile` uses, the GPUs to use.
llvm_config.with_system_environment(
    ["HOME", "FASTLLM_CXX", "FASTLLM_NVCC", "CUDA_VISIBLE_DEVICES"])

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%python", config.python3))
config.substitutions.append(("%src_root", config.fastllm_src_root))
config.substitutions.append(("%obj_root", config.fastllm_obj_root))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.fastllm_tools_dir, append_path=True)

tools = [ToolSubst("fastllm-opt", unresolved="fatal"),
         ToolSubst("fastllm-plot", unresolved="fatal")]
llvm_config.add_tool_substitutions(tools, [config.fastllm_tools_dir])
config.substitutions.append(
    ("%expect_exit",
     f"{config.python3} {os.path.join(config.fastllm_src_root, 'test', 'expect_exit.py')}"))

# Features for `REQUIRES:`, each set only when what it names is found here.
#   torch, onnx     config.python3 (Debian's /usr/bin/python3) imports the module
#   mpirun          mpirun is on the tests' PATH
#   nvcc            `compile --target cuda`'s nvcc (FASTLLM_NVCC, else the one
#                   the build found) exists and runs
#   cuda-emulation  the emulated CUDA libraries (runtime/cuda/emu) were built
#   gpu             a real GPU: `nvidia-smi -L` lists one
#   onnx-testdata   ONNX's node tests (Debian's libonnx-testdata) are installed
#   sentencepiece-tools  spm_train, spm_encode and spm_export_vocab (Debian's
#                   sentencepiece) are on the tests' PATH
#   matplotlib      config.python3 imports matplotlib (fastllm-plot needs it)
#   qemu-x86_64     an x86-64 host with qemu-user's qemu-x86_64 on the tests'
#                   PATH (runs a `train` on an emulated older CPU)
#   x86-64-v3, avx512f  this CPU has AVX2, FMA and BMI2 (what the portable
#                   CPU build targets on such a host) / AVX-512F
def run_ok(argv, timeout):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=config.environment)
    except (OSError, subprocess.SubprocessError):
        return None


def importable(modules):
    probe = ("import sys\n"
             "for m in sys.argv[1:]:\n"
             "    try:\n"
             "        __import__(m)\n"
             "        print(m)\n"
             "    except Exception:\n"
             "        pass\n")
    out = run_ok([config.python3, "-c", probe] + modules, timeout=300)
    return set(out.stdout.split()) if out and out.returncode == 0 else set()


def executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


probes = {}
found_modules = importable(["torch", "onnx", "matplotlib"])
probes["torch"] = "torch" in found_modules
probes["onnx"] = "onnx" in found_modules
probes["matplotlib"] = "matplotlib" in found_modules
probes["mpirun"] = shutil.which("mpirun", path=config.environment["PATH"]) is not None
nvcc = os.environ.get("FASTLLM_NVCC") or config.fastllm_nvcc
if nvcc.endswith("-NOTFOUND"):
    nvcc = ""
nvcc_version = run_ok([nvcc, "--version"], timeout=60) if executable(nvcc) else None
probes["nvcc"] = bool(nvcc_version) and nvcc_version.returncode == 0
probes["cuda-emulation"] = all(
    os.path.isfile(os.path.join(config.fastllm_lib_dir, lib))
    for lib in ("libfastllm_cuda_emu.a", "libfastllm_cuda_kernels_emu.a",
                "libfastllm_rt_cuda_emu.a"))
gpus = run_ok(["nvidia-smi", "-L"], timeout=60)
probes["gpu"] = bool(gpus) and gpus.returncode == 0 and any(
    line.startswith("GPU ") for line in gpus.stdout.splitlines())
probes["sentencepiece-tools"] = all(
    shutil.which(tool, path=config.environment["PATH"])
    for tool in ("spm_train", "spm_encode", "spm_export_vocab"))
probes["onnx-testdata"] = os.path.isdir("/usr/share/libonnx-testdata/data/node")
probes["qemu-x86_64"] = platform.machine() == "x86_64" and shutil.which(
    "qemu-x86_64", path=config.environment["PATH"]) is not None
cpu_flags = set()
try:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                cpu_flags = set(line.split(":", 1)[1].split())
                break
except OSError:
    pass
probes["x86-64-v3"] = {"avx2", "fma", "bmi2"} <= cpu_flags
probes["avx512f"] = "avx512f" in cpu_flags
# Why each feature is missing where it is (the note below, and the reason
# test/lit_harness.py gives the cases it reports skipped).
why_missing = {
    "torch": f"{config.python3} cannot import torch (Debian: python3-torch)",
    "onnx": f"{config.python3} cannot import onnx (Debian: python3-onnx)",
    "matplotlib": f"{config.python3} cannot import matplotlib (Debian: python3-matplotlib)",
    "mpirun": "no mpirun on the tests' PATH (Debian: openmpi-bin)",
    "nvcc": (f"nvcc '{nvcc}' does not run" if nvcc else
             "no nvcc: the build found none and FASTLLM_NVCC is unset (CUDA toolkit; "
             "README.md, Tests)"),
    "cuda-emulation": "the CUDA emulation's libraries were not built (no CUDA toolkit "
                      "when the build was configured; README.md, Tests)",
    "gpu": ("no nvidia-smi" if gpus is None else
            "nvidia-smi -L lists no GPU: " + " ".join((gpus.stderr or gpus.stdout).split())[:200]),
    "sentencepiece-tools": "spm_train/spm_encode/spm_export_vocab not on PATH "
                           "(Debian: sentencepiece)",
    "onnx-testdata": "no /usr/share/libonnx-testdata/data/node (Debian: libonnx-testdata)",
    "qemu-x86_64": "not an x86-64 host with qemu-x86_64 on PATH (Debian: qemu-user)",
    "x86-64-v3": "this CPU lacks AVX2, FMA or BMI2",
    "avx512f": "this CPU lacks AVX-512F",
}
config.fastllm_missing = {}
for feature, found in probes.items():
    if found:
        config.available_features.add(feature)
    else:
        config.fastllm_missing[feature] = why_missing.get(feature, "not found")
lit_config.note("features: %s; not found: %s" % (
    " ".join(f for f, found in probes.items() if found) or "none",
    "; ".join(f"{f} ({why})" for f, why in config.fastllm_missing.items()) or "none"))

# The harnesses run one at a time: several time ranks out under mpirun
# --oversubscribe, and each keeps the machine's cores busy on its own.
lit_config.parallelism_groups["harness"] = 1
