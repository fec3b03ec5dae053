//===- DataLauncher.cpp - `fastllm-opt data` runs fastllm-data -----------===//
//
// `fastllm-opt data` is the fastllm-data executable beside fastllm-opt
// (tools/Data.cpp), exec'd with the same arguments: SentencePiece's library
// carries its own protobuf, which aborts at load in a process that also holds
// the system protobuf the ONNX importer uses, so the tokenizer lives in a
// process of its own.
//
//===----------------------------------------------------------------------===//

#include "tools/Compile.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/WithColor.h"

#include <cerrno>
#include <cstring>
#include <string>

#include <unistd.h>

using namespace llvm;

int mlir::fastllm::dataMain(int argc, char **argv) {
  // The address of a function in this executable finds its path.
  static int anchor;
  std::string self = sys::fs::getMainExecutable(argv[0], &anchor);
  SmallString<256> tool(sys::path::parent_path(self));
  sys::path::append(tool, "fastllm-data");
  if (self.empty() || !sys::fs::can_execute(tool)) {
    WithColor::error(errs(), "fastllm-opt data")
        << "cannot find '" << tool
        << "', which does the work of `fastllm-opt data`; it is built and "
           "installed beside fastllm-opt\n";
    return 1;
  }
  // The tool takes this process's place (exec, not a child): a signal
  // sent to the pid a user or a script holds reaches the process doing the
  // work, which removes its temporaries and writes nothing after it.
  errs().flush();
  outs().flush();
  ::execv(tool.c_str(), argv);
  WithColor::error(errs(), "fastllm-opt data")
      << "cannot run '" << tool << "': " << std::strerror(errno) << "\n";
  return 1;
}
