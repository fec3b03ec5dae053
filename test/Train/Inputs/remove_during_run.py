#!/usr/bin/python3
"""remove_during_run.py FOLDER METRICS -- TRAIN ARGS...: starts the training
command, waits until it has logged a step to METRICS (inside FOLDER), then
removes FOLDER, and waits for the run. Prints its exit status and stderr."""
import os
import shutil
import subprocess
import sys
import time

folder, metrics = sys.argv[1], sys.argv[2]
argv = sys.argv[sys.argv.index("--") + 1:]
proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        break
    time.sleep(0.02)
shutil.rmtree(folder)
_, err = proc.communicate(timeout=300)
print(f"exit {proc.returncode}")
sys.stdout.write(err)
