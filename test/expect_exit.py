#!/usr/bin/python3
"""Runs a command and fails unless it exits with the expected code.

lit's `not` accepts any non-zero exit; the frontend's contract is stricter
(bad input -> exit code 1, never a signal), so tests use this instead:
    %expect_exit 1 fastllm-opt import bad.onnx 2>&1 | FileCheck %s
The command's stdout and stderr pass through unchanged.
"""
import subprocess
import sys

want = int(sys.argv[1])
proc = subprocess.run(sys.argv[2:])
if proc.returncode != want:
    how = (f"signal {-proc.returncode}" if proc.returncode < 0
           else f"exit code {proc.returncode}")
    sys.stderr.write(f"expect_exit: {sys.argv[2]} ended with {how}, "
                     f"expected exit code {want}\n")
    sys.exit(1)
