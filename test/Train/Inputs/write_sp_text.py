"""Writes the text data-sentencepiece.test tokenizes, the same every run.

usage: write_sp_text.py FOLDER

FOLDER/a.txt     2000 lines of words (some accented, some punctuation)
FOLDER/b.jsonl   80 documents of 1-6 lines under "text", blank lines between
FOLDER/many.txt  80000 distinct words, ten a line (a word model of 70000
                 pieces has u32 ids)
"""
import json
import os
import random
import sys

folder = sys.argv[1]
r = random.Random(14)
syllables = ("ka to ri na mo se lu pa di ve xo ga ne bi tu ro sha ki "
             "mu le zo fa ja wi ch\u00e9 \u00fcr \u00e4n \u00df").split()
# A word list with a Zipf-like use: a few words are common, most rare.
lexicon = ["".join(r.choice(syllables) for _ in range(r.randint(1, 4)))
           for _ in range(3000)]
weights = [1.0 / (k + 1) for k in range(len(lexicon))]


def line():
    words = r.choices(lexicon, weights, k=r.randint(2, 24))
    if r.random() < 0.3:
        words[-1] += r.choice([".", ",", "!", "?", " \u2014 42"])
    return " ".join(words)


with open(os.path.join(folder, "a.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(line() for _ in range(2000)) + "\n")
with open(os.path.join(folder, "b.jsonl"), "w", encoding="utf-8") as f:
    for i in range(80):
        text = "\n".join(line() for _ in range(r.randint(1, 6)))
        f.write(json.dumps({"id": i, "text": text}) + "\n\n")
letters = "abcdefghijklmnopqrstuvwxyz"
many = sorted({"".join(r.choice(letters) for _ in range(9))
               for _ in range(80000)})[:80000]
r.shuffle(many)
with open(os.path.join(folder, "many.txt"), "w", encoding="utf-8") as f:
    for i in range(0, len(many), 10):
        f.write(" ".join(many[i:i + 10]) + "\n")
