#!/usr/bin/python3
# REQUIRES: torch, onnx, mpirun
# RUN: %python %s fastllm-opt
"""Training-run safety of the compiled binary (docs/TRAINING_RUNS.md).

Compiles the bundled GPT-2 (models/gpt2-tiny.onnx) for 1 and 2 ranks and a
small PyTorch model whose loss is finite but whose gradient is NaN whenever
token 0 is in the batch (h + sqrt(g * g) with g = gate[token] and gate's row
0 exactly zero: d sqrt(g^2)/dg = g / |g| = 0 / 0), then checks:

  outputs    --save-weights onto /dev/full, /dev/null, a FIFO, a folder or a
             symlink, and --metrics onto a symlink: exit 1 with
             `train: error: --FLAG: 'PATH' is ...; refusing` before step 1,
             the node untouched; a good --save-weights prints what it wrote
             (tensor count and bytes equal to the file's);
  skip       token 0 only in step 3's batch: step 3 is logged SKIPPED and
             its metrics line has "skipped": true and a NaN grad_norm; the
             weights saved after 3 steps are byte-identical to those after 2,
             and the step-3 checkpoint's master/m/v bytes equal step 2's with
             AdamW's step count still 2 (step 4's is 3);
  max-skip   token 0 everywhere: exit 1 after --max-skipped-steps (5, then 2)
             consecutive skipped steps, naming them;
  signals    SIGTERM to rank 1, SIGUSR1 to rank 0, SIGINT to rank 1, SIGHUP
             to rank 0 of a 2-rank run: exit 128 + signal, every rank stopped at the same
             step S (the log's step count equals the metrics'), a complete
             checkpoint at S (not a multiple of --checkpoint-every), and (for
             SIGTERM) --resume to S + 3 gives losses bit-identical to an
             uninterrupted S + 3 step run;
  pipe       `train | head -2` on one rank: the reader gone, SIGPIPE stops
             the run after its step, exit 141 and a checkpoint at that step;
  lock       a second job on a checkpoint folder in use fails at once naming
             the folder and the holder's pid; the first is unaffected;
  folder     a fresh run into a folder with only an incomplete checkpoint and
             orphan temporaries is not refused, removes the temporaries,
             checkpoints its last step (7, with --checkpoint-every 2) and
             keeps the 2 newest (--keep-last 2); --resume skips a newer
             incomplete step; a fresh run is refused once complete ones
             exist; --resume into an empty folder starts from the initial
             weights, says so, and equals a fresh run.
Prints PASS/FAIL per case and `run safety tests: P passed, F failed`.
"""
import array
import json
import math
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from kill_rank import rank_pid  # noqa: E402

TOOL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin", "fastllm-opt")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
NAN_VOCAB, NAN_DIM, BATCH, SEQ = 64, 8, 2, 16


def write_tokens(path, tokens):
    with open(path, "wb") as f:
        array.array("H", tokens).tofile(f)


def metrics(path):
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, **kw)


def safetensors_tensors(path):
    """The tensor names of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return [k for k in header if k != "__metadata__"]


def shard_state(folder, rank=0):
    """The bytes of a checkpoint shard after its header (master, m, v)."""
    data = open(os.path.join(folder, f"rank-{rank:05d}.bin"), "rb").read()
    n = struct.unpack("<Q", data[8:16])[0]
    return data[16 + n:]


def manifest(folder):
    return json.load(open(os.path.join(folder, "manifest.json")))


def step_dir(ckpt, step):
    return os.path.join(ckpt, f"step-{step:08d}")


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

def case_outputs(work, train, data):
    problems = []
    fifo = os.path.join(work, "fifo")
    os.mkfifo(fifo)
    target = os.path.join(work, "target.txt")
    open(target, "w").write("keep")
    link = os.path.join(work, "link")
    os.symlink(target, link)
    folder = os.path.join(work, "folder")
    os.mkdir(folder)
    kinds = {"/dev/full": "a device", "/dev/null": "a device", fifo: "a FIFO",
             folder: "a directory", link: "a symbolic link"}
    before = {p: os.lstat(p) for p in kinds}
    base = [train, "--data", data, "--steps", "2", "--lr", "1e-3"]
    for path, kind in list(kinds.items()) + [(link, "metrics")]:
        flag = "--metrics" if kind == "metrics" else "--save-weights"
        kind = "a symbolic link" if kind == "metrics" else kind
        try:
            p = run(base + [flag, path], timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{flag} {path}: hung")
            continue
        want = f"train: error: {flag}: '{path}' is {kind}; refusing to replace it"
        if p.returncode != 1 or want not in p.stderr or "step 1/" in p.stdout:
            problems.append(f"{flag} {path}: exit {p.returncode}, stderr {p.stderr.strip()!r}")
    for path, st in before.items():
        now = os.lstat(path)
        if (now.st_mode, now.st_ino, now.st_rdev) != (st.st_mode, st.st_ino, st.st_rdev):
            problems.append(f"{path} was replaced")
    if open(target).read() != "keep" or not os.path.islink(link):
        problems.append("the symlink or its target changed")
    out = os.path.join(work, "final.safetensors")
    p = run(base + ["--save-weights", out], timeout=60)
    said = re.search(r"saved weights: '([^']*)' \((\d+) tensors, (\d+) bytes\)", p.stdout)
    if p.returncode != 0 or not said:
        problems.append(f"good --save-weights: exit {p.returncode}, {p.stdout[-300:]!r}")
    elif (said.group(1), int(said.group(2)), int(said.group(3))) != \
            (out, len(safetensors_tensors(out)), os.path.getsize(out)):
        problems.append(f"--save-weights said {said.group(0)!r}, the file has "
                        f"{len(safetensors_tensors(out))} tensors, {os.path.getsize(out)} bytes")
    return not problems, ("; ".join(problems) or
                          "/dev/full, /dev/null, FIFO, folder, symlink refused before step 1 "
                          f"and left as they were; {said.group(0) if said else ''}")


def export_nan_model(path):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class NanGrad(nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.emb = nn.Parameter(torch.randn(NAN_VOCAB, NAN_DIM, generator=g))
            gate = torch.randn(NAN_VOCAB, NAN_DIM, generator=g)
            gate[0] = 0.0  # sqrt(0 * 0): a finite loss, a NaN gradient
            self.gate = nn.Parameter(gate)
            self.head = nn.Parameter(torch.randn(NAN_DIM, NAN_VOCAB, generator=g) * 0.3)

        def forward(self, tokens, targets):
            g = F.embedding(tokens, self.gate)
            h = F.embedding(tokens, self.emb) + torch.sqrt(g * g)
            logits = h @ self.head
            return F.cross_entropy(logits.reshape(-1, NAN_VOCAB), targets.reshape(-1))

    tokens = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    torch.onnx.export(NanGrad(), (tokens, tokens), path, input_names=["tokens", "targets"],
                      output_names=["loss"], opset_version=17, do_constant_folding=False,
                      dynamic_axes={"tokens": {0: "batch", 1: "seq"},
                                    "targets": {0: "batch", 1: "seq"}})


def case_skip(work, train):
    # --sampler sequential: step s (0-based) reads tokens [32 s, 32 s + 33).
    tokens = [1 + (7 * i) % (NAN_VOCAB - 1) for i in range(4000)]
    tokens[2 * BATCH * SEQ + 5] = 0  # in step 3's batch only
    data = os.path.join(work, "skip.u16")
    write_tokens(data, tokens)
    base = [train, "--data", data, "--lr", "1e-2", "--sampler", "sequential",
            "--clip-grad-norm", "1"]
    two, three = os.path.join(work, "two.safetensors"), os.path.join(work, "three.safetensors")
    ckpt, m = os.path.join(work, "skip-ckpt"), os.path.join(work, "skip.jsonl")
    p2 = run(base + ["--steps", "2", "--save-weights", two])
    p3 = run(base + ["--steps", "3", "--save-weights", three, "--metrics", m,
                     "--checkpoint-dir", ckpt, "--checkpoint-every", "1"])
    if p2.returncode or p3.returncode:
        return False, f"exit {p2.returncode}/{p3.returncode}: {p2.stderr[-500:]}{p3.stderr[-500:]}"
    lines = metrics(m)
    problems = []
    if [line["skipped"] for line in lines] != [False, False, True]:
        problems.append(f"skipped flags {[line['skipped'] for line in lines]}")
    elif not (math.isnan(lines[2]["grad_norm"]) and math.isfinite(lines[2]["loss"])):
        problems.append(f"step 3: grad_norm {lines[2]['grad_norm']}, loss {lines[2]['loss']}")
    if not re.search(r"step 3/3 .*SKIPPED", p3.stdout):
        problems.append("no SKIPPED log line")
    if open(two, "rb").read() != open(three, "rb").read():
        problems.append("the weights after the skipped step differ from those before it")
    if shard_state(step_dir(ckpt, 3)) != shard_state(step_dir(ckpt, 2)):
        problems.append("the step-3 checkpoint's master/m/v differ from step 2's")
    steps = [manifest(step_dir(ckpt, s))["optimizer_step"] for s in (2, 3)]
    if steps != [2, 2]:
        problems.append(f"AdamW step counts at steps 2, 3: {steps}")
    # Training goes on after the skip: step 4 updates, as AdamW's third step.
    p4 = run(base + ["--steps", "4", "--checkpoint-dir", ckpt, "--resume"])
    if p4.returncode or manifest(step_dir(ckpt, 4))["optimizer_step"] != 3 or \
            shard_state(step_dir(ckpt, 4)) == shard_state(step_dir(ckpt, 3)):
        problems.append(f"step 4 after the skip: exit {p4.returncode} {p4.stderr[-300:]}")
    return not problems, ("; ".join(problems) or
                          "step 3 (token 0, NaN gradient, finite loss) skipped: weights, "
                          "master/m/v bytes and AdamW step count equal step 2's; step 4 is "
                          "AdamW step 3")


def case_max_skip(work, train):
    data = os.path.join(work, "zeros.u16")
    write_tokens(data, [0] * 2000)
    problems = []
    for extra, n in (([], 5), (["--max-skipped-steps", "2"], 2)):
        m = os.path.join(work, f"max-skip-{n}.jsonl")
        p = run([train, "--data", data, "--steps", "20", "--lr", "1e-2", "--metrics", m] + extra)
        want = (f"train: error: the global gradient norm was not finite for {n} consecutive "
                f"steps (1 to {n}), each skipped; stopping (--max-skipped-steps {n})")
        lines = metrics(m)
        if p.returncode != 1 or want not in p.stderr or len(lines) != n or \
                not all(line["skipped"] for line in lines):
            problems.append(f"{n}: exit {p.returncode}, {len(lines)} lines, {p.stderr.strip()!r}")
    return not problems, "; ".join(problems) or "exit 1 after 5 (default) and 2 skipped steps"


def wait_for_lines(path, n, proc, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline and proc.poll() is None:
        if len(open(path).readlines() if os.path.exists(path) else []) >= n:
            return True
        time.sleep(0.05)
    return False


def case_signal(work, train2, data, sig, rank, resume):
    name = f"{sig.name}-rank{rank}"
    ckpt, m = os.path.join(work, f"ckpt-{name}"), os.path.join(work, f"{name}.jsonl")
    base = MPIRUN + ["-np", "2", train2, "--data", data, "--lr", "1e-3", "--seed", "5",
                     "--checkpoint-every", "100000"]
    cmd = base + ["--checkpoint-dir", ckpt, "--metrics", m]
    proc = subprocess.Popen(cmd + ["--steps", "1000000"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        if not wait_for_lines(m, 5, proc):
            return False, f"{name}: the run did not start (exit {proc.poll()})"
        pid = rank_pid(train2, rank)
        os.kill(pid, sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = metrics(m)
    stopped = re.search(r"stopped after step (\d+) of \d+: stop requested on rank "
                        + f"{rank} \\({sig.name}\\)", out)
    s = int(stopped.group(1)) if stopped else -1
    folders = sorted(f for f in os.listdir(ckpt) if f.startswith("step-"))
    ok = (proc.returncode == 128 + sig.value and stopped is not None and len(lines) == s
          and folders == [f"step-{s:08d}"] and manifest(step_dir(ckpt, s))["step"] == s)
    detail = (f"{sig.name} to rank {rank} of 2: exit {proc.returncode}, stopped after step {s} "
              f"with {len(lines)} metrics lines, checkpoints {folders}")
    if not ok:
        return False, detail + "\n" + out[-1500:]
    if resume:
        full_ckpt, full_m = os.path.join(work, f"full-{name}"), os.path.join(work, f"full-{name}.jsonl")
        p = run(base + ["--checkpoint-dir", full_ckpt, "--metrics", full_m,
                        "--steps", str(s + 3)])
        r = run(cmd + ["--steps", str(s + 3), "--resume"])
        got = [line["loss"] for line in metrics(m)]
        want = [line["loss"] for line in metrics(full_m)]
        same = p.returncode == 0 and r.returncode == 0 and got == want and len(got) == s + 3
        detail += (f"; resumed to step {s + 3}: {len(got)} losses "
                   f"{'bit-identical to' if same else 'DIFFERENT from'} an uninterrupted run")
        ok = same
        if not same:
            detail += f"\n{r.stdout[-800:]}{r.stderr[-800:]}"
    return ok, detail


def case_pipe(work, train, data):
    """`train ... | head -2`: the reader goes, SIGPIPE stops the run after
    its step with a checkpoint (it used to end the process, losing every
    step since the last checkpoint)."""
    ckpt, m = os.path.join(work, "ckpt-pipe"), os.path.join(work, "pipe.jsonl")
    cmd = [train, "--data", data, "--steps", "1000000", "--lr", "1e-3", "--log-every", "1",
           "--checkpoint-dir", ckpt, "--checkpoint-every", "100000", "--metrics", m]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    try:
        head = [proc.stdout.readline() for _ in range(2)]
        if not wait_for_lines(m, 5, proc):
            return False, f"the run did not go on (exit {proc.poll()})"
        proc.stdout.close()  # the reader goes away; the next log line raises SIGPIPE
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = metrics(m)
    folders = sorted(f for f in os.listdir(ckpt) if f.startswith("step-"))
    s = len(lines)
    ok = (proc.returncode == 128 + signal.SIGPIPE and s > 0
          and folders == [f"step-{s:08d}"] and manifest(step_dir(ckpt, s))["step"] == s)
    detail = (f"stdout closed after {head[-1].strip()[:40]!r}: exit {proc.returncode}, "
              f"{s} metrics lines, checkpoints {folders}")
    return ok, detail + ("" if ok else "\n" + err[-1500:])


def case_lock(work, train, data):
    ckpt, m = os.path.join(work, "ckpt-lock"), os.path.join(work, "lock.jsonl")
    first = subprocess.Popen([train, "--data", data, "--steps", "1000000", "--lr", "1e-3",
                              "--checkpoint-dir", ckpt, "--checkpoint-every", "100000",
                              "--metrics", m], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        if not wait_for_lines(m, 3, first):
            return False, f"the first job did not start (exit {first.poll()})"
        start = time.time()
        second = run([train, "--data", data, "--steps", "5", "--lr", "1e-3",
                      "--checkpoint-dir", ckpt, "--resume"], timeout=60)
        took = time.time() - start
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    want = (f"train: error: --checkpoint-dir '{ckpt}' is in use by another training job "
            f"(pid {first.pid} on ")
    ok = second.returncode == 1 and want in second.stderr and took < 10 and \
        first.returncode == 128 + signal.SIGTERM
    return ok, (f"second job: exit {second.returncode} in {took:.1f} s: "
                f"{second.stderr.strip()!r}; first job then exit {first.returncode} on SIGTERM")


def case_folder(work, train, data):
    ckpt = os.path.join(work, "ckpt-folder")
    os.makedirs(step_dir(ckpt, 1))
    open(os.path.join(step_dir(ckpt, 1), "rank-00000.bin.tmp-Ab12Cd"), "w").write("torn")
    open(os.path.join(ckpt, "train.lock.owner.tmp-Zz9Yy8"), "w").write("torn")
    base = [train, "--data", data, "--lr", "1e-3", "--checkpoint-dir", ckpt]
    problems = []

    def folders():
        return sorted(f for f in os.listdir(ckpt) if not f.startswith("train.lock"))

    p = run(base + ["--steps", "7", "--checkpoint-every", "2", "--keep-last", "2"])
    if p.returncode or "removed 2 temporary files" not in p.stdout or \
            folders() != ["step-00000006", "step-00000007"]:
        problems.append(f"fresh run: exit {p.returncode}, folder {folders()}, {p.stderr[-400:]}")
    # A newer, incomplete step (killed before its manifest) is passed over.
    os.makedirs(step_dir(ckpt, 9))
    open(os.path.join(step_dir(ckpt, 9), "rank-00000.bin"), "w").write("partial")
    p = run(base + ["--steps", "8", "--resume"])
    if p.returncode or "resumed from" not in p.stdout or "step-00000007' at step 7" not in p.stdout \
            or "step-00000009' skipped" not in p.stderr:
        problems.append(f"resume past an incomplete step: exit {p.returncode}, {p.stdout[-300:]}"
                        f"{p.stderr[-300:]}")
    p = run(base + ["--steps", "8", "--checkpoint-every", "2"])
    if p.returncode != 1 or "already holds checkpoints (the newest is step 8)" not in p.stderr:
        problems.append(f"fresh run among complete checkpoints: exit {p.returncode}, "
                        f"{p.stderr.strip()!r}")
    # --resume into nothing: the initial weights, said so, as a fresh run.
    empty, fresh = os.path.join(work, "ckpt-empty"), os.path.join(work, "ckpt-fresh")
    a, b = os.path.join(work, "empty.jsonl"), os.path.join(work, "fresh.jsonl")
    p = run([train, "--data", data, "--lr", "1e-3", "--steps", "4", "--checkpoint-dir", empty,
             "--resume", "--metrics", a])
    q = run([train, "--data", data, "--lr", "1e-3", "--steps", "4", "--checkpoint-dir", fresh,
             "--checkpoint-every", "10", "--metrics", b])
    la, lb = [x["loss"] for x in metrics(a)], [x["loss"] for x in metrics(b)]
    if p.returncode or q.returncode or "starting from the initial weights" not in p.stdout or \
            la != lb or len(la) != 4 or not os.path.exists(step_dir(empty, 4) + "/manifest.json"):
        problems.append(f"--resume into an empty folder: exit {p.returncode}, losses {la} vs {lb}")
    return not problems, ("; ".join(problems) or
                          "fresh run among an incomplete step and 2 orphans: not refused, "
                          "orphans removed, steps 6 and 7 kept of 2, 4, 6, 7 (--keep-last 2); "
                          "--resume skipped incomplete step 9; a fresh run refused among "
                          "complete ones; --resume into an empty folder = a fresh run")


def main():
    work = tempfile.mkdtemp(prefix="run-safety-")
    model = os.path.join(ROOT, "models", "gpt2-tiny.onnx")
    one, two, nan = (os.path.join(work, d) for d in ("one", "two", "nan"))
    compiles = [(model, one, ["--batch-size", "2"]),
                (model, two, ["--batch-size", "1", "--dp", "2"])]
    nan_onnx = os.path.join(work, "nan.onnx")
    export_nan_model(nan_onnx)
    compiles.append((nan_onnx, nan, ["--batch-size", str(BATCH)]))
    for onnx_path, out, extra in compiles:
        subprocess.run([TOOL, "compile", onnx_path, "-o", out, "--seq-len", str(SEQ)] + extra,
                       check=True, capture_output=True)
    data = os.path.join(work, "tokens.u16")
    write_tokens(data, list(open("/usr/share/common-licenses/GPL-3", "rb").read()))
    train1, train2 = os.path.join(one, "train"), os.path.join(two, "train")
    cases = [("outputs", lambda: case_outputs(work, train1, data)),
             ("skip", lambda: case_skip(work, os.path.join(nan, "train"))),
             ("max-skip", lambda: case_max_skip(work, os.path.join(nan, "train"))),
             ("signal", lambda: case_signal(work, train2, data, signal.SIGTERM, 1, True)),
             ("signal", lambda: case_signal(work, train2, data, signal.SIGUSR1, 0, False)),
             ("signal", lambda: case_signal(work, train2, data, signal.SIGINT, 1, False)),
             ("signal", lambda: case_signal(work, train2, data, signal.SIGHUP, 0, False)),
             ("pipe", lambda: case_pipe(work, train1, data)),
             ("lock", lambda: case_lock(work, train1, data)),
             ("folder", lambda: case_folder(work, train1, data))]
    passed = failed = 0
    for name, case in cases:
        start = time.time()
        try:
            ok, detail = case()
        except Exception as e:  # one case's crash must not hide the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        print(f"{'PASS' if ok else 'FAIL'} {name} ({time.time() - start:.1f} s): {detail}",
              flush=True)
        passed += ok
        failed += not ok
    print(f"run safety tests: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
