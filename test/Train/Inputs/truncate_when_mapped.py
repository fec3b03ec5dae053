#!/usr/bin/python3
"""truncate_when_mapped.py FILE -- COMMAND...: starts COMMAND, waits until
it has FILE mapped (its /proc/PID/maps names it), cuts FILE down to one
page while it reads, and prints its exit status (or the signal) and its
stderr, for FileCheck. FILE should take the command a while to read (tens
of MB): the cut must come before the reading ends."""
import os
import subprocess
import sys
import time

path = os.path.realpath(sys.argv[1])
argv = sys.argv[sys.argv.index("--") + 1:]
proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 60
mapped = False
while time.time() < deadline and proc.poll() is None and not mapped:
    try:
        with open(f"/proc/{proc.pid}/maps") as maps:
            mapped = any(line.rstrip().endswith(path) for line in maps)
    except OSError:
        pass
    if not mapped:
        time.sleep(0.005)
os.truncate(path, 4096)
_, err = proc.communicate(timeout=120)
rc = proc.returncode
print(f"exit {rc}" if rc >= 0 else f"signal {-rc}")
print(err, end="")
