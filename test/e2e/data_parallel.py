#!/usr/bin/python3
"""Data-parallel training (ZeRO-1) equals one rank, and moves what the plan says.

For GPT-2- and Llama-style exports, compile once per (dp, layers-per-stage,
grad-accum) with the same global batch (8 samples), train 10 steps with
`mpirun -np dp --oversubscribe` (`--sampler sequential`), and compare every
step's loss with the single-rank run (relative 1e-5), and the bytes the
runtime counted per step with plan.json's prediction. The single-rank run is
the oracle here; test/e2e/train_vs_pytorch.py ties that one to PyTorch.

Prints `PASS`/`FAIL` per case and `data parallel tests: P passed, F failed`.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "test", "models"))
import export_models  # noqa: E402

TOOL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin", "fastllm-opt")
STEPS, SEQ, GLOBAL = 10, 32, 8
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]


def run(work, onnx_path, data, dp, lps, accum):
    batch = GLOBAL // (dp * accum)
    out = os.path.join(work, f"dp{dp}-lps{lps}-acc{accum}")
    subprocess.run([TOOL, "compile", onnx_path, "-o", out, "--batch-size", str(batch),
                    "--seq-len", str(SEQ), "--dp", str(dp), "--layers-per-stage", str(lps)],
                   check=True, capture_output=True)
    metrics = os.path.join(out, "metrics.jsonl")
    cmd = [os.path.join(out, "train"), "--data", data, "--steps", str(STEPS), "--lr", "1e-3",
           "--sampler", "sequential", "--grad-accum", str(accum), "--metrics", metrics]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run((MPIRUN + ["-np", str(dp)] if dp > 1 else []) + cmd, check=True,
                   capture_output=True, env=env)
    plan = json.load(open(os.path.join(out, "plan.json")))
    return [json.loads(line) for line in open(metrics)], plan


def main():
    work = tempfile.mkdtemp(prefix="dp-test-")
    data = os.path.join(work, "tokens.u16")
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    import array
    array.array("H", list(text)).tofile(open(data, "wb"))
    passed = failed = 0
    for model in ("gpt2", "llama"):
        onnx_path = os.path.join(work, f"{model}.onnx")
        export_models.main(["--model", model, "--fold", "on", "--out", onnx_path])
        ref, _ = run(work, onnx_path, data, 1, 1, 1)
        for dp, lps, accum in ((2, 1, 1), (2, 2, 2), (4, 1, 2), (4, 2, 1)):
            name = f"{model} dp {dp} layers-per-stage {lps} grad-accum {accum}"
            try:
                got, plan = run(work, onnx_path, data, dp, lps, accum)
                rel = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, ref))
                comm = plan["communication_bytes_per_step"]
                bytes_ok = all(s["reduce_scatter_bytes"] == comm["reduce_scatter"] and
                               s["all_gather_bytes"] == comm["all_gather"] and
                               s["all_reduce_bytes"] == comm["all_reduce"] for s in got)
                ok = len(got) == STEPS and rel <= 1e-5 and bytes_ok
                detail = (f"max rel loss diff vs 1 rank {rel:.1e}; per step reduce-scatter "
                          f"{got[0]['reduce_scatter_bytes']} B, all-gather "
                          f"{got[0]['all_gather_bytes']} B (plan {comm['reduce_scatter']}, "
                          f"{comm['all_gather']}){'' if bytes_ok else ' MISMATCH'}")
            except subprocess.CalledProcessError as e:
                ok, detail = False, f"{e.cmd[0]} failed: {e.stderr.decode()[-1500:]}"
            print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
            passed += ok
            failed += not ok
    print(f"data parallel tests: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
