//===- import-fuzzer.cpp - libFuzzer target for the ONNX importer ---------===//
//
// Feeds arbitrary bytes to the importer. Any input must give either a module
// or diagnostics: never a crash, a hang or unbounded memory. Built with
// -fsanitize=fuzzer,address when the compiler is clang.
//
// Both of the importer's surfaces are reached:
//  - the ONNX text parser, for inputs that are printable text (as the
//    .onnxtext seeds are), and the protobuf parser for everything else;
//  - external data: the model's folder is a scratch folder holding
//    `weights.bin` (4 KiB of floats), a symlink leaving the folder and an
//    empty file, so initializers with data_location EXTERNAL are loaded,
//    bounds-checked and refused the way a model file's would be.
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"
#include "frontend/OnnxImporter.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

using namespace mlir;

namespace {

/// A folder with files external data may name; made once per process.
std::string makeModelFolder() {
  char folder[] = "/tmp/fastllm-fuzz-XXXXXX";
  if (!mkdtemp(folder))
    std::abort();
  std::string dir = folder;
  if (FILE *f = std::fopen((dir + "/weights.bin").c_str(), "wb")) {
    for (int i = 0; i < 1024; ++i) {
      float v = 0.001f * float(i % 97) - 0.05f;
      std::fwrite(&v, sizeof v, 1, f);
    }
    std::fclose(f);
  }
  if (FILE *f = std::fopen((dir + "/empty.bin").c_str(), "wb"))
    std::fclose(f);
  (void)symlink("/etc/hostname", (dir + "/outside.bin").c_str());
  static std::string removeAtExit = dir;
  std::atexit([] {
    for (const char *name : {"/weights.bin", "/empty.bin", "/outside.bin"})
      ::unlink((removeAtExit + name).c_str());
    ::rmdir(removeAtExit.c_str());
  });
  return dir;
}

/// Text when every byte is printable ASCII or whitespace.
bool looksLikeText(const uint8_t *data, size_t size) {
  if (size == 0)
    return false;
  for (size_t i = 0; i < size; ++i)
    if (!(data[i] == '\n' || data[i] == '\t' || data[i] == '\r' ||
          (data[i] >= 0x20 && data[i] < 0x7f)))
      return false;
  return true;
}

/// Aborts when parseMappedModel accepts `data` but the model it gives,
/// raw_data put back, is not the one protobuf parses.
void checkMappedParse(const uint8_t *data, size_t size) {
  const char *bytes = reinterpret_cast<const char *>(data);
  onnx::ModelProto skeleton, whole;
  std::vector<std::optional<llvm::ArrayRef<char>>> rawData;
  if (!fastllm::parseMappedModel(bytes, size, skeleton, rawData))
    return;
  if (!whole.ParseFromArray(bytes, int(size))) {
    std::fprintf(stderr, "parseMappedModel accepted what protobuf rejects\n");
    std::abort();
  }
  for (auto [i, raw] : llvm::enumerate(rawData))
    if (raw)
      skeleton.mutable_graph()->mutable_initializer(int(i))->set_raw_data(
          raw->data(), raw->size());
  if (skeleton.SerializeAsString() != whole.SerializeAsString()) {
    std::fprintf(stderr, "parseMappedModel and protobuf disagree\n");
    std::abort();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static MLIRContext *context = [] {
    DialectRegistry registry;
    fastllm::registerOnnxImportDialects(registry);
    auto *ctx = new MLIRContext(registry);
    ctx->loadAllAvailableDialects();
    // Diagnostics are expected; keep the fuzzer's output readable.
    ctx->getDiagEngine().registerHandler(
        [](Diagnostic &) { return success(); });
    return ctx;
  }();
  static const std::string folder = makeModelFolder();
  fastllm::OnnxImportOptions options;
  options.dimBindings["batch"] = 2;
  options.dimBindings["seq"] = 4;
  options.textFormat = looksLikeText(data, size);
  if (!options.textFormat && size <= size_t(INT_MAX))
    checkMappedParse(data, size);
  llvm::StringRef buffer(reinterpret_cast<const char *>(data), size);
  OwningOpRef<ModuleOp> module = fastllm::importOnnxBuffer(
      context, buffer, folder + "/fuzz.onnx", folder, options);
  return 0;
}
