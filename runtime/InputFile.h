//===- InputFile.h - reading the user's files safely ------------*- C++ -*-===//
//
// Every file the runtime and the tools read is the user's, and may be
// anything: a FIFO (whose open blocks until a writer comes: forever), a
// device such as /dev/zero (endless), a symlink where none belongs, or a
// regular file far larger than its format allows. openInput() is the one
// way in: the open itself never blocks (O_NONBLOCK), the opened file must
// be a regular file (fstat, so the check is on what was opened, not on a
// name that may change), and its size is checked against the caller's
// bound before a byte is read or allocated.
//
// Plain C++17 and POSIX: linked by the runtime and by fastllm-opt alike.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_INPUTFILE_H
#define FASTLLM_RUNTIME_INPUTFILE_H

#include "runtime/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fastllm::rt {

/// A file descriptor closed when the object goes.
class InputFd {
public:
  InputFd() = default;
  explicit InputFd(int fd) : fd(fd) {}
  InputFd(InputFd &&other) noexcept : fd(other.fd) { other.fd = -1; }
  InputFd &operator=(InputFd &&other) noexcept;
  InputFd(const InputFd &) = delete;
  InputFd &operator=(const InputFd &) = delete;
  ~InputFd();
  int get() const { return fd; }

private:
  int fd = -1;
};

struct InputOptions {
  /// Larger files are refused before anything is read (-1: no bound).
  int64_t maxBytes = -1;
  /// Refuse a symlink (O_NOFOLLOW) instead of reading what it points to.
  bool noFollow = false;
  /// Open relative to this folder descriptor (openat) instead of the
  /// current directory, when not -1.
  int atFolder = -1;
};

/// The file at `path`, opened for reading as described above, with its
/// size; `what` names it in errors ("--data 'x.tok': ..."). The error for a
/// missing file says "does not exist" (notFound() tells it apart).
struct OpenedInput {
  InputFd fd;
  int64_t size = 0;
};
Expected<OpenedInput> openInput(const std::string &path,
                                const std::string &what,
                                const InputOptions &options = {});

/// Whether an openInput error was for a file that does not exist.
bool notFound(const Status &status);

/// The whole of a regular file of at most `options.maxBytes` bytes.
Expected<std::string> readInputFile(const std::string &path,
                                    const std::string &what,
                                    const InputOptions &options);

/// A file a command reads or writes, for distinctPaths(): the flag that
/// names it ("--data") and its path.
struct NamedPath {
  std::string flag;
  std::string path;
  bool output = false;
};

/// Refuses, before any work, a run whose outputs would replace one of its
/// inputs or each other (`--metrics data.tok`, `--trace` equal to
/// `--metrics`): paths are compared by identity (device and inode when the
/// file exists, whatever names it: a symlink, `./x`, a hard link), else by
/// the resolved folder plus the name. "" or the clash, naming both flags.
std::string distinctPaths(const std::vector<NamedPath> &paths);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_INPUTFILE_H
