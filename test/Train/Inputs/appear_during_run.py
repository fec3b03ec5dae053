#!/usr/bin/python3
"""appear_during_run.py TARGET METRICS -- TRAIN ARGS...: starts the training
command, waits until it has logged a step to METRICS, then writes "mine" to
TARGET (another run's output appearing at the path this one will write at
its end), and waits for the run. Prints its exit status, whether TARGET
still holds "mine", and the run's stderr."""
import os
import subprocess
import sys
import time

target, metrics = sys.argv[1], sys.argv[2]
argv = sys.argv[sys.argv.index("--") + 1:]
proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        break
    time.sleep(0.02)
with open(target, "w") as f:
    f.write("mine")
_, err = proc.communicate(timeout=300)
print(f"exit {proc.returncode}")
print("target kept" if open(target).read() == "mine" else "TARGET REPLACED")
sys.stdout.write(err)
