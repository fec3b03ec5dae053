//===- EmitKernels.cpp - one kernel call per op, by family ----------------===//
//
// Each function prints the call of one op (or a family of ops sharing a
// kernel) on the kernel library's API (runtime/cpu/Kernels.h, or
// runtime/cuda/Kernels.cuh for CUDA): shapes are static, so they are printed
// as literals or static arrays next to the call.
//
//===----------------------------------------------------------------------===//

#include "codegen/StepEmitter.h"
#include "runtime/Philox.h"

#include "mlir/Dialect/Traits.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {

ArrayRef<int64_t> shapeOf(Value v) { return tensorType(v).getShape(); }

/// The C type of an index tensor's elements.
const char *indexType(Value v) {
  return tensorType(v).getElementType().isInteger(64) ? "int64_t" : "int32_t";
}

/// Rows and columns of a normalisation over dims [dim, rank).
std::string rowsCols(Value x, int64_t dim) {
  ArrayRef<int64_t> s = shapeOf(x);
  return std::to_string(product(s.take_front(dim))) + ", " +
         std::to_string(product(s.drop_front(dim)));
}

/// Outer size, size of `dim` and inner size of `x`.
std::string outerNInner(Value x, int64_t dim) {
  ArrayRef<int64_t> s = shapeOf(x);
  return std::to_string(product(s.take_front(dim))) + ", " +
         std::to_string(s[dim]) + ", " +
         std::to_string(product(s.drop_front(dim + 1)));
}

/// A loss kernel's `ignore, ignoreIndex, reduction` arguments.
std::string lossArgs(std::optional<int64_t> ignore, LossReduction r) {
  std::string args =
      ignore ? "true, " + std::to_string(*ignore) : std::string("false, 0");
  switch (r) {
  case LossReduction::none:
    return args + ", Reduction::None";
  case LossReduction::sum:
    return args + ", Reduction::Sum";
  case LossReduction::mean:
    break;
  }
  return args + ", Reduction::Mean";
}

} // namespace

//===----------------------------------------------------------------------===//
// Matrix products
//===----------------------------------------------------------------------===//

void StepEmitter::emitMatmul(StringRef call, const std::string &out, Value lhs,
                             Value rhs, bool transA, bool transB,
                             const std::string &comment) {
  ArrayRef<int64_t> a = tensorType(lhs).getShape(),
                    b = tensorType(rhs).getShape();
  // A transposed operand is stored [..., K, M] (lhs) or [..., N, K] (rhs);
  // its batch strides are the same as the product's view.
  int64_t m = transA ? a.back() : a[a.size() - 2];
  int64_t k = transA ? a[a.size() - 2] : a.back();
  int64_t n = transB ? b[b.size() - 2] : b.back();
  SmallVector<int64_t> batch;
  OpTrait::util::getBroadcastedShape(a.drop_back(2), b.drop_back(2), batch);
  int64_t batchRank = batch.size();
  auto batchStrides = [&](ArrayRef<int64_t> s) {
    SmallVector<int64_t> full = broadcastStrides(s, batchRank + 2);
    return SmallVector<int64_t>(ArrayRef<int64_t>(full).take_front(batchRank));
  };
  os << "  {\n    static const int64_t bs[] = " << list(batch)
     << ", as[] = " << list(batchStrides(a))
     << ", bs2[] = " << list(batchStrides(b)) << ";\n    " << call << "(" << out
     << ", " << name(lhs) << ", " << name(rhs) << ", " << batchRank
     << ", bs, as, bs2, " << m << ", " << n << ", " << k << ", "
     << (transA ? "true" : "false") << ", " << (transB ? "true" : "false")
     << ");" << comment << "\n  }\n";
}

LogicalResult StepEmitter::emit(MatmulOp o) {
  if (failed(bindResults(o)))
    return failure();
  emitMatmul("matmul", name(o.getResult()), o.getLhs(), o.getRhs(),
             o.getTransposeLhs(), o.getTransposeRhs(), "");
  return success();
}

LogicalResult StepEmitter::emit(MatmulAccumulateGradOp o) {
  auto address = gradAddress(o);
  if (failed(address))
    return failure();
  emitMatmul("addMatmul", *address, o.getLhs(), o.getRhs(), o.getTransposeLhs(),
             o.getTransposeRhs(), " // " + paramRef(o.getName()));
  return success();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

LogicalResult StepEmitter::emit(TransposeOp o) {
  if (failed(bindResults(o)))
    return failure();
  os << "  {\n    static const int64_t shape[] = "
     << list(shapeOf(o.getInput())) << ", perm[] = " << list(o.getPermutation())
     << ";\n    transpose(" << name(o.getResult()) << ", " << name(o.getInput())
     << ", " << shapeOf(o.getInput()).size() << ", shape, perm);\n  }\n";
  return success();
}

/// model.gather (table, indices) or model.gather_grad (grad, indices -> the
/// table's gradient), with `dim` the gathered dimension of the table.
LogicalResult StepEmitter::emitGather(Operation *o, bool grad) {
  if (failed(bindResults(o)))
    return failure();
  Value table = grad ? o->getResult(0) : o->getOperand(0);
  Value data = o->getOperand(0), indices = o->getOperand(1);
  ArrayRef<int64_t> s = shapeOf(table);
  int64_t dim =
      grad ? cast<GatherGradOp>(o).getDim() : cast<GatherOp>(o).getDim();
  auto type = cType(tensorType(table).getElementType(), o);
  if (failed(type))
    return failure();
  os << "  " << (grad ? "gatherGrad" : "gather") << "<" << *type << ", "
     << indexType(indices) << ">(" << name(o->getResult(0)) << ", "
     << name(data) << ", " << name(indices) << ", "
     << product(s.take_front(dim)) << ", " << s[dim] << ", "
     << tensorType(indices).getNumElements() << ", "
     << product(s.drop_front(dim + 1)) << ");\n";
  return success();
}

/// model.slice (big -> small) or model.slice_grad (small's gradient -> big's).
LogicalResult StepEmitter::emitSlice(Operation *o, bool grad) {
  if (failed(bindResults(o)))
    return failure();
  Value big = grad ? o->getResult(0) : o->getOperand(0);
  Value small = grad ? o->getOperand(0) : o->getResult(0);
  ArrayRef<int64_t> start =
      grad ? cast<SliceGradOp>(o).getStart() : cast<SliceOp>(o).getStart();
  ArrayRef<int64_t> stride =
      grad ? cast<SliceGradOp>(o).getStride() : cast<SliceOp>(o).getStride();
  os << "  {\n    static const int64_t big[] = " << list(shapeOf(big))
     << ", start[] = " << list(start) << ", stride[] = " << list(stride)
     << ", small[] = " << list(shapeOf(small)) << ";\n    "
     << (grad ? "sliceGrad(" : "slice(") << name(o->getResult(0)) << ", "
     << name(o->getOperand(0)) << ", " << shapeOf(big).size()
     << ", big, start, stride, small);\n  }\n";
  return success();
}

LogicalResult StepEmitter::emit(SplitOp o) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> in = shapeOf(o.getInput());
  SmallVector<int64_t> start(in.size(), 0), stride(in.size(), 1);
  for (Value r : o.getResults()) {
    int trace = traceBegin(o); // one span per slice call
    os << "  {\n    static const int64_t big[] = " << list(in)
       << ", start[] = " << list(start) << ", stride[] = " << list(stride)
       << ", small[] = " << list(shapeOf(r)) << ";\n    slice(" << name(r)
       << ", " << name(o.getInput()) << ", " << in.size()
       << ", big, start, stride, small);\n  }\n";
    traceEnd(trace);
    start[o.getDim()] += tensorType(r).getDimSize(o.getDim());
  }
  return success();
}

LogicalResult StepEmitter::emit(ConcatOp o) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> out = shapeOf(o.getResult());
  int64_t dim = o.getDim();
  auto type = cType(tensorType(o.getResult()).getElementType(), o);
  if (failed(type))
    return failure();
  SmallVector<int64_t> sizes;
  SmallVector<std::string> ins;
  for (Value in : o.getInputs()) {
    sizes.push_back(tensorType(in).getDimSize(dim));
    ins.push_back(name(in));
  }
  os << "  {\n    static const int64_t sizes[] = " << list(sizes)
     << ";\n    const " << *type << " *ins[] = {";
  llvm::interleaveComma(ins, os);
  os << "};\n    concat(" << name(o.getResult()) << ", " << ins.size()
     << ", ins, sizes, " << product(out.take_front(dim)) << ", "
     << product(out.drop_front(dim + 1)) << ");\n  }\n";
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions and softmax
//===----------------------------------------------------------------------===//

LogicalResult StepEmitter::emitReduce(Operation *o, ArrayRef<int64_t> dims,
                                      StringRef kind) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> in = shapeOf(o->getOperand(0));
  std::string reduced = "{";
  for (int64_t i = 0; i < (int64_t)in.size(); ++i)
    reduced += std::string(i ? ", " : "") +
               (llvm::is_contained(dims, i) ? "true" : "false");
  reduced += in.empty() ? "false}" : "}";
  os << "  {\n    static const int64_t shape[] = " << list(in)
     << ";\n    static const bool reduced[] = " << reduced << ";\n    reduce("
     << name(o->getResult(0)) << ", " << name(o->getOperand(0)) << ", "
     << in.size() << ", shape, reduced, " << kind << ");\n  }\n";
  return success();
}

/// model.softmax or model.log_softmax (`log`) of its input along `dim`.
LogicalResult StepEmitter::emitSoftmax(Operation *o, bool log) {
  if (failed(bindResults(o)))
    return failure();
  Value input = o->getOperand(0);
  int64_t dim =
      log ? cast<LogSoftmaxOp>(o).getDim() : cast<SoftmaxOp>(o).getDim();
  os << "  softmax(" << name(o->getResult(0)) << ", " << name(input) << ", "
     << outerNInner(input, dim) << ", " << (log ? "true" : "false") << ");\n";
  return success();
}

/// The gradient of model.softmax or model.log_softmax (`log`) from its
/// output and the output's gradient.
LogicalResult StepEmitter::emitSoftmaxGrad(Operation *o, bool log) {
  if (failed(bindResults(o)))
    return failure();
  auto [output, grad, dim] =
      log ? std::tuple{cast<LogSoftmaxGradOp>(o).getOutput(),
                       cast<LogSoftmaxGradOp>(o).getGrad(),
                       int64_t(cast<LogSoftmaxGradOp>(o).getDim())}
          : std::tuple{cast<SoftmaxGradOp>(o).getOutput(),
                       cast<SoftmaxGradOp>(o).getGrad(),
                       int64_t(cast<SoftmaxGradOp>(o).getDim())};
  os << "  softmaxGrad(" << name(o->getResult(0)) << ", " << name(output)
     << ", " << name(grad) << ", " << outerNInner(output, dim) << ", "
     << (log ? "true" : "false") << ");\n";
  return success();
}

//===----------------------------------------------------------------------===//
// Normalisations
//===----------------------------------------------------------------------===//

LogicalResult StepEmitter::emit(LayerNormOp o) {
  if (failed(bindResults(o)))
    return failure();
  os << "  layerNorm(" << name(o.getResult()) << ", " << name(o.getInput())
     << ", " << name(o.getScale()) << ", "
     << (o.getBias() ? name(o.getBias()) : "nullptr") << ", "
     << rowsCols(o.getInput(), o.getDim()) << ", "
     << floatLiteral(o.getEpsilon()) << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(LayerNormGradOp o) {
  if (failed(bindResults(o)))
    return failure();
  os << "  layerNormGrad(" << name(o.getInputGrad()) << ", "
     << name(o.getScaleGrad()) << ", " << name(o.getBiasGrad()) << ", "
     << name(o.getInput()) << ", " << name(o.getScale()) << ", "
     << name(o.getGrad()) << ", " << rowsCols(o.getInput(), o.getDim()) << ", "
     << floatLiteral(o.getEpsilon()) << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(RmsNormOp o) {
  if (failed(bindResults(o)))
    return failure();
  os << "  rmsNorm(" << name(o.getResult()) << ", " << name(o.getInput())
     << ", " << name(o.getScale()) << ", " << rowsCols(o.getInput(), o.getDim())
     << ", " << floatLiteral(o.getEpsilon()) << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(RmsNormGradOp o) {
  if (failed(bindResults(o)))
    return failure();
  os << "  rmsNormGrad(" << name(o.getInputGrad()) << ", "
     << name(o.getScaleGrad()) << ", " << name(o.getInput()) << ", "
     << name(o.getScale()) << ", " << name(o.getGrad()) << ", "
     << rowsCols(o.getInput(), o.getDim()) << ", "
     << floatLiteral(o.getEpsilon()) << ");\n";
  return success();
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

/// model.cross_entropy or model.nll_loss (operands: input, targets).
LogicalResult StepEmitter::emitLoss(Operation *o, StringRef call,
                                    std::optional<int64_t> ignoreIndex,
                                    LossReduction reduction) {
  if (failed(bindResults(o)))
    return failure();
  Value input = o->getOperand(0), targets = o->getOperand(1);
  ArrayRef<int64_t> in = shapeOf(input);
  os << "  " << call << "<" << indexType(targets) << ">("
     << name(o->getResult(0)) << ", " << name(input) << ", " << name(targets)
     << ", " << product(in.drop_back()) << ", " << in.back() << ", "
     << lossArgs(ignoreIndex, reduction) << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(CrossEntropyGradOp o) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> in = shapeOf(o.getInput());
  os << "  crossEntropyGrad<" << indexType(o.getTargets()) << ">("
     << name(o.getResult()) << ", " << name(o.getInput()) << ", "
     << name(o.getTargets()) << ", " << name(o.getGrad()) << ", "
     << product(in.drop_back()) << ", " << in.back() << ", "
     << lossArgs(o.getIgnoreIndex(), o.getReduction()) << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(NllLossGradOp o) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> in = shapeOf(o.getResult());
  os << "  nllLossGrad<" << indexType(o.getTargets()) << ">("
     << name(o.getResult()) << ", " << name(o.getTargets()) << ", "
     << name(o.getGrad()) << ", " << product(in.drop_back()) << ", "
     << in.back() << ", " << lossArgs(o.getIgnoreIndex(), o.getReduction())
     << ");\n";
  return success();
}

//===----------------------------------------------------------------------===//
// Dropout and attention
//===----------------------------------------------------------------------===//

LogicalResult StepEmitter::emit(DropoutOp o) {
  // The mask is keyed by sample: the input's leading dim must hold whole
  // samples, the batch first (a [B, ...] activation, or [B * T, ...]
  // flattened), so that each sample's elements are the same whatever the
  // micro-batch is.
  ArrayRef<int64_t> s = shapeOf(o.getInput());
  int64_t n = product(s);
  if (s.empty() || s[0] % microBatch != 0)
    return o.emitOpError("input's leading dimension (shape ")
               << tensorType(o.getInput())
               << ") is not a multiple of the micro-batch " << microBatch
               << ": dropout keys its mask by sample and needs the batch "
                  "as the leading dimension",
           failure();
  int64_t perSample = n / microBatch;
  if ((perSample + 3) / 4 > int64_t(UINT32_MAX))
    return o.emitOpError("has ")
               << perSample << " elements per sample; at most 2^34 are "
               << "supported",
           failure();
  if (failed(bindResults(o)))
    return failure();
  float ratio = o.getRatio().convertToFloat();
  // Evaluating (context->evaluating): threshold 0 keeps every element and
  // scale 1 leaves it as it is, as PyTorch's eval mode does.
  os << "  dropout(" << name(o.getResult()) << ", " << name(o.getInput())
     << ", " << (splats.count(o.getInput()) ? "true" : "false") << ", " << n
     << ", " << perSample << ", " << o.getSite() << "u, context->evaluating ? "
     << "0u : "
     << llvm::format_hex(::fastllm::rt::dropoutThreshold(ratio), 10)
     << "u, context->evaluating ? 1.0f : "
     << llvm::format("%.9e", ::fastllm::rt::dropoutScale(ratio))
     << "f, context->seed, context->step, context->firstSample);\n";
  return success();
}

LogicalResult StepEmitter::emit(CausalAttentionOp o) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> q = shapeOf(o.getQuery());
  os << "  causalAttention(" << name(o.getResult()) << ", " << name(o.getLse())
     << ", " << name(o.getQuery()) << ", " << name(o.getKey()) << ", "
     << name(o.getValue()) << ", " << product(q.drop_back(2)) << ", "
     << q[q.size() - 2] << ", " << q.back() << ", "
     << shapeOf(o.getValue()).back() << ", " << floatLiteral(o.getScale())
     << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(CausalAttentionGradOp o) {
  if (failed(bindResults(o)))
    return failure();
  ArrayRef<int64_t> q = shapeOf(o.getQuery());
  os << "  causalAttentionGrad(" << name(o.getQueryGrad()) << ", "
     << name(o.getKeyGrad()) << ", " << name(o.getValueGrad()) << ", "
     << name(o.getQuery()) << ", " << name(o.getKey()) << ", "
     << name(o.getValue()) << ", " << name(o.getOutput()) << ", "
     << name(o.getLse()) << ", " << name(o.getGrad()) << ", "
     << product(q.drop_back(2)) << ", " << q[q.size() - 2] << ", " << q.back()
     << ", " << shapeOf(o.getValue()).back() << ", "
     << floatLiteral(o.getScale()) << ");\n";
  return success();
}
