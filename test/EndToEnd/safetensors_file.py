"""Reading a safetensors file with NumPy alone (no PyTorch): the weights,
gradients and checkpoints `train` writes, as the tests read them."""
import json

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
          "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """{name: array} of a safetensors file (the metadata entry skipped)."""
    with open(path, "rb") as f:
        raw = f.read()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(raw[base + b:base + e],
                                  dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out
