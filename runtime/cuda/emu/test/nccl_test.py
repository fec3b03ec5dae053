#!/usr/bin/python3
"""Runs NcclTest (the emulated NCCL over MPI) in every mode, under mpirun.

Usage: nccl_test.py PATH/TO/NcclTest

  - `all` with 2 and 3 ranks, in both stream modes (FASTLLM_CUDA_EMU_STREAMS
    inorder and threads): every rank must pass;
  - `thread-level` (MPI at MPI_THREAD_FUNNELED is refused);
  - overlap-gather and overlap-scatter, alone: fatal, naming the overlap;
  - `peer-exit` under mpirun --enable-recovery (which keeps the job alive
    when a rank dies): the ranks left must see ncclRemoteError;
  - `loop 5` (collectives with NcclComm.cu's watchdog scheme) with rank 1 of
    2, or rank 2 of 3, SIGKILLed or SIGSTOPped from outside as
    test/EndToEnd/kill_rank.py does: the job must end non-zero within 30 s,
    saying which rank died or that a collective timed out with the rank
    stopped.
Prints PASS/FAIL per case (with the measured time) and a summary; exits 1 if
any failed.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]
MODES = ("inorder", "threads")


def env(streams):
    return dict(os.environ, FASTLLM_CUDA_EMU_STREAMS=streams, OMP_NUM_THREADS="1")


def run(cmd, streams, timeout=120):
    start = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env(streams), timeout=timeout)
    return proc.returncode, proc.stdout, time.time() - start


def case_all(binary, np, streams):
    rc, out, took = run(MPIRUN + ["-np", str(np), binary, "all"], streams)
    ok = rc == 0 and f"NcclTest all: PASS ({np} ranks, {streams} streams)" in out
    aborts = re.findall(r"abort \([^)]*\): .*", out)
    return ok, f"all, {np} ranks, {streams}: exit {rc} in {took:.1f} s" + (
        "".join("\n    " + a for a in aborts) if ok else "\n" + out[-3000:])


def case_thread_level(binary):
    rc, out, took = run(MPIRUN + ["-np", "2", binary, "thread-level"], "inorder")
    ok = rc == 0 and "thread level: ok" in out
    return ok, f"thread-level: exit {rc}" + ("" if ok else "\n" + out[-2000:])


def case_overlap(binary, which):
    rc, out, took = run([binary, which], "inorder")
    ok = rc != 0 and "cuda emulation: error:" in out and "overlaps" in out
    return ok, f"{which}: exit {rc}, " + (
        out.strip().splitlines()[-1] if ok else "\n" + out[-2000:])


def case_peer_exit(binary, np, streams):
    rc, out, took = run(MPIRUN + ["--enable-recovery", "-np", str(np), binary, "peer-exit"],
                        streams, timeout=60)
    passed = re.findall(r"rank \d+: PASS after ([0-9.]+) s", out)
    ok = len(passed) == np - 1
    return ok, (f"peer-exit, {np} ranks, {streams}: {len(passed)} of {np - 1} ranks saw "
                f"ncclRemoteError after {', '.join(passed) or '-'} s"
                + ("" if ok else "\n" + out[-3000:]))


def case_signal(binary, np, streams, sig):
    victim = np - 1
    cmd = MPIRUN + ["-np", str(np), binary, "loop", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(streams))
    lines, pid = [], None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))
    reader.start()
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            text = "".join(lines)
            pids = dict(re.findall(r"rank (\d+): pid (\d+)", text))
            if len(pids) == np and len(re.findall(r"loop: \d+ collectives", text)) >= 2:
                pid = int(pids[str(victim)])
                break
            time.sleep(0.05)
        if pid is None:
            return False, f"{sig.name}: the loop did not start:\n" + "".join(lines)[-2000:]
        start = time.time()
        os.kill(pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return False, f"{sig.name} rank {victim} of {np}: the job still runs after 30 s"
        took = time.time() - start
        reader.join(timeout=5)
        out = "".join(lines)
        if sig == signal.SIGKILL:
            named = re.search(rf"rank {victim} \(pid {pid} on [^)]*\)[^\n]* exited[^\n]*|"
                              rf"process rank {victim} [^\n]* exited on signal 9[^\n]*", out)
        else:
            named = re.search(rf"timed out after 5 s\n(.*\n)?[^\n]*aborted with [^\n]*; "
                              rf"rank {victim} \(pid {pid}\) is stopped", out)
        ok = proc.returncode != 0 and named is not None and took < 30
        said = "\n    ".join(l for l in out.splitlines()
                              if re.match(r"(rank \d+: (?!pid)|cuda emulation|mpirun noticed)", l))
        return ok, (f"{sig.name} rank {victim} of {np}, {streams}: exit {proc.returncode} "
                    f"{took:.1f} s after the signal\n    {said}"
                    + ("" if ok else "\n" + out[-3000:]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid:  # a stopped rank outlives mpirun's kill
            for s in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, s)
                except ProcessLookupError:
                    pass
        reader.join(timeout=5)


def main():
    binary = os.path.abspath(sys.argv[1])
    cases = []
    for np in (2, 3):
        for streams in MODES:
            cases.append(lambda np=np, s=streams: case_all(binary, np, s))
    cases.append(lambda: case_thread_level(binary))
    cases.append(lambda: case_overlap(binary, "overlap-gather"))
    cases.append(lambda: case_overlap(binary, "overlap-scatter"))
    for np in (2, 3):
        for streams in MODES:
            cases.append(lambda np=np, s=streams: case_peer_exit(binary, np, s))
    for np in (2, 3):
        for streams in MODES:
            for sig in (signal.SIGKILL, signal.SIGSTOP):
                cases.append(lambda np=np, s=streams, g=sig: case_signal(binary, np, s, g))
    passed = failed = 0
    for case in cases:
        try:
            ok, detail = case()
        except Exception as e:  # one case's crash must not hide the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        print(f"{'PASS' if ok else 'FAIL'} {detail}", flush=True)
        passed += ok
        failed += not ok
    print(f"nccl tests: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
