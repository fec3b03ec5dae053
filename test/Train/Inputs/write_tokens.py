#!/usr/bin/python3
"""write_tokens.py OUT COUNT [BAD_AT BAD_VALUE] [--odd]: little-endian u16
tokens (i % 251), optionally with one out-of-vocabulary id, or with a
trailing odd byte."""
import array
import sys

out, count = sys.argv[1], int(sys.argv[2])
tokens = array.array("H", (i % 251 for i in range(count)))
if len(sys.argv) >= 5 and sys.argv[3] != "--odd":
    tokens[int(sys.argv[3])] = int(sys.argv[4])
data = tokens.tobytes() + (b"\0" if "--odd" in sys.argv else b"")
open(out, "wb").write(data)
