#!/usr/bin/python3
"""overlap_weights.py IN OUT: a copy of the safetensors file IN whose second
tensor's data_offsets are moved to overlap the first tensor's bytes (same
length, so each entry alone still looks valid)."""
import json
import struct
import sys

raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
names = sorted((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"][0])
first, second = header[names[0]], header[names[1]]
length = second["data_offsets"][1] - second["data_offsets"][0]
start = first["data_offsets"][0] + 4  # inside the first tensor
second["data_offsets"] = [start, start + length]
text = json.dumps(header).encode()
text += b" " * (n - len(text)) if len(text) <= n else b""
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
