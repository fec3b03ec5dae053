//===- ToolProcess.h - how fastllm-opt and fastllm-data start -*- C++ -*-===//

#ifndef FASTLLM_TOOLS_TOOLPROCESS_H
#define FASTLLM_TOOLS_TOOLPROCESS_H

namespace mlir::fastllm {

/// First thing in main(), before InitLLVM: closed standard streams
/// reopened on /dev/null, SIGXFSZ ignored (tools/ToolProcess.cpp).
void setUpToolProcess();

/// After InitLLVM: temporaries removed on SIGINT/SIGTERM/SIGHUP, SIGQUIT
/// taken as SIGTERM (tools/ToolProcess.cpp).
void setUpToolSignals();

/// Removes the OutputFile temporaries open now; async-signal-safe, for a
/// handler of the tool's own that ends the process (fastllm-data's SIGBUS:
/// an input truncated while it is mapped).
void removeTemporariesNow();

} // namespace mlir::fastllm

#endif // FASTLLM_TOOLS_TOOLPROCESS_H
