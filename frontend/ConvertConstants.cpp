//===- ConvertConstants.cpp - constants and shape arithmetic ----*- C++ -*-===//
//
// Constants, the shape queries (Shape, Size) and the ops that only reshape,
// expand or mask: exporters spell shape arithmetic with them, and it folds on
// the host once symbolic dims are bound. On run-time tensors they become
// model.reshape, model.broadcast or model.select.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

#include <cmath>

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

//===----------------------------------------------------------------------===//
// Constants and shape queries
//===----------------------------------------------------------------------===//

LogicalResult converters::convertConstant(NodeImporter &n) {
  Builder b(n.getContext());
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value", onnx::AttributeProto::TENSOR)) {
    auto t = n.decodeTensorAttribute(*a);
    if (failed(t))
      return failure();
    n.setOutput(0, std::move(*t));
    return success();
  }
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value_float", onnx::AttributeProto::FLOAT)) {
    n.setOutput(0, HostTensor::filled(b.getF32Type(), {}, a->f()));
    return success();
  }
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value_int", onnx::AttributeProto::INT)) {
    HostTensor t = HostTensor::filled(b.getI64Type(), {}, 0);
    t.ints[0] = a->i();
    n.setOutput(0, std::move(t));
    return success();
  }
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value_floats", onnx::AttributeProto::FLOATS)) {
    HostTensor t =
        HostTensor::filled(b.getF32Type(), {(int64_t)a->floats_size()}, 0);
    for (int k = 0; k < a->floats_size(); ++k)
      t.set(k, a->floats(k));
    n.setOutput(0, std::move(t));
    return success();
  }
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value_ints", onnx::AttributeProto::INTS)) {
    HostTensor t =
        HostTensor::filled(b.getI64Type(), {(int64_t)a->ints_size()}, 0);
    for (int k = 0; k < a->ints_size(); ++k)
      t.ints[k] = a->ints(k);
    n.setOutput(0, std::move(t));
    return success();
  }
  return n.error() << "only tensor, float and int constants are supported";
}

LogicalResult converters::convertShape(NodeImporter &n) {
  ArrayRef<int64_t> shape = n.inputShape(0);
  int64_t rank = shape.size();
  auto clampAxis = [&](int64_t a) {
    if (a < 0)
      a += rank;
    return std::clamp<int64_t>(a, 0, rank);
  };
  int64_t start = clampAxis(n.intAttr("start", 0));
  int64_t end = clampAxis(n.intAttr("end", rank));
  HostTensor out = HostTensor::filled(n.getBuilder().getI64Type(),
                                      {std::max<int64_t>(end - start, 0)}, 0);
  for (int64_t i = start; i < end; ++i)
    out.ints[i - start] = shape[i];
  n.setOutput(0, std::move(out));
  return success();
}

LogicalResult converters::convertSize(NodeImporter &n) {
  HostTensor out = HostTensor::filled(n.getBuilder().getI64Type(), {}, 0);
  out.ints[0] = product(n.inputShape(0));
  n.setOutput(0, std::move(out));
  return success();
}

LogicalResult converters::convertConstantOfShape(NodeImporter &n) {
  auto shape = shapeInput(n, 0, "the shape");
  if (failed(shape))
    return failure();
  for (int64_t d : *shape)
    if (d < 0)
      return n.error() << "negative dim in shape " << shapeString(*shape);
  if (failed(n.checkFoldSize(*shape)))
    return failure();
  HostTensor fill = HostTensor::filled(n.getBuilder().getF32Type(), {}, 0);
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value", onnx::AttributeProto::TENSOR)) {
    auto t = n.decodeTensorAttribute(*a);
    if (failed(t))
      return failure();
    if (t->numElements() != 1)
      return n.error() << "value must hold exactly one element";
    fill = std::move(*t);
  }
  HostTensor out = HostTensor::filled(fill.elementType, *shape, 0);
  for (int64_t k = 0, e = out.numElements(); k < e; ++k) {
    if (out.isFloat())
      out.floats[k] = fill.floats[0];
    else
      out.ints[k] = fill.ints[0];
  }
  n.setOutput(0, std::move(out));
  return success();
}

LogicalResult converters::convertRange(NodeImporter &n) {
  auto start = n.requireHostInput(0, "start");
  auto limit = n.requireHostInput(1, "limit");
  auto delta = n.requireHostInput(2, "delta");
  if (failed(start) || failed(limit) || failed(delta))
    return failure();
  for (const HostTensor *t : {*start, *limit, *delta})
    if (t->numElements() != 1)
      return n.error() << "start, limit and delta must be scalars";
  const HostTensor &s = **start;
  double d = (*delta)->getDouble(0);
  if (d == 0)
    return n.error() << "delta is zero";
  double count = std::ceil(((*limit)->getDouble(0) - s.getDouble(0)) / d);
  if (!(count < (double)kMaxFoldElements))
    count = (double)kMaxFoldElements + 1;
  int64_t size = std::max<int64_t>(0, (int64_t)count);
  if (failed(n.checkFoldSize({size})))
    return failure();
  HostTensor out = HostTensor::filled(s.elementType, {size}, 0);
  for (int64_t k = 0; k < size; ++k) {
    if (s.isFloat()) {
      out.set(k, s.getDouble(0) + k * d);
      continue;
    }
    int64_t step;
    if (__builtin_mul_overflow(k, (*delta)->ints[0], &step) ||
        __builtin_add_overflow(s.ints[0], step, &out.ints[k]))
      return n.error() << "integer overflow while folding constants";
  }
  n.setOutput(0, std::move(out));
  return success();
}

//===----------------------------------------------------------------------===//
// Reshapes, expansion, masks
//===----------------------------------------------------------------------===//

LogicalResult converters::convertReshape(NodeImporter &n) {
  auto target = shapeInput(n, 1, "the target shape");
  if (failed(target))
    return failure();
  ArrayRef<int64_t> in = n.inputShape(0);
  bool allowZero = n.intAttr("allowzero", 0) != 0;
  SmallVector<int64_t> shape;
  int64_t inferred = -1, known = 1;
  for (auto [i, d] : llvm::enumerate(*target)) {
    if (d == 0 && !allowZero) {
      if (i >= in.size())
        return n.error() << "shape " << shapeString(*target) << " copies dim "
                         << i << " that the input " << shapeString(in)
                         << " lacks";
      d = in[i];
    }
    if (d == -1) {
      if (inferred >= 0)
        return n.error() << "shape " << shapeString(*target)
                         << " has two -1 dims";
      inferred = i;
      shape.push_back(1);
      continue;
    }
    if (d < 0)
      return n.error() << "invalid dim " << d << " in shape "
                       << shapeString(*target);
    shape.push_back(d);
    known *= d;
  }
  int64_t total = product(in);
  if (inferred >= 0) {
    if (known == 0 || total % known)
      return n.error() << "cannot reshape " << shapeString(in) << " to "
                       << shapeString(*target);
    shape[inferred] = total / known;
  }
  return setReshaped(n, 0, shape);
}

LogicalResult converters::convertFlatten(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  int64_t axis = n.intAttr("axis", 1);
  if (axis < 0)
    axis += in.size();
  if (axis < 0 || axis > (int64_t)in.size())
    return n.error() << "axis " << n.intAttr("axis", 1)
                     << " is out of range for rank " << in.size();
  return setReshaped(
      n, 0, {product(in.take_front(axis)), product(in.drop_front(axis))});
}

LogicalResult converters::convertUnsqueeze(NodeImporter &n) {
  auto axes = axesOperand(n, 1, /*fromInput=*/true);
  if (failed(axes) || !*axes)
    return failed(axes) ? failure() : n.error() << "axes are missing";
  ArrayRef<int64_t> in = n.inputShape(0);
  int64_t rank = in.size() + (*axes)->size();
  auto sorted = normalizeAxes(n, **axes, rank);
  if (failed(sorted))
    return failure();
  SmallVector<int64_t> shape;
  for (int64_t i = 0, j = 0; i < rank; ++i)
    shape.push_back(llvm::is_contained(*sorted, i) ? 1 : in[j++]);
  return setReshaped(n, 0, shape);
}

LogicalResult converters::convertSqueeze(NodeImporter &n) {
  auto axes = axesOperand(n, 1, /*fromInput=*/true);
  if (failed(axes))
    return failure();
  ArrayRef<int64_t> in = n.inputShape(0);
  SmallVector<int64_t> sorted;
  if (*axes) {
    auto normalized = normalizeAxes(n, **axes, in.size());
    if (failed(normalized))
      return failure();
    sorted = *normalized;
    for (int64_t a : sorted)
      if (in[a] != 1)
        return n.error() << "cannot squeeze dim " << a << " of size " << in[a];
  } else {
    for (auto [i, d] : llvm::enumerate(in))
      if (d == 1)
        sorted.push_back(i);
  }
  SmallVector<int64_t> shape;
  for (auto [i, d] : llvm::enumerate(in))
    if (!llvm::is_contained(sorted, (int64_t)i))
      shape.push_back(d);
  return setReshaped(n, 0, shape);
}

LogicalResult converters::convertExpand(NodeImporter &n) {
  auto target = shapeInput(n, 1, "the shape");
  if (failed(target))
    return failure();
  auto shape = broadcastShapes(n.inputShape(0), *target);
  if (!shape)
    return n.error() << "cannot expand " << shapeString(n.inputShape(0))
                     << " to " << shapeString(*target);
  if (const HostTensor *h = n.hostInput(0)) {
    if (failed(n.checkFoldSize(*shape)))
      return failure();
    n.setOutput(0, hostElementwise(
                       {h}, *shape, h->elementType,
                       [&](HostTensor &out, int64_t k, ArrayRef<int64_t> src) {
                         if (out.isFloat())
                           out.floats[k] = h->floats[src[0]];
                         else
                           out.ints[k] = h->ints[src[0]];
                       }));
    return success();
  }
  if (ArrayRef<int64_t>(*shape) == n.inputShape(0)) {
    n.forwardInput(0, 0);
    return success();
  }
  n.setOutput(
      0, n.create<m::BroadcastOp>(
             tensorOf(*shape, n.inputType(0).getElementType()), n.operand(0)));
  return success();
}

LogicalResult converters::convertTrilu(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  if (in.size() < 2)
    return n.error() << "input must have rank >= 2, got " << in.size();
  int64_t k = 0;
  if (n.hasInput(1)) {
    auto kt = n.requireHostInput(1, "k");
    if (failed(kt))
      return failure();
    k = (*kt)->getInt(0);
  }
  bool upper = n.intAttr("upper", 1) != 0;
  int64_t rows = in[in.size() - 2], cols = in.back();
  auto keep = [&](int64_t i, int64_t j) {
    return upper ? j - i >= k : j - i <= k;
  };
  if (const HostTensor *h = n.hostInput(0)) {
    HostTensor out = *h;
    forEachIndex(in, [&](ArrayRef<int64_t> index, int64_t e) {
      if (!keep(index[index.size() - 2], index.back()))
        out.setInt(e, 0);
    });
    n.setOutput(0, std::move(out));
    return success();
  }
  // On a run-time tensor: select against a constant mask.
  HostTensor mask =
      HostTensor::filled(n.getBuilder().getI1Type(), {rows, cols}, 0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      mask.ints[i * cols + j] = keep(i, j);
  Type elementType = n.inputType(0).getElementType();
  Value zero = constant(n, HostTensor::filled(elementType, {}, 0));
  n.setOutput(
      0, n.createInferred<m::SelectOp>(constant(n, mask), n.operand(0), zero));
  return success();
}
