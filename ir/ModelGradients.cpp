//===- ModelGradients.cpp - gradient rules of the model dialect -----------===//
//
// Each differentiable op builds the gradients of its operands from those of
// its results (GradientOpInterface). Rules are written with model ops, using
// the forward results where that is cheaper (exp, tanh, sqrt reuse y); the
// heavy ones (normalisations, softmax, losses, gather, slice) have dedicated
// backward ops so codegen can emit one fused kernel for each.
//
//===----------------------------------------------------------------------===//

#include "ir/ModelDialect.h"

#include "mlir/IR/Builders.h"

#include <cmath>

using namespace mlir;
using namespace mlir::fastllm::model;

namespace {
/// Small helpers that create model ops with the result type worked out.
class GradBuilder {
public:
  GradBuilder(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  static RankedTensorType type(Value v) {
    return cast<RankedTensorType>(v.getType());
  }

  Value scalar(double v, Type elementType) {
    auto t = RankedTensorType::get({}, elementType);
    Attribute attr = isa<FloatType>(elementType)
                         ? Attribute(b.getFloatAttr(elementType, v))
                         : Attribute(b.getIntegerAttr(elementType, (int64_t)v));
    return b.create<ConstantOp>(loc, DenseElementsAttr::get(t, attr));
  }
  Value scalarLike(double v, Value like) {
    return scalar(v, type(like).getElementType());
  }
  Value zerosLike(RankedTensorType t) {
    return b.create<ConstantOp>(
        loc,
        DenseElementsAttr::get(t, b.getFloatAttr(t.getElementType(), 0.0)));
  }

  template <typename OpTy> Value binary(Value x, Value y) {
    return b.create<OpTy>(loc, x, y);
  }
  Value add(Value x, Value y) { return binary<AddOp>(x, y); }
  Value sub(Value x, Value y) { return binary<SubOp>(x, y); }
  Value mul(Value x, Value y) { return binary<MulOp>(x, y); }
  Value div(Value x, Value y) { return binary<DivOp>(x, y); }
  Value mul(Value x, double c) { return mul(x, scalarLike(c, x)); }
  Value neg(Value x) { return b.create<NegOp>(loc, x); }
  template <typename OpTy> Value unary(Value x) {
    return b.create<OpTy>(loc, x);
  }
  Value select(Value c, Value x, Value y) {
    return b.create<SelectOp>(loc, c, x, y);
  }
  Value reshape(Value x, ArrayRef<int64_t> shape) {
    if (type(x).getShape() == shape)
      return x;
    return b.create<ReshapeOp>(
        loc, RankedTensorType::get(shape, type(x).getElementType()), x);
  }
  Value transpose(Value x, ArrayRef<int64_t> perm) {
    return b.create<TransposeOp>(loc, x, perm);
  }
  /// Swaps the last two dims.
  Value transposeLast2(Value x) {
    int64_t rank = type(x).getRank();
    SmallVector<int64_t> perm;
    for (int64_t i = 0; i < rank; ++i)
      perm.push_back(i);
    std::swap(perm[rank - 1], perm[rank - 2]);
    return transpose(x, perm);
  }
  Value matmul(Value x, Value y) { return b.create<MatmulOp>(loc, x, y); }
  /// Sums a gradient of a broadcast result back to an operand's shape.
  Value sumToShape(Value g, RankedTensorType target) {
    ArrayRef<int64_t> gs = type(g).getShape(), ts = target.getShape();
    if (gs == ts)
      return g;
    size_t lead = gs.size() - ts.size();
    SmallVector<int64_t> dims;
    for (size_t i = 0; i < gs.size(); ++i)
      if (i < lead || (ts[i - lead] == 1 && gs[i] != 1))
        dims.push_back(i);
    Value summed = g;
    if (!dims.empty())
      summed = b.create<ReduceSumOp>(loc, g, dims, /*keep_dims=*/false);
    return reshape(summed, ts);
  }
  /// Broadcasts a reduced gradient back over the reduced dims.
  Value expandReduced(Value g, RankedTensorType input, ArrayRef<int64_t> dims) {
    SmallVector<int64_t> kept(input.getShape());
    for (int64_t d : dims)
      kept[d] = 1;
    Value r = reshape(g, kept);
    if (ArrayRef<int64_t>(kept) == input.getShape())
      return r;
    return b.create<BroadcastOp>(
        loc, RankedTensorType::get(input.getShape(), type(g).getElementType()),
        r);
  }

  OpBuilder &b;
  Location loc;
};

bool isFloat(Value v) {
  return isa<FloatType>(cast<RankedTensorType>(v.getType()).getElementType());
}

/// The splat value of a model.constant, if `v` is one.
std::optional<double> splatConstant(Value v) {
  auto c = v.getDefiningOp<ConstantOp>();
  if (!c)
    return std::nullopt;
  auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
  if (!dense || !dense.isSplat() || !isa<FloatType>(dense.getElementType()))
    return std::nullopt;
  return dense.getSplatValue<APFloat>().convertToDouble();
}

/// Resizes `grads` to the op's operand count, all null.
void resetGrads(Operation *op, SmallVectorImpl<Value> &grads) {
  grads.assign(op->getNumOperands(), Value());
}
} // namespace

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

LogicalResult AddOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  og[0] = gb.sumToShape(rg[0], GradBuilder::type(getLhs()));
  og[1] = gb.sumToShape(rg[0], GradBuilder::type(getRhs()));
  return success();
}

LogicalResult SubOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  og[0] = gb.sumToShape(rg[0], GradBuilder::type(getLhs()));
  og[1] = gb.sumToShape(gb.neg(rg[0]), GradBuilder::type(getRhs()));
  return success();
}

LogicalResult MulOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  og[0] = gb.sumToShape(gb.mul(rg[0], getRhs()), GradBuilder::type(getLhs()));
  og[1] = gb.sumToShape(gb.mul(rg[0], getLhs()), GradBuilder::type(getRhs()));
  return success();
}

LogicalResult DivOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  // d(x/y)/dx = 1/y; d(x/y)/dy = -(x/y)/y.
  og[0] = gb.sumToShape(gb.div(rg[0], getRhs()), GradBuilder::type(getLhs()));
  og[1] = gb.sumToShape(gb.neg(gb.div(gb.mul(rg[0], getResult()), getRhs())),
                        GradBuilder::type(getRhs()));
  return success();
}

LogicalResult PowOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  Value x = getLhs(), y = getRhs(), g = rg[0];
  Value dx;
  if (std::optional<double> c = splatConstant(y)) {
    // The common x^2 (variance, RMSNorm): 2 * x, no pow needed.
    if (*c == 2.0)
      dx = gb.mul(gb.mul(g, x), 2.0);
    else if (*c == 1.0)
      dx = g;
    else
      dx = gb.mul(gb.mul(g, gb.binary<PowOp>(x, gb.scalarLike(*c - 1, x))), *c);
  } else {
    dx = gb.mul(gb.mul(g, y),
                gb.binary<PowOp>(x, gb.sub(y, gb.scalarLike(1, y))));
  }
  og[0] = gb.sumToShape(dx, GradBuilder::type(x));
  if (!splatConstant(y))
    og[1] = gb.sumToShape(gb.mul(gb.mul(g, getResult()), gb.unary<LogOp>(x)),
                          GradBuilder::type(y));
  return success();
}

LogicalResult SelectOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                       SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  Value zero = gb.scalarLike(0, rg[0]);
  og[1] = gb.sumToShape(gb.select(getCondition(), rg[0], zero),
                        GradBuilder::type(getOnTrue()));
  og[2] = gb.sumToShape(gb.select(getCondition(), zero, rg[0]),
                        GradBuilder::type(getOnFalse()));
  return success();
}

/// Shared shape of the unary rules: og[0] = rule(gb, g).
template <typename OpTy, typename Rule>
static LogicalResult unaryGrad(OpTy op, OpBuilder &b, ArrayRef<Value> rg,
                               SmallVectorImpl<Value> &og, Rule rule) {
  resetGrads(op, og);
  if (!rg[0] || !isFloat(op.getResult()))
    return success();
  GradBuilder gb(b, op.getLoc());
  og[0] = rule(gb, rg[0], op.getInput(), op.getResult());
  return success();
}

LogicalResult SqrtOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                     SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [](GradBuilder &gb, Value g, Value, Value y) {
                     return gb.div(gb.mul(g, 0.5), y);
                   });
}
LogicalResult RsqrtOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                      SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [](GradBuilder &gb, Value g, Value, Value y) {
                     return gb.mul(gb.mul(g, gb.mul(gb.mul(y, y), y)), -0.5);
                   });
}
LogicalResult ReciprocalOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                           SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [](GradBuilder &gb, Value g, Value, Value y) {
                     return gb.neg(gb.mul(g, gb.mul(y, y)));
                   });
}
LogicalResult NegOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og,
      [](GradBuilder &gb, Value g, Value, Value) { return gb.neg(g); });
}
LogicalResult ExpOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og,
      [](GradBuilder &gb, Value g, Value, Value y) { return gb.mul(g, y); });
}
LogicalResult LogOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og,
      [](GradBuilder &gb, Value g, Value x, Value) { return gb.div(g, x); });
}
LogicalResult TanhOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                     SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og, [](GradBuilder &gb, Value g, Value, Value y) {
        return gb.mul(g, gb.sub(gb.scalarLike(1, y), gb.mul(y, y)));
      });
}
LogicalResult ErfOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [](GradBuilder &gb, Value g, Value x, Value) {
                     Value e = gb.unary<ExpOp>(gb.neg(gb.mul(x, x)));
                     return gb.mul(gb.mul(g, e), 2.0 / std::sqrt(M_PI));
                   });
}
LogicalResult SigmoidOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                        SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og, [](GradBuilder &gb, Value g, Value, Value y) {
        return gb.mul(gb.mul(g, y), gb.sub(gb.scalarLike(1, y), y));
      });
}
LogicalResult ReluOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                     SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og, [](GradBuilder &gb, Value g, Value x, Value) {
        Value zero = gb.scalarLike(0, x);
        Value positive = gb.b.create<CmpOp>(gb.loc, CmpPredicate::gt, x, zero);
        return gb.select(positive, g, zero);
      });
}
LogicalResult SiluOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                     SmallVectorImpl<Value> &og) {
  return unaryGrad(
      *this, b, rg, og, [](GradBuilder &gb, Value g, Value x, Value) {
        // d(x s(x)) = s * (1 + x * (1 - s))
        Value s = gb.unary<SigmoidOp>(x);
        Value one = gb.scalarLike(1, x);
        return gb.mul(g, gb.mul(s, gb.add(one, gb.mul(x, gb.sub(one, s)))));
      });
}
LogicalResult SinOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [](GradBuilder &gb, Value g, Value x, Value) {
                     return gb.mul(g, gb.unary<CosOp>(x));
                   });
}
LogicalResult CosOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                    SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [](GradBuilder &gb, Value g, Value x, Value) {
                     return gb.neg(gb.mul(g, gb.unary<SinOp>(x)));
                   });
}
LogicalResult GeluOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                     SmallVectorImpl<Value> &og) {
  return unaryGrad(*this, b, rg, og,
                   [this](GradBuilder &gb, Value g, Value x, Value) -> Value {
                     return gb.b.create<GeluGradOp>(gb.loc, x, g,
                                                    getApproximate());
                   });
}

//===----------------------------------------------------------------------===//
// Linear algebra and data movement
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                       SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (getTransposeLhs() || getTransposeRhs())
    return emitOpError("reads a transposed operand and has no gradient rule; "
                       "fastllm-fold-transposes runs after autodiff");
  if (!rg[0])
    return success();
  GradBuilder gb(b, getLoc());
  Value a = getLhs(), w = getRhs(), g = rg[0];
  RankedTensorType aType = GradBuilder::type(a), wType = GradBuilder::type(w);
  og[0] = gb.sumToShape(gb.matmul(g, gb.transposeLast2(w)), aType);
  if (wType.getRank() == 2 && aType.getRank() > 2) {
    // A weight shared by every batch row: fold the batch into M so dW is
    // one GEMM, not a batched one summed afterwards.
    int64_t k = aType.getShape().back(), n = wType.getShape().back();
    Value a2 = gb.reshape(a, {aType.getNumElements() / k, k});
    Value g2 = gb.reshape(g, {GradBuilder::type(g).getNumElements() / n, n});
    og[1] = gb.matmul(gb.transposeLast2(a2), g2);
  } else {
    og[1] = gb.sumToShape(gb.matmul(gb.transposeLast2(a), g), wType);
  }
  return success();
}

LogicalResult TransposeOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                          SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  ArrayRef<int64_t> perm = getPermutation();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = i;
  og[0] = GradBuilder(b, getLoc()).transpose(rg[0], inverse);
  return success();
}

LogicalResult ReshapeOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                        SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0] && isFloat(getResult()))
    og[0] = GradBuilder(b, getLoc())
                .reshape(rg[0], GradBuilder::type(getInput()).getShape());
  return success();
}

LogicalResult SliceOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                      SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0] && isFloat(getResult()))
    og[0] = b.create<SliceGradOp>(getLoc(), getInput().getType(), rg[0],
                                  getStart(), getLimit(), getStride());
  return success();
}

LogicalResult ConcatOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                       SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  ArrayRef<int64_t> shape = GradBuilder::type(getResult()).getShape();
  int64_t offset = 0, dim = getDim();
  for (auto [i, input] : llvm::enumerate(getInputs())) {
    SmallVector<int64_t> start(shape.size(), 0), limit(shape),
        stride(shape.size(), 1);
    int64_t len = GradBuilder::type(input).getDimSize(dim);
    start[dim] = offset;
    limit[dim] = offset + len;
    offset += len;
    og[i] = b.create<SliceOp>(getLoc(), rg[0], start, limit, stride);
  }
  return success();
}

LogicalResult SplitOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                      SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!isFloat(getInput()) || llvm::all_of(rg, [](Value v) { return !v; }))
    return success();
  GradBuilder gb(b, getLoc());
  SmallVector<Value> pieces;
  for (auto [g, result] : llvm::zip(rg, getResults()))
    pieces.push_back(g ? g : gb.zerosLike(GradBuilder::type(result)));
  og[0] = b.create<ConcatOp>(getLoc(), pieces, getDim());
  return success();
}

LogicalResult GatherOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                       SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0] && isFloat(getResult()))
    og[0] = b.create<GatherGradOp>(getLoc(), getInput().getType(), rg[0],
                                   getIndices(), getDim());
  return success();
}

LogicalResult BroadcastOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                          SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0] && isFloat(getResult()))
    og[0] = GradBuilder(b, getLoc())
                .sumToShape(rg[0], GradBuilder::type(getInput()));
  return success();
}

LogicalResult CastOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                     SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0] && isFloat(getInput()) && isFloat(getResult()))
    og[0] = b.create<CastOp>(getLoc(), getInput().getType(), rg[0]);
  return success();
}

LogicalResult DropoutOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                        SmallVectorImpl<Value> &og) {
  // dx = dy * mask / (1 - p): the same dropout, site and all, of the
  // gradient. The mask is regenerated from its key, so the forward keeps
  // nothing for the backward but the graph itself.
  resetGrads(*this, og);
  if (rg[0])
    og[0] = b.create<DropoutOp>(getLoc(), rg[0], getRatioAttr(), getSiteAttr());
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions, normalisation, losses
//===----------------------------------------------------------------------===//

LogicalResult ReduceSumOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                          SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0] && isFloat(getResult()))
    og[0] = GradBuilder(b, getLoc())
                .expandReduced(rg[0], GradBuilder::type(getInput()), getDims());
  return success();
}

LogicalResult ReduceMeanOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                           SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  GradBuilder gb(b, getLoc());
  RankedTensorType in = GradBuilder::type(getInput());
  int64_t count = 1;
  for (int64_t d : getDims())
    count *= in.getDimSize(d);
  og[0] = gb.expandReduced(gb.mul(rg[0], 1.0 / count), in, getDims());
  return success();
}

LogicalResult ReduceMaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                          SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0] || !isFloat(getResult()))
    return success();
  // Ties share the gradient evenly, as torch.amax does.
  GradBuilder gb(b, getLoc());
  RankedTensorType in = GradBuilder::type(getInput());
  Value max = gb.expandReduced(getResult(), in, getDims());
  Value mask = b.create<CmpOp>(getLoc(), CmpPredicate::eq, getInput(), max);
  Value ones = gb.select(mask, gb.scalarLike(1, max), gb.scalarLike(0, max));
  SmallVector<int64_t> kept(in.getShape());
  for (int64_t d : getDims())
    kept[d] = 1;
  Value count = b.create<ReduceSumOp>(getLoc(), ones, getDims(),
                                      /*keep_dims=*/true);
  Value share = gb.div(gb.reshape(rg[0], kept), count);
  og[0] = gb.mul(ones, share);
  return success();
}

LogicalResult SoftmaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                        SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0])
    og[0] = b.create<SoftmaxGradOp>(getLoc(), getResult(), rg[0], getDim());
  return success();
}

LogicalResult LogSoftmaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                           SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0])
    og[0] = b.create<LogSoftmaxGradOp>(getLoc(), getResult(), rg[0], getDim());
  return success();
}

LogicalResult LayerNormOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                          SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0])
    return success();
  auto grads = b.create<LayerNormGradOp>(getLoc(), getInput(), getScale(),
                                         rg[0], getDim(), getEpsilon());
  og[0] = grads.getInputGrad();
  og[1] = grads.getScaleGrad();
  if (getBias())
    og[2] = grads.getBiasGrad();
  return success();
}

LogicalResult RmsNormOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                        SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (!rg[0])
    return success();
  auto grads = b.create<RmsNormGradOp>(getLoc(), getInput(), getScale(), rg[0],
                                       getDim(), getEpsilon());
  og[0] = grads.getInputGrad();
  og[1] = grads.getScaleGrad();
  return success();
}

LogicalResult CrossEntropyOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                             SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0])
    og[0] =
        b.create<CrossEntropyGradOp>(getLoc(), getInput(), getTargets(), rg[0],
                                     getIgnoreIndexAttr(), getReduction());
  return success();
}

LogicalResult NllLossOp::buildGradients(OpBuilder &b, ArrayRef<Value> rg,
                                        SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  if (rg[0])
    og[0] =
        b.create<NllLossGradOp>(getLoc(), getInput().getType(), getTargets(),
                                rg[0], getIgnoreIndexAttr(), getReduction());
  return success();
}

LogicalResult CausalAttentionOp::buildGradients(OpBuilder &b,
                                                ArrayRef<Value> rg,
                                                SmallVectorImpl<Value> &og) {
  resetGrads(*this, og);
  // The lse result only feeds the backward; nothing differentiates it.
  if (!rg[0])
    return success();
  auto grads = b.create<CausalAttentionGradOp>(getLoc(), getQuery(), getKey(),
                                               getValue(), getResult(),
                                               getLse(), rg[0], getScaleAttr());
  og[0] = grads.getQueryGrad();
  og[1] = grads.getKeyGrad();
  og[2] = grads.getValueGrad();
  return success();
}
