#!/usr/bin/python3
"""random_tokens.py OUT COUNT SEED [VOCAB]: COUNT little-endian u16 token ids
drawn uniformly below VOCAB (default 256) by Python's random.Random(SEED)."""
import array
import random
import sys

out, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 256
rng = random.Random(seed)
tokens = array.array("H", (rng.randrange(vocab) for _ in range(count)))
open(out, "wb").write(tokens.tobytes())
