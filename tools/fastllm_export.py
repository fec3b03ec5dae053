#!/usr/bin/python3
"""Export a PyTorch model to ONNX for fastllm-opt, keeping what training needs.

`torch.onnx.export`'s defaults are made for inference: in eval mode it merges
parameters that happen to hold equal values (every LayerNorm gain starts at 1)
and constant folding replaces weights by transposed copies under generated
names. fastllm-opt undoes most of that on import, but an export made for
training keeps every parameter distinct and named as in PyTorch, and says
which initializers are parameters and which are buffers. This module does
that:

    import sys; sys.path.insert(0, "/path/to/fastllm-opt/tools")
    from fastllm_export import export
    export(model, (idx, targets), "model.onnx")   # forward(idx, targets) -> loss

It exports in training mode with constant folding off (so `nn.Dropout(p)`
modules become real dropout, which fastllm-opt trains with its own counter-
based generator), records the names of `model.named_parameters()` in the
file's metadata (`fastllm.trainable_parameters`, `fastllm.frozen_parameters`
for those with requires_grad=False) so that the importer trains exactly those
and keeps every buffer constant, and, when `fastllm-opt` is found, checks the
exported model: it compiles it, trains two steps and compares both losses
with PyTorch's on the same batches, the second after one AdamW step on a
copy of the model (a tie broken or a buffer trained shows only there;
dropout off on both
sides: `nn.Dropout` modules, and rates modules keep as floats for functional
dropout, `nn.MultiheadAttention(dropout=...)` say). A mismatch raises
ExportCheckError.

Run with Debian's python3 (python3-torch, python3-onnx). The model's forward
must take the token ids and the targets, both int64 [batch, seq], and return
the scalar loss: alone, as the one scalar of a tuple such as (logits, loss),
or as the 'loss' entry of a dict (a Hugging Face output); the helper says
which it took, and the file's one output is the loss.
"""
import copy
import inspect
import json
import os
import shutil
import struct
import subprocess
import tempfile

import onnx
import torch

TRAINABLE_KEY = "fastllm.trainable_parameters"
# The check's learning rate: large enough that a weight trained apart from
# its tie moves step 2's loss past the bound (2.5e-5 at 1e-3 on a small GPT
# with a folded tie broken), small enough that rounding does not.
_CHECK_LR = 3e-3
FROZEN_KEY = "fastllm.frozen_parameters"


class ExportCheckError(RuntimeError):
    """The exported model's loss differs from the PyTorch model's."""


def _parameter_names(model, graph_names):
    """Each parameter once, under the name its initializer has in the graph.

    A tied parameter (`lm_head.weight = wte.weight`) is one tensor under
    several names; the exporter keeps one of them.
    """
    aliases = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        aliases.setdefault(id(tensor), []).append(name)
    trainable, frozen, missing = [], [], []
    for name, p in model.named_parameters():
        names = aliases.get(id(p), [name])
        found = [n for n in names if n in graph_names]
        if not found:
            missing.append(name)
            continue
        (trainable if p.requires_grad else frozen).append(found[0])
    return trainable, frozen, missing


def _find_tool(tool):
    if tool:
        return tool
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "..", "build", "bin", "fastllm-opt"),
                      shutil.which("fastllm-opt")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def export(model, example_inputs, path, input_names=("idx", "targets"),
           output_name="loss", opset_version=17, check=True, tool=None,
           rtol=1e-5, verbose=False, dynamic_batch=False):
    """Exports `model` to `path` for training with fastllm-opt.

    example_inputs: the (idx, targets) tensors forward takes; their shapes
    become the compiled batch size and sequence length.
    dynamic_batch: export the batch dim symbolic ("batch"), so that one file
    serves every micro-batch size (`compile --batch-size N` binds it). Code
    whose shapes then depend on it (repeat_interleave, say) may export as
    ONNX sequences or loops, which compile refuses: export static then.
    check: compile the export with fastllm-opt (`tool`, default: the build in
    this repository or `fastllm-opt` on PATH) and compare the first two
    losses (the second after one AdamW step) with PyTorch's within `rtol`; raises ExportCheckError on a mismatch and
    RuntimeError when the tool cannot be found.
    Returns the names recorded as trainable and frozen.
    """
    example_inputs = tuple(example_inputs)
    was_training = model.training
    rng = torch.get_rng_state()  # the probe's dropout must not move it
    with torch.no_grad():
        pick, how = _loss_picker(model(*example_inputs))
    torch.set_rng_state(rng)
    if how != "the loss forward returns":
        print(f"fastllm_export: the loss is {how}")
    with tempfile.TemporaryDirectory(prefix="fastllm-export-") as tmp:
        raw = os.path.join(tmp, "raw.onnx")
        _export(model, example_inputs, raw, input_names, output_name, opset_version, pick,
                dynamic_batch)
        proto = onnx.load(raw)
        graph_names = {t.name for t in proto.graph.initializer}
        trainable, frozen, missing = _parameter_names(model, graph_names)
        if missing:
            # Not in the graph: the loss does not read them (an unused head,
            # say); PyTorch gives them no gradient either.
            if verbose:
                print(f"fastllm_export: not in the graph (unused): {missing}")
        _record_parameters(raw, path, trainable, frozen, proto)
        if check:
            _check(model, example_inputs, path, input_names, output_name,
                   opset_version, tool, rtol, tmp, verbose, trainable, frozen, pick,
                   dynamic_batch)
    model.train(was_training)
    return trainable, frozen


class ExportError(RuntimeError):
    """The model cannot be exported for training as it is (what its forward
    returns holds no loss the helper can tell)."""


def _loss_picker(output):
    """(pick, how): a function taking forward's output to the loss, and
    what it took. forward may return the loss, a dict (or a Hugging Face
    output) with a 'loss' entry, or a tuple or list holding one scalar
    float tensor, such as (logits, loss)."""
    if torch.is_tensor(output):
        return (lambda out: out), "the loss forward returns"
    if isinstance(output, dict):
        if torch.is_tensor(output.get("loss")) and output["loss"].dim() == 0:
            return (lambda out: out["loss"]), "the 'loss' entry of the dict forward returns"
        raise ExportError("forward returned a dict without a scalar 'loss' entry "
                          f"(keys: {', '.join(map(str, output))})")
    if isinstance(output, (tuple, list)):
        scalars = [i for i, o in enumerate(output)
                   if torch.is_tensor(o) and o.dim() == 0 and o.is_floating_point()]
        if len(scalars) == 1:
            i = scalars[0]
            return (lambda out: out[i]), (f"element {i} of the {len(output)} forward "
                                          "returns (the one scalar)")
        raise ExportError(f"forward returned a {type(output).__name__} of {len(output)} "
                          f"with {len(scalars)} scalar float tensors: return the loss "
                          "alone, or a dict with a 'loss' entry")
    raise ExportError(f"forward returned a {type(output).__name__}, not a loss tensor, "
                      "a dict with a 'loss' entry or a tuple holding the loss")


def _export(model, inputs, path, input_names, output_name, opset_version, pick,
            dynamic_batch=False):
    # The TorchScript exporter, which fastllm-opt is tested with: PyTorch 2.9
    # made the torch.export-based one (dynamo=True) the default.
    extra = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        extra["dynamo"] = False
    if dynamic_batch:
        extra["dynamic_axes"] = {name: {0: "batch"} for name in input_names}
    # The graph's one output is the loss: forward, seen through `pick`,
    # for the time of the export (an instance attribute shadows the
    # method; the model's own is back afterwards).
    had = "forward" in vars(model)
    own = vars(model).get("forward")
    forward = model.forward
    model.forward = lambda *args: pick(forward(*args))
    try:
        torch.onnx.export(model, inputs, path, input_names=list(input_names),
                          output_names=[output_name], opset_version=opset_version,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, **extra)
    finally:
        if had:
            model.forward = own
        else:
            del model.forward


def _dropout_modules(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]


def _dropout_rates(model):
    """(module, attribute) of the dropout rates modules keep as plain floats
    and pass to functional dropout themselves: nn.MultiheadAttention's
    `dropout`, a `self.dropout` or `self.attn_pdrop` handed to F.dropout or
    scaled_dot_product_attention (nanoGPT, minGPT-style code), Hugging
    Face's `attention_dropout`."""
    return [(m, name) for m in model.modules() for name, value in vars(m).items()
            if "drop" in name and isinstance(value, float) and 0.0 < value <= 1.0]


def _record_parameters(source, path, trainable, frozen, proto=None):
    """Writes the ONNX file `source` (or its loaded `proto`) to `path` with
    the parameter lists in its metadata, through a temporary beside `path`
    renamed over it: never half a file."""
    proto = proto if proto is not None else onnx.load(source)
    del proto.metadata_props[:]
    for key, names in ((TRAINABLE_KEY, trainable), (FROZEN_KEY, frozen)):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(names)
    target_dir = os.path.dirname(os.path.abspath(path))
    fd, staged = tempfile.mkstemp(prefix=".fastllm-export-", dir=target_dir)
    os.close(fd)
    try:
        onnx.save(proto, staged)
        os.replace(staged, path)
    except BaseException:
        os.unlink(staged)
        raise


def _check(model, inputs, path, input_names, output_name, opset_version, tool,
           rtol, tmp, verbose, trainable, frozen, pick, dynamic_batch):
    tool = _find_tool(tool)
    if tool is None:
        raise RuntimeError("fastllm_export: cannot check the export: fastllm-opt "
                           "not found (pass tool=, or check=False to skip the check)")
    idx = inputs[0]
    if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("fastllm_export: the check needs integer token ids "
                           "[batch, seq] as the first input")
    batch, seq = idx.shape
    # The batches the training program reads with --sampler sequential at
    # steps 1 and 2 (sample i of step s starts at ((s * batch + i) * seq)
    # mod (n - seq - 1) of the n-token stream; targets shifted by one).
    # Step 1's loss is computed before any update; step 2's after one AdamW
    # step, which a weight trained apart from its tie (a folded copy read as
    # a tensor of its own) moves differently: one step could not see it.
    stream = idx.reshape(-1).to(torch.int64)
    stream = torch.cat([stream, stream[: seq + 2]])
    if int(stream.max()) >= 1 << 32 or int(stream.min()) < 0:
        raise RuntimeError("fastllm_export: token ids must be in [0, 2^32)")
    n = len(stream)

    def step_batch(s):
        offsets = [((s * batch + i) * seq) % (n - seq - 1) for i in range(batch)]
        return (torch.stack([stream[o:o + seq] for o in offsets]),
                torch.stack([stream[o + 1:o + seq + 1] for o in offsets]))

    (x, y), (x2, y2) = step_batch(0), step_batch(1)
    # Dropout off on both sides: the check is of everything else (dropout's
    # own tests check the masks). The rest of the graph is the same.
    dropouts = _dropout_modules(model)
    saved = [m.p for m in dropouts]
    rates = _dropout_rates(model)
    saved_rates = [getattr(m, name) for m, name in rates]
    try:
        for m in dropouts:
            m.p = 0.0
        for m, name in rates:
            setattr(m, name, 0.0)
        check_path = os.path.join(tmp, "check.onnx")
        _export(model, (x, y), check_path, input_names, output_name, opset_version, pick,
                dynamic_batch)
        _record_parameters(check_path, check_path, trainable, frozen)
        model.train()
        with torch.no_grad():
            expected = [float(pick(model(x, y)))]
        # One step of AdamW as `train` takes it (its default betas, eps and
        # weight decay, decay on tensors of two or more dims), on a copy.
        stepped = copy.deepcopy(model)
        params = [p for p in stepped.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
            lr=_CHECK_LR, betas=(0.9, 0.95), eps=1e-8)
        pick(stepped(x, y)).backward()
        opt.step()
        with torch.no_grad():
            expected.append(float(pick(stepped(x2, y2))))
    finally:
        for m, p in zip(dropouts, saved):
            m.p = p
        for (m, name), rate in zip(rates, saved_rates):
            setattr(m, name, rate)
    tokens = os.path.join(tmp, "tokens.u32")
    with open(tokens, "wb") as f:
        f.write(struct.pack(f"<{len(stream)}I", *[int(t) for t in stream]))
    out = os.path.join(tmp, "run")
    r = subprocess.run([tool, "compile", check_path, "-o", out, "--batch-size",
                        str(batch), "--seq-len", str(seq)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ExportCheckError(f"fastllm-opt could not compile the export:\n{r.stderr}")
    metrics = os.path.join(tmp, "metrics.jsonl")
    r = subprocess.run([os.path.join(out, "train"), "--data", tokens, "--data-dtype", "u32",
                        "--steps", "2", "--lr", repr(_CHECK_LR), "--sampler", "sequential",
                        "--metrics", metrics], capture_output=True, text=True)
    if r.returncode != 0:
        raise ExportCheckError(f"the compiled export did not run:\n{r.stderr}")
    with open(metrics) as f:
        got = [json.loads(line)["loss"] for line in f]
    for step, (ours, theirs) in enumerate(zip(got, expected), start=1):
        diff = abs(ours - theirs) / max(abs(theirs), 1e-30)
        if verbose:
            print(f"fastllm_export: step {step} loss {ours:.7g} (fastllm-opt) vs "
                  f"{theirs:.7g} (PyTorch), relative difference {diff:.2e}")
        if not diff <= rtol:
            raise ExportCheckError(
                f"the exported model's loss at step {step} {ours:.7g} differs from "
                f"PyTorch's {theirs:.7g} (relative {diff:.2e} > {rtol:g}) on the same "
                "batch" + (" after one AdamW step: a weight trains unlike PyTorch's (a "
                           "tie broken, a buffer trained?)" if step == 2 else ""))
