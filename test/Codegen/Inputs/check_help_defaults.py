#!/usr/bin/python3
"""check_help_defaults.py HELP: every option line of `compile --help`'s own
category says its default (or that it is required)."""
import re
import sys

text = open(sys.argv[1]).read()
section = text.split("compile options:", 1)[1]
options = [line for line in section.splitlines() if re.match(r"  -", line)]
assert len(options) >= 20, f"only {len(options)} options found"
bad = [line for line in options if "default" not in line and "required" not in line]
assert not bad, "no default stated:\n" + "\n".join(bad)
print(f"{len(options)} options, each with its default")
