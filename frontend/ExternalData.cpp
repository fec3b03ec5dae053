//===- ExternalData.cpp - initializer bytes beside the model ----*- C++ -*-===//
//
// An initializer may keep its bytes in another file (`data_location:
// EXTERNAL`). The file must be inside the model's folder, symlinks
// resolved, and a regular file long enough for the tensor; sizes are checked
// before anything is mapped or allocated.
//
// Each such file is mapped once, read-only, and the parameters' resource
// blobs point into the mapping (immutable blobs), which lives as long as
// the last blob. Pages come from the page cache: nothing is read until
// used, nothing is copied, and a scan that is done with a tensor gives its
// pages back (releaseMappedPages), so the process holds about one tensor
// of a large model at a time. A folded weight in such a mapping is not
// transposed in place (nameFoldedWeights marks it instead; codegen/Weights.cpp
// transposes it while writing weights.safetensors). The .onnx file itself
// is mapped the same way (MappedModel.cpp).
//
// A file that shrinks while it is mapped makes the next access to its lost
// pages raise SIGBUS. The handler installed with the first mapping reports
// that ("fastllm-opt: error: a model file mapped in memory (the .onnx or its
// external data) was truncated while being read; ...") and exits with
// status 1 at once:
// the output folder is not updated (compile's `.fastllm-staging-*` folder
// inside it is left behind). A file rewritten in place while mapped may be
// read partly old, partly new, as with any reader of a changing file.
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mlir;
using namespace mlir::fastllm;

namespace {
/// The mapped ranges the SIGBUS handler recognises. A fixed table written
/// before a range is used and cleared when it is unmapped, so the handler
/// reads it without locks; a mapping beyond its capacity is still used,
/// and a SIGBUS in it is reported as a plain bus error.
/// Each range also keeps the mapped file open (rangeFd), for scanBytes.
constexpr int kMaxRanges = 4096;
std::atomic<uintptr_t> rangeBegin[kMaxRanges], rangeEnd[kMaxRanges];
std::atomic<int> rangeFd[kMaxRanges];
std::mutex rangesMutex;

void registerRange(char *base, size_t size, bool add, int fd = -1) {
  std::lock_guard<std::mutex> lock(rangesMutex);
  uintptr_t b = reinterpret_cast<uintptr_t>(base);
  for (int i = 0; i < kMaxRanges; ++i) {
    if (add && rangeBegin[i].load() == 0) {
      rangeEnd[i].store(b + size);
      rangeFd[i].store(fd);
      rangeBegin[i].store(b);
      return;
    }
    if (!add && rangeBegin[i].load() == b) {
      rangeBegin[i].store(0);
      rangeEnd[i].store(0);
      return;
    }
  }
}

/// SIGBUS in a mapped model file: it was truncated under us. Anything else
/// is a real bus error: the default action runs.
void onBusError(int sig, siginfo_t *info, void *) {
  uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kMaxRanges; ++i) {
    uintptr_t b = rangeBegin[i].load();
    if (b && at >= b && at < rangeEnd[i].load()) {
      static const char message[] =
          "fastllm-opt: error: a model file mapped in memory (the .onnx "
          "or its external data) was truncated while being read; nothing "
          "was written to the output folder\n";
      ssize_t ignored = ::write(2, message, sizeof(message) - 1);
      (void)ignored;
      ::_exit(1);
    }
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void installBusErrorHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = onBusError;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, nullptr);
  });
}
} // namespace

/// Descriptors mappings keep open (MappedFile::fd), and how many may be.
static std::atomic<int> keptDescriptors{0};
static int descriptorBudget() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0)
    return 64;
  rlim_t quarter = limit.rlim_cur == RLIM_INFINITY ? 4096 : limit.rlim_cur / 4;
  return int(std::min<rlim_t>(quarter, 4096));
}

/// The registered range that holds all of `data`, or -1.
static int findRange(ArrayRef<char> data) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(data.data());
  uintptr_t end = begin + data.size();
  for (int i = 0; i < kMaxRanges; ++i) {
    uintptr_t b = rangeBegin[i].load();
    if (b && begin >= b && end <= rangeEnd[i].load())
      return i;
  }
  return -1;
}

bool mlir::fastllm::scanBytes(ArrayRef<char> data, size_t unit,
                              llvm::function_ref<bool(ArrayRef<char>)> fn) {
  int range = data.empty() ? -1 : findRange(data);
  int fd = range < 0 ? -1 : rangeFd[range].load();
  if (fd < 0)
    return fn(data);
  // 1 MiB at a time: the buffer stays in the cache between the read and
  // the scan.
  size_t chunk = std::max<size_t>((size_t(1) << 20) / unit, 1) * unit;
  std::vector<char> buffer(std::min(chunk, data.size()));
  uint64_t offset =
      reinterpret_cast<uintptr_t>(data.data()) - rangeBegin[range].load();
  for (size_t done = 0; done < data.size();) {
    size_t want = std::min(chunk, data.size() - done), got = 0;
    while (got < want) {
      ssize_t n =
          ::pread(fd, buffer.data() + got, want - got, offset + done + got);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      got += size_t(n);
    }
    // A read that comes up short (the file shrank) goes through the
    // mapping, whose SIGBUS says what happened.
    ArrayRef<char> piece = got == want ? ArrayRef<char>(buffer.data(), want)
                                       : data.slice(done, want);
    if (fn(piece))
      return true;
    done += want;
  }
  return false;
}

void mlir::fastllm::releaseMappedPages(ArrayRef<char> data) {
  if (data.empty() || findRange(data) < 0)
    return;
  // Whole pages inside the range only: a neighbour's bytes may share the
  // first and last. The mapping is read-only, so nothing is lost: a later
  // read faults the page in again from the page cache.
  uintptr_t begin = reinterpret_cast<uintptr_t>(data.data());
  uintptr_t end = begin + data.size();
  uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  uintptr_t first = (begin + page - 1) / page * page;
  uintptr_t last = end / page * page;
  if (first < last)
    ::madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  registerRange(base, size, /*add=*/false);
  ::munmap(base, size);
  if (fd >= 0) {
    ::close(fd);
    --keptDescriptors;
  }
}

std::shared_ptr<MappedFile> mlir::fastllm::mapFileReadOnly(int fd,
                                                           uint64_t size) {
  if (size == 0 || size > SIZE_MAX)
    return nullptr;
  void *base = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED)
    return nullptr;
  installBusErrorHandler();
  // The mapping keeps a descriptor of its own (the caller closes `fd`) for
  // scanBytes, while fewer than a quarter of the process's descriptors are
  // so kept: a model may lie in thousands of files (PyTorch writes one per
  // tensor), and scans of the others read through their mappings.
  int own = -1;
  if (keptDescriptors.load() < descriptorBudget()) {
    own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own >= 0)
      ++keptDescriptors;
  }
  registerRange(static_cast<char *>(base), size_t(size), true, own);
  auto mapped =
      std::make_shared<MappedFile>(static_cast<char *>(base), size_t(size));
  mapped->fd = own;
  return mapped;
}

std::shared_ptr<MappedFile>
GraphImporter::mapExternalFile(StringRef realPath, int fd, uint64_t fileSize) {
  auto it = mappedFiles.find(realPath);
  if (it != mappedFiles.end())
    return it->second;
  std::shared_ptr<MappedFile> mapped = mapFileReadOnly(fd, fileSize);
  // A file that cannot be mapped is read instead (and asked again next time:
  // nothing is cached).
  if (mapped)
    mappedFiles[realPath] = mapped;
  return mapped;
}

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

FailureOr<TensorBytes>
GraphImporter::readExternalData(const onnx::TensorProto &tensor,
                                size_t expectedBytes, size_t alignment,
                                StringRef what) {
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
        return fileError() << what << ": external data " << kv.key() << " '"
                           << kv.value() << "' is not a number";
      if (kv.key() == "offset")
        offset = v;
      else
        length = v;
    }
  }
  auto fail = [&]() {
    return fileError() << what << ": external data location '" << location
                       << "' ";
  };
  if (location.empty())
    return fileError() << what << ": external data has no location";
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
  if (options.filesRead)
    options.filesRead->push_back(realPath.str().str());
  // Sizes are checked before anything is mapped or allocated.
  if (offset > fileSize || expectedBytes > fileSize - offset) {
    ::close(fd);
    return fail() << "is too short: the tensor needs " << expectedBytes
                  << " bytes at offset " << offset << ", the file has "
                  << fileSize;
  }
  if (expectedBytes == 0) {
    ::close(fd);
    return TensorBytes{};
  }
  // The mapping, when the tensor lies in it at its elements' alignment (the
  // blob's data must be aligned); a mapping made earlier may be shorter than
  // the file is now.
  if (offset % alignment == 0) {
    std::shared_ptr<MappedFile> mapped =
        mapExternalFile(realPath, fd, fileSize);
    if (mapped && offset <= mapped->size &&
        expectedBytes <= mapped->size - offset) {
      ::close(fd);
      return TensorBytes{ArrayRef<char>(mapped->base + offset, expectedBytes),
                         std::move(mapped), /*mapped=*/true};
    }
  }
  auto bytes = std::make_shared<std::string>(expectedBytes, '\0');
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
  ArrayRef<char> data(bytes->data(), bytes->size());
  return TensorBytes{data, std::move(bytes), /*mapped=*/false};
}

FailureOr<HostTensor> GraphImporter::decodeConstantTensor(
    const onnx::TensorProto &tensor, StringRef what,
    llvm::function_ref<InFlightDiagnostic()> error) {
  if (tensor.data_location() != onnx::TensorProto::EXTERNAL)
    return decodeTensorProto(tensor, context, error);
  auto type = tensorProtoType(tensor, context, error);
  if (failed(type))
    return failure();
  if (type->getNumElements() > kMaxFoldElements)
    return error() << "has " << type->getNumElements()
                   << " elements in external data, more than the "
                   << kMaxFoldElements << " a constant may fold",
           failure();
  size_t width = byteWidth(type->getElementType());
  auto bytes =
      readExternalData(tensor, type->getNumElements() * width, width, what);
  if (failed(bytes))
    return failure();
  return decodeHost(*type, StringRef(bytes->data.data(), bytes->data.size()));
}
