//===- ConvertDataMovement.cpp - ops that move elements ---------*- C++ -*-===//
//
// Ops that move elements without computing on them: they fold on host
// inputs and otherwise emit the model op, after the ONNX rules (negative axes
// and indices, Slice's clamping) are resolved here.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

LogicalResult converters::convertTranspose(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  SmallVector<int64_t> perm;
  if (auto attr = n.intsAttr("perm"))
    perm = *attr;
  else
    for (int64_t i = in.size() - 1; i >= 0; --i)
      perm.push_back(i);
  SmallVector<bool> seen(in.size(), false);
  if (perm.size() != in.size())
    return n.error() << "perm " << shapeString(perm) << " does not match rank "
                     << in.size();
  SmallVector<int64_t> shape;
  for (int64_t p : perm) {
    if (p < 0 || p >= (int64_t)in.size() || seen[p])
      return n.error() << "perm " << shapeString(perm)
                       << " is not a permutation";
    seen[p] = true;
    shape.push_back(in[p]);
  }
  if (const HostTensor *h = n.hostInput(0)) {
    HostTensor out = HostTensor::filled(h->elementType, shape, 0);
    SmallVector<int64_t> inStrides = stridesOf(in);
    forEachIndex(shape, [&](ArrayRef<int64_t> index, int64_t k) {
      int64_t src = 0;
      for (size_t i = 0; i < perm.size(); ++i)
        src += index[i] * inStrides[perm[i]];
      if (out.isFloat())
        out.floats[k] = h->floats[src];
      else
        out.ints[k] = h->ints[src];
    });
    n.setOutput(0, std::move(out));
    return success();
  }
  n.setOutput(0, n.createInferred<m::TransposeOp>(n.operand(0), perm));
  return success();
}

LogicalResult converters::convertConcat(NodeImporter &n) {
  if (n.numInputs() == 0)
    return n.error() << "needs at least one input";
  ArrayRef<int64_t> first = n.inputShape(0);
  Type elementType = n.inputType(0).getElementType();
  auto axis = n.normalizeAxis(n.intAttr("axis", 0), first.size());
  if (failed(axis))
    return failure();
  SmallVector<int64_t> shape(first);
  shape[*axis] = 0;
  for (unsigned i = 0; i < n.numInputs(); ++i) {
    if (!n.hasInput(i))
      return n.error() << "input " << i << " is missing";
    ArrayRef<int64_t> s = n.inputShape(i);
    if (n.inputType(i).getElementType() != elementType)
      return n.error() << "input element types differ";
    bool ok = s.size() == first.size();
    for (size_t d = 0; ok && d < s.size(); ++d)
      ok = (int64_t)d == *axis || s[d] == first[d];
    if (!ok)
      return n.error() << "cannot concatenate " << shapeString(first) << " and "
                       << shapeString(s) << " along axis " << *axis;
    shape[*axis] += s[*axis];
  }
  if (n.allInputsHost()) {
    if (failed(n.checkFoldSize(shape)))
      return failure();
    HostTensor out = HostTensor::filled(elementType, shape, 0);
    int64_t outer = product(ArrayRef<int64_t>(shape).take_front(*axis));
    int64_t inner = product(ArrayRef<int64_t>(shape).drop_front(*axis + 1));
    int64_t offset = 0;
    for (unsigned i = 0; i < n.numInputs(); ++i) {
      const HostTensor *h = n.hostInput(i);
      int64_t len = h->shape[*axis];
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < len * inner; ++j) {
          int64_t dst = (o * shape[*axis] + offset) * inner + j;
          int64_t src = o * len * inner + j;
          if (out.isFloat())
            out.floats[dst] = h->floats[src];
          else
            out.ints[dst] = h->ints[src];
        }
      offset += len;
    }
    n.setOutput(0, std::move(out));
    return success();
  }
  SmallVector<Value> operands;
  for (unsigned i = 0; i < n.numInputs(); ++i)
    operands.push_back(n.operand(i));
  n.setOutput(0, n.createInferred<m::ConcatOp>(operands, *axis));
  return success();
}

/// Host slice with arbitrary (also negative) steps.
static HostTensor hostSlice(const HostTensor &h, ArrayRef<int64_t> starts,
                            ArrayRef<int64_t> steps, ArrayRef<int64_t> shape) {
  HostTensor out = HostTensor::filled(h.elementType, shape, 0);
  SmallVector<int64_t> strides = stridesOf(h.shape);
  forEachIndex(shape, [&](ArrayRef<int64_t> index, int64_t k) {
    int64_t src = 0;
    for (size_t i = 0; i < index.size(); ++i)
      src += (starts[i] + index[i] * steps[i]) * strides[i];
    if (out.isFloat())
      out.floats[k] = h.floats[src];
    else
      out.ints[k] = h.ints[src];
  });
  return out;
}

LogicalResult converters::convertSlice(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  int64_t rank = in.size();
  auto starts = shapeInput(n, 1, "starts");
  auto ends = shapeInput(n, 2, "ends");
  if (failed(starts) || failed(ends))
    return failure();
  SmallVector<int64_t> axes, steps;
  if (n.hasInput(3)) {
    auto a = shapeInput(n, 3, "axes");
    if (failed(a))
      return failure();
    axes = *a;
  } else {
    for (size_t i = 0; i < starts->size(); ++i)
      axes.push_back(i);
  }
  if (n.hasInput(4)) {
    auto s = shapeInput(n, 4, "steps");
    if (failed(s))
      return failure();
    steps = *s;
  } else {
    steps.assign(starts->size(), 1);
  }
  if (ends->size() != starts->size() || axes.size() != starts->size() ||
      steps.size() != starts->size())
    return n.error() << "starts, ends, axes and steps differ in length";

  SmallVector<int64_t> start(rank, 0), step(rank, 1), shape(in);
  SmallVector<bool> seen(rank, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    auto axis = n.normalizeAxis(axes[i], rank);
    if (failed(axis))
      return failure();
    if (seen[*axis])
      return n.error() << "axis " << axes[i] << " is repeated";
    seen[*axis] = true;
    int64_t dim = in[*axis], s = (*starts)[i], e = (*ends)[i], st = steps[i];
    if (st == 0)
      return n.error() << "step is zero";
    // ONNX: negative indices count from the end, then starts clamp to
    // [0, dim] ([0, dim-1] when stepping back) and ends to [0, dim]
    // ([-1, dim-1] when stepping back); INT64_MAX/MIN mean "to the end".
    if (s < 0)
      s += dim;
    if (e < 0)
      e += dim;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
    } else {
      s = std::clamp<int64_t>(s, 0, std::max<int64_t>(dim - 1, 0));
      e = std::clamp<int64_t>(e, -1, dim - 1);
    }
    int64_t len = st > 0 ? (e - s + st - 1) / st : (s - e + (-st) - 1) / (-st);
    if (dim == 0)
      len = 0;
    start[*axis] = s;
    step[*axis] = st;
    shape[*axis] = std::max<int64_t>(len, 0);
  }
  if (const HostTensor *h = n.hostInput(0)) {
    n.setOutput(0, hostSlice(*h, start, step, shape));
    return success();
  }
  SmallVector<int64_t> limit(rank);
  for (int64_t i = 0; i < rank; ++i) {
    if (step[i] < 0)
      return n.error() << "negative steps are only supported on values known "
                          "at import time";
    limit[i] =
        shape[i] == 0 ? start[i] : start[i] + (shape[i] - 1) * step[i] + 1;
    if (shape[i] == 0)
      start[i] = limit[i] = std::min(start[i], in[i]);
  }
  n.setOutput(0,
              n.createInferred<m::SliceOp>(n.operand(0), start, limit, step));
  return success();
}

LogicalResult converters::convertSplit(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  auto axis = n.normalizeAxis(n.intAttr("axis", 0), in.size());
  if (failed(axis))
    return failure();
  int64_t dim = in[*axis];
  int64_t outputs = n.numOutputs();
  SmallVector<int64_t> sizes;
  if (n.hasInput(1)) {
    auto s = shapeInput(n, 1, "split");
    if (failed(s))
      return failure();
    sizes = *s;
  } else if (n.getOpset() >= 18 && n.hasAttribute("num_outputs")) {
    int64_t parts = n.intAttr("num_outputs", outputs);
    if (parts <= 0)
      return n.error() << "num_outputs must be positive";
    int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  } else {
    if (outputs == 0 || dim % outputs)
      return n.error() << "dim " << *axis << " of size " << dim
                       << " does not split evenly into " << outputs << " parts";
    sizes.assign(outputs, dim / outputs);
  }
  if ((int64_t)sizes.size() != outputs)
    return n.error() << "split has " << sizes.size() << " sizes for " << outputs
                     << " outputs";
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0)
      return n.error() << "negative split size " << s;
    total += s;
  }
  if (total != dim)
    return n.error() << "split sizes " << shapeString(sizes) << " add up to "
                     << total << " but dim " << *axis << " has size " << dim;
  if (const HostTensor *h = n.hostInput(0)) {
    SmallVector<int64_t> start(in.size(), 0), step(in.size(), 1);
    for (auto [i, s] : llvm::enumerate(sizes)) {
      SmallVector<int64_t> shape(in);
      shape[*axis] = s;
      n.setOutput(i, hostSlice(*h, start, step, shape));
      start[*axis] += s;
    }
    return success();
  }
  auto op =
      n.getBuilder().create<m::SplitOp>(n.getLoc(), n.operand(0), *axis, sizes);
  for (auto [i, r] : llvm::enumerate(op.getResults()))
    n.setOutput(i, r);
  return success();
}

LogicalResult converters::convertGather(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  if (in.empty())
    return n.error() << "data must have rank >= 1";
  auto axis = n.normalizeAxis(n.intAttr("axis", 0), in.size());
  if (failed(axis))
    return failure();
  Type indexType = n.inputType(1).getElementType();
  if (!indexType.isInteger(64) && !indexType.isInteger(32))
    return n.error() << "indices must be int32 or int64, got " << indexType;
  ArrayRef<int64_t> idxShape = n.inputShape(1);
  SmallVector<int64_t> shape(in.take_front(*axis));
  shape.append(idxShape.begin(), idxShape.end());
  shape.append(in.begin() + *axis + 1, in.end());
  int64_t dim = in[*axis];
  Type elementType = n.inputType(0).getElementType();

  // Indices known here are checked and made non-negative.
  std::optional<HostTensor> indices;
  if (const HostTensor *h = n.hostInput(1)) {
    indices = *h;
    for (int64_t &v : indices->ints) {
      if (v < -dim || v >= dim)
        return n.error() << "index " << v << " is out of range for dim "
                         << *axis << " of size " << dim;
      if (v < 0)
        v += dim;
    }
  }
  if (const HostTensor *data = n.hostInput(0); data && indices) {
    if (failed(n.checkFoldSize(shape)))
      return failure();
    HostTensor out = HostTensor::filled(elementType, shape, 0);
    int64_t inner = product(in.drop_front(*axis + 1));
    int64_t count = indices->numElements();
    forEachIndex(shape, [&](ArrayRef<int64_t> index, int64_t k) {
      int64_t o = k / (count * inner), rest = k % (count * inner);
      int64_t src =
          (o * dim + indices->ints[rest / inner]) * inner + rest % inner;
      if (out.isFloat())
        out.floats[k] = data->floats[src];
      else
        out.ints[k] = data->ints[src];
    });
    n.setOutput(0, std::move(out));
    return success();
  }
  Value idx = indices ? constant(n, *indices) : n.operand(1);
  n.setOutput(0, n.createInferred<m::GatherOp>(n.operand(0), idx, *axis));
  return success();
}
