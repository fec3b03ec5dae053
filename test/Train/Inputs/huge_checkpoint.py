#!/usr/bin/python3
"""huge_checkpoint.py DIR: a checkpoint folder whose manifest describes one
parameter of 2^36 floats (256 GiB) on one rank, with a sparse shard file of
the size that manifest records (no data on disk): what a hostile or damaged
manifest looks like to `consolidate`, which must refuse it by the memory it
would take instead of allocating it."""
import json
import os
import sys

n = 1 << 36
folder = os.path.join(sys.argv[1], "step-00000001")
os.makedirs(folder, exist_ok=True)
header = json.dumps({"rank": 0, "step": 1, "regions": [
    {"name": r, "bytes": 4 * n} for r in ("master", "adam_m", "adam_v")]}).encode()
shard_bytes = 16 + len(header) + 3 * 4 * n
plan = {"target": "cpu", "batch_size": "1", "seq_len": "4", "vocab_size": "8",
        "tokens_input": "tokens", "targets_input": "targets", "dp": "1",
        "zero_stage": "1", "param_elements": str(n), "num_stages": "1",
        "stages[0].offset": "0", "stages[0].elements": str(n), "num_params": "1",
        "params[0].name": "huge.weight", "params[0].shape": f"[{n}]",
        "params[0].offset": "0", "params[0].trainable": "true"}
manifest = {"format": "fastllm-checkpoint", "version": 1, "producer": "a test",
            "step": 1, "optimizer_step": 1, "dp": 1, "plan": plan, "run": {},
            "shards": [{"file": "rank-00000.bin", "bytes": shard_bytes,
                        "crc32c": "00000000"}]}
with open(os.path.join(folder, "manifest.json"), "w") as f:
    json.dump(manifest, f)
with open(os.path.join(folder, "rank-00000.bin"), "wb") as f:
    f.write(b"FLCKPT01" + len(header).to_bytes(8, "little") + header)
    f.truncate(shard_bytes)
