//===- ExternalData.cpp - initializer bytes beside the model ----*- C++ -*-===//
//
// An initializer may keep its bytes in another file (`data_location:
// EXTERNAL`). The file must be inside the model's folder, symlinks
// resolved, and a regular file long enough for the tensor; sizes are checked
// before anything is allocated.
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mlir;
using namespace mlir::fastllm;

int mlir::fastllm::openRegularFile(const std::string &path, uint64_t &size,
                                   std::string &error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    error = std::string("cannot open the file: ") + std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error = S_ISDIR(st.st_mode) ? "is a directory, not a file"
                                : "is not a regular file (a FIFO, device or "
                                  "socket); refusing to read it";
    ::close(fd);
    return -1;
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0)
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  size = uint64_t(st.st_size);
  return fd;
}

FailureOr<std::unique_ptr<std::string>>
GraphImporter::readExternalData(const onnx::TensorProto &tensor,
                                size_t expectedBytes) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const onnx::StringStringEntryProto &kv : tensor.external_data()) {
    char *end = nullptr;
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset" || kv.key() == "length") {
      uint64_t v = std::strtoull(kv.value().c_str(), &end, 10);
      if (kv.value().empty() || *end)
        return fileError() << "initializer '" << tensor.name()
                           << "': external data " << kv.key() << " '"
                           << kv.value() << "' is not a number";
      if (kv.key() == "offset")
        offset = v;
      else
        length = v;
    }
  }
  auto fail = [&]() {
    return fileError() << "initializer '" << tensor.name()
                       << "': external data location '" << location << "' ";
  };
  if (location.empty())
    return fileError() << "initializer '" << tensor.name()
                       << "': external data has no location";
  if (modelDir.empty())
    return fail() << "cannot be resolved for a model read from memory";
  if (llvm::sys::path::is_absolute(location))
    return fail()
           << "is an absolute path; it must be inside the model's folder";
  for (StringRef part : llvm::make_range(llvm::sys::path::begin(location),
                                         llvm::sys::path::end(location)))
    if (part == "..")
      return fail() << "leaves the model's folder";
  SmallString<256> path(modelDir);
  llvm::sys::path::append(path, location);
  SmallString<256> realDir, realPath;
  if (llvm::sys::fs::real_path(modelDir, realDir) ||
      llvm::sys::fs::real_path(path, realPath))
    return fail() << "does not exist";
  // A symlink inside the folder may still point outside of it.
  if (!StringRef(realPath).starts_with((realDir + "/").str()))
    return fail() << "resolves to '" << realPath
                  << "', outside the model's folder";
  if (length && *length != expectedBytes)
    return fail() << "has length " << *length << " but the tensor needs "
                  << expectedBytes << " bytes";
  uint64_t fileSize = 0;
  std::string openError;
  int fd = openRegularFile(realPath.str().str(), fileSize, openError);
  if (fd < 0)
    return fail() << openError;
  // Sizes are checked before anything is allocated.
  if (offset > fileSize || expectedBytes > fileSize - offset) {
    ::close(fd);
    return fail() << "is too short: the tensor needs " << expectedBytes
                  << " bytes at offset " << offset << ", the file has "
                  << fileSize;
  }
  auto bytes = std::make_unique<std::string>(expectedBytes, '\0');
  size_t done = 0;
  while (done < expectedBytes) {
    ssize_t n =
        ::pread(fd, bytes->data() + done, expectedBytes - done, offset + done);
    if (n <= 0)
      break;
    done += n;
  }
  ::close(fd);
  if (done != expectedBytes)
    return fail() << "is too short: needed " << expectedBytes
                  << " bytes at offset " << offset << ", read " << done;
  return bytes;
}
