//===- OutputFile.h - files written whole or not at all ---------*- C++ -*-===//
//
// Every file the compiler and the training binary write goes through
// OutputFile: the bytes go to a temporary file created exclusively in the
// target's folder, are synced, and the temporary is renamed over the target
// only when complete. A rename replaces a directory entry; it never writes
// through a symlink or into a device, so the only check needed is on what the
// entry is now: nothing or a regular file may be replaced, anything else (a
// device node, a FIFO, a socket, a directory, a symlink) is refused with a
// message before a byte is written. A failed or abandoned write leaves the
// target as it was and removes its temporary. A file that can be made again
// (compile's weights.safetensors: the model's weights, rewritten) may skip
// the sync: readers still see the old file or the complete new one while the
// system runs, and after a crash it may be short, which its reader reports
// (a truncated safetensors file is refused), never silently wrong.
//
// Plain C++17 and POSIX: linked by the runtime and by fastllm-opt alike.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_OUTPUTFILE_H
#define FASTLLM_RUNTIME_OUTPUTFILE_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastllm::rt {

/// Why `path` may not be replaced by a new file, or "" when it may: it does
/// not exist or is a regular file (not a symlink to one).
std::string checkReplaceable(const std::string &path);

/// Reads `size` bytes of `fd` at `offset` into `buf`, pread after pread
/// (a short read is not mistaken for data); false when the file ends first
/// or cannot be read.
bool readAt(int fd, void *buf, uint64_t size, uint64_t offset);

/// Opens /dev/null on each of file descriptors 0, 1 and 2 that is closed
/// (`train >&-`): otherwise the next file opened would take its number, and
/// the log would be written into it (the metrics file, a checkpoint's
/// lock). Called first by every main().
void reserveStandardStreams();

/// Makes a write past the file-size limit (`ulimit -f`) fail with EFBIG,
/// reported naming the file with its temporary removed, instead of the
/// default SIGXFSZ killing the process in the middle of the write (a run's
/// trained weights lost with it). Called first by every main().
void ignoreFileSizeSignal();

/// Suffix of the temporaries OutputFile creates: `<target>.tmp-XXXXXX`.
/// Cleanup code recognises orphans (left by a killed process) by it.
constexpr const char *kTemporarySuffix = ".tmp-";

/// Told of each temporary OutputFile creates (`created` true) and of its
/// end (renamed into place or removed: false), so that a tool a user may
/// interrupt can register it for removal on a signal (LLVM's
/// RemoveFileOnSignal): a killed `fastllm-opt data` leaves no
/// `x.tok.tmp-XXXXXX`. None by default; set once, before any file is
/// written.
using TemporaryHook = void (*)(const std::string &path, bool created);
void setTemporaryHook(TemporaryHook hook);

class OutputFile {
public:
  /// `durable`: sync the file before it is renamed over the target (see
  /// above for when not to). `replace` false: commit() refuses a target that
  /// exists by then (one that appeared since the caller checked: another
  /// run's output), keeping the complete temporary and naming it.
  explicit OutputFile(std::string path, bool durable = true,
                      bool replace = true);
  OutputFile(const OutputFile &) = delete;
  OutputFile &operator=(const OutputFile &) = delete;
  /// Removes the temporary unless commit() succeeded.
  ~OutputFile();

  /// Checks the target and creates the temporary. Returns false and sets
  /// error() on failure.
  bool open();
  /// Appends bytes; false (and error()) on failure.
  bool write(const void *data, size_t bytes);
  bool write(const std::string &text) {
    return write(text.data(), text.size());
  }
  /// Appends `bytes` bytes of the open file `source` from `offset`, copied
  /// by the kernel (copy_file_range: they never pass through this process,
  /// and a filesystem that can share extents shares them). Returns how many
  /// were copied before the kernel declined (another filesystem, an old
  /// kernel): the caller writes the rest itself. Sets error() and returns
  /// SIZE_MAX on a real failure (the disk is full, say).
  size_t copyFrom(int source, uint64_t offset, size_t bytes);
  /// Syncs the temporary, checks the target again and renames over it, then
  /// syncs the folder. Returns false (and error()) on failure; the target is
  /// then untouched.
  bool commit();
  /// Like commit() but leaves the complete temporary in place for a caller
  /// that renames several files together (see renameInto()); temporaryPath()
  /// names it and the destructor no longer removes it.
  bool finishWithoutRename();

  const std::string &path() const { return target; }
  const std::string &temporaryPath() const { return tmp; }
  const std::string &error() const { return message; }

private:
  bool fail(const std::string &what, int err);

  std::string target, tmp, message;
  int fd = -1;
  bool durable, replace;
  bool keepTemporary = false;
};

/// Writes `data` to `path` through an OutputFile. Returns "" or the error.
std::string writeFileAtomically(const std::string &path, const void *data,
                                size_t bytes);
inline std::string writeFileAtomically(const std::string &path,
                                       const std::string &text) {
  return writeFileAtomically(path, text.data(), text.size());
}

/// Renames the complete file `from` over `to` after checking that `to` may be
/// replaced, and syncs `to`'s folder. Returns "" or the error. `replace`
/// false: only where nothing is (RENAME_NOREPLACE; a file that appeared
/// since the caller checked is left as it is, an error).
std::string renameInto(const std::string &from, const std::string &to,
                       bool replace = true);

/// Makes renames and new entries in `folder` durable. A folder that cannot be
/// synced (some network filesystems) still holds complete files.
void syncFolder(const std::string &folder);

/// The folder part of `path` ("." when it has none).
std::string folderOf(const std::string &path);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_OUTPUTFILE_H
