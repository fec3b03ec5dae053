//===- reader-fuzzer.cpp - libFuzzer target for the runtime's file readers ===//
//
// Feeds arbitrary bytes to the readers of the files a user hands `train`
// and `fastllm-opt consolidate`: a checkpoint manifest (parsed, then its
// plan fingerprint turned into a layout), a safetensors file (opened, every
// F32 tensor read), a token file (opened, mapped, some ids read) and a
// metrics line (as `--resume` reads the --metrics file it continues). The
// first byte picks the reader; the rest is the file. Any input must give a
// value or an error: never a crash, a hang or unbounded memory. Built with
// -fsanitize=fuzzer,address when the compiler is clang.
//
//===----------------------------------------------------------------------===//

#include "runtime/Checkpoint.h"
#include "runtime/Data.h"
#include "runtime/Metrics.h"
#include "runtime/Safetensors.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

using namespace fastllm::rt;

namespace {

/// The bytes as a file: an in-memory file (memfd), named by its /proc path,
/// which the readers open as they open any path.
struct MemoryFile {
  int fd = -1;
  std::string path;
  MemoryFile(const uint8_t *data, size_t size) {
    fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0)
      std::abort();
    for (size_t done = 0; done < size;) {
      ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0)
        std::abort();
      done += size_t(n);
    }
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  ~MemoryFile() { ::close(fd); }
};

void manifest(const uint8_t *data, size_t size) {
  Expected<Manifest> m =
      parseManifest(std::string_view(reinterpret_cast<const char *>(data), size));
  if (!m)
    return;
  (void)checkpointLayout(*m);
}

void safetensors(const uint8_t *data, size_t size) {
  MemoryFile file(data, size);
  Expected<SafetensorsReader> reader = SafetensorsReader::open(file.path);
  if (!reader)
    return;
  for (const TensorEntry &e : reader->tensors()) {
    if (e.dtype != "F32")
      continue;
    // The reader checked that the shape's elements are the entry's bytes,
    // which lie in the file: the buffer is at most the file's size.
    std::vector<float> out((e.end - e.begin) / sizeof(float));
    (void)reader->readF32(e.name, e.shape, out.data());
  }
}

void tokens(const uint8_t *data, size_t size) {
  MemoryFile file(data, size);
  Expected<TokenFile> t = TokenFile::open(file.path, TokenDtype::U16,
                                          /*seqLen=*/4, /*vocabSize=*/300,
                                          /*dtypeGiven=*/false);
  if (!t)
    return;
  int64_t ids[5];
  t->read(0, 5, ids);
  t->read(t->size() - 5, 5, ids);
}

void metricsLine(const uint8_t *data, size_t size) {
  (void)parseMetricsLine(
      std::string_view(reinterpret_cast<const char *>(data), size));
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  switch (data[0] % 4) {
  case 0:
    manifest(data + 1, size - 1);
    break;
  case 1:
    safetensors(data + 1, size - 1);
    break;
  case 2:
    tokens(data + 1, size - 1);
    break;
  default:
    metricsLine(data + 1, size - 1);
    break;
  }
  return 0;
}
