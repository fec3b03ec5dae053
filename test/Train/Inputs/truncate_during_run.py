#!/usr/bin/python3
"""truncate_during_run.py DATA METRICS -- TRAIN ARGS...: starts the training
command, waits until it has logged a step to METRICS, cuts DATA down to one
page, and waits (at most 120 s) for the run to end. Prints the exit status
(or the signal) and the run's stderr, for FileCheck."""
import os
import subprocess
import sys
import time

data, metrics = sys.argv[1], sys.argv[2]
argv = sys.argv[sys.argv.index("--") + 1:]
proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        break
    time.sleep(0.05)
os.truncate(data, 4096)
try:
    _, err = proc.communicate(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    _, err = proc.communicate()
    print("still running 120 s after the truncation")
code = proc.returncode
print(f"signal {-code}" if code < 0 else f"exit {code}")
sys.stdout.write(err)
