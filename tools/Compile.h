//===- Compile.h - the driver's subcommands ---------------------*- C++ -*-===//

#ifndef FASTLLM_TOOLS_COMPILE_H
#define FASTLLM_TOOLS_COMPILE_H

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringMap.h"

#include <string>
#include <vector>

namespace mlir::fastllm {

/// `fastllm-opt compile ...` (argv[0] is the subcommand's name).
int compileMain(int argc, char **argv);

/// Parses `NAME=V` pairs; reports and fails on malformed ones.
bool parseDimBindings(llvm::ArrayRef<std::string> specs,
                      llvm::StringMap<int64_t> &bindings);

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
