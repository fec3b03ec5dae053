//===- Safetensors.h - read and write safetensors files ---------*- C++ -*-===//
//
// Weights come in and go out as safetensors (an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then
// the raw data), so PyTorch tests and users can read them with the
// `safetensors` package. Headers come from user files: every field is checked
// before any byte of data is trusted.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_SAFETENSORS_H
#define FASTLLM_RUNTIME_SAFETENSORS_H

#include "runtime/ModelABI.h"
#include "runtime/Status.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fastllm::rt {

/// One tensor as the header describes it.
struct TensorEntry {
  std::string name;
  std::string dtype; ///< "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0; ///< byte range within the data section
};

/// An open safetensors file with its validated header.
class SafetensorsReader {
public:
  static Expected<SafetensorsReader> open(const std::string &path);

  SafetensorsReader(SafetensorsReader &&other) noexcept;
  SafetensorsReader &operator=(SafetensorsReader &&other) noexcept;
  SafetensorsReader(const SafetensorsReader &) = delete;
  SafetensorsReader &operator=(const SafetensorsReader &) = delete;
  ~SafetensorsReader();

  const std::vector<TensorEntry> &tensors() const { return entries; }
  const TensorEntry *find(const std::string &name) const;
  /// Reads `name`, which must be F32 of exactly `shape`, into `out`.
  Status readF32(const std::string &name, const std::vector<int64_t> &shape,
                 float *out) const;

private:
  SafetensorsReader() = default;
  std::string path;
  int fd = -1;
  uint64_t dataStart = 0;
  std::vector<TensorEntry> entries;
};

/// A float tensor to write: its elements at `data`, or, when `data` is
/// null, produced by `read` into the writer's bounded buffer (whole rows of
/// the last dim at a time) so that no copy of the tensor is ever made.
struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const void *data;
  /// Where `data`'s bytes also lie in an open file, when they do as they
  /// are ({descriptor, offset}, or a negative descriptor): asked just
  /// before the tensor is written, and the descriptor need only stay open
  /// until it is. The writer has the kernel copy them from there (no page
  /// of them is touched in this process), and writes from `data` what it
  /// cannot.
  std::function<std::pair<int, uint64_t>()> source = {};
  /// Writes the `count` elements that start at element `begin` to `out`.
  std::function<void(uint64_t begin, uint64_t count, float *out)> read = {};
  /// Called once the tensor's bytes are written (to let go of them).
  std::function<void()> written = {};
};

/// The most bytes writeSafetensors buffers for a tensor given by `read`.
constexpr uint64_t kWriteBufferBytes = uint64_t(1) << 20;

/// What a writer put in a file.
struct WrittenFile {
  int64_t tensors = 0;
  int64_t bytes = 0;
};

/// Writes F32 tensors to `path` through OutputFile (runtime/OutputFile.h): a
/// temporary file in the same folder, synced and renamed over `path`, so
/// readers see the old file or the complete new one; a device, FIFO,
/// directory or symlink at `path` is refused, never written through.
/// Tensors stream from where they lie: `data` is written as is, `read`
/// fills a buffer of at most kWriteBufferBytes (or one row, if larger).
/// `written`, when given, receives the tensor count and file size.
/// `durable` false skips the sync before the rename, for a file that can be
/// made again (runtime/OutputFile.h).
Status writeSafetensors(
    const std::string &path, const std::vector<TensorRef> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata = {},
    WrittenFile *written = nullptr, bool durable = true, bool replace = true);

/// Which parameters loadParams reads.
enum class Which { All, Frozen };

/// Fills the flat params array with the plan's trainable parameters and the
/// frozen array (PlanInfo::frozenElements) with its frozen ones (with
/// Which::Frozen, only those): each must be in the file as F32 with the
/// plan's shape. `unused`, when given, receives the names of the file's
/// tensors the plan has no parameter for (a file of another model?).
Status loadParams(const std::string &path, const PlanInfo &plan, float *params,
                  float *frozen = nullptr, Which which = Which::All,
                  std::vector<std::string> *unused = nullptr);

/// Writes the plan's trainable parameters from a flat array laid out like
/// params (the weights themselves, or their gradients) and, unless
/// trainableOnly, the frozen ones from `frozen`.
Status saveParams(const std::string &path, const PlanInfo &plan,
                  const float *flat, bool trainableOnly,
                  const float *frozen = nullptr,
                  WrittenFile *written = nullptr, bool replace = true);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_SAFETENSORS_H
