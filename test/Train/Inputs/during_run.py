#!/usr/bin/python3
"""during_run.py ACTION PATH METRICS -- TRAIN ARGS...: starts the training
command, waits until it has logged a step to METRICS, does ACTION to PATH
while it runs, and waits (at most 120 s) for it to end. Prints its exit
status (or the signal), for `appear` whether PATH still holds what was
written there, and the run's stderr, for FileCheck. ACTION:
  truncate  cut the file PATH down to one page (a data file changing);
  appear    write "mine" to PATH (another run's output at the path this
            one will write at its end);
  remove    remove the folder PATH (the outputs' folder deleted)."""
import os
import shutil
import subprocess
import sys
import time

action, path, metrics = sys.argv[1:4]
argv = sys.argv[sys.argv.index("--") + 1:]
proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        break
    time.sleep(0.02)
if action == "truncate":
    os.truncate(path, 4096)
elif action == "appear":
    with open(path, "w") as f:
        f.write("mine")
elif action == "remove":
    shutil.rmtree(path)
else:
    sys.exit(f"unknown action {action}")
try:
    _, err = proc.communicate(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    _, err = proc.communicate()
    print(f"still running 120 s after the {action}")
code = proc.returncode
print(f"signal {-code}" if code < 0 else f"exit {code}")
if action == "appear":
    print("target kept" if open(path).read() == "mine" else "TARGET REPLACED")
sys.stdout.write(err)
