#!/usr/bin/python3
"""Load fastllm-opt weights into PyTorch: a state_dict with PyTorch's names.

    import sys; sys.path.insert(0, "/path/to/fastllm-opt/tools")
    from fastllm_weights import load_state_dict
    model.load_state_dict(load_state_dict("weights.safetensors", model))

Reads the safetensors files fastllm-opt writes (`train --save-weights`,
`fastllm-opt consolidate`, a compiled run's initial weights.safetensors) with
the standard library and torch only: the format is an 8-byte little-endian
header length, a JSON header naming each tensor's dtype, shape and byte range,
then the raw little-endian data.

Names. fastllm's parameters carry the ONNX initializer names, which are
PyTorch's for an export made with tools/fastllm_export.py. With
`torch.onnx.export`'s defaults (constant folding on) `compile` restores what
it can and records the result in the weights themselves: a Linear weight the
exporter replaced by a transposed copy under a generated name
(`onnx::MatMul_N`) is stored under its module's name (`h.0.attn.c_attn.weight`)
in PyTorch's [out, in] layout, a folded copy of another weight (a tied head) is
read as a view of that weight and not stored twice, and parameters the
exporter merged because their values were equal are stored one per name.
(`compile` prints these decisions in its summary; nothing else about them is
needed here.) What this loader does with `model` given:
  - tied parameters (one tensor, several names in `model.state_dict()`, such
    as `lm_head.weight` and `transformer.wte.weight`) get the one stored
    tensor under every name; if the file holds different values for two
    names of one tie, that is an error;
  - buffers the file lacks (a causal mask) are taken from `model`: fastllm
    keeps buffers constant, so the model's own values are the trained ones;
  - every shape must be the model's;
  - a tensor under a name the model lacks is placed only with `initial=`,
    the compiled run's weights.safetensors, and `model` holding the values
    it was exported with: the one parameter whose value equals the tensor's
    initial value, as stored or transposed (then transposed back), like the
    importer's rule for folded copies. Parameters of equal value (the
    deep-copied layers of an nn.TransformerEncoder) are told apart by the
    module that reads the tensor, which `compile` records in the initial
    weights' metadata (`fastllm.module.NAME`); a tensor whose elements are
    all equal (a zero position table) is placed only where one parameter
    alone is left with its shape and value; one that is a buffer of the
    model reshaped (an attention mask), unchanged by training, is the
    buffer. Such names are generated ones (`onnx::...`: `compile` could not tell
    the module; e.g. `wpe(arange(T))` folded into a constant `onnx::Add_N`)
    or a module path read from the exporter's scopes that the model does
    not have (a Linear inside an `nn.ModuleDict` called through a lambda is
    scoped without the dict's name: `blocks.0.a.weight` for
    `blocks.0.layers.a.weight`);
  - any tensor still unplaced, and a parameter of the model that the file
    lacks, are errors that name them, each unplaced tensor with the model's
    closest names of the same size: such a weight cannot be placed without
    guessing (export with tools/fastllm_export.py to keep every name).
Without `model`, the file's tensors are returned under the file's names, with
a warning listing generated names.

Errors. Every problem with a file, `path` or `initial`, raises WeightsError (a
ValueError) naming it, never another exception: one that does not exist or
cannot be read; one that is not a regular file (a FIFO, a folder, a device
such as /dev/zero: refused without blocking or reading, through
tools/fastllm_input.py, beside this file); and one that is not valid
safetensors. Checked before any tensor's bytes are read or allocated:
  - the header length (the first 8 bytes) fits the file and is at most
    100 MiB (the reference implementation's limit);
  - the header is UTF-8 JSON nested at most 64 levels, with at most
    1,048,576 arrays and objects and 4,194,304 values (16 per tensor at the
    most tensors: Python's objects for 100 MiB of `[],` would take 3 GB),
    an object without duplicate keys, of at most 262,144 tensors;
    __metadata__, if present, maps strings to strings;
  - each tensor has a known dtype (a string), a shape of at most 32
    non-negative integer dimensions whose element count matches its byte
    range exactly, and data_offsets [begin, end] within the data;
  - no two tensors' byte ranges overlap, so the bytes read add up to at most
    the file's size (read in chunks of 4 MiB).
BOOL tensors must hold only bytes 0 and 1.
"""
import difflib
import os
import struct
import sys
import warnings

import torch

try:  # tools/fastllm_input.py, beside this file
    import fastllm_input
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import fastllm_input

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_MAX_HEADER = 100 << 20  # the reference implementation's limit
_MAX_TENSORS = 1 << 18
_MAX_DIMS = 32


class WeightsError(ValueError):
    """The file cannot be read, is not valid safetensors, or does not fit
    the model; the message names it."""


def _shown(name):
    """A tensor name for a message: quoted, and cut to 200 characters."""
    return repr(name) if len(name) <= 200 else repr(name[:200]) + "..."


def _listed(names, most=20):
    """Names for a message: the first `most`, and how many more."""
    names = list(names)
    text = ", ".join(n if len(n) <= 200 else n[:200] + "..."
                     for n in names[:most])
    return text + (f" and {len(names) - most} more"
                   if len(names) > most else "")


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise fastllm_input.JsonError(f"duplicate key {_shown(key)}")
        for text in [key] + ([value] if isinstance(value, str) else []):
            try:  # JSON's \ud800 alone is no character: no UTF-8 holds it
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise fastllm_input.JsonError(
                    f"a lone UTF-16 surrogate in {_shown(text)}") from None
        out[key] = value
    return out


def _header_int(literal):
    """A header's integers are sizes and offsets, never negative: "-0" is
    refused too (as runtime/Safetensors.cpp reads it), where int() would
    make it 0. Other negatives are refused naming their tensor."""
    value = int(literal)
    if value == 0 and literal.startswith("-"):
        raise fastllm_input.JsonError("a negative zero (-0)")
    return value


def _entry(path, name, e, data_bytes):
    """(dtype, shape, begin, end) of header entry `name`, checked."""
    def bad(what):
        return WeightsError(f"{path}: tensor {_shown(name)} {what}")
    if not isinstance(e, dict):
        raise bad("is not a JSON object")
    dtype_name = e.get("dtype")
    dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        shown = (f"of type {type(dtype_name).__name__}"
                 if not isinstance(dtype_name, str) else repr(dtype_name)
                 if len(dtype_name) <= 20 else "(a long string)")
        raise bad(f"has dtype {shown}, not one of {sorted(_DTYPES)}")
    shape, offsets = e.get("shape"), e.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS or not all(
            type(d) is int and 0 <= d < 1 << 63 for d in shape):
        raise bad(f"has no shape of at most {_MAX_DIMS} non-negative "
                  "integers (below 2^63)")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_bytes):
        shown = repr(offsets) if isinstance(offsets, list) and \
            len(offsets) == 2 and all(type(o) is int for o in offsets) \
            else "that are not two integers"
        raise bad(f"has data_offsets {shown}, not a range within the "
                  f"{data_bytes} data bytes")
    # PyTorch multiplies every dim, zeros or not, in 64 bits: an empty
    # tensor whose other dims overflow that is no tensor it can make (a
    # non-empty one is held to its byte count below).
    if 0 in shape:
        product = 1
        for d in shape:
            product *= max(d, 1)
            if product >= 1 << 63:
                raise bad(f"has shape {shape}, whose dims multiply past 2^63")
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = 0 if 0 in shape else itemsize
    for d in shape:  # stops once past the range: no product of 2^63s
        nbytes *= d
        if nbytes > offsets[1] - offsets[0]:
            break
    if nbytes != offsets[1] - offsets[0]:
        raise bad(f"has {offsets[1] - offsets[0]} data bytes, which do not "
                  f"hold {dtype_name} of shape {shape}")
    return dtype, shape, offsets[0], offsets[1]


def read_safetensors(path):
    """(tensors, metadata): the file's tensors by name, in file order, and its
    __metadata__ (a dict of strings). Raises WeightsError on a file that
    cannot be read or is malformed (the module docstring lists the checks)."""
    try:
        with fastllm_input.open_input(path) as f:
            return _read_safetensors(path, f)
    except fastllm_input.InputError as e:
        raise WeightsError(str(e)) from None


def _read_safetensors(path, f):
    size = f.size
    if size < 8:
        raise WeightsError(f"{path}: not a safetensors file (too short)")
    (header_bytes,) = struct.unpack("<Q", f.read(0, 8))
    if header_bytes > _MAX_HEADER:
        raise WeightsError(f"{path}: not a safetensors file (header length "
                           f"{header_bytes}, more than the 100 MiB allowed)")
    if header_bytes > size - 8:
        raise WeightsError(f"{path}: not a safetensors file (header length "
                           f"{header_bytes} does not fit its {size} bytes)")
    try:
        header = fastllm_input.loads(f.read(8, header_bytes),
                                     object_pairs_hook=_no_duplicates,
                                     parse_int=_header_int,
                                     max_containers=4 * _MAX_TENSORS,
                                     max_values=16 * _MAX_TENSORS)
    except fastllm_input.JsonError as e:
        where = f" (line {e.lineno}, column {e.colno})" if e.lineno else ""
        raise WeightsError(f"{path}: malformed safetensors header: "
                           f"{e.msg}{where}") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise WeightsError(f"{path}: __metadata__ is not a JSON object of "
                           "strings")
    if len(header) > _MAX_TENSORS:
        raise WeightsError(f"{path}: {len(header)} tensors, more than the "
                           f"{_MAX_TENSORS} read")
    data_bytes = size - 8 - header_bytes
    entries = [(name, *_entry(path, name, e, data_bytes))
               for name, e in header.items()]
    # Each tensor's bytes are its own (as runtime/Safetensors.cpp checks):
    # overlapping ranges would load as aliases, and their sum could exceed
    # the file. Empty ranges hold no bytes.
    ranges = sorted((begin, end, name) for name, _, _, begin, end in entries
                    if end > begin)
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise WeightsError(f"{path}: tensors {_shown(n0)} and "
                               f"{_shown(n1)} overlap in "
                               f"the file (bytes {b0}..{e0} and {b1}..{e1} of "
                               "the data)")
    tensors = {}
    for name, dtype, shape, begin, end in entries:
        raw = f.read(8 + header_bytes + begin, end - begin)
        if dtype is torch.bool and raw.translate(None, b"\0\1"):
            raise WeightsError(f"{path}: tensor {_shown(name)} (BOOL) holds "
                               "bytes other than 0 and 1")
        t = (torch.frombuffer(raw, dtype=dtype) if raw
             else torch.empty(0, dtype=dtype))
        tensors[name] = t.reshape(shape)
    return tensors, metadata


def _converted(path, name, t, dtype):
    """`t` in the model's dtype, refusing a conversion that would change what
    the file says rather than round it: a boolean or integer tensor into a
    float parameter (or the reverse), and finite values that overflow the
    narrower float (1e300 into float32 is inf)."""
    if t.dtype == dtype:
        return t
    if t.is_floating_point() != dtype.is_floating_point or t.dtype == torch.bool \
            or dtype == torch.bool:
        raise WeightsError(f"{path}: tensor {name!r} is {str(t.dtype)[6:]}, the "
                           f"model's is {str(dtype)[6:]}: not converted")
    c = t.to(dtype)
    if dtype.is_floating_point and bool((torch.isfinite(t) & ~torch.isfinite(c)).any()):
        raise WeightsError(f"{path}: tensor {name!r} holds values beyond "
                           f"{str(dtype)[6:]}'s range (they would become inf)")
    return c


def _ties(model):
    """Each name of model.state_dict() -> the names sharing its tensor."""
    groups = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return {n: g for g in groups.values() for n in g}


_MODULE_KEY = "fastllm.module."


def _in_module(name, scope):
    """True when parameter `name` belongs to the module at exporter scope
    `scope`: the scope's parts are in order among the module path's, the
    last ones equal (the exporter's scopes skip containers not called, as
    the importer's rule has it)."""
    path = name.split(".")[:-1]
    parts = scope.split(".")
    if not path or path[-1] != parts[-1]:
        return False
    it = iter(path)
    return all(p in it for p in parts)


def _match_by_value(tensors, initial_path, model):
    """Renames tensors under names `model` lacks to the model's parameter
    whose current value is exactly the tensor's value in `initial_path` (the
    compiled run's weights.safetensors), as stored or transposed (then the
    trained tensor is transposed back). `model` must hold the values it was
    exported with. Several parameters of equal value (the deep-copied layers
    of an nn.TransformerEncoder) are told apart by the module the file says
    reads the tensor (metadata `fastllm.module.NAME`); a tensor of equal
    elements (zeros) is placed only where one parameter alone is left with
    its shape and value. A tensor equal to a
    buffer of the model in its initial and its saved value (a mask the
    exporter reshaped) is the buffer, which comes from `model`: dropped. A
    name with no such parameter, or several, stays."""
    initial, metadata = read_safetensors(initial_path)
    scopes = {k[len(_MODULE_KEY):]: v for k, v in metadata.items()
              if k.startswith(_MODULE_KEY)}
    own = model.state_dict()
    parameters = {n for n, t in model.state_dict(keep_vars=True).items()
                  if isinstance(t, torch.nn.Parameter)}
    taken = set(tensors)
    uniform = []
    for name in [n for n in tensors if n not in own]:
        start = initial.get(name)
        if start is None:
            continue
        if not start.is_floating_point():
            continue
        if start.numel() < 2 or bool((start == start.flatten()[0]).all()):
            uniform.append(name)  # equal elements say nothing here
            continue
        found = []
        for pname, value in own.items():
            if pname in taken or not value.is_floating_point():
                continue
            if value.shape == start.shape and torch.equal(value, start.to(value.dtype)):
                found.append((pname, False))
            elif (value.dim() == 2 and value.t().shape == start.shape
                  and torch.equal(value.t(), start.to(value.dtype))):
                found.append((pname, True))
        if len(found) > 1 and name in scopes:
            found = [f for f in found if _in_module(f[0], scopes[name])]
        if len(found) == 1:
            pname, transposed = found[0]
            t = tensors.pop(name)
            tensors[pname] = t.t().contiguous() if transposed else t
            taken.add(pname)
        elif not found and torch.equal(tensors[name], start.to(tensors[name].dtype)):
            flat = start.flatten()
            if any(pname not in parameters and value.numel() == flat.numel()
                   and torch.equal(value.flatten(), flat.to(value.dtype))
                   for pname, value in own.items()):
                del tensors[name]  # a buffer, reshaped: the model has it
    # A tensor of equal elements (zeros: a position table) is placed when,
    # everything else placed, one parameter alone is left with its shape and
    # value.
    for name in uniform:
        start = initial[name]
        left = [p for p in parameters - taken
                if own[p].shape == start.shape
                and torch.equal(own[p], start.to(own[p].dtype))]
        if len(left) == 1:
            tensors[left[0]] = tensors.pop(name)
            taken.add(left[0])


def _closest(name, t, own, placed, most=3):
    """The model's names not yet placed that hold as many elements as `t`,
    the likeliest first: those whose parts hold `name`'s parts in order (an
    exporter's scope skips a container: `blocks.0.a.weight` is
    `blocks.0.layers.a.weight`), then the most alike as text."""
    pool = [n for n, v in own.items()
            if n not in placed and v.numel() == t.numel()]
    parts = name.split(".")

    def holds(candidate):
        it = iter(candidate.split("."))
        return (candidate.split(".")[-1] == parts[-1]
                and all(p in it for p in parts))

    first = sorted((n for n in pool if holds(n)), key=len)
    rest = difflib.get_close_matches(name, [n for n in pool if n not in first],
                                     n=most, cutoff=0.4)
    return (first + rest)[:most] or sorted(pool)[:most]


def load_state_dict(path, model=None, initial=None):
    """The tensors of fastllm-opt weights file `path` as a state_dict.

    With `model` (a torch.nn.Module), the result has exactly the keys of
    `model.state_dict()`, ready for `model.load_state_dict(...)` (strict):
    tied names share the stored tensor, buffers missing from the file come
    from `model`, and anything that cannot be placed raises WeightsError
    naming it (see the module docstring). `initial`, the compiled run's
    weights.safetensors, with `model` still holding the values it was
    exported with, places tensors under generated names too: by their
    initial values, as the importer ties folded copies."""
    tensors, _ = read_safetensors(path)
    if model is not None and initial is not None:
        _match_by_value(tensors, initial, model)
    generated = sorted(n for n in tensors if n.startswith("onnx::"))
    if model is None:
        if generated:
            warnings.warn(f"{path}: {len(generated)} tensor(s) under the "
                          f"exporter's generated names, which no PyTorch "
                          f"module has: {_listed(generated)}")
        return dict(tensors)

    own = model.state_dict()
    ties = _ties(model)
    parameters = {n for n, t in model.state_dict(keep_vars=True).items()
                  if isinstance(t, torch.nn.Parameter)}
    unknown = [n for n in tensors if n not in own]
    if unknown:
        placed = {a for n in tensors if n in own for a in ties[n]}
        shown = []
        for n in unknown[:20]:
            close = _closest(n, tensors[n], own, placed)
            shown.append(n + (f" (closest: {', '.join(close)})" if close
                              else " (no name of the model holds as many "
                                   "elements)"))
        raise WeightsError(
            f"{path}: tensor(s) the model has no name for: "
            f"{_listed(shown)}"
            + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
            + ("; pass initial=RUN/weights.safetensors (the compiled run's "
               "initial weights) with the model as exported to place them "
               "by value" if initial is None else
               "; not placed by value either: `initial` has no tensor of "
               "that name, or not one parameter of `model` (as exported) "
               "equals it")
            + ", or export with tools/fastllm_export.py to keep every name")
    out = {}
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(own[name].shape):
            raise WeightsError(f"{path}: tensor {name!r} has shape "
                               f"{list(t.shape)}, the model's is "
                               f"{list(own[name].shape)}")
        for alias in ties[name]:
            if alias in out and not torch.equal(out[alias], t):
                raise WeightsError(
                    f"{path}: the model ties {', '.join(ties[name])}, but the "
                    f"file holds different values for {alias!r} and {name!r}")
            out[alias] = _converted(path, name, t, own[name].dtype)
    missing = [n for n in own if n not in out and n in parameters]
    if missing:
        raise WeightsError(f"{path}: no tensor for the model's parameter(s) "
                           f"{_listed(missing)}")
    for name in own:
        if name not in out:  # a buffer: constant in fastllm's training
            out[name] = own[name].detach().clone()
    return {name: out[name] for name in own}
