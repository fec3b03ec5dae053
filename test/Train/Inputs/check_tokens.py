"""Checks a token file `fastllm-opt data` wrote against the text it came from.

usage: check_tokens.py TOKENS VOCAB [--eod] [--jsonl FIELD] [--val VAL FRACTION] INPUT...

Reads the header (magic, version 1, 2 bytes per token, VOCAB, count) and the
ids, and compares the concatenation of train and validation ids with the
byte-level encoding of the inputs computed here: each document's UTF-8 bytes,
then 256 with --eod. Prints "ok N tokens" or exits non-zero with the first
difference.
"""
import argparse
import json
import struct
import sys


def read(path):
    data = open(path, "rb").read()
    magic, version, width, vocab, count = struct.unpack("<8sIIQQ", data[:32])
    assert magic == b"FLLMTOK\0", magic
    assert version == 1 and width == 2, (version, width)
    ids = list(struct.unpack("<%dH" % count, data[32:]))
    assert len(data) == 32 + 2 * count, "size does not match the count"
    return vocab, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokens")
    ap.add_argument("vocab", type=int)
    ap.add_argument("--eod", action="store_true")
    ap.add_argument("--jsonl")
    ap.add_argument("--val", nargs=2)
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    vocab, ids = read(a.tokens)
    if vocab != a.vocab:
        sys.exit(f"vocabulary {vocab}, expected {a.vocab}")
    documents = []
    for path in a.inputs:
        if a.jsonl:
            for line in open(path, encoding="utf-8-sig"):
                if line.strip():
                    documents.append(json.loads(line)[a.jsonl].encode("utf-8"))
        else:
            documents.append(open(path, "rb").read())
    expected = []
    for d in documents:
        expected += list(d) + ([256] if a.eod else [])
    if a.val:
        val_vocab, val_ids = read(a.val[0])
        if val_vocab != vocab:
            sys.exit("the validation file's vocabulary differs")
        if len(val_ids) != int(len(expected) * float(a.val[1])):
            sys.exit(f"{len(val_ids)} validation tokens of {len(expected)}")
        ids += val_ids
    for i, (x, y) in enumerate(zip(ids, expected)):
        if x != y:
            sys.exit(f"token {i}: {x}, expected {y}")
    if len(ids) != len(expected):
        sys.exit(f"{len(ids)} tokens, expected {len(expected)}")
    print(f"ok {len(ids)} tokens")


main()
