#!/usr/bin/python3
"""tree_digest.py DIR [--ignore NAME]...: one line naming every entry under
DIR (without following symlinks) with its kind and, for regular files, a
SHA-256 of the bytes; entries named NAME are left out (a checkpoint folder's
train.lock.owner, rewritten by every run that takes the lock). So that a
test can check that a run changed nothing there:
    RUN: %python tree_digest.py D > before && ... && %python tree_digest.py D > after
    RUN: diff before after"""
import hashlib
import os
import stat
import sys

root = sys.argv[1]
ignored = {sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--ignore"}
for folder, dirs, files in sorted(os.walk(root)):
    dirs.sort()
    for name in sorted(dirs + files):
        if name in ignored:
            continue
        path = os.path.join(folder, name)
        st = os.lstat(path)
        rel = os.path.relpath(path, root)
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                print(rel, "file", hashlib.sha256(f.read()).hexdigest())
        elif stat.S_ISLNK(st.st_mode):
            print(rel, "link ->", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            print(rel, "folder")
        else:
            print(rel, "other", stat.S_IFMT(st.st_mode))
