#!/usr/bin/python3
"""alter_shard.py STEP_FOLDER MODE: changes rank 0's shard (or the manifest)
of a checkpoint step the way a tool or a hand edit could, then records the
shard's new size and CRC32C in the manifest, so that only the checks on the
contents can tell. MODE:
  nan-master    the first master weight becomes NaN
  negative-v    the first AdamW v becomes -1
  reorder       the header lists adam_m before master (the bytes stay)
  optimizer     the manifest's optimizer_step becomes step + 1000
"""
import json
import os
import struct
import sys


def crc32c(data):
    """CRC-32C (Castagnoli), reflected, as the runtime computes it."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


folder, mode = sys.argv[1], sys.argv[2]
manifest_path = os.path.join(folder, "manifest.json")
manifest = json.load(open(manifest_path))
shard_path = os.path.join(folder, "rank-00000.bin")
data = bytearray(open(shard_path, "rb").read())
header_bytes = struct.unpack_from("<Q", data, 8)[0]
header = json.loads(data[16:16 + header_bytes])
start = {}
at = 16 + header_bytes
for region in header["regions"]:
    start[region["name"]] = at
    at += region["bytes"]
if mode == "nan-master":
    struct.pack_into("<f", data, start["master"], float("nan"))
elif mode == "negative-v":
    struct.pack_into("<f", data, start["adam_v"], -1.0)
elif mode == "reorder":
    regions = header["regions"]
    regions[0], regions[1] = regions[1], regions[0]
    text = json.dumps(header).encode()
    assert len(text) == header_bytes, "the header must keep its length"
    data[16:16 + header_bytes] = text
elif mode == "optimizer":
    manifest["optimizer_step"] = manifest["step"] + 1000
else:
    sys.exit(f"unknown mode {mode}")
open(shard_path, "wb").write(data)
manifest["shards"][0]["bytes"] = len(data)
manifest["shards"][0]["crc32c"] = "%08x" % crc32c(bytes(data))
json.dump(manifest, open(manifest_path, "w"), indent=2)
