#!/usr/bin/python3
"""write_token_file.py OUT COUNT VOCAB [MAX_ID]: a token file with the
32-byte header `fastllm-opt data` writes (runtime/TokenFileFormat.h: magic,
version 1, 2 bytes per token, VOCAB, COUNT) and COUNT u16 ids i % MAX_ID
(MAX_ID defaults to VOCAB, or 1 when VOCAB is 0): a header that may lie
about its own ids."""
import struct
import sys

out, count, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_id = int(sys.argv[4]) if len(sys.argv) > 4 else max(vocab, 1)
header = b"FLLMTOK\0" + struct.pack("<IIQQ", 1, 2, vocab, count)
ids = struct.pack(f"<{count}H", *(i % max_id for i in range(count)))
with open(out, "wb") as f:
    f.write(header + ids)
