//===- Fuse.cpp - recognise GELU, RMSNorm, SiLU and causal attention ------===//
//
// Exporters spell these out as chains of elementwise ops whose operands come
// in whatever order the model's Python wrote them. The patterns therefore
// look at a product as a multiset of factors (flattening nested model.mul
// ops whose intermediates have one use) instead of matching a fixed tree.
// Causal attention's mask is matched by value, not by form: KnownTensor
// reads it at compile time from constants and frozen parameters through
// the data movement and elementwise ops exporters put in between.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

namespace mlir::fastllm {
#define GEN_PASS_DEF_FUSEPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {

/// The value of a splat float constant.
std::optional<double> splatValue(Value v) {
  auto c = v.getDefiningOp<ConstantOp>();
  auto dense = c ? dyn_cast<DenseElementsAttr>(c.getValue()) : nullptr;
  if (!dense || !dense.isSplat() || !isa<FloatType>(dense.getElementType()))
    return std::nullopt;
  return dense.getSplatValue<APFloat>().convertToDouble();
}

bool isConstant(Value v, double expected) {
  std::optional<double> c = splatValue(v);
  return c &&
         std::abs(*c - expected) <= 1e-6 * std::max(1.0, std::abs(expected));
}

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

/// The factors of a product: `v` itself, or the factors of both operands of
/// a model.mul producing it when that mul has no other use (the root is
/// always expanded). Scalar factors are kept as values; the caller matches
/// them.
void collectFactors(Value v, bool isRoot, SmallVectorImpl<Value> &factors,
                    SmallVectorImpl<Operation *> &muls) {
  auto mul = v.getDefiningOp<MulOp>();
  if (mul && (isRoot || v.hasOneUse())) {
    muls.push_back(mul);
    collectFactors(mul.getLhs(), false, factors, muls);
    collectFactors(mul.getRhs(), false, factors, muls);
    return;
  }
  factors.push_back(v);
}

/// Removes one factor equal to a constant `c` from `factors`.
bool takeConstant(SmallVectorImpl<Value> &factors, double c) {
  for (auto *it = factors.begin(); it != factors.end(); ++it)
    if (isConstant(*it, c)) {
      factors.erase(it);
      return true;
    }
  return false;
}

/// Removes one factor equal to `v`.
bool takeValue(SmallVectorImpl<Value> &factors, Value v) {
  for (auto *it = factors.begin(); it != factors.end(); ++it)
    if (*it == v) {
      factors.erase(it);
      return true;
    }
  return false;
}

/// Matches `1 + y` (either order) with a single use; returns y.
Value matchOnePlus(Value v) {
  auto add = v.getDefiningOp<AddOp>();
  if (!add || !v.hasOneUse())
    return nullptr;
  if (isConstant(add.getLhs(), 1.0))
    return add.getRhs();
  if (isConstant(add.getRhs(), 1.0))
    return add.getLhs();
  return nullptr;
}

/// Matches `x / c` or `x * (1/c)` (either order); returns x.
Value matchScaledBy(Value v, double c) {
  if (!v.hasOneUse())
    return nullptr;
  if (auto div = v.getDefiningOp<DivOp>())
    return isConstant(div.getRhs(), c) ? div.getLhs() : nullptr;
  if (auto mul = v.getDefiningOp<MulOp>()) {
    if (isConstant(mul.getRhs(), 1.0 / c))
      return mul.getLhs();
    if (isConstant(mul.getLhs(), 1.0 / c))
      return mul.getRhs();
  }
  return nullptr;
}

/// True if `v` is x^3, as pow(x, 3) or a product of three x.
bool isCube(Value v, Value x) {
  if (!v.hasOneUse())
    return false;
  if (auto pow = v.getDefiningOp<PowOp>())
    return pow.getLhs() == x && isConstant(pow.getRhs(), 3.0);
  SmallVector<Value> factors;
  SmallVector<Operation *> muls;
  collectFactors(v, /*isRoot=*/true, factors, muls);
  return factors.size() == 3 &&
         llvm::all_of(factors, [&](Value f) { return f == x; });
}

/// True if `v` is x^2, as pow(x, 2) or x * x.
bool isSquare(Value v, Value x) {
  if (!v.hasOneUse())
    return false;
  if (auto pow = v.getDefiningOp<PowOp>())
    return pow.getLhs() == x && isConstant(pow.getRhs(), 2.0);
  auto mul = v.getDefiningOp<MulOp>();
  return mul && mul.getLhs() == x && mul.getRhs() == x;
}

/// GELU: the product 0.5 * x * (1 + erf(x/sqrt2)) or the tanh form.
struct GeluPattern : OpRewritePattern<MulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MulOp root,
                                PatternRewriter &rewriter) const override {
    SmallVector<Value> factors;
    SmallVector<Operation *> muls;
    collectFactors(root.getResult(), true, factors, muls);
    if (factors.size() != 3 || !takeConstant(factors, 0.5))
      return failure();
    for (int i = 0; i < 2; ++i) {
      Value x = factors[i], inner = matchOnePlus(factors[1 - i]);
      if (!inner || typeOf(x) != typeOf(root.getResult()))
        continue;
      if (auto erf = inner.getDefiningOp<ErfOp>()) {
        if (inner.hasOneUse() &&
            matchScaledBy(erf.getInput(), std::sqrt(2.0)) == x) {
          rewriter.replaceOpWithNewOp<GeluOp>(root, x, GeluApproximation::none);
          return success();
        }
      }
      if (auto tanh = inner.getDefiningOp<TanhOp>()) {
        if (inner.hasOneUse() && matchTanhArgument(tanh.getInput(), x)) {
          rewriter.replaceOpWithNewOp<GeluOp>(root, x, GeluApproximation::tanh);
          return success();
        }
      }
    }
    return failure();
  }

  /// sqrt(2/pi) * (x + 0.044715 * x^3), factors in any order.
  static bool matchTanhArgument(Value v, Value x) {
    if (!v.hasOneUse())
      return false;
    SmallVector<Value> outer;
    SmallVector<Operation *> muls;
    collectFactors(v, true, outer, muls);
    if (outer.size() != 2 || !takeConstant(outer, std::sqrt(2.0 / M_PI)))
      return false;
    auto add = outer[0].getDefiningOp<AddOp>();
    if (!add || !outer[0].hasOneUse())
      return false;
    for (auto [a, b] : {std::pair{add.getLhs(), add.getRhs()},
                        std::pair{add.getRhs(), add.getLhs()}}) {
      if (a != x || !b.hasOneUse())
        continue;
      SmallVector<Value> cubic;
      SmallVector<Operation *> cubicMuls;
      collectFactors(b, true, cubic, cubicMuls);
      if (!takeConstant(cubic, 0.044715))
        continue;
      // What remains is x^3: one pow/cube factor, or three x factors.
      if (cubic.size() == 1 && isCube(cubic[0], x))
        return true;
      if (cubic.size() == 3 &&
          llvm::all_of(cubic, [&](Value f) { return f == x; }))
        return true;
      if (cubic.size() == 2 && takeValue(cubic, x) && isSquare(cubic[0], x))
        return true;
    }
    return false;
  }
};

/// RMSNorm: x * r * w with r = 1 / sqrt(mean(x^2, trailing dims) + eps).
struct RmsNormPattern : OpRewritePattern<MulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MulOp root,
                                PatternRewriter &rewriter) const override {
    SmallVector<Value> factors;
    SmallVector<Operation *> muls;
    collectFactors(root.getResult(), true, factors, muls);
    if (factors.size() != 3)
      return failure();
    RankedTensorType type = typeOf(root.getResult());
    for (Value r : factors) {
      auto [x, eps, dim] = matchInverseRms(r);
      // A NaN, infinite or non-positive epsilon is no RMSNorm's: leave the
      // ops as they are.
      if (!x || typeOf(x) != type || !std::isfinite(eps) || !(eps > 0) ||
          !std::isfinite(float(eps)))
        continue;
      SmallVector<Value> rest(factors);
      if (!takeValue(rest, r) || !takeValue(rest, x))
        continue;
      Value w = rest[0];
      if (typeOf(w).getShape() != type.getShape().drop_front(dim) ||
          typeOf(w).getElementType() != type.getElementType())
        continue;
      rewriter.replaceOpWithNewOp<RmsNormOp>(root, x, w,
                                             rewriter.getI64IntegerAttr(dim),
                                             rewriter.getF32FloatAttr(eps));
      return success();
    }
    return failure();
  }

  /// 1 / sqrt(mean(x^2) + eps): returns x, eps and the first reduced dim.
  static std::tuple<Value, double, int64_t> matchInverseRms(Value r) {
    if (!r.hasOneUse())
      return {};
    Value sqrtArg;
    if (auto rsqrt = r.getDefiningOp<RsqrtOp>()) {
      sqrtArg = rsqrt.getInput();
    } else {
      Value s;
      if (auto div = r.getDefiningOp<DivOp>();
          div && isConstant(div.getLhs(), 1.0))
        s = div.getRhs();
      else if (auto rec = r.getDefiningOp<ReciprocalOp>())
        s = rec.getInput();
      auto sqrt = s ? s.getDefiningOp<SqrtOp>() : nullptr;
      if (!sqrt || !s.hasOneUse())
        return {};
      sqrtArg = sqrt.getInput();
    }
    auto add = sqrtArg.getDefiningOp<AddOp>();
    if (!add || !sqrtArg.hasOneUse())
      return {};
    for (auto [m, e] : {std::pair{add.getLhs(), add.getRhs()},
                        std::pair{add.getRhs(), add.getLhs()}}) {
      std::optional<double> eps = splatValue(e);
      auto mean = m.getDefiningOp<ReduceMeanOp>();
      if (!eps || !mean || !m.hasOneUse() || !mean.getKeepDims())
        continue;
      // The statistics must cover the trailing dims [dim, rank).
      int64_t rank = typeOf(mean.getInput()).getRank();
      ArrayRef<int64_t> dims = mean.getDims();
      if (dims.empty() || dims.back() != rank - 1 ||
          dims.back() - dims.front() + 1 != (int64_t)dims.size())
        continue;
      Value sq = mean.getInput();
      Value x;
      if (auto pow = sq.getDefiningOp<PowOp>())
        x = pow.getLhs();
      else if (auto mul = sq.getDefiningOp<MulOp>())
        x = mul.getLhs();
      if (x && isSquare(sq, x))
        return {x, *eps, dims.front()};
    }
    return {};
  }
};

/// SiLU: x * sigmoid(x).
struct SiluPattern : OpRewritePattern<MulOp> {
  SiluPattern(MLIRContext *context)
      : OpRewritePattern(context, /*benefit=*/1) {}
  LogicalResult matchAndRewrite(MulOp mul,
                                PatternRewriter &rewriter) const override {
    for (auto [x, s] : {std::pair{mul.getLhs(), mul.getRhs()},
                        std::pair{mul.getRhs(), mul.getLhs()}}) {
      auto sigmoid = s.getDefiningOp<SigmoidOp>();
      if (sigmoid && sigmoid.getInput() == x && s.hasOneUse() &&
          x.getType() == mul.getType()) {
        rewriter.replaceOpWithNewOp<SiluOp>(mul, x);
        return success();
      }
    }
    return failure();
  }
};

//===----------------------------------------------------------------------===//
// Compile-time values (attention masks)
//===----------------------------------------------------------------------===//

/// A tensor whose values are known at compile time, read one row (the last
/// dimension; a rank-0 tensor is one row of one element) at a time. Nothing
/// is materialised beyond a row per op, so a slice of a large buffer costs
/// only the rows it keeps. Elements are doubles, which hold every f32, bool
/// and integer below 2^53 exactly.
class KnownTensor {
public:
  explicit KnownTensor(RankedTensorType type) : type(type) {}
  virtual ~KnownTensor() = default;

  ArrayRef<int64_t> shape() const { return type.getShape(); }
  int64_t rowLength() const {
    return type.getRank() ? type.getShape().back() : 1;
  }

  /// Reads the row at `outer` (one index per dim but the last) into `row`
  /// (rowLength() elements); false when an element has no exact value.
  virtual bool readRow(ArrayRef<int64_t> outer,
                       MutableArrayRef<double> row) = 0;

  RankedTensorType type;
};

using KnownPtr = std::unique_ptr<KnownTensor>;

/// The row number of `outer` in `shape` (row-major over all dims but the last).
int64_t rowIndex(ArrayRef<int64_t> shape, ArrayRef<int64_t> outer) {
  int64_t index = 0;
  for (size_t d = 0; d < outer.size(); ++d)
    index = index * shape[d] + outer[d];
  return index;
}

/// `value` rounded to the element type `t`, or nullopt when `t` cannot hold
/// it (an integer out of range or with a fraction).
std::optional<double> roundTo(Type t, double value) {
  if (t.isInteger(1))
    return value != 0 ? 1.0 : 0.0;
  if (t.isF64())
    return value;
  if (t.isF32())
    return double(float(value));
  if (auto f = dyn_cast<FloatType>(t)) {
    APFloat v(value);
    bool lost;
    v.convert(f.getFloatSemantics(), APFloat::rmNearestTiesToEven, &lost);
    return v.convertToDouble();
  }
  auto i = dyn_cast<IntegerType>(t);
  if (!i || value != std::trunc(value) || std::abs(value) >= 0x1p53)
    return std::nullopt;
  unsigned w = i.getWidth();
  bool isUnsigned = i.isUnsigned();
  double lo = isUnsigned ? 0.0 : -std::ldexp(1.0, w - 1);
  double hi = std::ldexp(1.0, isUnsigned ? w : w - 1);
  if (value < lo || value >= hi)
    return std::nullopt;
  return value;
}

/// The elements of a constant or of a parameter's initial value: f32 bytes
/// (a resource blob or dense data), or DenseElementsAttr's iterators.
class KnownElements : public KnownTensor {
public:
  KnownElements(RankedTensorType type, ElementsAttr value) : KnownTensor(type) {
    bool f32 = type.getElementType().isF32();
    size_t bytes = type.getNumElements() * sizeof(float);
    if (auto res = dyn_cast<DenseResourceElementsAttr>(value)) {
      AsmResourceBlob *blob = res.getRawHandle().getBlob();
      if (f32 && blob && blob->getData().size() == bytes)
        floats = blob->getData().data();
      return;
    }
    dense = dyn_cast<DenseElementsAttr>(value);
    if (dense && f32 && !dense.isSplat() && dense.getRawData().size() == bytes)
      floats = dense.getRawData().data();
  }

  bool known() const { return floats || dense; }

  bool readRow(ArrayRef<int64_t> outer, MutableArrayRef<double> row) override {
    int64_t length = rowLength();
    int64_t base = rowIndex(shape(), outer) * length;
    if (floats) {
      for (int64_t j = 0; j < length; ++j) {
        float v;
        std::memcpy(&v, floats + (base + j) * sizeof(float), sizeof(float));
        row[j] = v;
      }
      return true;
    }
    if (dense.isSplat())
      base = 0, length = 1;
    Type element = type.getElementType();
    if (element.isInteger(1)) {
      auto it = dense.value_begin<bool>() + base;
      for (int64_t j = 0; j < length; ++j, ++it)
        row[j] = *it;
    } else if (auto i = dyn_cast<IntegerType>(element)) {
      auto it = dense.value_begin<APInt>() + base;
      for (int64_t j = 0; j < length; ++j, ++it) {
        APInt v = *it;
        if (i.isUnsigned() ? v.getActiveBits() > 53
                           : v.getSignificantBits() > 53)
          return false;
        row[j] = i.isUnsigned() ? double(v.getZExtValue())
                                : double(v.getSExtValue());
      }
    } else if (isa<FloatType>(element)) {
      auto it = dense.value_begin<APFloat>() + base;
      for (int64_t j = 0; j < length; ++j, ++it)
        row[j] = (*it).convertToDouble();
    } else {
      return false;
    }
    if (dense.isSplat())
      std::fill(row.begin(), row.end(), row[0]);
    return true;
  }

private:
  const char *floats = nullptr; // f32 elements, little-endian
  DenseElementsAttr dense;
};

/// Reads the row `outer` of `source` broadcast (NumPy rules) to `shape`.
bool readBroadcast(KnownTensor &source, ArrayRef<int64_t> shape,
                   ArrayRef<int64_t> outer, MutableArrayRef<double> row) {
  ArrayRef<int64_t> from = source.shape();
  int64_t lead = shape.size() - from.size();
  SmallVector<int64_t> sourceOuter;
  for (int64_t d = 0; d + 1 < (int64_t)from.size(); ++d)
    sourceOuter.push_back(from[d] == 1 ? 0 : outer[d + lead]);
  if (source.rowLength() == (int64_t)row.size())
    return source.readRow(sourceOuter, row);
  // The source's last dim is 1 (or it is a scalar): one element, repeated.
  if (!source.readRow(sourceOuter, row.take_front()))
    return false;
  std::fill(row.begin(), row.end(), row[0]);
  return true;
}

/// model.slice: each kept row is one row of the input, strided.
class KnownSlice : public KnownTensor {
public:
  KnownSlice(SliceOp op, KnownPtr input)
      : KnownTensor(typeOf(op.getResult())), input(std::move(input)),
        start(op.getStart()), stride(op.getStride()),
        inputRow(this->input->rowLength()) {}

  bool readRow(ArrayRef<int64_t> outer, MutableArrayRef<double> row) override {
    SmallVector<int64_t> inputOuter;
    for (size_t d = 0; d < outer.size(); ++d)
      inputOuter.push_back(start[d] + outer[d] * stride[d]);
    if (!input->readRow(inputOuter, inputRow))
      return false;
    for (size_t j = 0; j < row.size(); ++j)
      row[j] = inputRow[start.back() + j * stride.back()];
    return true;
  }

private:
  KnownPtr input;
  SmallVector<int64_t> start, stride;
  SmallVector<double> inputRow;
};

/// model.reshape: rows are runs of the input's row-major elements; the last
/// input row read is kept, so reading rows in order reads each input row once.
class KnownReshape : public KnownTensor {
public:
  KnownReshape(ReshapeOp op, KnownPtr input)
      : KnownTensor(typeOf(op.getResult())), input(std::move(input)),
        inputRow(this->input->rowLength()) {}

  bool readRow(ArrayRef<int64_t> outer, MutableArrayRef<double> row) override {
    int64_t length = rowLength(), inputLength = input->rowLength();
    int64_t begin = rowIndex(shape(), outer) * length;
    for (int64_t done = 0; done < length;) {
      int64_t at = begin + done, r = at / inputLength,
              offset = at % inputLength;
      if (r != cachedRow) {
        // The outer index of input row r.
        ArrayRef<int64_t> in = input->shape();
        SmallVector<int64_t> inputOuter(in.empty() ? 0 : in.size() - 1);
        for (int64_t d = (int64_t)inputOuter.size() - 1, rest = r; d >= 0;
             --d) {
          inputOuter[d] = rest % in[d];
          rest /= in[d];
        }
        if (!input->readRow(inputOuter, inputRow))
          return false;
        cachedRow = r;
      }
      int64_t n = std::min(length - done, inputLength - offset);
      std::copy_n(inputRow.begin() + offset, n, row.begin() + done);
      done += n;
    }
    return true;
  }

private:
  KnownPtr input;
  SmallVector<double> inputRow;
  int64_t cachedRow = -1;
};

/// model.broadcast and the elementwise ops: `apply` computes the result's
/// row from the operands' (broadcast to it), false when an element has no
/// exact value.
class KnownMap : public KnownTensor {
public:
  using Apply = std::function<bool(ArrayRef<SmallVector<double>> operandRows,
                                   MutableArrayRef<double> row)>;
  KnownMap(RankedTensorType type, SmallVector<KnownPtr> operands, Apply apply)
      : KnownTensor(type), operands(std::move(operands)),
        apply(std::move(apply)),
        rows(this->operands.size(), SmallVector<double>(rowLength())) {}

  bool readRow(ArrayRef<int64_t> outer, MutableArrayRef<double> row) override {
    for (auto [operand, operandRow] : llvm::zip(operands, rows))
      if (!readBroadcast(*operand, shape(), outer, operandRow))
        return false;
    return apply(rows, row);
  }

private:
  SmallVector<KnownPtr> operands;
  Apply apply;
  SmallVector<SmallVector<double>> rows;
};

/// The KnownMap::Apply of an elementwise function `f` of N operands,
/// returning a double or, where a result may have no exact value, an
/// optional one.
template <size_t N, typename F> KnownMap::Apply elementwise(F f) {
  return [f](ArrayRef<SmallVector<double>> in, MutableArrayRef<double> row) {
    std::array<double, N> x;
    for (size_t j = 0; j < row.size(); ++j) {
      for (size_t k = 0; k < N; ++k)
        x[k] = in[k][j];
      std::optional<double> v = f(x);
      if (!v)
        return false;
      row[j] = *v;
    }
    return true;
  };
}

/// Builds the compile-time value of `v`: a model.constant, a `frozen`
/// parameter's initial value (a trainable one changes as it trains, so it is
/// never known), or pure data movement and elementwise ops of those. Null
/// when `v` is not known. `budget` bounds the ops visited (a DAG is read as
/// a tree).
KnownPtr buildKnown(Value v, int &budget) {
  if (--budget < 0)
    return nullptr;
  auto type = dyn_cast<RankedTensorType>(v.getType());
  Operation *op = v.getDefiningOp();
  if (!type || !op || type.getNumElements() == 0)
    return nullptr;
  auto leaf = [&](ElementsAttr value) -> KnownPtr {
    auto known = std::make_unique<KnownElements>(type, value);
    return known->known() ? std::move(known) : nullptr;
  };
  if (auto c = dyn_cast<ConstantOp>(op))
    return leaf(c.getValue());
  if (auto get = dyn_cast<GetParameterOp>(op)) {
    auto param = SymbolTable::lookupNearestSymbolFrom<ParameterOp>(
        get, get.getNameAttr());
    // A value still in the exporter's layout is not the parameter's.
    if (!param || !param.getFrozen() || !param.getInitialValue() ||
        param->hasAttr(kInitialValueTransposedAttr))
      return nullptr;
    return leaf(*param.getInitialValue());
  }

  if (!isa<SliceOp, ReshapeOp, BroadcastOp, CastOp, NotOp, NegOp, AndOp, OrOp,
           SelectOp, AddOp, SubOp, MulOp, CmpOp>(op) ||
      (type.getRank() == 0 && isa<SliceOp>(op)))
    return nullptr;
  SmallVector<KnownPtr> operands;
  for (Value operand : op->getOperands()) {
    operands.push_back(buildKnown(operand, budget));
    if (!operands.back())
      return nullptr;
  }
  if (auto slice = dyn_cast<SliceOp>(op))
    return std::make_unique<KnownSlice>(slice, std::move(operands[0]));
  if (auto reshape = dyn_cast<ReshapeOp>(op))
    return std::make_unique<KnownReshape>(reshape, std::move(operands[0]));

  Type element = type.getElementType();
  auto map = [&](KnownMap::Apply apply) -> KnownPtr {
    return std::make_unique<KnownMap>(type, std::move(operands),
                                      std::move(apply));
  };
  using X1 = std::array<double, 1>;
  using X2 = std::array<double, 2>;
  using X3 = std::array<double, 3>;
  // Arithmetic in double, rounded once to the result type: exact IEEE
  // results for f32 (and narrower) +, - and *.
  auto arith = [&](double (*f)(double, double)) {
    return map(elementwise<2>(
        [=](const X2 &x) { return roundTo(element, f(x[0], x[1])); }));
  };
  if (isa<BroadcastOp>(op))
    return map(elementwise<1>([](const X1 &x) { return x[0]; }));
  if (isa<CastOp>(op))
    return map(elementwise<1>([=](const X1 &x) -> std::optional<double> {
      // Float to integer truncates toward zero; to i1 is x != 0.
      if (isa<IntegerType>(element) && !element.isInteger(1))
        return std::isfinite(x[0]) ? roundTo(element, std::trunc(x[0]))
                                   : std::nullopt;
      return roundTo(element, x[0]);
    }));
  if (isa<NotOp>(op))
    return map(
        elementwise<1>([](const X1 &x) { return x[0] == 0 ? 1.0 : 0.0; }));
  if (isa<NegOp>(op))
    return map(
        elementwise<1>([=](const X1 &x) { return roundTo(element, -x[0]); }));
  if (isa<AndOp>(op))
    return map(elementwise<2>(
        [](const X2 &x) { return x[0] != 0 && x[1] != 0 ? 1.0 : 0.0; }));
  if (isa<OrOp>(op))
    return map(elementwise<2>(
        [](const X2 &x) { return x[0] != 0 || x[1] != 0 ? 1.0 : 0.0; }));
  if (isa<SelectOp>(op))
    return map(
        elementwise<3>([](const X3 &x) { return x[0] != 0 ? x[1] : x[2]; }));
  if (isa<AddOp>(op))
    return arith([](double a, double b) { return a + b; });
  if (isa<SubOp>(op))
    return arith([](double a, double b) { return a - b; });
  if (isa<MulOp>(op))
    return arith([](double a, double b) { return a * b; });
  if (auto cmp = dyn_cast<CmpOp>(op)) {
    auto compare = [](CmpPredicate p, double a, double b) {
      switch (p) {
      case CmpPredicate::eq:
        return a == b;
      case CmpPredicate::ne:
        return a != b;
      case CmpPredicate::lt:
        return a < b;
      case CmpPredicate::le:
        return a <= b;
      case CmpPredicate::gt:
        return a > b;
      case CmpPredicate::ge:
        return a >= b;
      }
      llvm_unreachable("unknown predicate");
    };
    return map(elementwise<2>([compare, p = cmp.getPredicate()](const X2 &x) {
      return compare(p, x[0], x[1]) ? 1.0 : 0.0;
    }));
  }
  return nullptr;
}

KnownPtr knownValue(Value v) {
  int budget = 64;
  return buildKnown(v, budget);
}

/// -inf, or a value so negative that exp() of it is 0 in float (float
/// lowest, which Hugging Face models fill with). -1e9 and the like are not.
bool isMaskedOut(double v) { return v <= -1e30; }

/// How a causal mask enters the attention scores.
enum class MaskForm {
  Future,   ///< select(mask, fill, scores): mask true where key j > query i
  Past,     ///< select(mask, scores, fill): mask true where j <= i
  Additive, ///< scores + mask: mask 0 where j <= i, -inf where j > i
};

/// True if `mask` is known at compile time (knownValue) and, over the
/// [t, t] it is broadcast to against scores [..., t, t] (its leading dims
/// 1), is exactly the causal pattern in `form`. Reads t * t elements once.
bool isCausalMask(Value mask, RankedTensorType scores, MaskForm form) {
  ArrayRef<int64_t> shape = typeOf(mask).getShape();
  int64_t rank = shape.size(), t = scores.getShape().back();
  if (rank < 2 || rank > (int64_t)scores.getRank() || shape[rank - 1] != t ||
      shape[rank - 2] != t || scores.getDimSize(scores.getRank() - 2) != t ||
      llvm::any_of(shape.drop_back(2), [](int64_t d) { return d != 1; }))
    return false;
  KnownPtr known = knownValue(mask);
  if (!known)
    return false;
  SmallVector<int64_t> outer(rank - 1, 0);
  SmallVector<double> row(t);
  for (int64_t i = 0; i < t; ++i) {
    outer.back() = i;
    if (!known->readRow(outer, row))
      return false;
    for (int64_t j = 0; j < t; ++j) {
      bool keep = j <= i, set = row[j] != 0;
      bool causal = form == MaskForm::Future ? set != keep
                    : form == MaskForm::Past ? set == keep
                    : keep                   ? row[j] == 0
                                             : isMaskedOut(row[j]);
      if (!causal)
        return false;
    }
  }
  return true;
}

/// True if `v` is a single element (broadcast) known to be -inf-like.
bool isFill(Value v) {
  if (typeOf(v).getNumElements() != 1)
    return false;
  KnownPtr known = knownValue(v);
  double value;
  SmallVector<int64_t> outer(std::max<int64_t>(typeOf(v).getRank() - 1, 0), 0);
  return known && known->readRow(outer, value) && isMaskedOut(value);
}

/// Scores and the mask applied to them, as matched in a softmax's input.
struct MaskedScores {
  Value scores, mask;
  MaskForm form;
};

/// The ways `masked` may be scores with a mask applied: a select with an
/// -inf-like fill, or an add (either operand may be the mask). The mask's
/// values are not checked yet.
SmallVector<MaskedScores, 2> maskedScores(Value masked) {
  SmallVector<MaskedScores, 2> found;
  RankedTensorType type = typeOf(masked);
  if (auto select = masked.getDefiningOp<SelectOp>()) {
    Value cond = select.getCondition();
    if (typeOf(select.getOnFalse()) == type && isFill(select.getOnTrue()))
      found.push_back({select.getOnFalse(), cond, MaskForm::Future});
    else if (typeOf(select.getOnTrue()) == type && isFill(select.getOnFalse()))
      found.push_back({select.getOnTrue(), cond, MaskForm::Past});
  } else if (auto add = masked.getDefiningOp<AddOp>()) {
    for (auto [scores, mask] : {std::pair{add.getLhs(), add.getRhs()},
                                std::pair{add.getRhs(), add.getLhs()}})
      if (typeOf(scores) == type)
        found.push_back({scores, mask, MaskForm::Additive});
  }
  return found;
}

/// Causal attention: softmax(mask(scale * q k^T)) v, the mask keeping keys
/// j <= i and known at compile time: a boolean mask selecting an -inf-like
/// fill, or an additive mask of 0 and -inf. Masks are read through slices,
/// reshapes, broadcasts, comparisons and casts of constants and of frozen
/// parameters (a registered buffer such as nanoGPT's `bias`), never of a
/// trainable parameter.
struct CausalAttentionPattern : OpRewritePattern<MatmulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MatmulOp root,
                                PatternRewriter &rewriter) const override {
    auto softmax = root.getLhs().getDefiningOp<SoftmaxOp>();
    if (!softmax || !root.getLhs().hasOneUse())
      return failure();
    Value masked = softmax.getInput();
    int64_t rank = typeOf(masked).getRank();
    if (rank < 2 || (int64_t)softmax.getDim() != rank - 1 ||
        !masked.hasOneUse())
      return failure();
    for (auto [scores, mask, form] : maskedScores(masked)) {
      auto qk = matchScaledProduct(scores);
      // The mask is read last: the check costs t * t elements.
      if (qk && isCausalMask(mask, typeOf(scores), form) &&
          succeeded(rewrite(root, qk->first, qk->second, rewriter)))
        return success();
    }
    return failure();
  }

  /// `scores` as scale * (q @ k^T) (the scale as a product or a division,
  /// or none), each value with no other use: the product and the scale.
  static std::optional<std::pair<MatmulOp, double>>
  matchScaledProduct(Value scores) {
    if (!scores.hasOneUse())
      return std::nullopt;
    double scale = 1.0;
    Value qk = scores;
    if (auto mul = scores.getDefiningOp<MulOp>()) {
      for (auto [x, c] : {std::pair{mul.getLhs(), mul.getRhs()},
                          std::pair{mul.getRhs(), mul.getLhs()}})
        if (std::optional<double> v = splatValue(c);
            v && x.getType() == scores.getType()) {
          scale = *v;
          qk = x;
        }
    } else if (auto div = scores.getDefiningOp<DivOp>()) {
      if (std::optional<double> v = splatValue(div.getRhs());
          v && *v != 0 && div.getLhs().getType() == scores.getType()) {
        scale = 1.0 / *v;
        qk = div.getLhs();
      }
    }
    if (qk != scores && !qk.hasOneUse())
      return std::nullopt;
    auto matmul = qk.getDefiningOp<MatmulOp>();
    if (!matmul || matmul.getTransposeLhs() || matmul.getTransposeRhs())
      return std::nullopt;
    return std::pair{matmul, scale};
  }

  /// Replaces `root` (softmax(...) @ v) by model.causal_attention of q and
  /// k, from `matmul` = q @ k^T, when the shapes are attention's.
  static LogicalResult rewrite(MatmulOp root, MatmulOp matmul, double scale,
                               PatternRewriter &rewriter) {
    int64_t rank = typeOf(root.getLhs()).getRank();
    Value q = matmul.getLhs(), kt = matmul.getRhs(), v = root.getRhs();
    RankedTensorType qType = typeOf(q), ktType = typeOf(kt), vType = typeOf(v);
    if (qType.getRank() != rank || ktType.getRank() != rank ||
        vType.getRank() != rank ||
        qType.getShape().drop_back(2) != ktType.getShape().drop_back(2) ||
        vType.getShape().drop_back() != qType.getShape().drop_back() ||
        qType.getShape().back() != ktType.getDimSize(rank - 2))
      return failure();

    // k itself, [..., t, d]: undo the transpose that made k^T when there is
    // one, else transpose k^T back.
    SmallVector<int64_t> swap;
    for (int64_t i = 0; i < rank; ++i)
      swap.push_back(i);
    std::swap(swap[rank - 1], swap[rank - 2]);
    Location loc = root.getLoc();
    Value k;
    if (auto t = kt.getDefiningOp<TransposeOp>(); t && kt.hasOneUse()) {
      SmallVector<int64_t> perm(t.getPermutation());
      std::swap(perm[rank - 1], perm[rank - 2]);
      bool identity = llvm::equal(perm, llvm::seq<int64_t>(0, rank));
      k = identity ? t.getInput()
                   : rewriter.create<TransposeOp>(loc, t.getInput(), perm)
                         .getResult();
    } else {
      k = rewriter.create<TransposeOp>(loc, kt, swap).getResult();
    }
    if (typeOf(k) != qType)
      return failure();
    auto attention = rewriter.create<CausalAttentionOp>(
        loc, q, k, v, rewriter.getF32FloatAttr(scale));
    rewriter.replaceOp(root, attention.getResult());
    return success();
  }
};

/// 1 / sqrt(x), as a reciprocal or a division, is model.rsqrt.
struct RsqrtPattern : RewritePattern {
  RsqrtPattern(MLIRContext *context)
      : RewritePattern(MatchAnyOpTypeTag(), /*benefit=*/1, context) {}
  LogicalResult matchAndRewrite(Operation *op,
                                PatternRewriter &rewriter) const override {
    Value s;
    if (auto rec = dyn_cast<ReciprocalOp>(op))
      s = rec.getInput();
    else if (auto div = dyn_cast<DivOp>(op);
             div && isConstant(div.getLhs(), 1.0))
      s = div.getRhs();
    auto sqrt = s ? s.getDefiningOp<SqrtOp>() : nullptr;
    if (!sqrt || !s.hasOneUse() || s.getType() != op->getResult(0).getType())
      return failure();
    rewriter.replaceOpWithNewOp<RsqrtOp>(op, sqrt.getInput());
    return success();
  }
};

struct FusePass : fastllm::impl::FusePassBase<FusePass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    // Larger patterns first: GELU and RMSNorm contain plain products.
    patterns.add<GeluPattern, RmsNormPattern, CausalAttentionPattern>(
        &getContext(), /*benefit=*/2);
    patterns.add<SiluPattern, RsqrtPattern>(&getContext());
    if (failed(
            applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};
} // namespace
