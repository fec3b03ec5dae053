#!/usr/bin/python3
"""make_reader_seeds.py DIR: seeds for fastllm-reader-fuzzer, each file's
first byte picking the reader (0 manifest, 1 safetensors, 2 token file,
3 metrics line) as
tools/fuzz/readers/reader-fuzzer.cpp reads it: a valid checkpoint manifest
of a two-parameter plan, a safetensors file of two F32 tensors, and token
files with and without the 32-byte header, and a metrics line."""
import json
import os
import struct
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

plan = {"target": "cpu", "batch_size": "2", "seq_len": "4", "vocab_size": "8",
        "tokens_input": "tokens", "targets_input": "targets", "dp": "1",
        "zero_stage": "1", "param_elements": "64", "num_stages": "1",
        "stages[0].offset": "0", "stages[0].elements": "64", "num_params": "2",
        "params[0].name": "emb.weight", "params[0].shape": "[8, 4]",
        "params[0].offset": "0", "params[0].trainable": "true",
        "params[1].name": "head.bias", "params[1].shape": "[32]",
        "params[1].offset": "32", "params[1].trainable": "true"}
run = {"data_tokens": "100", "sampler": "random", "seed": "0", "grad_accum": "1",
       "lr": "0.001", "lr_schedule": "constant", "warmup_steps": "0"}
manifest = {"format": "fastllm-checkpoint", "version": 1, "producer": "seed",
            "step": 3, "optimizer_step": 3, "dp": 1, "plan": plan, "run": run,
            "shards": [{"file": "rank-00000.bin", "bytes": 1000, "crc32c": "0123abcd"}]}
with open(os.path.join(out, "manifest.seed"), "wb") as f:
    f.write(b"\0" + json.dumps(manifest).encode())

a = struct.pack("<6f", *range(6))
b = struct.pack("<4f", 0.5, -1.0, 2.0, 3.5)
header = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, len(a)]},
          "b": {"dtype": "F32", "shape": [4], "data_offsets": [len(a), len(a) + len(b)]},
          "__metadata__": {"format": "pt"}}
text = json.dumps(header).encode()
with open(os.path.join(out, "weights.seed"), "wb") as f:
    f.write(b"\1" + struct.pack("<Q", len(text)) + text + a + b)

ids = struct.pack("<20H", *(i % 7 for i in range(20)))
with open(os.path.join(out, "tokens-header.seed"), "wb") as f:
    f.write(b"\2" + b"FLLMTOK\0" + struct.pack("<IIQQ", 1, 2, 8, 20) + ids)
with open(os.path.join(out, "tokens-raw.seed"), "wb") as f:
    f.write(b"\2" + ids)
with open(os.path.join(out, "metrics.seed"), "wb") as f:
    f.write(b"\3" + b'{"step": 7, "loss": NaN, "lr": 0.001, "grad_norm": Infinity, '
            b'"time": "2026-11-27T23:59:59.000Z", "skipped": true}')
