#!/usr/bin/python3
"""compiler_wrapper.py BUILD_LOG OUT: writes OUT, an executable script that
runs the compiler of BUILD_LOG's first command with its arguments: the
build's compiler under another name (for FASTLLM_CXX)."""
import os
import shlex
import sys

log, out = sys.argv[1:3]
compiler = next(line.split()[1] for line in open(log) if line.startswith("$ "))
with open(out, "w") as f:
    f.write(f'#!/bin/sh\nexec {shlex.quote(compiler)} "$@"\n')
os.chmod(out, 0o755)
