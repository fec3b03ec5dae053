//===- Fuse.cpp - recognise GELU, RMSNorm and SiLU -------------------------===//
//
// Exporters spell these out as chains of elementwise ops whose operands come
// in whatever order the model's Python wrote them. The patterns therefore
// look at a product as a multiset of factors (flattening nested model.mul
// ops whose intermediates have one use) instead of matching a fixed tree.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <cmath>

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
  return c && std::abs(*c - expected) <= 1e-6 * std::max(1.0, std::abs(expected));
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
  return factors.size() == 3 && llvm::all_of(factors, [&](Value f) { return f == x; });
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
  LogicalResult matchAndRewrite(MulOp root, PatternRewriter &rewriter) const override {
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
        if (inner.hasOneUse() && matchScaledBy(erf.getInput(), std::sqrt(2.0)) == x) {
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
      if (cubic.size() == 3 && llvm::all_of(cubic, [&](Value f) { return f == x; }))
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
  LogicalResult matchAndRewrite(MulOp root, PatternRewriter &rewriter) const override {
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
      rewriter.replaceOpWithNewOp<RmsNormOp>(root, type, x, w,
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
      if (auto div = r.getDefiningOp<DivOp>(); div && isConstant(div.getLhs(), 1.0))
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
  SiluPattern(MLIRContext *context) : OpRewritePattern(context, /*benefit=*/1) {}
  LogicalResult matchAndRewrite(MulOp mul, PatternRewriter &rewriter) const override {
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

/// Causal attention: softmax(mask(scale * q k^T)) v, the mask keeping
/// keys j <= i.
struct CausalAttentionPattern : OpRewritePattern<MatmulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MatmulOp root, PatternRewriter &rewriter) const override {
    auto softmax = root.getLhs().getDefiningOp<SoftmaxOp>();
    if (!softmax || !root.getLhs().hasOneUse())
      return failure();
    Value masked = softmax.getInput();
    int64_t rank = typeOf(masked).getRank();
    if (rank < 2 || softmax.getDim() != rank - 1 || !masked.hasOneUse())
      return failure();
    auto select = masked.getDefiningOp<SelectOp>();
    if (!select)
      return failure();
    // Either select(future, fill, scores) or select(past, scores, fill).
    Value scores;
    bool maskIsFuture;
    if (isFill(select.getOnTrue())) {
      scores = select.getOnFalse();
      maskIsFuture = true;
    } else if (isFill(select.getOnFalse())) {
      scores = select.getOnTrue();
      maskIsFuture = false;
    } else {
      return failure();
    }
    if (!scores.hasOneUse() || typeOf(scores) != typeOf(masked) ||
        !isCausalMask(select.getCondition(), typeOf(scores), maskIsFuture))
      return failure();
    // Optional scaling of the scores.
    double scale = 1.0;
    Value qk = scores;
    if (auto mul = scores.getDefiningOp<MulOp>()) {
      for (auto [x, c] : {std::pair{mul.getLhs(), mul.getRhs()},
                          std::pair{mul.getRhs(), mul.getLhs()}})
        if (std::optional<double> v = splatValue(c); v && x.getType() == scores.getType()) {
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
      return failure();
    auto matmul = qk.getDefiningOp<MatmulOp>();
    if (!matmul)
      return failure();
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
                   : rewriter.create<TransposeOp>(loc, qType, t.getInput(), perm)
                         .getResult();
    } else {
      k = rewriter.create<TransposeOp>(loc, qType, kt, swap).getResult();
    }
    if (typeOf(k) != qType)
      return failure();
    auto lseType = RankedTensorType::get(qType.getShape().drop_back(),
                                         qType.getElementType());
    auto attention = rewriter.create<CausalAttentionOp>(
        loc, root.getType(), lseType, q, k, v, rewriter.getF32FloatAttr(scale));
    rewriter.replaceOp(root, attention.getResult());
    return success();
  }

  /// -inf, or a value so negative that exp() of it is 0 in float.
  static bool isFill(Value v) {
    std::optional<double> c = splatValue(v);
    return c && *c <= -1e30;
  }

  /// `cond` is a constant [.., t, t] (leading dims 1) that is true exactly
  /// where key j > query i (future) or j <= i (past).
  static bool isCausalMask(Value cond, RankedTensorType scores, bool future) {
    auto c = cond.getDefiningOp<ConstantOp>();
    auto dense = c ? dyn_cast<DenseElementsAttr>(c.getValue()) : nullptr;
    if (!dense || !dense.getElementType().isInteger(1))
      return false;
    ArrayRef<int64_t> shape = typeOf(cond).getShape();
    int64_t t = scores.getShape().back();
    if (shape.size() < 2 || shape.back() != t || shape[shape.size() - 2] != t ||
        scores.getDimSize(scores.getRank() - 2) != t ||
        llvm::any_of(shape.drop_back(2), [](int64_t d) { return d != 1; }))
      return false;
    auto values = dense.getValues<bool>();
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j)
        if (values[i * t + j] != (future ? j > i : j <= i))
          return false;
    return true;
  }
};

/// 1 / sqrt(x), as a reciprocal or a division, is model.rsqrt.
struct RsqrtPattern : RewritePattern {
  RsqrtPattern(MLIRContext *context)
      : RewritePattern(MatchAnyOpTypeTag(), /*benefit=*/1, context) {}
  LogicalResult matchAndRewrite(Operation *op, PatternRewriter &rewriter) const override {
    Value s;
    if (auto rec = dyn_cast<ReciprocalOp>(op))
      s = rec.getInput();
    else if (auto div = dyn_cast<DivOp>(op); div && isConstant(div.getLhs(), 1.0))
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
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};
} // namespace
