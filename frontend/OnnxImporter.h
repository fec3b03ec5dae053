//===- OnnxImporter.h - ONNX to the model dialect ---------------*- C++ -*-===//
//
// Public entry points of the ONNX frontend. The importer reads a binary
// ModelProto or the ONNX text format and builds a module with one
// `func.func @forward` in the model dialect, every value statically shaped.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_FRONTEND_ONNXIMPORTER_H
#define FASTLLM_FRONTEND_ONNXIMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringMap.h"

#include <optional>
#include <string>
#include <vector>
#include <string>

namespace mlir::fastllm {

struct OnnxImportOptions {
  /// Values for symbolic dims, by dim_param name (`--bind-dim NAME=V`).
  llvm::StringMap<int64_t> dimBindings;
  /// Parse the buffer as ONNX text rather than a binary ModelProto.
  bool textFormat = false;
  /// `--batch-size` / `--seq-len`: bind the two dims of the token input (the
  /// first integer graph input, [batch, seq]) whatever the exporter named
  /// them; a static dim that disagrees is an error.
  std::optional<int64_t> batchSize, seqLen;
  /// Keep the graph's literal sharing of initializers: an Identity of a
  /// weight stays the same parameter (`--keep-shared-initializers`). By
  /// default it becomes a parameter of its own (see GraphImporter).
  bool keepSharedInitializers = false;
  /// When set, receives the real path of each external-data file the
  /// import reads (compile refuses an output that is one of them).
  std::vector<std::string> *filesRead = nullptr;
};

/// ModelProto.metadata_props keys the export helper (tools/fastllm_export.py)
/// writes: JSON arrays of the names of `model.named_parameters()` that are
/// trained and that are frozen. When present, every other initializer under
/// a PyTorch name is a buffer and is not trained.
constexpr const char *kTrainableParametersKey = "fastllm.trainable_parameters";
constexpr const char *kFrozenParametersKey = "fastllm.frozen_parameters";

/// The most elements one tensor of an imported model may have (2^36: 256 GiB
/// of fp32); beyond it element counts and byte sizes stop being meaningful.
constexpr int64_t kMaxTensorElements = int64_t(1) << 36;

/// Lowest and highest default-domain opset the importer accepts.
constexpr int64_t kMinOpset = 13, kMaxOpset = 18;
/// Lowest and highest ModelProto.ir_version the importer accepts.
constexpr int64_t kMinIrVersion = 7, kMaxIrVersion = 10;

/// Imports the model at `path`; the text format is chosen when the file name
/// ends in `.onnxtext`. Diagnostics go to the context's handler with the file
/// as their location; returns null on any error.
OwningOpRef<ModuleOp> importOnnxFile(MLIRContext *context, llvm::StringRef path,
                                     OnnxImportOptions options);

/// Imports a model held in memory. `modelDir` is where external data is
/// looked up (empty: external data is rejected). Used by the fuzzer.
OwningOpRef<ModuleOp> importOnnxBuffer(MLIRContext *context,
                                       llvm::StringRef buffer,
                                       llvm::StringRef name,
                                       llvm::StringRef modelDir,
                                       const OnnxImportOptions &options);

/// Registers the dialects the importer creates ops of.
void registerOnnxImportDialects(DialectRegistry &registry);

} // namespace mlir::fastllm

#endif // FASTLLM_FRONTEND_ONNXIMPORTER_H
