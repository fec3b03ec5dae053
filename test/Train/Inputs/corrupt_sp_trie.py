#!/usr/bin/python3
"""corrupt_sp_trie.py IN.model OUT.model: a copy of a SentencePiece model
whose normalizer's precompiled character map (a double-array trie the
library walks without bounds checks) has its first 400 units replaced by
seeded random words: a model damaged the way a bad download or a bit rot
damages it. The protobuf is walked by hand (ModelProto field 3, the
normalizer spec; its field 2, the map: a u32 trie size, then the trie)."""
import random
import struct
import sys


def varint(b, i):
    value = shift = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def field(b, number):
    """(start, end) of the first length-delimited field NUMBER of message B."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        kind = key & 7
        if kind == 0:
            _, i = varint(b, i)
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        elif kind == 2:
            n, i = varint(b, i)
            if key >> 3 == number:
                return i, i + n
            i += n
        else:
            sys.exit(f"unexpected wire type {kind}")
    sys.exit(f"no field {number}")


data = bytearray(open(sys.argv[1], "rb").read())
spec_start, spec_end = field(data, 3)
map_start, map_end = field(bytes(data[spec_start:spec_end]), 2)
base = spec_start + map_start
trie_bytes = struct.unpack("<I", data[base:base + 4])[0]
rng = random.Random(0)
for unit in range(min(400, trie_bytes // 4)):
    at = base + 4 + unit * 4
    data[at:at + 4] = struct.pack("<I", rng.randrange(1 << 32))
open(sys.argv[2], "wb").write(data)
