"""Checks a token file `fastllm-opt data --tokenizer sentencepiece` wrote
against Debian's SentencePiece command-line tools.

usage: check_sp_tokens.py TOKENS MODEL [--eod] [--jsonl FIELD]
                          [--val VAL FRACTION] INPUT...

The reference: the model's pieces listed by `spm_export_vocab` (the
vocabulary is their count, the end of document the row of "</s>"), each
document's lines encoded by `spm_encode --output_format=id` (documents are
whole files, or the FIELD of each JSON line), the end of document after each
with --eod. Reads the header (magic, version 1, width 2 for a vocabulary up
to 65536 else 4, the count) and compares the ids of the token file and of
the validation file after it. Prints "ok N tokens (uBITS ids, vocabulary V)"
or exits non-zero with the first difference.
"""
import argparse
import json
import struct
import subprocess
import sys


def read(path):
    data = open(path, "rb").read()
    magic, version, width, vocab, count = struct.unpack("<8sIIQQ", data[:32])
    assert magic == b"FLLMTOK\0", magic
    assert version == 1 and width in (2, 4), (version, width)
    assert len(data) == 32 + width * count, "size does not match the count"
    ids = list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"),
                             data[32:]))
    return width, vocab, ids


def spm(args, stdin=b""):
    out = subprocess.run(args, input=stdin, capture_output=True, check=True)
    return out.stdout.decode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokens")
    ap.add_argument("model")
    ap.add_argument("--eod", action="store_true")
    ap.add_argument("--jsonl")
    ap.add_argument("--val", nargs=2)
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    pieces = [row.split("\t")[0] for row in
              spm(["spm_export_vocab", "--model=" + a.model]).splitlines()]
    documents = []
    for path in a.inputs:
        if a.jsonl:
            for line in open(path, encoding="utf-8"):
                if line.strip():
                    documents.append(json.loads(line)[a.jsonl])
        else:
            documents.append(open(path, encoding="utf-8").read())
    # One spm_encode run for every line of every document: it answers a
    # line of ids per line.
    lines = [d.split("\n") for d in documents]
    text = "".join(line + "\n" for doc in lines for line in doc)
    encoded = spm(["spm_encode", "--model=" + a.model, "--output_format=id"],
                  text.encode("utf-8")).split("\n")
    expected, row = [], 0
    for doc in lines:
        for _ in doc:
            expected += [int(x) for x in encoded[row].split()]
            row += 1
        if a.eod:
            expected.append(pieces.index("</s>"))

    width, vocab, ids = read(a.tokens)
    if vocab != len(pieces):
        sys.exit(f"vocabulary {vocab}, the model has {len(pieces)} pieces")
    if width != (2 if vocab <= 65536 else 4):
        sys.exit(f"{width} bytes per id for a vocabulary of {vocab}")
    if a.val:
        val_width, val_vocab, val_ids = read(a.val[0])
        if (val_width, val_vocab) != (width, vocab):
            sys.exit("the validation file's header differs")
        if len(val_ids) != int(len(expected) * float(a.val[1])):
            sys.exit(f"{len(val_ids)} validation tokens of {len(expected)}")
        ids += val_ids
    for i, (x, y) in enumerate(zip(ids, expected)):
        if x != y:
            sys.exit(f"token {i}: {x}, spm_encode says {y}")
    if len(ids) != len(expected):
        sys.exit(f"{len(ids)} tokens, spm_encode gives {len(expected)}")
    print(f"ok {len(ids)} tokens (u{8 * width} ids, vocabulary {vocab})")


main()
