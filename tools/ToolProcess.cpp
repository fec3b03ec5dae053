//===- ToolProcess.cpp - what fastllm-opt and fastllm-data set up first ---===//
//
// Both executables are LLVM tools (InitLLVM: a crash prints a stack dump).
// Beyond that, each must leave nothing half-written when it is stopped:
// the temporaries OutputFile creates are registered for removal on a
// signal; SIGQUIT (Ctrl-\) stops it like SIGTERM instead of being reported
// as a crash; and a write past `ulimit -f` fails with EFBIG, reported
// naming the file, instead of SIGXFSZ killing the process mid-write.
//
//===----------------------------------------------------------------------===//

#include "tools/ToolProcess.h"

#include "runtime/OutputFile.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Signals.h"

#include <csignal>
#include <string>

void mlir::fastllm::setUpToolProcess() {
  ::fastllm::rt::reserveStandardStreams();
  ::fastllm::rt::ignoreFileSizeSignal();
}

void mlir::fastllm::setUpToolSignals() {
  ::fastllm::rt::setTemporaryHook([](const std::string &path, bool created) {
    if (created)
      llvm::sys::RemoveFileOnSignal(path);
    else
      llvm::sys::DontRemoveFileOnSignal(path);
  });
  // (After InitLLVM, whose handler would take SIGQUIT for a crash.)
  std::signal(SIGQUIT, [](int) { std::raise(SIGTERM); });
}
