//===- CppEmitter.h - planned model IR to C++ -------------------*- C++ -*-===//
//
// Emission never changes the IR (CIRCT's rule): everything it needs (buffer
// offsets, parameter layout, data sizes, weight decay) was decided by the
// passes and is read from attributes (fastllm-prepare-emission makes the last
// decisions visible). One walk serves both targets: the CPU source calls
// runtime/cpu/Kernels.h, the CUDA source (compiled by nvcc) the same API in
// runtime/cuda/Kernels.cuh, which launches kernels on device pointers into
// the same arena; what differs is asked of the TargetDescription. The printer
// is StepEmitter.h/.cpp and its Emit*.cpp parts; Weights.cpp writes the
// initial weights; Translate.cpp exposes the printer to `fastllm-opt
// translate`.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_CODEGEN_CPPEMITTER_H
#define FASTLLM_CODEGEN_CPPEMITTER_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::fastllm {

enum class Target { Cpu, Cuda };

/// Everything in which the emitted source of one target differs from
/// another's, in one place: the emitter asks it, never `if (cuda)`.
struct TargetDescription {
  llvm::StringRef name;         ///< as `--target` and PlanInfo::target spell it
  llvm::StringRef displayName;  ///< in the generated file's first line
  llvm::StringRef sourceFile;   ///< the file `compile` writes the step to
  llvm::StringRef kernelHeader; ///< the kernel library's API
  llvm::StringRef kernelNamespace; ///< where its calls live
  /// What a generated functor's call operator is declared with (CUDA: it
  /// runs on the device and on the host).
  llvm::StringRef functorQualifier;
  /// The C type of bf16 storage, empty when the target computes in fp32 only.
  llvm::StringRef bf16Type;
  /// Whether constants live on the device: a `__device__` array gN the step
  /// finds once through deviceAddress(), rather than a static array.
  bool constantsOnDevice;
  /// Whether the loss must be copied back from the device when the step's
  /// work is done (readScalar), rather than read in place.
  bool lossOnDevice;
  /// Whether the source is written in parts that `compile` builds as
  /// separate translation units in parallel (sourceParts()); otherwise it is
  /// one translation unit.
  bool splitParts;

  static const TargetDescription &get(Target target);
};

/// The target's name, as `--target` and PlanInfo::target spell it.
llvm::StringRef targetName(Target target);

/// Writes the C++ (CUDA: CUDA C++) source defining fastllm_plan() and
/// fastllm_step() (runtime/ModelABI.h) for a module that went through
/// fastllm-autodiff and fastllm-plan-memory. Fails with diagnostics on ops
/// the target cannot run.
///
/// Compiled as it is, the source is one translation unit. A target with
/// `splitParts` writes it in sections that may instead be compiled as N
/// translation units, the k-th with -DFASTLLM_PART=k (1 <= k <= N), and
/// linked together (sourceParts()): part 1 holds the plan and
/// fastllm_step(), whose body only computes pointers and calls kernels;
/// parts 2..S the constants when they are large; none of these needs
/// optimisation. Parts S+1..N hold the explicit instantiations of the
/// kernel templates the step's functors need, which do.
LogicalResult emitSource(ModuleOp module, Target target, llvm::raw_ostream &os);

/// How a source emitSource() wrote splits into translation units.
struct SourceParts {
  unsigned count = 0;       ///< N; 0 when it is one translation unit only
  unsigned unoptimised = 0; ///< S: parts 1..S need no optimisation
};

/// The parts of a source emitSource() wrote, read from its header line
/// `// fastllm-parts: N unoptimised: S`.
SourceParts sourceParts(llvm::StringRef source);

/// Registers the translations `fastllm-to-cpu` and `fastllm-to-cuda`
/// (emitSource() for each target) for `fastllm-opt translate`.
void registerFastllmTranslations();

/// Writes every model.parameter's initial value as F32 tensors in the
/// safetensors format, atomically (temporary file, fsync, rename).
LogicalResult writeWeights(ModuleOp module, llvm::StringRef path);

} // namespace mlir::fastllm

#endif // FASTLLM_CODEGEN_CPPEMITTER_H
