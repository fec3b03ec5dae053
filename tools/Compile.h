//===- Compile.h - the driver's subcommands ---------------------*- C++ -*-===//

#ifndef FASTLLM_TOOLS_COMPILE_H
#define FASTLLM_TOOLS_COMPILE_H

#include "frontend/OnnxImporter.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/CommandLine.h"

#include <string>
#include <vector>

namespace mlir::fastllm {

/// `fastllm-opt compile ...` (argv[0] is the subcommand's name).
int compileMain(int argc, char **argv);

/// `fastllm-opt data ...`: text to a token file (tools/Data.cpp).
int dataMain(int argc, char **argv);

/// What `--version` prints: the project's version and commit, and LLVM's.
void printVersion(llvm::raw_ostream &os);

/// The importer's flags, shared by `import` and `compile`: `--bind-dim
/// NAME=V` (repeatable) and `--keep-shared-initializers`.
struct ImportFlags {
  explicit ImportFlags(llvm::cl::OptionCategory &category);
  /// Sets the flags' fields of `options`; reports and fails on a malformed
  /// `--bind-dim`.
  bool fill(OnnxImportOptions &options) const;

  llvm::cl::list<std::string> bindDims;
  llvm::cl::opt<bool> keepShared;
};

/// Prints a frontend/driver diagnostic as `FILE: error: message`.
void printDiagnostic(Diagnostic &diag);

/// The context of the `import` and `compile` subcommands: the importer's
/// dialects loaded, diagnostics printed with printDiagnostic.
struct DriverContext {
  DriverContext();
  MLIRContext context;
  ScopedDiagnosticHandler handler;
};

} // namespace mlir::fastllm

#endif // FASTLLM_TOOLS_COMPILE_H
