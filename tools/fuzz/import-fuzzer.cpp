//===- import-fuzzer.cpp - libFuzzer target for the ONNX importer ---------===//
//
// Feeds arbitrary bytes to the importer as a binary ModelProto. Any input must
// give either a module or diagnostics: never a crash, a hang or unbounded
// memory. Built with -fsanitize=fuzzer,address when the compiler is clang.
//
//===----------------------------------------------------------------------===//

#include "frontend/OnnxImporter.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

#include <cstddef>
#include <cstdint>

using namespace mlir;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static MLIRContext *context = [] {
    DialectRegistry registry;
    fastllm::registerOnnxImportDialects(registry);
    auto *ctx = new MLIRContext(registry);
    ctx->loadAllAvailableDialects();
    // Diagnostics are expected; keep the fuzzer's output readable.
    ctx->getDiagEngine().registerHandler([](Diagnostic &) { return success(); });
    return ctx;
  }();
  fastllm::OnnxImportOptions options;
  options.dimBindings["batch"] = 2;
  options.dimBindings["seq"] = 4;
  // The first byte picks the format, so the text parser is fuzzed as well.
  options.textFormat = size > 0 && data[0] == '<';
  llvm::StringRef buffer(reinterpret_cast<const char *>(data), size);
  OwningOpRef<ModuleOp> module =
      fastllm::importOnnxBuffer(context, buffer, "fuzz", "", options);
  return 0;
}
