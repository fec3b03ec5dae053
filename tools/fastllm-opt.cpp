//===- fastllm-opt.cpp - the fastllm-opt driver ---------------------------===//
//
// One binary, five modes:
//   fastllm-opt import MODEL.onnx [--bind-dim N=V]... [-o FILE]   ONNX -> MLIR
//   fastllm-opt compile MODEL -o DIR ...                 the training program
//   fastllm-opt data TEXT... -o TOKENS                     text -> token file
//   fastllm-opt translate --fastllm-to-cpu PLANNED.mlir       MLIR -> C++
//   fastllm-opt [opt flags] INPUT.mlir                            mlir-opt mode
// The opt mode is MLIR's MlirOptMain with only our dialects and passes; the
// translate mode MLIR's MlirTranslateMain with the emitter's translations.
//
//===----------------------------------------------------------------------===//

#include "codegen/CppEmitter.h"
#include "frontend/OnnxImporter.h"
#include "ir/ModelDialect.h"
#include "ir/ModelSummary.h"
#include "ir/Plan.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "tools/Compile.h"
#include "tools/ToolProcess.h"

#include "mlir/Bytecode/BytecodeWriter.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace mlir;
using namespace llvm;

fastllm::ImportFlags::ImportFlags(cl::OptionCategory &category)
    : bindDims("bind-dim",
               cl::desc("Bind the symbolic dim NAME to V (repeatable), e.g. "
                        "batch=8 (default: none; --batch-size and --seq-len "
                        "bind the token input's dims)"),
               cl::value_desc("NAME=V"), cl::cat(category)),
      keepShared("keep-shared-initializers",
                 cl::desc("Keep the graph's literal sharing of initializers: "
                          "an exporter's Identity copy of a weight stays that "
                          "weight, a folded copy stays apart (default: each "
                          "copy is a parameter of its own, a folded copy a "
                          "view of its weight)"),
                 cl::cat(category)) {}

bool fastllm::ImportFlags::fill(OnnxImportOptions &options) const {
  options.keepSharedInitializers = keepShared;
  StringMap<int64_t> &bindings = options.dimBindings;
  for (StringRef spec : bindDims) {
    auto [name, value] = spec.split('=');
    int64_t v;
    if (name.empty() || value.getAsInteger(10, v) || v <= 0) {
      WithColor::error(errs(), "fastllm-opt")
          << "--bind-dim expects NAME=V with a positive integer V, got '"
          << spec << "'\n";
      return false;
    }
    bindings[name] = v;
  }
  return true;
}

/// Prints import diagnostics as `FILE: error: message`: an ONNX file has no
/// line numbers worth showing, and the message names the node.
void fastllm::printDiagnostic(Diagnostic &diag) {
  raw_ostream &os = errs();
  Location loc = diag.getLocation();
  if (auto file = loc->findInstanceOf<FileLineColLoc>())
    os << file.getFilename().getValue() << ": ";
  switch (diag.getSeverity()) {
  case DiagnosticSeverity::Error:
    WithColor(os, raw_ostream::RED, true) << "error: ";
    break;
  case DiagnosticSeverity::Warning:
    WithColor(os, raw_ostream::MAGENTA, true) << "warning: ";
    break;
  default:
    WithColor(os, raw_ostream::BLACK, true) << "note: ";
  }
  os << diag.str() << "\n";
  for (Diagnostic &note : diag.getNotes())
    os << "  note: " << note.str() << "\n";
}

static DialectRegistry importRegistry() {
  DialectRegistry registry;
  fastllm::registerOnnxImportDialects(registry);
  return registry;
}

fastllm::DriverContext::DriverContext()
    : context(importRegistry()), handler(&context, [](Diagnostic &diag) {
        printDiagnostic(diag);
        return success();
      }) {
  context.loadAllAvailableDialects();
  // A user's error is a line with a location and perhaps a note, not the
  // whole function's IR: the op is printed only when asked for
  // (--mlir-print-op-on-diagnostic, where the subcommand registers it).
  auto &options = cl::getRegisteredOptions();
  auto it = options.find("mlir-print-op-on-diagnostic");
  if (it == options.end() || !it->second->getNumOccurrences())
    context.printOpOnDiagnostic(false);
}

static int importMain(int argc, char **argv) {
  cl::OptionCategory category("fastllm-opt import options");
  cl::opt<std::string> input(cl::Positional, cl::Required,
                             cl::desc("<model.onnx | model.onnxtext>"),
                             cl::cat(category));
  cl::opt<std::string> output("o", cl::desc("Output file (default: stdout)"),
                              cl::value_desc("file"), cl::init("-"),
                              cl::cat(category));
  fastllm::ImportFlags importFlags(category);
  cl::opt<bool> summary("summary",
                        cl::desc("Print a readable summary of the model "
                                 "(parameters, inputs, outputs, ops) first"),
                        cl::cat(category));
  cl::opt<bool> noIR("no-ir", cl::desc("Do not print the IR"),
                     cl::cat(category));
  cl::opt<bool> emitBytecode("emit-bytecode",
                             cl::desc("Write MLIR bytecode instead of text"),
                             cl::cat(category));
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  cl::HideUnrelatedOptions({&category, &getColorCategory()});
  cl::ParseCommandLineOptions(
      argc, argv,
      "fastllm-opt import: ONNX model (binary, or ONNX text when the file ends "
      "in .onnxtext) to the model dialect, every shape static\n");

  fastllm::OnnxImportOptions options;
  if (!importFlags.fill(options))
    return 1;

  fastllm::DriverContext driver;
  MLIRContext &context = driver.context;

  OwningOpRef<ModuleOp> module =
      fastllm::importOnnxFile(&context, input, options);
  if (!module)
    return 1;

  if (summary)
    fastllm::printModelSummary(*module, outs());
  if (noIR)
    return 0;
  std::string error;
  auto out = openOutputFile(output, &error);
  if (!out) {
    WithColor::error(errs(), "fastllm-opt import") << error << "\n";
    return 1;
  }
  if (emitBytecode) {
    if (failed(writeBytecodeToFile(*module, out->os())))
      return 1;
  } else {
    module->print(out->os(), OpPrintingFlags());
    out->os() << "\n";
  }
  out->keep();
  return 0;
}

namespace mlir::fastllm {
/// `fastllm-opt consolidate ...` (tools/Consolidate.cpp).
int consolidateMain(int argc, char **argv);
} // namespace mlir::fastllm

int main(int argc, char **argv) {
  // (A closed stdout would be taken by the next file opened, the output.)
  mlir::fastllm::setUpToolProcess();
  InitLLVM y(argc, argv);
  mlir::fastllm::setUpToolSignals();
  cl::SetVersionPrinter(fastllm::printVersion);
  if (argc > 1 && StringRef(argv[1]) == "import") {
    // Drop the subcommand so cl sees `fastllm-opt-import ARGS...`.
    std::string name = std::string(argv[0]) + " import";
    argv[1] = name.data();
    return importMain(argc - 1, argv + 1);
  }
  if (argc > 1 && StringRef(argv[1]) == "compile") {
    std::string name = std::string(argv[0]) + " compile";
    argv[1] = name.data();
    return fastllm::compileMain(argc - 1, argv + 1);
  }
  if (argc > 1 && StringRef(argv[1]) == "data") {
    std::string name = std::string(argv[0]) + " data";
    argv[1] = name.data();
    return fastllm::dataMain(argc - 1, argv + 1);
  }
  if (argc > 1 && StringRef(argv[1]) == "consolidate") {
    std::string name = std::string(argv[0]) + " consolidate";
    argv[1] = name.data();
    return fastllm::consolidateMain(argc - 1, argv + 1);
  }
  if (argc > 1 && StringRef(argv[1]) == "translate") {
    std::string name = std::string(argv[0]) + " translate";
    argv[1] = name.data();
    fastllm::registerFastllmTranslations();
    return asMainReturnCode(
        mlirTranslateMain(argc - 1, argv + 1,
                          "fastllm-opt translate: planned model IR (after "
                          "fastllm-training-pipeline) to the C++ or CUDA "
                          "source of its training step\n"));
  }

  DialectRegistry registry;
  registry.insert<fastllm::model::ModelDialect, fastllm::plan::PlanDialect,
                  func::FuncDialect>();
  fastllm::registerFastllmPasses();
  fastllm::registerFastllmPipelines();
  registerCanonicalizerPass();
  registerCSEPass();
  registerSymbolDCEPass();
  return asMainReturnCode(MlirOptMain(
      argc, argv,
      "fastllm-opt: ONNX transformer -> distributed training program\n\n"
      "Modes:\n"
      "  fastllm-opt import MODEL [--bind-dim NAME=V]... [-o FILE]\n"
      "      import an ONNX model (see `fastllm-opt import --help`)\n"
      "  fastllm-opt compile MODEL -o DIR --batch-size B --seq-len T\n"
      "      build the training program (see `fastllm-opt compile --help`)\n"
      "  fastllm-opt data TEXT... -o TOKENS [--jsonl-field NAME]\n"
      "      text to a token file for `train --data` (`data --help`)\n"
      "  fastllm-opt consolidate CKPT [-o weights.safetensors] [--step N]\n"
      "      a sharded checkpoint to one weights file (`consolidate --help`)\n"
      "  fastllm-opt translate --fastllm-to-cpu|--fastllm-to-cuda "
      "PLANNED.mlir\n"
      "      print the step's C++ of a planned module (`translate --help`)\n"
      "  fastllm-opt [options] INPUT.mlir\n"
      "      run passes over MLIR, as mlir-opt does (options below)\n",
      registry));
}
