#!/usr/bin/python3
"""Where one GPU training step of GPT-2 124M spends its time, kernel by kernel.

Runs the binary that `bench/gpu_bench.py --prepare DIR` compiled for two
steps under Nsight Compute (ncu), one pass per kernel that reads only its
duration and launch shape (no replay, caches not flushed, clocks not
locked), and prints for the second step:

    kernels      how many launches one step makes
    kernel time  the sum of their durations (what the step would take with
                 no gap between kernels; gpu_bench's step time minus this is
                 the launch and host-synchronisation overhead)
    families     the kernels grouped by name without template arguments,
                 sorted by time: launches, total µs, share of the step, the
                 largest grid
    top kernels  the 25 longest launches with their grid and block

    /usr/bin/python3 bench/gpu_profile.py --from DIR [--csv FILE]

One step is found as the repeating tail of the launch sequence (every step
launches the same kernels in the same order; the first one also holds
start-up work). It needs a GPU and ncu (on PATH, under /usr/local/cuda*/bin
or /opt/nvidia/nsight-compute/*).
"""
import argparse
import collections
import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_bench  # noqa: E402

METRICS = ["gpu__time_duration.sum", "launch__grid_size", "launch__block_size",
           "launch__registers_per_thread"]


def find_ncu():
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def family(name):
    """A kernel's name without its arguments, template arguments and
    namespaces: `void fastllm::cuda::detail::addKernel<float>(...)` ->
    `addKernel`."""
    name = name.split("(")[0]
    depth, plain = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            plain.append(ch)
    plain = "".join(plain).strip()
    plain = re.sub(r"^(void|static|__global__)\s+", "", plain)
    plain = plain.split("::")[-1]
    if plain in ("", "Kernel", "Kernel2", "device_kernel"):  # CUTLASS's wrappers
        return re.sub(r"^void\s+", "", name)[:80]
    return plain


def one_step(rows):
    """The launches of the last step: the longest tail that repeats right
    before itself (the longest, since a step's own tail may repeat, e.g. one
    optimizer kernel per tensor)."""
    names = [r["name"] for r in rows]
    n = len(names)
    for period in range(n // 2, 0, -1):
        if names[n - period:] == names[n - 2 * period:n - period]:
            return rows[n - period:]
    return rows


def read_report(ncu, report, keep):
    text = subprocess.run([ncu, "--import", report, "--csv", "--page", "raw",
                           "--print-units", "base"], check=True, capture_output=True,
                          text=True).stdout
    if keep:
        with open(keep, "w") as f:
            f.write(text)
    lines = [line for line in text.splitlines() if line.startswith('"')]
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = table[0], table[1:]
    col = {name: i for i, name in enumerate(header)}
    name_col = col.get("Kernel Name", col.get("Function Name"))
    rows = []
    for r in body:
        try:
            ns = float(r[col["gpu__time_duration.sum"]].replace(",", ""))
        except ValueError:
            continue  # the units row
        rows.append({"name": r[name_col], "ns": ns,
                     "grid": r[col["launch__grid_size"]],
                     "block": r[col["launch__block_size"]],
                     "regs": r[col["launch__registers_per_thread"]]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="prepared", required=True, metavar="DIR",
                    help="what gpu_bench.py --prepare left in DIR")
    ap.add_argument("--csv", metavar="FILE",
                    help="also write ncu's table of every launch (both steps) here")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for the profiled run")
    args = ap.parse_args()
    ncu = find_ncu()
    if not ncu:
        print("gpu_profile: ncu (Nsight Compute) not found; nothing measured")
        sys.exit(1)
    _, batch, precision, out = gpu_bench.from_prepared(args.prepared)
    work = tempfile.mkdtemp(prefix="gpu-profile-")
    data = gpu_bench.token_file(work)
    report = os.path.join(work, "step")
    cmd = [ncu, "--clock-control", "none", "--cache-control", "none",
           "--metrics", ",".join(METRICS), "-o", report, "-f",
           os.path.join(out, "train"), "--data", data, "--steps", "2", "--lr", "3e-4"]
    subprocess.run(cmd, check=True, timeout=args.timeout, stdout=subprocess.DEVNULL)
    rows = one_step(read_report(ncu, report + ".ncu-rep", args.csv))
    total = sum(r["ns"] for r in rows)
    print(f"GPT-2 124M ({precision}, batch {batch}): one step = {len(rows)} kernels, "
          f"kernel time {total / 1e3:.0f} us")
    fams = collections.defaultdict(lambda: [0, 0.0, 0])
    for r in rows:
        f = fams[family(r["name"])]
        f[0] += 1
        f[1] += r["ns"]
        f[2] = max(f[2], int(float((r["grid"] or "0").replace(",", ""))))
    print(f"{'family':48s} {'launches':>8s} {'us':>9s} {'share':>6s} {'max grid':>9s}")
    for name, (count, ns, grid) in sorted(fams.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:48]:48s} {count:8d} {ns / 1e3:9.1f} {100 * ns / total:5.1f}% {grid:9d}")
    print("longest launches:")
    for r in sorted(rows, key=lambda r: -r["ns"])[:25]:
        print(f"  {r['ns'] / 1e3:8.1f} us  grid {r['grid']:>7s} block {r['block']:>5s} "
              f"regs {r['regs']:>4s}  {r['name'][:110]}")


if __name__ == "__main__":
    main()
