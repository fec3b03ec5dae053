"""Every skipped test, grouped by the reason it gave: lit tests and harness
cases (lit.json), unit tests (ctest's JUnit report: GTEST_SKIP's message, or
the line a test that was not built prints), the fuzzer. Arguments: lit.json,
ctest.xml, fuzz.skipped (each may be missing)."""
import collections
import json
import re
import sys
import xml.etree.ElementTree as ET

LIT_REASON = "Test requires the following unavailable features"
NO_REASON = "(no reason given)"


def lit_skips(path, by_reason):
    try:
        tests = json.load(open(path))["tests"]
    except (OSError, ValueError, KeyError):
        return
    names = [t["name"] for t in tests]
    for t in tests:
        if t["code"] not in ("UNSUPPORTED", "SKIPPED"):
            continue
        _, _, path = t["name"].partition(" :: ")
        test, _, case = path.partition(":")
        if case:  # a harness's case: "SKIP NAME: REASON"
            line = case[5:] if case.startswith("SKIP ") else case
            if LIT_REASON in line:
                name, reason = line.split(": " + LIT_REASON, 1)
                reason = LIT_REASON + reason
            else:
                name, _, reason = line.partition(": ")
            reason = re.sub(r"\s*\[[^\]]*\]$", "", reason.strip())  # a trailing [note]
            by_reason[reason or NO_REASON].append(f"{test}: {name}")
        elif not any(n.startswith(t["name"] + ":") for n in names):
            by_reason[" ".join((t.get("output") or "").split()) or NO_REASON].append(test)


def ctest_skips(path, by_reason):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return
    for case in root.iter("testcase"):
        if case.get("status") != "notrun":
            continue
        out = (case.findtext("system-out") or "").splitlines()
        reason = NO_REASON
        for i, line in enumerate(out):
            if re.search(r": Skipped$", line) and i + 1 < len(out):
                reason = out[i + 1].strip()
                break
            if line.startswith("skipped: "):
                reason = line[len("skipped: "):].strip()
                break
        by_reason[reason].append(case.get("name"))


def other_skips(path, by_reason):
    try:
        for line in open(path):
            name, _, reason = line.strip().partition(": ")
            by_reason[reason or NO_REASON].append(name)
    except OSError:
        pass


def main():
    by_reason = collections.defaultdict(list)
    lit_skips(sys.argv[1], by_reason)
    ctest_skips(sys.argv[2], by_reason)
    other_skips(sys.argv[3], by_reason)
    print(f"== skipped: {sum(map(len, by_reason.values()))}, by reason")
    for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {len(names)} x {reason}")
        for name in names:
            print(f"      {name}")


if __name__ == "__main__":
    main()
