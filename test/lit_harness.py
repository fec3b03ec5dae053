"""lit's test format for the Python harnesses (test/EndToEnd, test/Import).

A harness is one Python script that runs many cases and prints, per case, a
line starting with PASS, FAIL or SKIP, and then a closing line
`PREFIX: P passed, F failed[, S skipped]`. It names its command in one `RUN:`
line (lit's substitutions apply) and what it needs in `REQUIRES:` lines
(the features test/lit.cfg.py sets), like any lit test.

Each harness is one lit test, and each of its cases one micro-result of it
(PASS, FAIL, or UNSUPPORTED for SKIP), named by the case's line; lit's JSON
report (`-o`) lists them, and scripts/test.sh counts the cases from it. The
test fails when a case fails, and also, with a FAIL micro-result saying why,
when the harness ends without its closing line (it crashed), exits non-zero
with no failed case, or prints case lines that do not add up to its closing
line. A missing feature makes the test UNSUPPORTED before anything runs;
a harness that takes `--list-cases` (printing `CASE name` lines and running
nothing) then has each of its cases reported UNSUPPORTED by name, with the
missing features as the reason, so that the count of cases does not depend
on the machine.

The harness's whole output (stdout and stderr) goes to
Output/NAME.log under the folder's exec dir (build/test/EndToEnd/...),
written as it runs.
"""
import os
import re
import subprocess
import time

import lit.formats
import lit.Test
import lit.TestRunner
import lit.util

CASE = re.compile(r"^(PASS|FAIL|SKIP)\b:?[ \t]*(.*)$")
CLOSING = re.compile(
    r"^(?P<prefix>[^:\n]+): (?P<passed>\d+) passed, (?P<failed>\d+) failed"
    r"(?:, (?P<skipped>\d+) skipped)?\s*$")
CODES = {"PASS": lit.Test.PASS, "FAIL": lit.Test.FAIL, "SKIP": lit.Test.UNSUPPORTED}
TAIL_LINES = 60


class HarnessTest(lit.formats.FileBasedTest):
    """Runs a harness's RUN line and reports its cases as micro-results."""

    def execute(self, test, lit_config):
        if test.config.unsupported:
            return lit.Test.Result(lit.Test.UNSUPPORTED, "Test is unsupported")
        # RUN, REQUIRES, UNSUPPORTED and XFAIL as in lit's shell tests; an
        # unavailable feature returns UNSUPPORTED here.
        script = lit.TestRunner.parseIntegratedTestScript(test)
        if isinstance(script, lit.Test.Result):
            if script.code == lit.Test.UNSUPPORTED:
                self._list_skipped_cases(test, script)
            return script
        if len(script) != 1:
            return lit.Test.Result(
                lit.Test.UNRESOLVED,
                f"a harness has exactly one RUN line (the command); found {len(script)}")
        tmp_dir, tmp_base = lit.TestRunner.getTempPaths(test)
        substitutions = lit.TestRunner.getDefaultSubstitutions(test, tmp_dir, tmp_base)
        command = lit.TestRunner.applySubstitutions(
            script, substitutions,
            recursion_limit=test.config.recursiveExpansionLimit)[0]
        # Without lit's "%dbg(RUN: at line N)" marker, which is for its shell.
        dbg = re.fullmatch(lit.TestRunner.kPdbgRegex, command)
        if dbg:
            command = dbg.group(2).strip()
        if lit_config.noExecute:
            return lit.Test.Result(lit.Test.PASS)

        os.makedirs(tmp_dir, exist_ok=True)
        log_path = tmp_base + ".log"
        exit_code, timed_out, elapsed = self._run(
            command, os.path.dirname(test.getExecPath()), test.config.environment,
            log_path, lit_config.maxIndividualTestTime)
        with open(log_path, encoding="utf-8", errors="replace") as f:
            output = f.read()
        return self._result(command, log_path, output, exit_code, timed_out, elapsed)

    @staticmethod
    def _list_skipped_cases(test, result):
        """Adds a SKIP micro-result per case of an unsupported harness that
        can list them (`--list-cases`), the missing features as the reason."""
        with open(test.getSourcePath(), encoding="utf-8") as f:
            run = re.search(r"^#\s*RUN:\s*(.*)$", f.read(), re.M)
        if not run:
            return
        tmp_dir, tmp_base = lit.TestRunner.getTempPaths(test)
        substitutions = lit.TestRunner.getDefaultSubstitutions(test, tmp_dir, tmp_base)
        try:
            command = lit.TestRunner.applySubstitutions(
                [run.group(1).strip()], substitutions,
                recursion_limit=test.config.recursiveExpansionLimit)[0]
            listed = subprocess.run(["/bin/bash", "-c", command + " --list-cases"],
                                    env=test.config.environment, capture_output=True,
                                    text=True, timeout=300)
        except (OSError, ValueError, subprocess.SubprocessError):
            return
        if listed.returncode != 0:
            return
        why = " ".join((result.output or "unsupported").split())
        # The missing features' reasons, as test/lit.cfg.py found them.
        missing = getattr(test.config, "fastllm_missing", {})
        named = [f"{f}: {w}" for f, w in missing.items()
                 if re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", why)]
        if named:
            why += " (" + "; ".join(named) + ")"
        for line in listed.stdout.splitlines():
            if line.startswith("CASE "):
                name = f"SKIP {line[5:].strip()}: {why}"
                result.addMicroResult(name, lit.Test.Result(lit.Test.UNSUPPORTED))

    @staticmethod
    def _run(command, cwd, env, log_path, timeout):
        """Runs COMMAND with its output going to LOG_PATH as it comes."""
        os.makedirs(cwd, exist_ok=True)
        start = time.time()
        with open(log_path, "wb") as log:
            log.write(f"$ {command}\n".encode())
            log.flush()
            proc = subprocess.Popen(["/bin/bash", "-c", command], cwd=cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
            try:
                exit_code = proc.wait(timeout=timeout or None)
                timed_out = False
            except subprocess.TimeoutExpired:
                if lit.util.killProcessAndChildrenIsSupported()[0]:
                    lit.util.killProcessAndChildren(proc.pid)  # mpirun's ranks too
                else:
                    proc.kill()
                exit_code = proc.wait()
                timed_out = True
        return exit_code, timed_out, time.time() - start

    @staticmethod
    def _result(command, log_path, output, exit_code, timed_out, elapsed):
        lines = output.splitlines()
        cases = []  # (status word, line)
        closing = None
        for line in lines:
            m = CASE.match(line)
            if m:
                cases.append((m.group(1), line.strip()))
            m = CLOSING.match(line)
            if m:
                closing = m

        micro = {}

        def add(status, name):
            key, n = name, 2
            while key in micro:
                key, n = f"{name} [{n}]", n + 1
            micro[key] = lit.Test.Result(CODES[status])

        for status, line in cases:
            add(status, line)

        problems = []
        if timed_out:
            problems.append(f"timed out after {elapsed:.0f} s")
        if closing is None:
            problems.append(f"ended (exit {exit_code}) without its closing line "
                            "'PREFIX: P passed, F failed[, S skipped]'")
        else:
            said = {"PASS": int(closing["passed"]), "FAIL": int(closing["failed"]),
                    "SKIP": int(closing["skipped"] or 0)}
            seen = {s: sum(1 for status, _ in cases if status == s) for s in said}
            if said != seen:
                problems.append(
                    "its case lines (%d PASS, %d FAIL, %d SKIP) do not add up to its "
                    "closing line '%s'" % (seen["PASS"], seen["FAIL"], seen["SKIP"],
                                           closing.group(0).strip()))
            if exit_code != 0 and not said["FAIL"]:
                problems.append(f"exit {exit_code} with no failed case")
        for problem in problems:
            add("FAIL", f"FAIL harness: {problem}")

        failed = any(r.code == lit.Test.FAIL for r in micro.values())
        code = lit.Test.TIMEOUT if timed_out else lit.Test.FAIL if failed else lit.Test.PASS
        report = [f"Command: {command}", f"Exit code: {exit_code}",
                  f"Time: {elapsed:.1f} s", f"Log: {log_path}"]
        if closing is not None:
            report.append(f"Closing line: {closing.group(0).strip()}")
        report += [f"Problem: {p}" for p in problems]
        if code != lit.Test.PASS:
            fails = [line for status, line in cases if status == "FAIL"]
            if fails:
                report += ["", "Failed cases:"] + fails
            report += ["", f"Last {TAIL_LINES} lines of the log:", "--"]
            report += lines[-TAIL_LINES:] + ["--"]
        result = lit.Test.Result(code, "\n".join(report) + "\n", elapsed)
        for name, micro_result in micro.items():  # in the harness's order
            result.addMicroResult(name, micro_result)
        return result
