#!/usr/bin/python3
"""Writes random initial weights for a compiled model, from its plan.json.

    /usr/bin/python3 bench/random_weights.py DIR/plan.json DIR/weights.safetensors

Every parameter the plan lists gets float32 values drawn from N(0, std)
(seeded), in the safetensors layout `train --weights` reads. For throughput
runs where the model's own initial weights do not matter and are too large
to carry (GPT-2 124M's are about 500 MB): the plan is small, the weights are
made where the run is.
"""
import argparse
import json
import struct

import numpy as np


def write(plan_path, out_path, seed=0, std=0.02):
    params = json.load(open(plan_path))["params"]
    rng = np.random.default_rng(seed)
    header, offset = {}, 0
    for p in params:
        nbytes = 4 * int(np.prod(p["shape"], dtype=np.int64))
        header[p["name"]] = {"dtype": "F32", "shape": p["shape"],
                             "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for p in params:
            values = rng.standard_normal(p["shape"], dtype=np.float32) * np.float32(std)
            f.write(values.astype("<f4").tobytes())
    import os
    os.replace(tmp, out_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02)
    args = ap.parse_args()
    write(args.plan, args.out, args.seed, args.std)


if __name__ == "__main__":
    main()
