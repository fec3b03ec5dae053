//===- CppEmitter.h - planned model IR to C++ -------------------*- C++ -*-===//
//
// Emission never changes the IR (CIRCT's rule): everything it needs (buffer
// offsets, parameter layout) was decided by the passes and is read from
// attributes. The CPU emitter writes C++ that calls runtime/cpu/Kernels.h; the
// CUDA emitter will reuse the walk and the plan and differ in kernel calls.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_CODEGEN_CPPEMITTER_H
#define FASTLLM_CODEGEN_CPPEMITTER_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::fastllm {

/// Writes the C++ translation unit defining fastllm_plan() and
/// fastllm_step() (runtime/ModelABI.h) for a module that went through
/// fastllm-autodiff and fastllm-plan-memory. Fails with diagnostics on ops
/// the CPU target cannot run.
LogicalResult emitCpuSource(ModuleOp module, llvm::raw_ostream &os);

/// Writes every model.parameter's initial value as F32 tensors in the
/// safetensors format, atomically (temporary file, fsync, rename).
LogicalResult writeWeights(ModuleOp module, llvm::StringRef path);

} // namespace mlir::fastllm

#endif // FASTLLM_CODEGEN_CPPEMITTER_H
