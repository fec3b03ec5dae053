#!/usr/bin/python3
"""Writes a Llama-style training graph of any size as ONNX with external data,
without holding its weights in memory.

PyTorch cannot export a 7B model on a 24 GB machine (the export holds the
whole model, and more). This generator has PyTorch export the same
architecture (test/EndToEnd/user_models.py's LlamaStyleLM with the
Llama-family FFN width, or --ffn) with ONE layer at the full width, with
torch.onnx.export's defaults (eval mode, constant folding); takes that
layer's nodes as they are and repeats them --layers times (node and value
names renamed /blocks.0/ -> /blocks.i/, each layer its own weights, the
hidden state threaded from one layer to the next); and writes every weight's
bytes into one external-data file, streamed from numpy (random normal,
std 0.02, norm gains 1), so memory stays bounded by the one-layer export.
The head is untied (Llama 2's), and the exporter's deduplication of equal
initializers (every norm gain starts at 1) is undone: each weight is an
initializer of its own.

--check compares the per-layer op sequence of the generated graph with a
small PyTorch export of the same architecture (2 layers, d 64): the same op
types in the same order in every layer, or exit 1.

Usage: bench/llama_onnx_gen.py --out DIR/model.onnx [--dim 4096 --layers 32
       --heads 32 --ffn 11008 --vocab 32000 --batch 1 --seq 1024] [--check]
"""
import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_bench  # noqa: E402  (the models, shared with the benchmark)

# The model's layer list (LlamaStyleLM.blocks): node names start with
# /blocks.N/ and the layers' weight names with blocks.N.
SCOPE = "blocks"


def export_template(dim, layers, heads, ffn, vocab, batch, seq, folder):
    """PyTorch's export of the architecture (defaults), loaded with its data."""
    import torch
    models = compile_bench.load_user_models()
    model = compile_bench.llama_model(models, dim, layers, heads, vocab, seq, hidden=ffn)
    with torch.no_grad():
        model.head.weight = torch.nn.Parameter(model.head.weight.clone())  # untied
    model.eval()
    path = os.path.join(folder, "model.onnx")
    compile_bench.export(model, batch, seq, path)
    return onnx.load(path)


def layer_of(node_name):
    """The layer index of a node named /blocks.N/..., or None."""
    if node_name.startswith(f"/{SCOPE}."):
        head = node_name[len(f"/{SCOPE}."):].split("/", 1)[0]
        if head.isdigit():
            return int(head)
    return None


def layer_op_types(graph):
    """{layer: [op types in node order]}."""
    out = {}
    for node in graph.node:
        layer = layer_of(node.name)
        if layer is not None:
            out.setdefault(layer, []).append(node.op_type)
    return out


def is_weight(init):
    return init.data_type == onnx.TensorProto.FLOAT and (
        init.name.startswith("onnx::MatMul") or init.name.endswith(".weight"))


class DataWriter:
    """Streams tensors into one external-data file, 4096-byte aligned."""

    def __init__(self, path):
        self.file = open(path, "wb")
        self.location = os.path.basename(path)
        self.rng = np.random.default_rng(0)
        self.pool = (self.rng.standard_normal(1 << 22, dtype=np.float32) * 0.02)

    def add(self, tensor, fill):
        """Makes `tensor` external: `fill` is 'ones', 'random' or an array."""
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        offset = self.file.tell()
        pad = (-offset) % 4096
        self.file.write(b"\0" * pad)
        offset += pad
        if isinstance(fill, np.ndarray):
            self.file.write(fill.astype(np.float32).tobytes())
        else:
            done = 0
            while done < count:
                n = min(count - done, self.pool.size)
                if fill == "ones":
                    chunk = np.ones(n, dtype=np.float32)
                else:
                    start = int(self.rng.integers(0, self.pool.size - n + 1))
                    chunk = self.pool[start:start + n]
                self.file.write(chunk.tobytes())
                done += n
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for k, v in (("location", self.location), ("offset", str(offset)),
                     ("length", str(count * 4))):
            entry = tensor.external_data.add()
            entry.key, entry.value = k, v

    def close(self):
        self.file.close()


def generate(template, layers, out_path):
    """The template's graph with its one layer repeated `layers` times."""
    g = template.graph
    inits = {t.name: t for t in g.initializer}
    # Undo deduplication: an Identity of an initializer becomes an
    # initializer of its own, under the Identity's output name.
    aliases = {}
    nodes = []
    for node in g.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            aliases[node.output[0]] = node.input[0]
        else:
            nodes.append(node)
    in_layer = [k for k, n in enumerate(nodes) if layer_of(n.name) is not None]
    if not in_layer or any(layer_of(n.name) != 0 for n in nodes[in_layer[0]:in_layer[-1] + 1]):
        sys.exit(f"the template must have exactly one layer (/{SCOPE}.0/...), its nodes together")
    pre, body = nodes[:in_layer[0]], nodes[in_layer[0]:in_layer[-1] + 1]
    post = nodes[in_layer[-1] + 1:]
    produced = {o for n in body for o in n.output}
    consumed_after = {i for n in post for i in n.input}
    pre_outputs = {o for n in pre for o in n.output}
    h_out = [v for v in produced if v in consumed_after]
    h_in = sorted({i for n in body for i in n.input if i in pre_outputs})
    if len(h_out) != 1 or len(h_in) != 1:
        sys.exit(f"cannot find the layer's hidden state: in {h_in}, out {h_out}")
    h_in, h_out = h_in[0], h_out[0]
    layer_weights = sorted({i for n in body for i in n.input
                            if (i in inits or i in aliases) and
                            is_weight(inits[aliases.get(i, i)])})

    folder = os.path.dirname(out_path)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    writer = DataWriter(os.path.join(tmp, "model.onnx.data"))
    new_inits = []

    def weight(source_name, new_name):
        src = inits[aliases.get(source_name, source_name)]
        t = onnx.TensorProto()
        t.name, t.data_type = new_name, src.data_type
        t.dims.extend(src.dims)
        writer.add(t, "ones" if len(src.dims) == 1 else "random")
        new_inits.append(t)

    out_nodes = []
    for n in pre:
        out_nodes.append(n)
    for i in range(layers):
        rename = {h_in: h_in if i == 0 else f"/{SCOPE}.{i - 1}/" + h_out[len(f"/{SCOPE}.0/"):]}
        for w in layer_weights:
            new = (w.replace(f"{SCOPE}.0.", f"{SCOPE}.{i}.", 1) if w.startswith(f"{SCOPE}.0.")
                   else f"{w}_layer{i}")
            rename[w] = new
            weight(w, new)
        for n in body:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.name = n.name.replace(f"/{SCOPE}.0/", f"/{SCOPE}.{i}/", 1)
            for k, v in enumerate(n.input):
                m.input[k] = rename.get(v, v.replace(f"/{SCOPE}.0/", f"/{SCOPE}.{i}/", 1))
            for k, v in enumerate(n.output):
                m.output[k] = v.replace(f"/{SCOPE}.0/", f"/{SCOPE}.{i}/", 1)
            out_nodes.append(m)
    last = f"/{SCOPE}.{layers - 1}/" + h_out[len(f"/{SCOPE}.0/"):]
    for n in post:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for k, v in enumerate(n.input):
            m.input[k] = last if v == h_out else v
        out_nodes.append(m)
    # Initializers read outside the layers, and those the layers share
    # (the mask): weights get streamed data, the rest keep their values.
    used = {i for n in out_nodes for i in n.input}
    for name in sorted(used):
        if name in {t.name for t in new_inits}:
            continue
        src = aliases.get(name, name)
        if src not in inits:
            continue
        if is_weight(inits[src]) and name not in layer_weights:
            weight(name, name)
        elif not is_weight(inits[src]):
            t = onnx.TensorProto()
            t.CopyFrom(inits[src])
            t.name = name
            if t.data_type == onnx.TensorProto.FLOAT and len(t.raw_data) > 4096:
                writer.add(t, numpy_helper.to_array(inits[src]).ravel())
            new_inits.append(t)
    writer.close()
    graph = onnx.helper.make_graph(out_nodes, g.name, list(g.input), list(g.output),
                                   initializer=new_inits)
    model = onnx.helper.make_model(graph, opset_imports=list(template.opset_import),
                                   producer_name="fastllm bench/llama_onnx_gen.py")
    model.ir_version = template.ir_version
    with open(os.path.join(tmp, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return model


def check(generated, dims):
    """Same op types in the same order in every layer as PyTorch's export."""
    with tempfile.TemporaryDirectory() as tmp:
        small = export_template(64, 2, 4, dims["ffn_small"], 96, 2, 16,
                                os.path.join(tmp, "small"))
    reference = layer_op_types(small.graph)
    ours = layer_op_types(generated.graph)
    if reference[0] != reference[1]:
        sys.exit("the small PyTorch export's layers differ from each other")
    bad = [i for i, ops in ours.items() if ops != reference[0]]
    if bad or len(ours) != dims["layers"]:
        sys.exit(f"op sequence differs from PyTorch's export in layers {bad} "
                 f"({len(ours)} layers generated)")
    print(f"check: all {len(ours)} layers have PyTorch's per-layer op sequence "
          f"({len(reference[0])} ops: {' '.join(reference[0][:8])} ...)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    parent = os.path.dirname(os.path.dirname(os.path.abspath(args.out)))
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        template = export_template(args.dim, 1, args.heads, args.ffn, args.vocab, args.batch,
                                   args.seq, os.path.join(tmp, "template"))
        model = generate(template, args.layers, os.path.abspath(args.out))
    if args.check:
        check(model, {"layers": args.layers,
                      "ffn_small": compile_bench.swiglu_width(64)})
    print(f"wrote {args.out}: {args.layers} layers, d {args.dim}, "
          f"{sum(os.path.getsize(os.path.join(os.path.dirname(args.out), f)) for f in os.listdir(os.path.dirname(args.out))) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
