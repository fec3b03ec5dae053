#!/usr/bin/python3
"""build_one_tu.py BUILD_LOG SOURCE OUT: rebuilds a CPU step that `compile`
built in parts (build.log: one compile per -DFASTLLM_PART=k, then the link)
as what a user building the source by hand gets: SOURCE compiled once,
without FASTLLM_PART, with the last (kernel) part's flags, and linked like
the parts into OUT/train. Also compiles the parts built without
optimisation (1..S of SOURCE's `// fastllm-parts: N unoptimised: S`: the
plan and the step's calls, the large constants) into OUT/partK.o and checks
that they define no kernel code: every instance of a kernel template the
step calls is defined by a kernel part or the library, built optimised."""
import os
import re
import subprocess
import sys

log, source, out = sys.argv[1:4]
commands = [line[2:].split() for line in open(log) if line.startswith("$ ")]
parts = {}
for args in commands:
    for a in args:
        m = re.fullmatch(r"-DFASTLLM_PART=(\d+)", a)
        if m:
            parts[int(m.group(1))] = args
assert sorted(parts) == list(range(1, len(parts) + 1)) and len(parts) >= 2, \
    f"expected parts 1..N (N >= 2) in {log}, got {sorted(parts)}"
link = commands[-1]
assert any(a.endswith(".part1.o") for a in link), "the last command is not the link"
os.makedirs(out, exist_ok=True)


def retarget(args, obj, keep_part):
    """args with SOURCE compiled into obj (FASTLLM_PART dropped unless
    keep_part)."""
    res = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a.startswith("-DFASTLLM_PART=") and not keep_part:
            continue
        if a == "-c":
            res += ["-c", source]
            skip = True
        elif a == "-o":
            res += ["-o", obj]
            skip = True
        else:
            res.append(a)
    return res


header = re.search(r"^// fastllm-parts: (\d+) unoptimised: (\d+)$", open(source).read(),
                   re.M)
count, unoptimised = int(header.group(1)), int(header.group(2))
assert count == len(parts), f"the source has {count} parts, the log {len(parts)}"
one = os.path.join(out, "train_step.o")
subprocess.run(retarget(parts[count], one, False), check=True)
linked, placed = [], False
for a in retarget(link, os.path.join(out, "train"), True):
    if re.search(r"\.part\d+\.o$", a):
        if not placed:
            linked.append(one)
            placed = True
        continue
    linked.append(a)
subprocess.run(linked, check=True)

for k in range(1, unoptimised + 1):
    obj = os.path.join(out, f"part{k}.o")
    subprocess.run(retarget(parts[k], obj, True), check=True)
    symbols = subprocess.run(["nm", "-C", "--defined-only", obj], check=True,
                             capture_output=True, text=True).stdout
    kernels = [s for s in symbols.splitlines() if "fastllm::rt::cpu::" in s]
    assert not kernels, f"part {k} defines kernel code:\n" + "\n".join(kernels[:10])
print(f"{count} parts; one translation unit built; parts 1..{unoptimised} "
      "define no kernel code")
