//===- ConvertElementwise.cpp - elementwise ONNX ops ------------*- C++ -*-===//
//
// Arithmetic, comparisons, logic, unary math, Where, Cast, Identity and
// Dropout. On host inputs they fold (integers checked for overflow); else they
// emit the model op of the same name, broadcasting as ONNX does.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

namespace {
struct AddFn {
  using Op = m::AddOp;
  static double f(double a, double b) { return a + b; }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    return !__builtin_add_overflow(a, b, &r);
  }
};
struct SubFn {
  using Op = m::SubOp;
  static double f(double a, double b) { return a - b; }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    return !__builtin_sub_overflow(a, b, &r);
  }
};
struct MulFn {
  using Op = m::MulOp;
  static double f(double a, double b) { return a * b; }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    return !__builtin_mul_overflow(a, b, &r);
  }
};
struct DivFn {
  using Op = m::DivOp;
  static double f(double a, double b) { return a / b; }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    if (b == 0 || (a == INT64_MIN && b == -1))
      return false; // division by zero is refused before; this overflows
    r = a / b;
    return true;
  }
};
struct PowFn {
  using Op = m::PowOp;
  static double f(double a, double b) { return std::pow(a, b); }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    double p = std::pow((double)a, (double)b);
    // 2^63 is exactly representable; anything at or past it is not an int64.
    if (!(p > -9223372036854775808.0 && p < 9223372036854775808.0))
      return false;
    r = (int64_t)p;
    return true;
  }
};
struct AndFn {
  using Op = m::AndOp;
  static double f(double a, double b) { return a != 0 && b != 0; }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    r = a != 0 && b != 0;
    return true;
  }
};
struct OrFn {
  using Op = m::OrOp;
  static double f(double a, double b) { return a != 0 || b != 0; }
  static bool i(int64_t a, int64_t b, int64_t &r) {
    r = a != 0 || b != 0;
    return true;
  }
};
} // namespace

/// The broadcast shape of inputs `a` and `b`, or a diagnostic.
static FailureOr<SmallVector<int64_t>> broadcastInputs(NodeImporter &n,
                                                       unsigned a, unsigned b) {
  auto shape = broadcastShapes(n.inputShape(a), n.inputShape(b));
  if (!shape)
    return n.error() << "input shapes " << shapeString(n.inputShape(a))
                     << " and " << shapeString(n.inputShape(b))
                     << " do not broadcast",
           failure();
  return *shape;
}

template <typename Fn> static LogicalResult convertBinary(NodeImporter &n) {
  Type lhsType = n.inputType(0).getElementType();
  Type rhsType = n.inputType(1).getElementType();
  bool isPow = std::is_same_v<Fn, PowFn>;
  if (lhsType != rhsType && !isPow)
    return n.error() << "input element types differ: " << lhsType << " and "
                     << rhsType;
  bool isLogical = std::is_same_v<Fn, AndFn> || std::is_same_v<Fn, OrFn>;
  if (isLogical && !lhsType.isInteger(1))
    return n.error() << "inputs must be bool tensors, got " << lhsType;
  auto shape = broadcastInputs(n, 0, 1);
  if (failed(shape))
    return failure();
  if (n.allInputsHost()) {
    if (failed(n.checkFoldSize(*shape)))
      return failure();
    const HostTensor *a = n.hostInput(0), *b = n.hostInput(1);
    if (std::is_same_v<Fn, DivFn> && !a->isFloat())
      for (int64_t v : b->ints)
        if (v == 0)
          return n.error() << "integer division by zero";
    bool isFloat = a->isFloat() || b->isFloat(); // Pow may mix the two
    bool overflow = false;
    HostTensor folded = hostElementwise(
        {a, b}, *shape, lhsType,
        [&](HostTensor &out, int64_t k, ArrayRef<int64_t> src) {
          if (isFloat) {
            out.set(k, Fn::f(a->getDouble(src[0]), b->getDouble(src[1])));
            return;
          }
          int64_t r = 0;
          if (!Fn::i(a->ints[src[0]], b->ints[src[1]], r))
            overflow = true;
          // Narrower integers must hold the result too (int32 shape math).
          unsigned width = lhsType.getIntOrFloatBitWidth();
          if (width > 1 && width < 64 &&
              (r < -(int64_t(1) << (width - 1)) ||
               r >= (int64_t(1) << (width - 1))))
            overflow = true;
          out.setInt(k, r);
        });
    if (overflow)
      return n.error() << "integer overflow while folding constants";
    n.setOutput(0, std::move(folded));
    return success();
  }
  Value lhs = n.operand(0), rhs = n.operand(1);
  if (lhsType != rhsType && isa<FloatType>(rhsType)) {
    // Pow of an integer base by a float exponent: computed in float, then
    // truncated to the base's type, as ONNX (and NumPy) do.
    lhs = n.create<m::CastOp>(tensorOf(n.inputShape(0), rhsType), lhs);
    Value pow = n.createInferred<typename Fn::Op>(lhs, rhs);
    n.setOutput(0, n.create<m::CastOp>(tensorOf(*shape, lhsType), pow));
    return success();
  }
  if (lhsType != rhsType) // Pow with an integer exponent of another type.
    rhs = n.create<m::CastOp>(tensorOf(n.inputShape(1), lhsType), rhs);
  n.setOutput(0, n.createInferred<typename Fn::Op>(lhs, rhs));
  return success();
}

template <m::CmpPredicate Pred, typename T> static bool compare(T x, T y) {
  switch (Pred) {
  case m::CmpPredicate::eq:
    return x == y;
  case m::CmpPredicate::ne:
    return x != y;
  case m::CmpPredicate::lt:
    return x < y;
  case m::CmpPredicate::le:
    return x <= y;
  case m::CmpPredicate::gt:
    return x > y;
  case m::CmpPredicate::ge:
    return x >= y;
  }
  return false;
}

template <m::CmpPredicate Pred>
static LogicalResult convertCompare(NodeImporter &n) {
  Type lhsType = n.inputType(0).getElementType();
  if (lhsType != n.inputType(1).getElementType())
    return n.error() << "input element types differ: " << lhsType << " and "
                     << n.inputType(1).getElementType();
  auto shape = broadcastInputs(n, 0, 1);
  if (failed(shape))
    return failure();
  Type i1 = n.getBuilder().getI1Type();
  if (n.allInputsHost()) {
    if (failed(n.checkFoldSize(*shape)))
      return failure();
    const HostTensor *a = n.hostInput(0), *b = n.hostInput(1);
    n.setOutput(
        0, hostElementwise(
               {a, b}, *shape, i1,
               [&](HostTensor &out, int64_t k, ArrayRef<int64_t> src) {
                 bool r =
                     a->isFloat()
                         ? compare<Pred>(a->floats[src[0]], b->floats[src[1]])
                         : compare<Pred>(a->ints[src[0]], b->ints[src[1]]);
                 out.setInt(k, r);
               }));
    return success();
  }
  n.setOutput(0, n.createInferred<m::CmpOp>(Pred, n.operand(0), n.operand(1)));
  return success();
}

LogicalResult converters::convertAdd(NodeImporter &n) {
  return convertBinary<AddFn>(n);
}

LogicalResult converters::convertSub(NodeImporter &n) {
  return convertBinary<SubFn>(n);
}

LogicalResult converters::convertMul(NodeImporter &n) {
  return convertBinary<MulFn>(n);
}

LogicalResult converters::convertDiv(NodeImporter &n) {
  return convertBinary<DivFn>(n);
}

LogicalResult converters::convertPow(NodeImporter &n) {
  return convertBinary<PowFn>(n);
}

LogicalResult converters::convertAnd(NodeImporter &n) {
  return convertBinary<AndFn>(n);
}

LogicalResult converters::convertOr(NodeImporter &n) {
  return convertBinary<OrFn>(n);
}

LogicalResult converters::convertEqual(NodeImporter &n) {
  return convertCompare<m::CmpPredicate::eq>(n);
}

LogicalResult converters::convertLess(NodeImporter &n) {
  return convertCompare<m::CmpPredicate::lt>(n);
}

LogicalResult converters::convertLessOrEqual(NodeImporter &n) {
  return convertCompare<m::CmpPredicate::le>(n);
}

LogicalResult converters::convertGreater(NodeImporter &n) {
  return convertCompare<m::CmpPredicate::gt>(n);
}

LogicalResult converters::convertGreaterOrEqual(NodeImporter &n) {
  return convertCompare<m::CmpPredicate::ge>(n);
}

namespace {
struct SqrtFn {
  using Op = m::SqrtOp;
  static double f(double x) { return std::sqrt(x); }
};
struct ReciprocalFn {
  using Op = m::ReciprocalOp;
  static double f(double x) { return 1.0 / x; }
};
struct ExpFn {
  using Op = m::ExpOp;
  static double f(double x) { return std::exp(x); }
};
struct LogFn {
  using Op = m::LogOp;
  static double f(double x) { return std::log(x); }
};
struct TanhFn {
  using Op = m::TanhOp;
  static double f(double x) { return std::tanh(x); }
};
struct ErfFn {
  using Op = m::ErfOp;
  static double f(double x) { return std::erf(x); }
};
struct SigmoidFn {
  using Op = m::SigmoidOp;
  static double f(double x) { return 1.0 / (1.0 + std::exp(-x)); }
};
struct ReluFn {
  using Op = m::ReluOp;
  static double f(double x) { return x > 0 ? x : 0; }
};
struct SinFn {
  using Op = m::SinOp;
  static double f(double x) { return std::sin(x); }
};
struct CosFn {
  using Op = m::CosOp;
  static double f(double x) { return std::cos(x); }
};
} // namespace

template <typename Fn> static LogicalResult convertUnaryFloat(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  if (const HostTensor *h = n.hostInput(0)) {
    HostTensor out = *h;
    for (int64_t k = 0, e = out.numElements(); k < e; ++k)
      out.set(k, Fn::f(h->floats[k]));
    n.setOutput(0, std::move(out));
    return success();
  }
  n.setOutput(0, n.create<typename Fn::Op>(n.inputType(0), n.operand(0)));
  return success();
}

LogicalResult converters::convertSqrt(NodeImporter &n) {
  return convertUnaryFloat<SqrtFn>(n);
}

LogicalResult converters::convertReciprocal(NodeImporter &n) {
  return convertUnaryFloat<ReciprocalFn>(n);
}

LogicalResult converters::convertExp(NodeImporter &n) {
  return convertUnaryFloat<ExpFn>(n);
}

LogicalResult converters::convertLog(NodeImporter &n) {
  return convertUnaryFloat<LogFn>(n);
}

LogicalResult converters::convertTanh(NodeImporter &n) {
  return convertUnaryFloat<TanhFn>(n);
}

LogicalResult converters::convertErf(NodeImporter &n) {
  return convertUnaryFloat<ErfFn>(n);
}

LogicalResult converters::convertSigmoid(NodeImporter &n) {
  return convertUnaryFloat<SigmoidFn>(n);
}

LogicalResult converters::convertRelu(NodeImporter &n) {
  return convertUnaryFloat<ReluFn>(n);
}

LogicalResult converters::convertSin(NodeImporter &n) {
  return convertUnaryFloat<SinFn>(n);
}

LogicalResult converters::convertCos(NodeImporter &n) {
  return convertUnaryFloat<CosFn>(n);
}

LogicalResult converters::convertNeg(NodeImporter &n) {
  if (const HostTensor *h = n.hostInput(0)) {
    HostTensor out = *h;
    for (int64_t k = 0, e = out.numElements(); k < e; ++k)
      if (out.isFloat())
        out.floats[k] = -out.floats[k];
      else if (out.ints[k] == INT64_MIN)
        return n.error() << "integer overflow while folding constants";
      else
        out.ints[k] = -out.ints[k];
    n.setOutput(0, std::move(out));
    return success();
  }
  n.setOutput(0, n.create<m::NegOp>(n.inputType(0), n.operand(0)));
  return success();
}

LogicalResult converters::convertNot(NodeImporter &n) {
  if (!n.inputType(0).getElementType().isInteger(1))
    return n.error() << "input must be a bool tensor";
  if (const HostTensor *h = n.hostInput(0)) {
    HostTensor out = *h;
    for (int64_t &v : out.ints)
      v = !v;
    n.setOutput(0, std::move(out));
    return success();
  }
  n.setOutput(0, n.create<m::NotOp>(n.inputType(0), n.operand(0)));
  return success();
}

LogicalResult converters::convertWhere(NodeImporter &n) {
  if (!n.inputType(0).getElementType().isInteger(1))
    return n.error() << "the condition must be a bool tensor";
  Type elementType = n.inputType(1).getElementType();
  if (elementType != n.inputType(2).getElementType())
    return n.error() << "input element types differ: " << elementType << " and "
                     << n.inputType(2).getElementType();
  auto shape01 = broadcastInputs(n, 0, 1);
  if (failed(shape01))
    return failure();
  auto shape = broadcastShapes(*shape01, n.inputShape(2));
  if (!shape)
    return n.error() << "input shapes do not broadcast";
  if (n.allInputsHost()) {
    if (failed(n.checkFoldSize(*shape)))
      return failure();
    const HostTensor *c = n.hostInput(0), *a = n.hostInput(1),
                     *b = n.hostInput(2);
    n.setOutput(0, hostElementwise(
                       {c, a, b}, *shape, elementType,
                       [&](HostTensor &out, int64_t k, ArrayRef<int64_t> src) {
                         const HostTensor *pick = c->ints[src[0]] ? a : b;
                         int64_t s = c->ints[src[0]] ? src[1] : src[2];
                         if (out.isFloat())
                           out.floats[k] = pick->floats[s];
                         else
                           out.ints[k] = pick->ints[s];
                       }));
    return success();
  }
  n.setOutput(0, n.createInferred<m::SelectOp>(n.operand(0), n.operand(1),
                                               n.operand(2)));
  return success();
}

LogicalResult converters::convertCast(NodeImporter &n) {
  int64_t to = n.intAttr("to", 0);
  Type target = convertOnnxElementType(n.getContext(), to);
  if (!target)
    return n.error() << "cast to unsupported element type "
                     << onnxDataTypeName(to);
  if (target == n.inputType(0).getElementType()) {
    n.forwardInput(0, 0);
    return success();
  }
  if (const HostTensor *h = n.hostInput(0)) {
    HostTensor out = HostTensor::filled(target, h->shape, 0);
    for (int64_t k = 0, e = out.numElements(); k < e; ++k) {
      if (h->isFloat())
        out.set(k, h->floats[k]);
      else
        out.setInt(k, h->ints[k]);
    }
    n.setOutput(0, std::move(out));
    return success();
  }
  n.setOutput(
      0, n.create<m::CastOp>(tensorOf(n.inputShape(0), target), n.operand(0)));
  return success();
}

LogicalResult converters::convertIdentity(NodeImporter &n) {
  if (!n.splitParameter(0, 0))
    n.forwardInput(0, 0);
  return success();
}

/// The one element of input `i`, which must be known at import time.
static FailureOr<double> hostScalar(NodeImporter &n, unsigned i,
                                    StringRef what) {
  auto t = n.requireHostInput(i, what);
  if (failed(t))
    return failure();
  if ((*t)->numElements() != 1)
    return n.error() << what << " must be a scalar", failure();
  return (*t)->getDouble(0);
}

/// The dropout site of a node: the 32-bit FNV-1a hash of its output's name,
/// which every compile of the same ONNX file gives the same value whatever
/// else the graph holds (test/EndToEnd/dropout.py computes it too).
static int64_t dropoutSite(StringRef outputName) {
  uint32_t h = 2166136261u;
  for (unsigned char c : outputName) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

/// Dropout is the identity in eval mode and, in any mode, with ratio 0 (what
/// `nn.Dropout(p)` modules export in training mode with p = 0). A real ratio
/// in training mode becomes model.dropout, whose mask is keyed by the run's
/// seed, the step, the sample and this node's site (runtime/Philox.h); the
/// node's own `seed` attribute is not used, the run's --seed is. The optional
/// mask output, when read, is computed from the same key.
LogicalResult converters::convertDropout(NodeImporter &n) {
  bool training = false;
  if (n.hasInput(2)) {
    auto mode = hostScalar(n, 2, "training_mode");
    if (failed(mode))
      return failure();
    training = *mode != 0;
  }
  double ratio = 0.5; // ONNX's default
  if (training) {
    if (n.hasInput(1)) {
      auto r = hostScalar(n, 1, "ratio");
      if (failed(r))
        return failure();
      ratio = *r;
    }
    char text[32];
    std::snprintf(text, sizeof text, "%g", ratio);
    // The op carries the ratio as an f32: the check is on that value, so a
    // ratio just below 1 that rounds to 1 is refused here too.
    if (!(ratio >= 0 && ratio < 1 && float(ratio) < 1.0f))
      return n.error() << "ratio must be in [0, 1), got " << text;
  }
  OpBuilder &b = n.getBuilder();
  RankedTensorType type = n.inputType(0);
  auto maskType = tensorOf(type.getShape(), b.getI1Type());
  if (!training || ratio == 0) {
    n.forwardInput(0, 0);
    // Nothing is dropped: the mask is all true (a splat, whatever the size).
    if (n.outputUsed(1))
      n.setOutput(1, b.create<m::ConstantOp>(
                         n.getLoc(), DenseElementsAttr::get(
                                         maskType, b.getBoolAttr(true))));
    return success();
  }
  if (failed(n.requireFloat(0)))
    return failure();
  FloatAttr ratioAttr = b.getF32FloatAttr(float(ratio));
  IntegerAttr site = b.getI64IntegerAttr(dropoutSite(n.getNode().output(0)));
  n.setOutput(0, n.create<m::DropoutOp>(type, n.operand(0), ratioAttr, site));
  if (n.outputUsed(1)) {
    // The mask is where the same dropout keeps a one: dropout(1) != 0, the
    // same site drawing the same words as the output's.
    Type et = type.getElementType();
    Value ones = b.create<m::ConstantOp>(
        n.getLoc(), DenseElementsAttr::get(type, b.getFloatAttr(et, 1.0)));
    Value kept = n.create<m::DropoutOp>(type, ones, ratioAttr, site);
    Value zero = b.create<m::ConstantOp>(
        n.getLoc(),
        DenseElementsAttr::get(tensorOf({}, et), b.getFloatAttr(et, 0.0)));
    n.setOutput(1, n.createInferred<m::CmpOp>(m::CmpPredicate::ne, kept, zero));
  }
  return success();
}
