//===- Converters.cpp - one converter per ONNX op and opset form ----------===//
//
// Each converter either evaluates its node on host tensors (when everything it
// reads is known at import time: shape arithmetic, masks, position tables) or
// emits model-dialect ops. Shapes are computed and checked here so that a
// malformed model gets a diagnostic naming the node, not a verifier failure.
//
//===----------------------------------------------------------------------===//

#include "frontend/NodeImporter.h"
#include "ir/ModelDialect.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace mlir::fastllm;
namespace m = mlir::fastllm::model;

static std::string str(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

static RankedTensorType tensorOf(ArrayRef<int64_t> shape, Type elementType) {
  return RankedTensorType::get(shape, elementType);
}

static int64_t product(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Materialises a host tensor as an SSA constant.
static Value constant(NodeImporter &n, const HostTensor &t) {
  return n.getBuilder().create<m::ConstantOp>(n.getLoc(), t.toAttr());
}

/// A host tensor with another shape but the same elements (row-major).
static HostTensor reshaped(const HostTensor &t, ArrayRef<int64_t> shape) {
  HostTensor out = t;
  out.shape.assign(shape.begin(), shape.end());
  return out;
}

/// Emits a reshape unless the shape already matches.
static Value reshape(NodeImporter &n, Value v, ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  return n.create<m::ReshapeOp>(tensorOf(shape, type.getElementType()), v);
}

/// Output `out` becomes input `in` reshaped to `shape` (host or emitted).
static LogicalResult setReshaped(NodeImporter &n, unsigned in,
                                 ArrayRef<int64_t> shape) {
  if (product(shape) != product(n.inputShape(in)))
    return n.error() << "cannot reshape " << str(n.inputShape(in)) << " to "
                     << str(shape);
  if (const HostTensor *h = n.hostInput(in))
    n.setOutput(0, reshaped(*h, shape));
  else
    n.setOutput(0, reshape(n, n.operand(in), shape));
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// Host evaluation of an elementwise op over broadcast operands.
static HostTensor hostElementwise(
    ArrayRef<const HostTensor *> ins, ArrayRef<int64_t> shape, Type outType,
    llvm::function_ref<void(HostTensor &, int64_t, ArrayRef<int64_t>)> fn) {
  HostTensor out = HostTensor::filled(outType, shape, 0);
  SmallVector<int64_t> src(ins.size());
  forEachIndex(shape, [&](ArrayRef<int64_t> index, int64_t k) {
    for (auto [i, in] : llvm::enumerate(ins))
      src[i] = broadcastSourceIndex(index, in->shape);
    fn(out, k, src);
  });
  return out;
}

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

static FailureOr<SmallVector<int64_t>> broadcastInputs(NodeImporter &n,
                                                       unsigned a, unsigned b) {
  auto shape = broadcastShapes(n.inputShape(a), n.inputShape(b));
  if (!shape)
    return n.error() << "input shapes " << str(n.inputShape(a)) << " and "
                     << str(n.inputShape(b)) << " do not broadcast",
           failure();
  return *shape;
}

template <typename Fn>
static LogicalResult convertBinary(NodeImporter &n) {
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
    Value pow = n.create<typename Fn::Op>(tensorOf(*shape, rhsType), lhs, rhs);
    n.setOutput(0, n.create<m::CastOp>(tensorOf(*shape, lhsType), pow));
    return success();
  }
  if (lhsType != rhsType) // Pow with an integer exponent of another type.
    rhs = n.create<m::CastOp>(tensorOf(n.inputShape(1), lhsType), rhs);
  n.setOutput(0, n.create<typename Fn::Op>(tensorOf(*shape, lhsType), lhs, rhs));
  return success();
}

template <m::CmpPredicate Pred, typename T>
static bool compare(T x, T y) {
  switch (Pred) {
  case m::CmpPredicate::eq: return x == y;
  case m::CmpPredicate::ne: return x != y;
  case m::CmpPredicate::lt: return x < y;
  case m::CmpPredicate::le: return x <= y;
  case m::CmpPredicate::gt: return x > y;
  case m::CmpPredicate::ge: return x >= y;
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
    n.setOutput(0, hostElementwise(
                       {a, b}, *shape, i1,
                       [&](HostTensor &out, int64_t k, ArrayRef<int64_t> src) {
                         bool r = a->isFloat()
                                      ? compare<Pred>(a->floats[src[0]],
                                                      b->floats[src[1]])
                                      : compare<Pred>(a->ints[src[0]],
                                                      b->ints[src[1]]);
                         out.setInt(k, r);
                       }));
    return success();
  }
  n.setOutput(0, n.create<m::CmpOp>(tensorOf(*shape, i1), Pred, n.operand(0),
                                    n.operand(1)));
  return success();
}

namespace {
struct SqrtFn { using Op = m::SqrtOp; static double f(double x) { return std::sqrt(x); } };
struct ReciprocalFn { using Op = m::ReciprocalOp; static double f(double x) { return 1.0 / x; } };
struct ExpFn { using Op = m::ExpOp; static double f(double x) { return std::exp(x); } };
struct LogFn { using Op = m::LogOp; static double f(double x) { return std::log(x); } };
struct TanhFn { using Op = m::TanhOp; static double f(double x) { return std::tanh(x); } };
struct ErfFn { using Op = m::ErfOp; static double f(double x) { return std::erf(x); } };
struct SigmoidFn { using Op = m::SigmoidOp; static double f(double x) { return 1.0 / (1.0 + std::exp(-x)); } };
struct ReluFn { using Op = m::ReluOp; static double f(double x) { return x > 0 ? x : 0; } };
struct SinFn { using Op = m::SinOp; static double f(double x) { return std::sin(x); } };
struct CosFn { using Op = m::CosOp; static double f(double x) { return std::cos(x); } };
} // namespace

template <typename Fn>
static LogicalResult convertUnaryFloat(NodeImporter &n) {
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

static LogicalResult convertNeg(NodeImporter &n) {
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

static LogicalResult convertNot(NodeImporter &n) {
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

static LogicalResult convertWhere(NodeImporter &n) {
  if (!n.inputType(0).getElementType().isInteger(1))
    return n.error() << "the condition must be a bool tensor";
  Type elementType = n.inputType(1).getElementType();
  if (elementType != n.inputType(2).getElementType())
    return n.error() << "input element types differ: " << elementType
                     << " and " << n.inputType(2).getElementType();
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
    n.setOutput(0, hostElementwise({c, a, b}, *shape, elementType,
                                   [&](HostTensor &out, int64_t k,
                                       ArrayRef<int64_t> src) {
                                     const HostTensor *pick =
                                         c->ints[src[0]] ? a : b;
                                     int64_t s = c->ints[src[0]] ? src[1] : src[2];
                                     if (out.isFloat())
                                       out.floats[k] = pick->floats[s];
                                     else
                                       out.ints[k] = pick->ints[s];
                                   }));
    return success();
  }
  n.setOutput(0, n.create<m::SelectOp>(tensorOf(*shape, elementType),
                                       n.operand(0), n.operand(1),
                                       n.operand(2)));
  return success();
}

static LogicalResult convertCast(NodeImporter &n) {
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
  n.setOutput(0, n.create<m::CastOp>(tensorOf(n.inputShape(0), target),
                                     n.operand(0)));
  return success();
}

static LogicalResult convertIdentity(NodeImporter &n) {
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
/// else the graph holds (test/e2e/dropout.py computes it too).
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
static LogicalResult convertDropout(NodeImporter &n) {
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
        n.getLoc(), DenseElementsAttr::get(tensorOf({}, et),
                                           b.getFloatAttr(et, 0.0)));
    n.setOutput(1, n.create<m::CmpOp>(maskType, m::CmpPredicate::ne, kept,
                                      zero));
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Constants and shape arithmetic
//===----------------------------------------------------------------------===//

static LogicalResult convertConstant(NodeImporter &n) {
  auto err = [&]() { return n.error() << "value "; };
  Builder b(n.getContext());
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value", onnx::AttributeProto::TENSOR)) {
    auto t = decodeTensorProto(a->t(), n.getContext(), err);
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
    HostTensor t = HostTensor::filled(b.getF32Type(), {(int64_t)a->floats_size()}, 0);
    for (int k = 0; k < a->floats_size(); ++k)
      t.set(k, a->floats(k));
    n.setOutput(0, std::move(t));
    return success();
  }
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value_ints", onnx::AttributeProto::INTS)) {
    HostTensor t = HostTensor::filled(b.getI64Type(), {(int64_t)a->ints_size()}, 0);
    for (int k = 0; k < a->ints_size(); ++k)
      t.ints[k] = a->ints(k);
    n.setOutput(0, std::move(t));
    return success();
  }
  return n.error() << "only tensor, float and int constants are supported";
}

/// Reads a 1-D int64 shape input.
static FailureOr<SmallVector<int64_t>> shapeInput(NodeImporter &n, unsigned i,
                                                  StringRef what) {
  auto t = n.requireHostInput(i, what);
  if (failed(t))
    return failure();
  if ((*t)->shape.size() > 1 || (*t)->isFloat())
    return n.error() << what << " must be a 1-D integer tensor", failure();
  return (*t)->toInts();
}

static LogicalResult convertShape(NodeImporter &n) {
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

static LogicalResult convertSize(NodeImporter &n) {
  HostTensor out = HostTensor::filled(n.getBuilder().getI64Type(), {}, 0);
  out.ints[0] = product(n.inputShape(0));
  n.setOutput(0, std::move(out));
  return success();
}

static LogicalResult convertConstantOfShape(NodeImporter &n) {
  auto shape = shapeInput(n, 0, "the shape");
  if (failed(shape))
    return failure();
  for (int64_t d : *shape)
    if (d < 0)
      return n.error() << "negative dim in shape " << str(*shape);
  if (failed(n.checkFoldSize(*shape)))
    return failure();
  HostTensor fill = HostTensor::filled(n.getBuilder().getF32Type(), {}, 0);
  if (const onnx::AttributeProto *a =
          n.typedAttribute("value", onnx::AttributeProto::TENSOR)) {
    auto t = decodeTensorProto(a->t(), n.getContext(),
                               [&]() { return n.error() << "value "; });
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

static LogicalResult convertRange(NodeImporter &n) {
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

static LogicalResult convertReshape(NodeImporter &n) {
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
        return n.error() << "shape " << str(*target) << " copies dim " << i
                         << " that the input " << str(in) << " lacks";
      d = in[i];
    }
    if (d == -1) {
      if (inferred >= 0)
        return n.error() << "shape " << str(*target) << " has two -1 dims";
      inferred = i;
      shape.push_back(1);
      continue;
    }
    if (d < 0)
      return n.error() << "invalid dim " << d << " in shape " << str(*target);
    shape.push_back(d);
    known *= d;
  }
  int64_t total = product(in);
  if (inferred >= 0) {
    if (known == 0 || total % known)
      return n.error() << "cannot reshape " << str(in) << " to "
                       << str(*target);
    shape[inferred] = total / known;
  }
  return setReshaped(n, 0, shape);
}

static LogicalResult convertFlatten(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  int64_t axis = n.intAttr("axis", 1);
  if (axis < 0)
    axis += in.size();
  if (axis < 0 || axis > (int64_t)in.size())
    return n.error() << "axis " << n.intAttr("axis", 1)
                     << " is out of range for rank " << in.size();
  return setReshaped(n, 0, {product(in.take_front(axis)),
                            product(in.drop_front(axis))});
}

/// Axes from the input at `i` (opset 13+) or the `axes` attribute (older).
static FailureOr<std::optional<SmallVector<int64_t>>>
axesOperand(NodeImporter &n, unsigned i, bool fromInput) {
  if (!fromInput)
    return n.intsAttr("axes");
  if (!n.hasInput(i))
    return std::optional<SmallVector<int64_t>>();
  auto axes = shapeInput(n, i, "axes");
  if (failed(axes))
    return failure();
  return std::optional<SmallVector<int64_t>>(*axes);
}

/// Normalised, sorted, distinct axes.
static FailureOr<SmallVector<int64_t>>
normalizeAxes(NodeImporter &n, ArrayRef<int64_t> axes, int64_t rank) {
  SmallVector<int64_t> out;
  for (int64_t a : axes) {
    auto axis = n.normalizeAxis(a, rank);
    if (failed(axis))
      return failure();
    if (llvm::is_contained(out, *axis))
      return n.error() << "axis " << a << " is repeated", failure();
    out.push_back(*axis);
  }
  llvm::sort(out);
  return out;
}

static LogicalResult convertUnsqueeze(NodeImporter &n) {
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

static LogicalResult convertSqueeze(NodeImporter &n) {
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

static LogicalResult convertExpand(NodeImporter &n) {
  auto target = shapeInput(n, 1, "the shape");
  if (failed(target))
    return failure();
  auto shape = broadcastShapes(n.inputShape(0), *target);
  if (!shape)
    return n.error() << "cannot expand " << str(n.inputShape(0)) << " to "
                     << str(*target);
  if (const HostTensor *h = n.hostInput(0)) {
    if (failed(n.checkFoldSize(*shape)))
      return failure();
    n.setOutput(0, hostElementwise({h}, *shape, h->elementType,
                                   [&](HostTensor &out, int64_t k,
                                       ArrayRef<int64_t> src) {
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
  n.setOutput(0, n.create<m::BroadcastOp>(
                     tensorOf(*shape, n.inputType(0).getElementType()),
                     n.operand(0)));
  return success();
}

static LogicalResult convertTrilu(NodeImporter &n) {
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
  HostTensor mask = HostTensor::filled(n.getBuilder().getI1Type(), {rows, cols}, 0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      mask.ints[i * cols + j] = keep(i, j);
  Type elementType = n.inputType(0).getElementType();
  Value zero = constant(n, HostTensor::filled(elementType, {}, 0));
  n.setOutput(0, n.create<m::SelectOp>(n.inputType(0), constant(n, mask),
                                       n.operand(0), zero));
  return success();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

static LogicalResult convertTranspose(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  SmallVector<int64_t> perm;
  if (auto attr = n.intsAttr("perm"))
    perm = *attr;
  else
    for (int64_t i = in.size() - 1; i >= 0; --i)
      perm.push_back(i);
  SmallVector<bool> seen(in.size(), false);
  if (perm.size() != in.size())
    return n.error() << "perm " << str(perm) << " does not match rank "
                     << in.size();
  SmallVector<int64_t> shape;
  for (int64_t p : perm) {
    if (p < 0 || p >= (int64_t)in.size() || seen[p])
      return n.error() << "perm " << str(perm) << " is not a permutation";
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
  n.setOutput(0, n.create<m::TransposeOp>(
                     tensorOf(shape, n.inputType(0).getElementType()),
                     n.operand(0), perm));
  return success();
}

static LogicalResult convertConcat(NodeImporter &n) {
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
      return n.error() << "cannot concatenate " << str(first) << " and "
                       << str(s) << " along axis " << *axis;
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
  n.setOutput(0, n.create<m::ConcatOp>(tensorOf(shape, elementType), operands,
                                       *axis));
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

static LogicalResult convertSlice(NodeImporter &n) {
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
    limit[i] = shape[i] == 0 ? start[i] : start[i] + (shape[i] - 1) * step[i] + 1;
    if (shape[i] == 0)
      start[i] = limit[i] = std::min(start[i], in[i]);
  }
  n.setOutput(0, n.create<m::SliceOp>(
                     tensorOf(shape, n.inputType(0).getElementType()),
                     n.operand(0), start, limit, step));
  return success();
}

static LogicalResult convertSplit(NodeImporter &n) {
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
    return n.error() << "split has " << sizes.size() << " sizes for "
                     << outputs << " outputs";
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0)
      return n.error() << "negative split size " << s;
    total += s;
  }
  if (total != dim)
    return n.error() << "split sizes " << str(sizes) << " add up to " << total
                     << " but dim " << *axis << " has size " << dim;
  Type elementType = n.inputType(0).getElementType();
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
  SmallVector<Type> types;
  for (int64_t s : sizes) {
    SmallVector<int64_t> shape(in);
    shape[*axis] = s;
    types.push_back(tensorOf(shape, elementType));
  }
  auto op = n.getBuilder().create<m::SplitOp>(n.getLoc(), types, n.operand(0),
                                              *axis, sizes);
  for (auto [i, r] : llvm::enumerate(op.getResults()))
    n.setOutput(i, r);
  return success();
}

static LogicalResult convertGather(NodeImporter &n) {
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
      int64_t src = (o * dim + indices->ints[rest / inner]) * inner + rest % inner;
      if (out.isFloat())
        out.floats[k] = data->floats[src];
      else
        out.ints[k] = data->ints[src];
    });
    n.setOutput(0, std::move(out));
    return success();
  }
  Value idx = indices ? constant(n, *indices) : n.operand(1);
  n.setOutput(0, n.create<m::GatherOp>(tensorOf(shape, elementType),
                                       n.operand(0), idx, *axis));
  return success();
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

static LogicalResult convertMatMul(NodeImporter &n) {
  if (failed(n.requireFloat(0)) || failed(n.requireFloat(1)))
    return failure();
  Type elementType = n.inputType(0).getElementType();
  if (n.inputType(1).getElementType() != elementType)
    return n.error() << "input element types differ";
  SmallVector<int64_t> a(n.inputShape(0)), b(n.inputShape(1));
  if (a.empty() || b.empty())
    return n.error() << "inputs must have rank >= 1";
  // 1-D operands are promoted to matrices and the extra dim dropped after.
  bool vecA = a.size() == 1, vecB = b.size() == 1;
  if (vecA)
    a.insert(a.begin(), 1);
  if (vecB)
    b.push_back(1);
  if (a.back() != b[b.size() - 2])
    return n.error() << "inner dims differ: " << str(n.inputShape(0)) << " x "
                     << str(n.inputShape(1));
  auto batch = broadcastShapes(ArrayRef<int64_t>(a).drop_back(2),
                               ArrayRef<int64_t>(b).drop_back(2));
  if (!batch)
    return n.error() << "batch dims of " << str(n.inputShape(0)) << " and "
                     << str(n.inputShape(1)) << " do not broadcast";
  SmallVector<int64_t> shape(*batch);
  shape.push_back(a[a.size() - 2]);
  shape.push_back(b.back());
  Value lhs = reshape(n, n.operand(0), a), rhs = reshape(n, n.operand(1), b);
  Value result = n.create<m::MatmulOp>(tensorOf(shape, elementType), lhs, rhs);
  SmallVector<int64_t> final(*batch);
  if (!vecA)
    final.push_back(a[a.size() - 2]);
  if (!vecB)
    final.push_back(b.back());
  n.setOutput(0, reshape(n, result, final));
  return success();
}

static Value transpose2d(NodeImporter &n, Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  return n.create<m::TransposeOp>(
      tensorOf({type.getDimSize(1), type.getDimSize(0)}, type.getElementType()),
      v, ArrayRef<int64_t>{1, 0});
}

static LogicalResult convertGemm(NodeImporter &n) {
  if (failed(n.requireFloat(0)) || failed(n.requireFloat(1)))
    return failure();
  ArrayRef<int64_t> a = n.inputShape(0), b = n.inputShape(1);
  if (a.size() != 2 || b.size() != 2)
    return n.error() << "A and B must be matrices, got " << str(a) << " and "
                     << str(b);
  bool transA = n.intAttr("transA", 0), transB = n.intAttr("transB", 0);
  float alpha = n.floatAttr("alpha", 1.0f), beta = n.floatAttr("beta", 1.0f);
  int64_t M = transA ? a[1] : a[0], K = transA ? a[0] : a[1];
  int64_t K2 = transB ? b[1] : b[0], N = transB ? b[0] : b[1];
  if (K != K2)
    return n.error() << "inner dims differ: " << str(a)
                     << (transA ? "^T" : "") << " x " << str(b)
                     << (transB ? "^T" : "");
  Type elementType = n.inputType(0).getElementType();
  RankedTensorType resultType = tensorOf({M, N}, elementType);
  Value lhs = n.operand(0), rhs = n.operand(1);
  if (transA)
    lhs = transpose2d(n, lhs);
  if (transB)
    rhs = transpose2d(n, rhs);
  Value result = n.create<m::MatmulOp>(resultType, lhs, rhs);
  if (alpha != 1.0f)
    result = n.create<m::MulOp>(
        resultType, result,
        constant(n, HostTensor::filled(elementType, {}, alpha)));
  if (n.hasInput(2) && beta != 0.0f) {
    auto shape = broadcastShapes({M, N}, n.inputShape(2));
    if (!shape || ArrayRef<int64_t>(*shape) != ArrayRef<int64_t>{M, N})
      return n.error() << "C of shape " << str(n.inputShape(2))
                       << " does not broadcast to [" << M << ", " << N << "]";
    Value c = n.operand(2);
    if (beta != 1.0f)
      c = n.create<m::MulOp>(
          n.inputType(2), c,
          constant(n, HostTensor::filled(elementType, {}, beta)));
    result = n.create<m::AddOp>(resultType, result, c);
  }
  n.setOutput(0, result);
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions, normalisation, softmax
//===----------------------------------------------------------------------===//

template <typename OpTy, bool AxesFromInputSince13>
static LogicalResult convertReduce(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  // ReduceSum takes axes as an input from opset 13, the others from 18.
  bool fromInput = AxesFromInputSince13 || n.getOpset() >= 18;
  auto axes = axesOperand(n, 1, fromInput);
  if (failed(axes))
    return failure();
  bool keepDims = n.intAttr("keepdims", 1) != 0;
  SmallVector<int64_t> dims;
  if (*axes && !(*axes)->empty()) {
    auto sorted = normalizeAxes(n, **axes, in.size());
    if (failed(sorted))
      return failure();
    dims = *sorted;
  } else if (n.intAttr("noop_with_empty_axes", 0)) {
    n.forwardInput(0, 0);
    return success();
  } else {
    for (size_t i = 0; i < in.size(); ++i)
      dims.push_back(i);
  }
  SmallVector<int64_t> shape;
  for (auto [i, d] : llvm::enumerate(in)) {
    if (!llvm::is_contained(dims, (int64_t)i))
      shape.push_back(d);
    else if (keepDims)
      shape.push_back(1);
  }
  auto op = n.getBuilder().create<OpTy>(
      n.getLoc(), tensorOf(shape, n.inputType(0).getElementType()),
      n.operand(0), dims, keepDims);
  n.setOutput(0, op.getResult());
  return success();
}

template <typename OpTy>
static LogicalResult convertSoftmax(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  auto axis = n.normalizeAxis(n.intAttr("axis", -1), n.inputType(0).getRank());
  if (failed(axis))
    return failure();
  n.setOutput(0, n.create<OpTy>(n.inputType(0), n.operand(0), *axis));
  return success();
}

static LogicalResult convertLayerNorm(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  RankedTensorType type = n.inputType(0);
  auto axis = n.normalizeAxis(n.intAttr("axis", -1), type.getRank());
  if (failed(axis))
    return failure();
  if (n.outputUsed(1) || n.outputUsed(2))
    return n.error() << "the Mean and InvStdDev outputs are not supported";
  ArrayRef<int64_t> normalized = type.getShape().drop_front(*axis);
  auto affine = [&](unsigned i) -> FailureOr<Value> {
    if (n.inputType(i).getElementType() != type.getElementType())
      return n.error() << "scale and bias must have the input's element type",
             failure();
    if (product(n.inputShape(i)) != product(normalized))
      return n.error() << "scale/bias of shape " << str(n.inputShape(i))
                       << " does not match the normalised shape "
                       << str(normalized),
             failure();
    return reshape(n, n.operand(i), normalized);
  };
  auto scale = affine(1);
  if (failed(scale))
    return failure();
  Value bias;
  if (n.hasInput(2)) {
    auto b = affine(2);
    if (failed(b))
      return failure();
    bias = *b;
  }
  float eps = n.floatAttr("epsilon", 1e-5f);
  if (!std::isfinite(eps) || eps <= 0)
    return n.error() << "epsilon must be finite and positive, got " << eps;
  n.setOutput(0, n.create<m::LayerNormOp>(type, n.operand(0), *scale, bias,
                                          n.getBuilder().getI64IntegerAttr(*axis),
                                          n.getBuilder().getF32FloatAttr(eps)));
  return success();
}

/// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: inputs are
/// [N, C, d1..dk] with targets [N, d1..dk]; the model ops want classes last.
template <typename OpTy>
static LogicalResult convertLoss(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  if (n.hasInput(2))
    return n.error() << "class weights are not supported";
  RankedTensorType scores = n.inputType(0);
  ArrayRef<int64_t> s = scores.getShape(), t = n.inputShape(1);
  Type targetType = n.inputType(1).getElementType();
  if (!targetType.isInteger(64) && !targetType.isInteger(32))
    return n.error() << "labels must be int32 or int64, got " << targetType;
  if (s.size() < 2 || t.size() != s.size() - 1 || t[0] != s[0] ||
      t.drop_front() != s.drop_front(2))
    return n.error() << "scores " << str(s) << " and labels " << str(t)
                     << " do not match ([N, C, d...] and [N, d...])";
  std::string reduction = n.stringAttr("reduction", "mean");
  std::optional<m::LossReduction> red = m::symbolizeLossReduction(reduction);
  if (!red)
    return n.error() << "unknown reduction '" << reduction << "'";
  Value input = n.operand(0);
  SmallVector<int64_t> classesLast(t);
  classesLast.push_back(s[1]);
  if (s.size() > 2) {
    SmallVector<int64_t> perm{0};
    for (size_t i = 2; i < s.size(); ++i)
      perm.push_back(i);
    perm.push_back(1);
    input = n.create<m::TransposeOp>(tensorOf(classesLast, scores.getElementType()),
                                     input, perm);
  }
  IntegerAttr ignore;
  if (n.hasAttribute("ignore_index"))
    ignore = n.getBuilder().getI64IntegerAttr(n.intAttr("ignore_index", 0));
  SmallVector<int64_t> resultShape;
  if (*red == m::LossReduction::none)
    resultShape.assign(t.begin(), t.end());
  auto op = n.getBuilder().create<OpTy>(
      n.getLoc(), tensorOf(resultShape, scores.getElementType()), input,
      n.operand(1), ignore, *red);
  n.setOutput(0, op.getResult());
  if (n.outputUsed(1)) // log_prob, in the input's [N, C, d...] layout
    n.setOutput(1, n.create<m::LogSoftmaxOp>(scores, n.operand(0), 1));
  return success();
}

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

static const OnnxConverterEntry kConverters[] = {
    {"Add", 13, 2, convertBinary<AddFn>},
    {"Sub", 13, 2, convertBinary<SubFn>},
    {"Mul", 13, 2, convertBinary<MulFn>},
    {"Div", 13, 2, convertBinary<DivFn>},
    {"Pow", 13, 2, convertBinary<PowFn>},
    {"And", 7, 2, convertBinary<AndFn>},
    {"Or", 7, 2, convertBinary<OrFn>},
    {"Equal", 13, 2, convertCompare<m::CmpPredicate::eq>},
    {"Less", 13, 2, convertCompare<m::CmpPredicate::lt>},
    {"LessOrEqual", 12, 2, convertCompare<m::CmpPredicate::le>},
    {"Greater", 13, 2, convertCompare<m::CmpPredicate::gt>},
    {"GreaterOrEqual", 12, 2, convertCompare<m::CmpPredicate::ge>},
    {"Not", 1, 1, convertNot},
    {"Where", 9, 3, convertWhere},
    {"Sqrt", 13, 1, convertUnaryFloat<SqrtFn>},
    {"Reciprocal", 13, 1, convertUnaryFloat<ReciprocalFn>},
    {"Exp", 13, 1, convertUnaryFloat<ExpFn>},
    {"Log", 13, 1, convertUnaryFloat<LogFn>},
    {"Tanh", 13, 1, convertUnaryFloat<TanhFn>},
    {"Erf", 13, 1, convertUnaryFloat<ErfFn>},
    {"Sigmoid", 13, 1, convertUnaryFloat<SigmoidFn>},
    {"Relu", 13, 1, convertUnaryFloat<ReluFn>},
    {"Sin", 7, 1, convertUnaryFloat<SinFn>},
    {"Cos", 7, 1, convertUnaryFloat<CosFn>},
    {"Neg", 13, 1, convertNeg},
    {"Cast", 13, 1, convertCast},
    {"Identity", 13, 1, convertIdentity},
    {"Dropout", 13, 1, convertDropout},
    {"Constant", 13, 0, convertConstant},
    {"ConstantOfShape", 9, 1, convertConstantOfShape},
    {"Shape", 13, 1, convertShape},
    {"Size", 13, 1, convertSize},
    {"Range", 11, 3, convertRange},
    {"Reshape", 13, 2, convertReshape},
    {"Flatten", 13, 1, convertFlatten},
    {"Squeeze", 13, 1, convertSqueeze},
    {"Unsqueeze", 13, 2, convertUnsqueeze},
    {"Expand", 13, 2, convertExpand},
    {"Trilu", 14, 1, convertTrilu},
    {"Transpose", 13, 1, convertTranspose},
    {"Concat", 13, 1, convertConcat},
    {"Slice", 13, 3, convertSlice},
    {"Split", 13, 1, convertSplit},
    {"Gather", 13, 2, convertGather},
    {"MatMul", 13, 2, convertMatMul},
    {"Gemm", 13, 2, convertGemm},
    {"ReduceSum", 13, 1, convertReduce<m::ReduceSumOp, true>},
    {"ReduceMean", 13, 1, convertReduce<m::ReduceMeanOp, false>},
    {"ReduceMax", 13, 1, convertReduce<m::ReduceMaxOp, false>},
    {"Softmax", 13, 1, convertSoftmax<m::SoftmaxOp>},
    {"LogSoftmax", 13, 1, convertSoftmax<m::LogSoftmaxOp>},
    {"LayerNormalization", 17, 2, convertLayerNorm},
    {"SoftmaxCrossEntropyLoss", 13, 2, convertLoss<m::CrossEntropyOp>},
    {"NegativeLogLikelihoodLoss", 13, 2, convertLoss<m::NllLossOp>},
};

ArrayRef<OnnxConverterEntry> mlir::fastllm::getOnnxConverters() {
  return kConverters;
}

const OnnxConverterEntry *
mlir::fastllm::lookupOnnxConverter(StringRef opType, int64_t opset) {
  const OnnxConverterEntry *best = nullptr;
  for (const OnnxConverterEntry &e : kConverters)
    if (opType == e.opType && e.sinceVersion <= opset &&
        (!best || e.sinceVersion > best->sinceVersion))
      best = &e;
  return best;
}
