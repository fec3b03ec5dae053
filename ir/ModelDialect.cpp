//===- ModelDialect.cpp - model dialect ops and verifiers -----------------===//

#include "ir/ModelDialect.h"
#include "ir/Plan.h"
#include "llvm/ADT/SmallString.h"

#include "mlir/Dialect/Traits.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::fastllm::model;

#include "ir/GradientInterface.cpp.inc"
#include "ir/ModelDialect.cpp.inc"
#include "ir/ModelEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "ir/ModelAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "ir/ModelTypes.cpp.inc"

void ModelDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "ir/ModelOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "ir/ModelAttrs.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "ir/ModelTypes.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Shared verifier helpers
//===----------------------------------------------------------------------===//

static RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

static LogicalResult verifySameElementType(Operation *op, ValueRange values) {
  Type first = tensorType(values.front()).getElementType();
  for (Value v : values.drop_front())
    if (tensorType(v).getElementType() != first)
      return op->emitOpError("element types differ: ")
             << first << " and " << tensorType(v).getElementType();
  return success();
}

//===----------------------------------------------------------------------===//
// Shape rules
//===----------------------------------------------------------------------===//
//
// The result shapes of the ops that infer their result type, one rule each:
// the op's inferReturnTypes and its verifier both call it. A rule fails when
// the operands break the op's rules, reporting why through `emitError` when
// there is one: the verifier's (`'model.x' op ...` on the op) or, for
// inferReturnTypes, one at the location being built when it has one.

using ShapeErrorFn = llvm::function_ref<InFlightDiagnostic()>;

static InFlightDiagnostic report(ShapeErrorFn emitError) {
  return emitError ? emitError() : InFlightDiagnostic();
}

/// The verifier's diagnostics.
static auto opError(Operation *op) {
  return [op] { return op->emitOpError(); };
}

/// inferReturnTypes's diagnostics, worded as the verifier's.
template <typename OpTy>
static auto inferError(std::optional<Location> location) {
  return [location]() -> InFlightDiagnostic {
    if (!location)
      return InFlightDiagnostic();
    return mlir::emitError(*location)
           << "'" << OpTy::getOperationName() << "' op ";
  };
}

/// One tensor of `elementType` with the inferred shape, if there is one.
static LogicalResult inferTensor(FailureOr<SmallVector<int64_t>> shape,
                                 Type elementType,
                                 SmallVectorImpl<Type> &inferred) {
  if (failed(shape))
    return failure();
  inferred.push_back(RankedTensorType::get(*shape, elementType));
  return success();
}

/// Checks that `result` has the shape its rule gives.
static LogicalResult verifyResultShape(Operation *op, Value result,
                                       ArrayRef<int64_t> expected) {
  if (tensorType(result).getShape() != expected)
    return op->emitOpError("result shape ")
           << shapeStr(tensorType(result).getShape()) << " should be "
           << shapeStr(expected);
  return success();
}

static LogicalResult checkDim(int64_t dim, int64_t rank, ShapeErrorFn emitError,
                              StringRef what = "dim") {
  if (dim < 0 || dim >= rank)
    return report(emitError)
           << what << " " << dim << " is out of range for rank " << rank;
  return success();
}

static LogicalResult verifyDim(Operation *op, int64_t dim, int64_t rank,
                               StringRef what = "dim") {
  return checkDim(dim, rank, opError(op), what);
}

/// The NumPy broadcast of the operands' shapes (elementwise ops).
static FailureOr<SmallVector<int64_t>> broadcastShape(TypeRange operands,
                                                      ShapeErrorFn emitError) {
  SmallVector<int64_t> shape;
  for (Type operand : operands) {
    ArrayRef<int64_t> s = cast<RankedTensorType>(operand).getShape();
    SmallVector<int64_t> next;
    if (!OpTrait::util::getBroadcastedShape(shape, s, next))
      return report(emitError)
             << "operand shapes are not broadcast-compatible: "
             << shapeStr(shape) << " and " << shapeStr(s);
    shape = std::move(next);
  }
  return shape;
}

/// Checks that `result` has the NumPy broadcast of the operand shapes.
static LogicalResult verifyBroadcastResult(Operation *op, ValueRange operands,
                                           Value result) {
  auto shape = broadcastShape(operands.getTypes(), opError(op));
  if (failed(shape))
    return failure();
  if (tensorType(result).getShape() != ArrayRef<int64_t>(*shape))
    return op->emitOpError("result shape ")
           << shapeStr(tensorType(result).getShape())
           << " is not the broadcast shape " << shapeStr(*shape);
  return success();
}

/// The shape of op(lhs)·op(rhs) (model.matmul's rules).
static FailureOr<SmallVector<int64_t>> matmulShape(ArrayRef<int64_t> lhs,
                                                   ArrayRef<int64_t> rhs,
                                                   bool transLhs, bool transRhs,
                                                   ShapeErrorFn emitError) {
  SmallVector<int64_t> a(lhs), b(rhs);
  if (a.size() < 2 || b.size() < 2)
    return report(emitError) << "operands must have rank >= 2, got " << a.size()
                             << " and " << b.size();
  // The shapes the product reads.
  if (transLhs)
    std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (transRhs)
    std::swap(b[b.size() - 1], b[b.size() - 2]);
  if (a.back() != b[b.size() - 2])
    return report(emitError) << "contraction dims differ: lhs " << shapeStr(a)
                             << " has K = " << a.back() << ", rhs "
                             << shapeStr(b) << " has K = " << b[b.size() - 2];
  SmallVector<int64_t> shape;
  if (!OpTrait::util::getBroadcastedShape(ArrayRef<int64_t>(a).drop_back(2),
                                          ArrayRef<int64_t>(b).drop_back(2),
                                          shape))
    return report(emitError)
           << "batch dims are not broadcast-compatible: " << shapeStr(a)
           << " and " << shapeStr(b);
  shape.push_back(a[a.size() - 2]);
  shape.push_back(b.back());
  return shape;
}

/// `in` without `dims` (sorted, distinct, in range), or with them as size-1
/// dims when `keepDims`.
static FailureOr<SmallVector<int64_t>> reduceShape(ArrayRef<int64_t> in,
                                                   ArrayRef<int64_t> dims,
                                                   bool keepDims,
                                                   ShapeErrorFn emitError) {
  int64_t prev = -1;
  for (int64_t d : dims) {
    if (failed(checkDim(d, in.size(), emitError)))
      return failure();
    if (d <= prev)
      return report(emitError) << "dims must be sorted and distinct";
    prev = d;
  }
  SmallVector<int64_t> shape;
  for (int64_t i = 0; i < (int64_t)in.size(); ++i) {
    if (!llvm::is_contained(dims, i))
      shape.push_back(in[i]);
    else if (keepDims)
      shape.push_back(1);
  }
  return shape;
}

/// The shape of `input[start:limit:stride]`, checking the bounds.
static FailureOr<SmallVector<int64_t>> sliceShape(ArrayRef<int64_t> in,
                                                  ArrayRef<int64_t> start,
                                                  ArrayRef<int64_t> limit,
                                                  ArrayRef<int64_t> stride,
                                                  ShapeErrorFn emitError) {
  if (start.size() != in.size() || limit.size() != in.size() ||
      stride.size() != in.size())
    return report(emitError)
           << "start, limit and stride need one entry per dim (rank "
           << in.size() << ")";
  SmallVector<int64_t> shape;
  for (size_t i = 0; i < in.size(); ++i) {
    if (stride[i] <= 0)
      return report(emitError) << "stride " << stride[i] << " in dim " << i
                               << " must be positive";
    if (start[i] < 0 || limit[i] > in[i] || start[i] > limit[i])
      return report(emitError)
             << "slice [" << start[i] << ", " << limit[i]
             << ") is out of bounds for dim " << i << " of size " << in[i];
    shape.push_back((limit[i] - start[i] + stride[i] - 1) / stride[i]);
  }
  return shape;
}

/// The inputs joined along `dim`; they agree on every other dim.
static FailureOr<SmallVector<int64_t>>
concatShape(TypeRange inputs, int64_t dim, ShapeErrorFn emitError) {
  if (inputs.empty())
    return report(emitError) << "needs at least one input";
  ArrayRef<int64_t> first = cast<RankedTensorType>(inputs.front()).getShape();
  if (failed(checkDim(dim, first.size(), emitError)))
    return failure();
  SmallVector<int64_t> shape(first);
  shape[dim] = 0;
  for (Type input : inputs) {
    ArrayRef<int64_t> s = cast<RankedTensorType>(input).getShape();
    if (s.size() != first.size())
      return report(emitError) << "inputs have different ranks";
    for (size_t i = 0; i < s.size(); ++i)
      if ((int64_t)i != dim && s[i] != first[i])
        return report(emitError)
               << "inputs " << shapeStr(first) << " and " << shapeStr(s)
               << " differ outside dim " << dim;
    shape[dim] += s[dim];
  }
  return shape;
}

/// One piece of `in` per size along `dim`; the sizes add up to the dim.
static FailureOr<SmallVector<SmallVector<int64_t>>>
splitShapes(ArrayRef<int64_t> in, int64_t dim, ArrayRef<int64_t> sizes,
            ShapeErrorFn emitError) {
  if (failed(checkDim(dim, in.size(), emitError)))
    return failure();
  SmallVector<SmallVector<int64_t>> shapes;
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0)
      return report(emitError) << "size " << size << " is negative";
    shapes.emplace_back(in);
    shapes.back()[dim] = size;
    total += size;
  }
  if (total != in[dim])
    return report(emitError) << "sizes add up to " << total << " but dim "
                             << dim << " has size " << in[dim];
  return shapes;
}

/// `input[:dim] + indices + input[dim+1:]`.
static FailureOr<SmallVector<int64_t>> gatherShape(ArrayRef<int64_t> in,
                                                   ArrayRef<int64_t> indices,
                                                   int64_t dim,
                                                   ShapeErrorFn emitError) {
  if (failed(checkDim(dim, in.size(), emitError)))
    return failure();
  SmallVector<int64_t> shape(in.take_front(dim));
  shape.append(indices.begin(), indices.end());
  shape.append(in.begin() + dim + 1, in.end());
  return shape;
}

/// A loss's result: the targets' shape for `none`, else a scalar. The input
/// has the targets' shape plus a class dim.
static FailureOr<SmallVector<int64_t>> lossShape(ArrayRef<int64_t> in,
                                                 ArrayRef<int64_t> targets,
                                                 LossReduction reduction,
                                                 ShapeErrorFn emitError) {
  if (in.empty() || in.drop_back() != targets)
    return report(emitError)
           << "input shape " << shapeStr(in) << " should be the targets' shape "
           << shapeStr(targets) << " plus a class dim";
  if (reduction == LossReduction::none)
    return SmallVector<int64_t>(targets);
  return SmallVector<int64_t>();
}

/// The shapes of attention's output and log-sum-exp: q, k: [..., t, d];
/// v and the output: [..., t, dv]; the log-sum-exp: [..., t].
static FailureOr<std::pair<SmallVector<int64_t>, SmallVector<int64_t>>>
attentionShapes(ArrayRef<int64_t> q, ArrayRef<int64_t> k, ArrayRef<int64_t> v,
                ShapeErrorFn emitError) {
  if (q.size() < 2)
    return report(emitError) << "query must have rank >= 2, got " << q.size();
  if (k != q)
    return report(emitError) << "key shape " << shapeStr(k)
                             << " differs from query shape " << shapeStr(q);
  if (v.size() != q.size() || v.drop_back() != q.drop_back())
    return report(emitError)
           << "value shape " << shapeStr(v) << " should be "
           << shapeStr(q.drop_back()) << " plus a feature dim";
  return std::pair{SmallVector<int64_t>(v),
                   SmallVector<int64_t>(q.drop_back())};
}

/// The InferredOrF32 ops' results: the inferred types, or f32 tensors of the
/// inferred shapes where a float type was inferred.
static bool isInferredOrF32(TypeRange inferred, TypeRange actual) {
  if (inferred.size() != actual.size())
    return false;
  for (auto [want, have] : llvm::zip(inferred, actual)) {
    if (want == have)
      continue;
    auto w = dyn_cast<RankedTensorType>(want);
    auto h = dyn_cast<RankedTensorType>(have);
    if (!w || !h || w.getShape() != h.getShape() ||
        !isa<FloatType>(w.getElementType()) || !h.getElementType().isF32())
      return false;
  }
  return true;
}

/// Result dim i is input dim permutation[i].
static FailureOr<SmallVector<int64_t>> transposeShape(ArrayRef<int64_t> in,
                                                      ArrayRef<int64_t> perm,
                                                      ShapeErrorFn emitError) {
  if (perm.size() != in.size())
    return report(emitError) << "permutation has " << perm.size()
                             << " entries for an input of rank " << in.size();
  SmallVector<bool> seen(in.size(), false);
  SmallVector<int64_t> shape;
  for (int64_t p : perm) {
    if (p < 0 || p >= (int64_t)in.size() || seen[p])
      return report(emitError)
             << "permutation " << shapeStr(perm) << " is not a permutation";
    seen[p] = true;
    shape.push_back(in[p]);
  }
  return shape;
}

//===----------------------------------------------------------------------===//
// Parameters and constants
//===----------------------------------------------------------------------===//

LogicalResult ParameterOp::verify() {
  if (auto value = getInitialValueAttr())
    if (value.getType() != getType())
      return emitOpError("initial value type ")
             << value.getType() << " does not match parameter type "
             << getType();
  return success();
}

LogicalResult
GetParameterOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param =
      symbolTable.lookupNearestSymbolFrom<ParameterOp>(*this, getNameAttr());
  if (!param)
    return emitOpError("'") << getName() << "' does not name a model.parameter";
  if (param.getType() != getType())
    return emitOpError("result type ")
           << getType() << " does not match parameter type " << param.getType();
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

template <typename BinaryOp> static LogicalResult verifyBinary(BinaryOp op) {
  if (failed(verifySameElementType(op,
                                   {op.getLhs(), op.getRhs(), op.getResult()})))
    return failure();
  return verifyBroadcastResult(op, {op.getLhs(), op.getRhs()}, op.getResult());
}

/// The broadcast of `operands`, of `elementType`.
template <typename OpTy>
static LogicalResult inferBroadcast(std::optional<Location> location,
                                    ValueRange operands, Type elementType,
                                    SmallVectorImpl<Type> &inferred) {
  return inferTensor(
      broadcastShape(operands.getTypes(), inferError<OpTy>(location)),
      elementType, inferred);
}

/// A binary op's result: the broadcast, of the operands' element type.
template <typename BinaryOp>
static LogicalResult inferBinary(std::optional<Location> location,
                                 typename BinaryOp::Adaptor adaptor,
                                 SmallVectorImpl<Type> &inferred) {
  return inferBroadcast<BinaryOp>(
      location, {adaptor.getLhs(), adaptor.getRhs()},
      tensorType(adaptor.getLhs()).getElementType(), inferred);
}

LogicalResult AddOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBinary<AddOp>(location, adaptor, inferred);
}
LogicalResult SubOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBinary<SubOp>(location, adaptor, inferred);
}
LogicalResult MulOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBinary<MulOp>(location, adaptor, inferred);
}
LogicalResult DivOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBinary<DivOp>(location, adaptor, inferred);
}
LogicalResult PowOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBinary<PowOp>(location, adaptor, inferred);
}
LogicalResult AndOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBinary<AndOp>(location, adaptor, inferred);
}
LogicalResult OrOp::inferReturnTypes(MLIRContext *,
                                     std::optional<Location> location,
                                     Adaptor adaptor,
                                     SmallVectorImpl<Type> &inferred) {
  return inferBinary<OrOp>(location, adaptor, inferred);
}

LogicalResult AddOp::verify() { return verifyBinary(*this); }
LogicalResult SubOp::verify() { return verifyBinary(*this); }
LogicalResult MulOp::verify() { return verifyBinary(*this); }
LogicalResult DivOp::verify() { return verifyBinary(*this); }
LogicalResult PowOp::verify() { return verifyBinary(*this); }
LogicalResult AndOp::verify() { return verifyBinary(*this); }
LogicalResult OrOp::verify() { return verifyBinary(*this); }

LogicalResult CmpOp::inferReturnTypes(MLIRContext *context,
                                      std::optional<Location> location,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBroadcast<CmpOp>(location, {adaptor.getLhs(), adaptor.getRhs()},
                               IntegerType::get(context, 1), inferred);
}

LogicalResult CmpOp::verify() {
  if (failed(verifySameElementType(*this, {getLhs(), getRhs()})))
    return failure();
  return verifyBroadcastResult(*this, {getLhs(), getRhs()}, getResult());
}

LogicalResult SelectOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> location,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  return inferBroadcast<SelectOp>(
      location,
      {adaptor.getCondition(), adaptor.getOnTrue(), adaptor.getOnFalse()},
      tensorType(adaptor.getOnTrue()).getElementType(), inferred);
}

LogicalResult SelectOp::verify() {
  if (failed(verifySameElementType(*this,
                                   {getOnTrue(), getOnFalse(), getResult()})))
    return failure();
  return verifyBroadcastResult(
      *this, {getCondition(), getOnTrue(), getOnFalse()}, getResult());
}

//===----------------------------------------------------------------------===//
// Linear algebra and data movement
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> location,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  RankedTensorType lhs = tensorType(adaptor.getLhs());
  return inferTensor(
      matmulShape(lhs.getShape(), tensorType(adaptor.getRhs()).getShape(),
                  adaptor.getTransposeLhs(), adaptor.getTransposeRhs(),
                  inferError<MatmulOp>(location)),
      lhs.getElementType(), inferred);
}

LogicalResult MatmulOp::verify() {
  if (failed(verifySameElementType(*this, {getLhs(), getRhs(), getResult()})))
    return failure();
  auto shape = matmulShape(tensorType(getLhs()).getShape(),
                           tensorType(getRhs()).getShape(), getTransposeLhs(),
                           getTransposeRhs(), opError(*this));
  if (failed(shape))
    return failure();
  return verifyResultShape(*this, getResult(), *shape);
}

LogicalResult MatmulAccumulateGradOp::verify() {
  if (failed(verifySameElementType(*this, {getLhs(), getRhs()})))
    return failure();
  return matmulShape(tensorType(getLhs()).getShape(),
                     tensorType(getRhs()).getShape(), getTransposeLhs(),
                     getTransposeRhs(), opError(*this));
}

LogicalResult
MatmulAccumulateGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param =
      symbolTable.lookupNearestSymbolFrom<ParameterOp>(*this, getNameAttr());
  if (!param)
    return emitOpError("'") << getName() << "' does not name a model.parameter";
  if (param.getFrozen())
    return emitOpError("parameter '") << getName() << "' is frozen";
  auto shape = matmulShape(tensorType(getLhs()).getShape(),
                           tensorType(getRhs()).getShape(), getTransposeLhs(),
                           getTransposeRhs(), opError(*this));
  if (failed(shape))
    return failure();
  if (param.getTensorType().getShape() != ArrayRef<int64_t>(*shape))
    return emitOpError("product shape ")
           << shapeStr(*shape) << " differs from parameter '" << getName()
           << "' of shape " << shapeStr(param.getTensorType().getShape());
  return success();
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> location,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  RankedTensorType in = tensorType(adaptor.getInput());
  return inferTensor(transposeShape(in.getShape(), adaptor.getPermutation(),
                                    inferError<TransposeOp>(location)),
                     in.getElementType(), inferred);
}

LogicalResult TransposeOp::verify() {
  auto expected = transposeShape(tensorType(getInput()).getShape(),
                                 getPermutation(), opError(*this));
  if (failed(expected) ||
      failed(verifySameElementType(*this, {getInput(), getResult()})))
    return failure();
  return verifyResultShape(*this, getResult(), *expected);
}

Value ReshapeOp::getViewSource() { return getInput(); }

LogicalResult ReshapeOp::verify() {
  if (failed(verifySameElementType(*this, {getInput(), getResult()})))
    return failure();
  int64_t in = tensorType(getInput()).getNumElements();
  int64_t out = tensorType(getResult()).getNumElements();
  if (in != out)
    return emitOpError("element count changes from ") << in << " to " << out;
  return success();
}

LogicalResult SliceOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> location,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &inferred) {
  RankedTensorType in = tensorType(adaptor.getInput());
  return inferTensor(sliceShape(in.getShape(), adaptor.getStart(),
                                adaptor.getLimit(), adaptor.getStride(),
                                inferError<SliceOp>(location)),
                     in.getElementType(), inferred);
}

LogicalResult SliceOp::verify() {
  auto expected = sliceShape(tensorType(getInput()).getShape(), getStart(),
                             getLimit(), getStride(), opError(*this));
  if (failed(expected) ||
      failed(verifySameElementType(*this, {getInput(), getResult()})))
    return failure();
  return verifyResultShape(*this, getResult(), *expected);
}

LogicalResult SliceGradOp::verify() {
  auto expected = sliceShape(tensorType(getResult()).getShape(), getStart(),
                             getLimit(), getStride(), opError(*this));
  if (failed(expected) ||
      failed(verifySameElementType(*this, {getGrad(), getResult()})))
    return failure();
  if (tensorType(getGrad()).getShape() != ArrayRef<int64_t>(*expected))
    return emitOpError("grad shape ")
           << shapeStr(tensorType(getGrad()).getShape())
           << " should be the slice's shape " << shapeStr(*expected);
  return success();
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> location,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  auto shape = concatShape(adaptor.getInputs().getTypes(), adaptor.getDim(),
                           inferError<ConcatOp>(location));
  if (failed(shape))
    return failure();
  return inferTensor(shape,
                     tensorType(adaptor.getInputs().front()).getElementType(),
                     inferred);
}

LogicalResult ConcatOp::verify() {
  SmallVector<Value> all(getInputs());
  all.push_back(getResult());
  if (failed(verifySameElementType(*this, all)))
    return failure();
  auto expected = concatShape(getInputs().getTypes(), getDim(), opError(*this));
  if (failed(expected))
    return failure();
  return verifyResultShape(*this, getResult(), *expected);
}

LogicalResult SplitOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> location,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &inferred) {
  RankedTensorType in = tensorType(adaptor.getInput());
  auto shapes = splitShapes(in.getShape(), adaptor.getDim(), adaptor.getSizes(),
                            inferError<SplitOp>(location));
  if (failed(shapes))
    return failure();
  for (ArrayRef<int64_t> shape : *shapes)
    inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult SplitOp::verify() {
  RankedTensorType in = tensorType(getInput());
  auto expected =
      splitShapes(in.getShape(), getDim(), getSizes(), opError(*this));
  if (failed(expected))
    return failure();
  if (getSizes().size() != getResults().size())
    return emitOpError("has ") << getSizes().size() << " sizes for "
                               << getResults().size() << " results";
  for (auto [shape, result] : llvm::zip(*expected, getResults()))
    if (tensorType(result).getShape() != ArrayRef<int64_t>(shape) ||
        tensorType(result).getElementType() != in.getElementType())
      return emitOpError("result type ")
             << result.getType() << " should have shape " << shapeStr(shape);
  return success();
}

/// Checks `gathered == input[:dim] + indices + input[dim+1:]`.
static LogicalResult verifyGatherShapes(Operation *op, Value input,
                                        Value indices, int64_t dim,
                                        Value gathered, StringRef what) {
  auto expected = gatherShape(tensorType(input).getShape(),
                              tensorType(indices).getShape(), dim, opError(op));
  if (failed(expected) || failed(verifySameElementType(op, {input, gathered})))
    return failure();
  if (tensorType(gathered).getShape() != ArrayRef<int64_t>(*expected))
    return op->emitOpError()
           << what << " shape " << shapeStr(tensorType(gathered).getShape())
           << " should be " << shapeStr(*expected);
  return success();
}

LogicalResult GatherOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> location,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  RankedTensorType in = tensorType(adaptor.getInput());
  return inferTensor(
      gatherShape(in.getShape(), tensorType(adaptor.getIndices()).getShape(),
                  adaptor.getDim(), inferError<GatherOp>(location)),
      in.getElementType(), inferred);
}

LogicalResult GatherOp::verify() {
  return verifyGatherShapes(*this, getInput(), getIndices(), getDim(),
                            getResult(), "result");
}

LogicalResult GatherGradOp::verify() {
  return verifyGatherShapes(*this, getResult(), getIndices(), getDim(),
                            getGrad(), "grad");
}

LogicalResult BroadcastOp::verify() {
  if (failed(verifySameElementType(*this, {getInput(), getResult()})))
    return failure();
  ArrayRef<int64_t> in = tensorType(getInput()).getShape();
  ArrayRef<int64_t> out = tensorType(getResult()).getShape();
  if (in.size() > out.size())
    return emitOpError("cannot broadcast rank ")
           << in.size() << " to rank " << out.size();
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t d = in[in.size() - 1 - i], o = out[out.size() - 1 - i];
    if (d != o && d != 1)
      return emitOpError("cannot broadcast ")
             << shapeStr(in) << " to " << shapeStr(out);
  }
  return success();
}

LogicalResult CastOp::verify() {
  if (tensorType(getInput()).getShape() != tensorType(getResult()).getShape())
    return emitOpError("shape changes from ")
           << shapeStr(tensorType(getInput()).getShape()) << " to "
           << shapeStr(tensorType(getResult()).getShape());
  return success();
}

LogicalResult DropoutOp::verify() {
  // Ratio 1 would drop everything and scale by infinity; a NaN compares
  // false everywhere. The site is a 32-bit word of the mask's counter.
  APFloat ratio = getRatioAttr().getValue();
  if (!ratio.isFinite() || ratio.isNegative() ||
      ratio.compare(APFloat(ratio.getSemantics(), 1)) != APFloat::cmpLessThan) {
    SmallString<16> text;
    ratio.toString(text);
    return emitOpError("ratio must be in [0, 1), got ") << text;
  }
  int64_t site = getSiteAttr().getInt();
  if (site < 0 || site > int64_t(UINT32_MAX))
    return emitOpError("site must be in [0, 2^32), got ") << site;
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions and normalisation
//===----------------------------------------------------------------------===//

template <typename ReduceOp>
static LogicalResult inferReduce(std::optional<Location> location,
                                 typename ReduceOp::Adaptor adaptor,
                                 SmallVectorImpl<Type> &inferred) {
  RankedTensorType in = tensorType(adaptor.getInput());
  return inferTensor(reduceShape(in.getShape(), adaptor.getDims(),
                                 adaptor.getKeepDims(),
                                 inferError<ReduceOp>(location)),
                     in.getElementType(), inferred);
}

template <typename ReduceOp> static LogicalResult verifyReduce(ReduceOp op) {
  auto expected = reduceShape(tensorType(op.getInput()).getShape(),
                              op.getDims(), op.getKeepDims(), opError(op));
  if (failed(expected) ||
      failed(verifySameElementType(op, {op.getInput(), op.getResult()})))
    return failure();
  return verifyResultShape(op, op.getResult(), *expected);
}

LogicalResult ReduceSumOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> location,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  return inferReduce<ReduceSumOp>(location, adaptor, inferred);
}
LogicalResult ReduceMeanOp::inferReturnTypes(MLIRContext *,
                                             std::optional<Location> location,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &inferred) {
  return inferReduce<ReduceMeanOp>(location, adaptor, inferred);
}
LogicalResult ReduceMaxOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> location,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  return inferReduce<ReduceMaxOp>(location, adaptor, inferred);
}

LogicalResult ReduceSumOp::verify() { return verifyReduce(*this); }
LogicalResult ReduceMeanOp::verify() { return verifyReduce(*this); }
LogicalResult ReduceMaxOp::verify() { return verifyReduce(*this); }

LogicalResult SoftmaxOp::verify() {
  return verifyDim(*this, getDim(), tensorType(getInput()).getRank());
}
LogicalResult LogSoftmaxOp::verify() {
  return verifyDim(*this, getDim(), tensorType(getInput()).getRank());
}

/// Scale and bias of a normalisation cover dims [dim, rank) of the input.
static LogicalResult verifyNorm(Operation *op, Value input, ValueRange affine,
                                int64_t dim, Value result) {
  RankedTensorType in = tensorType(input);
  if (failed(verifyDim(op, dim, in.getRank())))
    return failure();
  ArrayRef<int64_t> normalized = in.getShape().drop_front(dim);
  for (Value v : affine)
    if (tensorType(v).getShape() != normalized)
      return op->emitOpError("scale/bias shape ")
             << shapeStr(tensorType(v).getShape())
             << " should be the normalised shape " << shapeStr(normalized);
  SmallVector<Value> all{input, result};
  all.append(affine.begin(), affine.end());
  if (failed(verifySameElementType(op, all)))
    return failure();
  if (in.getShape() != tensorType(result).getShape())
    return op->emitOpError("result shape differs from the input shape");
  return success();
}

/// Epsilon keeps a norm's denominator away from zero: it must be a positive
/// finite number (a NaN or infinity would also not print as C++).
static LogicalResult verifyEpsilon(Operation *op, APFloat eps) {
  if (eps.isFinite() && !eps.isNegative() && !eps.isZero())
    return success();
  SmallString<16> text;
  eps.toString(text);
  return op->emitOpError("epsilon must be finite and positive, got ") << text;
}

LogicalResult LayerNormOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location>,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  inferred.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult LayerNormOp::verify() {
  SmallVector<Value> affine{getScale()};
  if (getBias())
    affine.push_back(getBias());
  if (failed(verifyEpsilon(*this, getEpsilon())))
    return failure();
  return verifyNorm(*this, getInput(), affine, getDim(), getResult());
}

LogicalResult RmsNormOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location>,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &inferred) {
  inferred.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (failed(verifyEpsilon(*this, getEpsilon())))
    return failure();
  return verifyNorm(*this, getInput(), {getScale()}, getDim(), getResult());
}

/// Checks attention's operands, output and log-sum-exp (attentionShapes).
static LogicalResult verifyAttentionShapes(Operation *op, Value q, Value k,
                                           Value v, Value out, Value lse) {
  auto shapes =
      attentionShapes(tensorType(q).getShape(), tensorType(k).getShape(),
                      tensorType(v).getShape(), opError(op));
  if (failed(shapes))
    return failure();
  auto &[outShape, lseShape] = *shapes;
  if (tensorType(out).getShape() != ArrayRef<int64_t>(outShape))
    return op->emitOpError("output shape ")
           << shapeStr(tensorType(out).getShape()) << " should be "
           << shapeStr(outShape);
  if (tensorType(lse).getShape() != ArrayRef<int64_t>(lseShape))
    return op->emitOpError("lse shape ") << shapeStr(tensorType(lse).getShape())
                                         << " should be " << shapeStr(lseShape);
  // lse (kept for the backward) may be f32 when the attention is bf16.
  if (tensorType(lse).getElementType().isF32())
    return verifySameElementType(op, {q, k, v, out});
  return verifySameElementType(op, {q, k, v, out, lse});
}

LogicalResult CausalAttentionOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> location, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  RankedTensorType q = tensorType(adaptor.getQuery());
  auto shapes =
      attentionShapes(q.getShape(), tensorType(adaptor.getKey()).getShape(),
                      tensorType(adaptor.getValue()).getShape(),
                      inferError<CausalAttentionOp>(location));
  if (failed(shapes))
    return failure();
  inferred.push_back(adaptor.getValue().getType());
  inferred.push_back(RankedTensorType::get(shapes->second, q.getElementType()));
  return success();
}

bool CausalAttentionOp::isCompatibleReturnTypes(TypeRange inferred,
                                                TypeRange actual) {
  return isInferredOrF32(inferred, actual);
}

LogicalResult CausalAttentionOp::verify() {
  return verifyAttentionShapes(*this, getQuery(), getKey(), getValue(),
                               getResult(), getLse());
}

LogicalResult CausalAttentionGradOp::verify() {
  return verifyAttentionShapes(*this, getQuery(), getKey(), getValue(),
                               getOutput(), getLse());
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

/// `shape`, as a loss's result for `reduction`, in diagnostics.
static std::string lossShapeStr(ArrayRef<int64_t> shape,
                                LossReduction reduction) {
  return reduction == LossReduction::none ? shapeStr(shape)
                                          : std::string("[] (a scalar)");
}

template <typename LossOp>
static LogicalResult inferLoss(std::optional<Location> location,
                               typename LossOp::Adaptor adaptor,
                               SmallVectorImpl<Type> &inferred) {
  RankedTensorType in = tensorType(adaptor.getInput());
  return inferTensor(
      lossShape(in.getShape(), tensorType(adaptor.getTargets()).getShape(),
                adaptor.getReduction(), inferError<LossOp>(location)),
      in.getElementType(), inferred);
}

template <typename LossOp> static LogicalResult verifyLoss(LossOp op) {
  auto expected = lossShape(tensorType(op.getInput()).getShape(),
                            tensorType(op.getTargets()).getShape(),
                            op.getReduction(), opError(op));
  if (failed(expected))
    return failure();
  ArrayRef<int64_t> result = tensorType(op.getResult()).getShape();
  if (result != ArrayRef<int64_t>(*expected))
    return op.emitOpError("result shape ")
           << shapeStr(result) << " should be "
           << lossShapeStr(*expected, op.getReduction());
  // The loss is in the input's type, or in f32 (mixed precision: bf16
  // logits, an fp32 loss).
  if (!tensorType(op.getResult()).getElementType().isF32() &&
      failed(verifySameElementType(op, {op.getInput(), op.getResult()})))
    return failure();
  return success();
}

LogicalResult CrossEntropyOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> location, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  return inferLoss<CrossEntropyOp>(location, adaptor, inferred);
}
LogicalResult NllLossOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location> location,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &inferred) {
  return inferLoss<NllLossOp>(location, adaptor, inferred);
}

bool CrossEntropyOp::isCompatibleReturnTypes(TypeRange inferred,
                                             TypeRange actual) {
  return isInferredOrF32(inferred, actual);
}
bool NllLossOp::isCompatibleReturnTypes(TypeRange inferred, TypeRange actual) {
  return isInferredOrF32(inferred, actual);
}

LogicalResult CrossEntropyOp::verify() { return verifyLoss(*this); }
LogicalResult NllLossOp::verify() { return verifyLoss(*this); }

/// Checks a loss gradient's operands against the forward loss's rules.
static LogicalResult verifyLossGrad(Operation *op, Value input, Value targets,
                                    Value grad, LossReduction reduction) {
  auto loss = lossShape(tensorType(input).getShape(),
                        tensorType(targets).getShape(), reduction, opError(op));
  if (failed(loss))
    return failure();
  ArrayRef<int64_t> g = tensorType(grad).getShape();
  if (g != ArrayRef<int64_t>(*loss))
    return op->emitOpError("loss gradient shape ")
           << shapeStr(g) << " should be " << lossShapeStr(*loss, reduction);
  if (tensorType(grad).getElementType().isF32()) // an fp32 loss's gradient
    return success();
  return verifySameElementType(op, {input, grad});
}

LogicalResult CrossEntropyGradOp::verify() {
  return verifyLossGrad(*this, getInput(), getTargets(), getGrad(),
                        getReduction());
}
LogicalResult NllLossGradOp::verify() {
  return verifyLossGrad(*this, getResult(), getTargets(), getGrad(),
                        getReduction());
}

LogicalResult SoftmaxGradOp::verify() {
  return verifyDim(*this, getDim(), tensorType(getOutput()).getRank());
}
LogicalResult LogSoftmaxGradOp::verify() {
  return verifyDim(*this, getDim(), tensorType(getOutput()).getRank());
}
LogicalResult LayerNormGradOp::verify() {
  return verifyNorm(*this, getInput(), {getScale()}, getDim(), getInputGrad());
}
LogicalResult RmsNormGradOp::verify() {
  return verifyNorm(*this, getInput(), {getScale()}, getDim(), getInputGrad());
}

LogicalResult
AccumulateGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param =
      symbolTable.lookupNearestSymbolFrom<ParameterOp>(*this, getNameAttr());
  if (!param)
    return emitOpError("'") << getName() << "' does not name a model.parameter";
  // A bf16 gradient of an f32 parameter is widened (exactly) as it is added.
  auto grad = cast<RankedTensorType>(getGrad().getType());
  auto type = param.getTensorType();
  bool widened = grad.getElementType().isBF16() &&
                 type.getElementType().isF32() &&
                 grad.getShape() == type.getShape();
  if (grad != type && !widened)
    return emitOpError("gradient type ")
           << getGrad().getType() << " does not match parameter type "
           << param.getType();
  if (param.getFrozen())
    return emitOpError("parameter '") << getName() << "' is frozen";
  return success();
}

//===----------------------------------------------------------------------===//
// Distributed plan
//===----------------------------------------------------------------------===//

/// Stage and slot are indices; a collective's request is waited exactly once.
static LogicalResult verifyStageSlot(Operation *op, int64_t stage,
                                     int64_t slot) {
  if (stage < 0 || slot < 0)
    return op->emitOpError("stage and slot must be non-negative, got stage ")
           << stage << " and slot " << slot;
  return success();
}

static LogicalResult verifyCollective(Operation *op, int64_t stage,
                                      int64_t slot) {
  if (failed(verifyStageSlot(op, stage, slot)))
    return failure();
  Value request = op->getResult(0);
  if (!request.hasOneUse() || !isa<WaitOp>(*request.getUsers().begin()))
    return op->emitOpError("request must be waited exactly once (one "
                           "model.wait), it has ")
           << std::distance(request.use_begin(), request.use_end()) << " uses";
  if (request.getUsers().begin()->getBlock() != op->getBlock())
    return op->emitOpError(
        "request must be waited in the block that starts it");
  return success();
}

LogicalResult AllGatherOp::verify() {
  return verifyCollective(*this, getStage(), getSlot());
}
LogicalResult ReduceScatterOp::verify() {
  return verifyCollective(*this, getStage(), getSlot());
}
LogicalResult ClearGradsOp::verify() {
  return verifyStageSlot(*this, getStage(), getSlot());
}

/// Whether `shape` broadcasts to `to` (NumPy rules: aligned right, each dim
/// equal or 1).
static bool broadcastsTo(ArrayRef<int64_t> shape, ArrayRef<int64_t> to) {
  if (shape.size() > to.size())
    return false;
  for (auto [d, size] : llvm::enumerate(llvm::reverse(shape)))
    if (size != 1 && size != to[to.size() - 1 - d])
      return false;
  return true;
}

LogicalResult FusedElementwiseOp::verify() {
  Block &body = getBody().front();
  if (body.getArgumentTypes() != getInputs().getTypes())
    return emitOpError("body arguments must have the inputs' types");
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end with model.yield");
  if (yield.getValue().getType() != getType())
    return emitOpError("yields ") << yield.getValue().getType()
                                  << ", not the result type " << getType();
  ArrayRef<int64_t> shape = getType().getShape();
  for (Value input : getInputs())
    if (!broadcastsTo(tensorType(input).getShape(), shape))
      return emitOpError("input of type ")
             << input.getType() << " does not broadcast to the result's shape "
             << shapeStr(shape);
  for (Operation &op : body.without_terminator()) {
    if (!op.hasTrait<PointwiseTrait>() || op.getNumResults() != 1)
      return op.emitOpError("is not pointwise: model.fused_elementwise holds "
                            "only pointwise ops");
    if (!broadcastsTo(tensorType(op.getResult(0)).getShape(), shape))
      return op.emitOpError("result does not broadcast to the fused result's "
                            "shape ")
             << shapeStr(shape);
  }
  return success();
}

#define GET_OP_CLASSES
#include "ir/ModelOps.cpp.inc"
