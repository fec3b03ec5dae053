//===- InputFile.cpp - opening what the user hands us, without surprises --===//

#include "runtime/InputFile.h"
#include "runtime/OutputFile.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

InputFd &InputFd::operator=(InputFd &&other) noexcept {
  std::swap(fd, other.fd);
  return *this;
}

InputFd::~InputFd() {
  if (fd >= 0)
    ::close(fd);
}

namespace {
/// The marker notFound() looks for: the error says so in words too.
constexpr const char *kDoesNotExist = "does not exist";

const char *kindOf(mode_t mode) {
  if (S_ISDIR(mode))
    return "a folder";
  if (S_ISFIFO(mode))
    return "a FIFO (a named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}
} // namespace

bool fastllm::rt::notFound(const Status &status) {
  return !status.ok() &&
         status.message().find(kDoesNotExist) != std::string::npos;
}

Expected<OpenedInput> fastllm::rt::openInput(const std::string &path,
                                             const std::string &what,
                                             const InputOptions &options) {
  int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  if (options.noFollow)
    flags |= O_NOFOLLOW;
  int fd = options.atFolder >= 0 ? ::openat(options.atFolder, path.c_str(), flags)
                                 : ::open(path.c_str(), flags);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      return errorf("%s %s", what.c_str(), kDoesNotExist);
    if (err == ELOOP && options.noFollow)
      return errorf("%s is a symbolic link, which is not followed here",
                    what.c_str());
    return errorf("%s: cannot open it: %s", what.c_str(), std::strerror(err));
  }
  OpenedInput in;
  in.fd = InputFd(fd);
  struct stat st;
  if (fstat(fd, &st) != 0)
    return errorf("%s: cannot stat it: %s", what.c_str(), std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return errorf("%s is %s, not a regular file", what.c_str(),
                  kindOf(st.st_mode));
  if (options.maxBytes >= 0 && st.st_size > options.maxBytes)
    return errorf("%s has %lld bytes, more than the %lld such a file can "
                  "hold",
                  what.c_str(), (long long)st.st_size,
                  (long long)options.maxBytes);
  // Reads of a regular file never block; clear the flag all the same so
  // that nothing downstream sees EAGAIN.
  int current = fcntl(fd, F_GETFL);
  if (current >= 0)
    fcntl(fd, F_SETFL, current & ~O_NONBLOCK);
  in.size = st.st_size;
  return in;
}

Expected<std::string> fastllm::rt::readInputFile(const std::string &path,
                                                 const std::string &what,
                                                 const InputOptions &options) {
  Expected<OpenedInput> in = openInput(path, what, options);
  if (!in)
    return in.status();
  std::string text(size_t(in->size), '\0');
  if (!readAt(in->fd.get(), text.data(), text.size(), 0))
    return errorf("%s: cannot read its %lld bytes (it changed while being "
                  "read?)",
                  what.c_str(), (long long)in->size);
  return text;
}
