//===- StepEmitter.h - the step printer (private to codegen/) ---*- C++ -*-===//
//
// The printer behind emitSource(): one walk of @train_step in program order,
// one kernel call per op. Its parts live in one file each:
//   StepEmitter.cpp      the walk, names and buffers, memory and collective
//                        ops, the file's frame;
//   EmitPlan.cpp         the parameter, stage and slot tables, makePlan(), and
//                        the constants;
//   EmitElementwise.cpp  pointwise ops and fused chains as functors;
//   EmitKernels.cpp      one emit function per kernel op, by family (matmul,
//                        data movement, reductions, normalisations, losses,
//                        dropout, attention).
// Everything that differs between targets is asked of the TargetDescription.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_CODEGEN_STEPEMITTER_H
#define FASTLLM_CODEGEN_STEPEMITTER_H

#include "codegen/CppEmitter.h"
#include "ir/ModelDialect.h"
#include "ir/Plan.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <optional>
#include <string>

namespace mlir::fastllm {

inline RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// The product of `shape`'s dimensions (1 for a scalar).
int64_t product(ArrayRef<int64_t> shape);

/// Row-major strides of `operand` as seen from a broadcast result of rank
/// `rank` (0 where the operand is broadcast).
SmallVector<int64_t> broadcastStrides(ArrayRef<int64_t> operand, int64_t rank);

/// A C++ string literal holding exactly the bytes of `s`, whatever they are.
/// This is the only way text from the input reaches generated code.
std::string cString(StringRef s);

/// A braced C++ initializer of `values` ({0} when empty: zero-length arrays
/// are not C++).
std::string list(ArrayRef<int64_t> values);

/// A float attribute as a C++ float literal that reads back to the same bits.
std::string floatLiteral(const APFloat &value);

class StepEmitter {
public:
  StepEmitter(ModuleOp module, Target target, raw_ostream &out)
      : module(module), desc(TargetDescription::get(target)), out(out) {}
  LogicalResult emit();

private:
  //===--- StepEmitter.cpp: names, buffers, the walk ----------------------===//
  FailureOr<std::string> cType(Type type, Operation *where);
  /// The type a functor computes in for stored type `stored`: bf16 operands
  /// are widened to float, so a functor computes in fp32 and its result is
  /// rounded once when stored.
  std::string computeType(const std::string &stored) const {
    return !desc.bf16Type.empty() && stored == desc.bf16Type ? "float" : stored;
  }
  std::string name(Value v) { return names.lookup(v); }
  /// How a comment refers to parameter `symbol`: by its index in kParams,
  /// never by its name (names come from the input: only cString() may print
  /// them).
  std::string paramRef(StringRef symbol) const;
  /// Declares the pointer for result `i` of `op` at its planned offset.
  LogicalResult bindResult(Operation *op, unsigned i);
  /// Declares the pointers of all of `op`'s results.
  LogicalResult bindResults(Operation *op);
  /// The arena address of a parameter's gradient accumulator, planned on
  /// `op` by fastllm-plan-memory.
  FailureOr<std::string> gradAddress(Operation *op);
  LogicalResult emitOp(Operation *op);
  /// The kernel call(s) of `op`, without the trace hooks.
  LogicalResult emitCalls(Operation *op);
  /// Whether `op` makes kernel calls, each of which is traced: not a
  /// constant, view, parameter, collective, wait or return.
  static bool isTraced(Operation *op);
  /// Prints the trace hook before a kernel call of `op` and adds the call to
  /// the trace table (kTraceOps); returns its index there.
  int traceBegin(Operation *op);
  /// Prints the trace hook after kernel call `index`.
  void traceEnd(int index);
  /// kTraceOps and kNumTraceOps, defined before makePlan() reads them.
  std::string traceTable() const;
  /// The explicit instantiations (`extern` ones when `declare`) of
  /// instances[i] for i = first, first + stride, ...
  std::string instantiations(bool declare, size_t first, size_t stride) const;
  /// Writes the file: header, functors, the plan and step, and (split
  /// targets) the kernel parts.
  void writeFile(const std::string &planText);

  // Memory, collectives and the step's end.
  LogicalResult emit(model::GetParameterOp op);
  LogicalResult emitCollective(Operation *op);
  LogicalResult emit(model::WaitOp op);
  LogicalResult emit(model::ClearGradsOp op);
  LogicalResult emit(ViewLikeOpInterface view);
  LogicalResult emit(model::AccumulateGradOp op);
  LogicalResult emit(func::ReturnOp op);

  //===--- EmitPlan.cpp ---------------------------------------------------===//
  LogicalResult emitConstants(func::FuncOp step);
  LogicalResult emitPlan(const MemoryPlan &plan);

  //===--- EmitElementwise.cpp --------------------------------------------===//
  /// One `elementwise` call computing `op`'s result from its operands with
  /// a functor whose body is `functorBody` (statements on x0, x1, ...).
  LogicalResult emitElementwise(Operation *op, const std::string &functorBody);
  /// The C++ expression of a pointwise op on its operands x0, x1, ...
  FailureOr<std::string> pointwiseExpr(Operation *op);
  /// The functor body of a fused op: its ops in order, one local each.
  FailureOr<std::string> fusedBody(model::FusedElementwiseOp fused);
  LogicalResult emitPointwise(Operation *op);
  LogicalResult emit(model::FusedElementwiseOp op);

  //===--- EmitKernels.cpp ------------------------------------------------===//
  /// A `call` (matmul, addMatmul) of op(lhs)·op(rhs) into `out`.
  void emitMatmul(StringRef call, const std::string &out, Value lhs, Value rhs,
                  bool transA, bool transB, const std::string &comment);
  LogicalResult emit(model::MatmulOp op);
  LogicalResult emit(model::MatmulAccumulateGradOp op);
  // Data movement.
  LogicalResult emit(model::TransposeOp op);
  LogicalResult emitGather(Operation *op, bool grad);
  LogicalResult emitSlice(Operation *op, bool grad);
  LogicalResult emit(model::SplitOp op);
  LogicalResult emit(model::ConcatOp op);
  // Reductions and softmax.
  LogicalResult emitReduce(Operation *op, ArrayRef<int64_t> dims,
                           StringRef kind);
  LogicalResult emitSoftmax(Operation *op, bool log);
  LogicalResult emitSoftmaxGrad(Operation *op, bool log);
  // Normalisations.
  LogicalResult emit(model::LayerNormOp op);
  LogicalResult emit(model::LayerNormGradOp op);
  LogicalResult emit(model::RmsNormOp op);
  LogicalResult emit(model::RmsNormGradOp op);
  // Losses.
  LogicalResult emitLoss(Operation *op, StringRef call,
                         std::optional<int64_t> ignoreIndex,
                         model::LossReduction reduction);
  LogicalResult emit(model::CrossEntropyGradOp op);
  LogicalResult emit(model::NllLossGradOp op);
  // Dropout and attention.
  LogicalResult emit(model::DropoutOp op);
  LogicalResult emit(model::CausalAttentionOp op);
  LogicalResult emit(model::CausalAttentionGradOp op);

  ModuleOp module;
  const TargetDescription &desc;
  raw_ostream &out;
  /// Sections are written here first and assembled into `out` at the end.
  std::string text;
  llvm::raw_string_ostream os{text};
  DenseMap<Value, std::string> names;
  DenseSet<Value> splats; ///< 1-element arrays standing for a splat
  unsigned counter = 0;
  std::string constants;
  /// Each constant's declaration, definition (in `constants` too) and
  /// elements, for a split source that compiles large ones apart.
  struct ConstantDef {
    std::string declaration, definition;
    int64_t elements;
  };
  SmallVector<ConstantDef> constantDefs;
  std::string constantPointers;   ///< CUDA: the step's pointers to them
  std::optional<MemoryPlan> plan; ///< the module's, read once
  int64_t microBatch = 1;         ///< samples per micro-batch: the tokens' rows
  llvm::StringMap<std::string> functors; ///< signature and body -> name
  std::string functorDefs;
  /// The argument lists of the `elementwise` instances the step calls
  /// ("float *, int, const int64_t *, F0, In<float>"), in order of first
  /// use; a split source instantiates them in its kernel parts.
  SmallVector<std::string> instances;
  llvm::StringSet<> instanceSet;
  llvm::StringMap<int> paramIndex; ///< parameter symbol -> index in kParams
  /// The rows of kTraceOps, one per kernel call in program order.
  SmallVector<std::string> traceOps;
};

} // namespace mlir::fastllm

#endif // FASTLLM_CODEGEN_STEPEMITTER_H
