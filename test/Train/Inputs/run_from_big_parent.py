#!/usr/bin/python3
"""run_from_big_parent.py METRICS -- TRAIN ARGS...: holds 800 MiB of touched
memory, then runs the training command (fork and exec, as subprocess does
from a notebook or a driver script) and prints the peak resident memory
its metrics report. getrusage's peak survives exec, so a binary reporting
it would show the parent's 800 MiB."""
import json
import subprocess
import sys

metrics = sys.argv[1]
argv = sys.argv[sys.argv.index("--") + 1:]
ballast = bytearray(800 << 20)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
peak = max(json.loads(line)["rss_peak_bytes"] for line in open(metrics))
print(f"peak rss {'under' if peak < (200 << 20) else 'OVER'} 200 MiB ({peak >> 20} MiB)")
