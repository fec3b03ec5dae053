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

#include <climits>
#include <csignal>
#include <cstring>
#include <string>

#include <unistd.h>

void mlir::fastllm::setUpToolProcess() {
  ::fastllm::rt::reserveStandardStreams();
  ::fastllm::rt::ignoreFileSizeSignal();
}

namespace {
/// The temporaries now open, for removeTemporariesNow() in a signal
/// handler (fixed storage: nothing allocated there).
constexpr int kMaxTemporaries = 16;
char temporaries[kMaxTemporaries][PATH_MAX];
volatile sig_atomic_t temporaryUsed[kMaxTemporaries];
} // namespace

void mlir::fastllm::removeTemporariesNow() {
  for (int i = 0; i < kMaxTemporaries; ++i)
    if (temporaryUsed[i])
      ::unlink(temporaries[i]);
}

void mlir::fastllm::setUpToolSignals() {
  ::fastllm::rt::setTemporaryHook([](const std::string &path, bool created) {
    if (created)
      llvm::sys::RemoveFileOnSignal(path);
    else
      llvm::sys::DontRemoveFileOnSignal(path);
    for (int i = 0; i < kMaxTemporaries; ++i) {
      if (created && !temporaryUsed[i] && path.size() < PATH_MAX) {
        std::memcpy(temporaries[i], path.c_str(), path.size() + 1);
        temporaryUsed[i] = 1;
        return;
      }
      if (!created && temporaryUsed[i] && path == temporaries[i]) {
        temporaryUsed[i] = 0;
        return;
      }
    }
  });
  // (After InitLLVM, whose handler would take SIGQUIT for a crash.)
  std::signal(SIGQUIT, [](int) { std::raise(SIGTERM); });
}
