//===- InputFile.cpp - opening what the user hands us, without surprises --===//

#include "runtime/InputFile.h"
#include "runtime/OutputFile.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
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

namespace {
/// What a path names, for comparing: (device, inode) of an existing file,
/// else its folder's resolved path and its name.
struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string resolved;
};

Identity identify(const std::string &path) {
  Identity id;
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    return id;
  }
  std::string folder = folderOf(path);
  size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  char buf[PATH_MAX];
  id.resolved = (realpath(folder.c_str(), buf) ? std::string(buf) : folder) +
                "/" + name;
  return id;
}

bool same(const Identity &a, const Identity &b) {
  if (a.exists != b.exists)
    return false;
  return a.exists ? a.dev == b.dev && a.ino == b.ino
                  : a.resolved == b.resolved;
}
} // namespace

std::string fastllm::rt::distinctPaths(const std::vector<NamedPath> &paths) {
  std::vector<Identity> ids;
  for (const NamedPath &p : paths)
    ids.push_back(identify(p.path));
  for (size_t i = 0; i < paths.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      if (!paths[i].output && !paths[j].output)
        continue; // two inputs may well be one file
      if (paths[i].path.empty() || paths[j].path.empty() ||
          !same(ids[i], ids[j]))
        continue;
      const NamedPath &out = paths[i].output ? paths[i] : paths[j];
      const NamedPath &other = paths[i].output ? paths[j] : paths[i];
      if (other.output)
        return out.flag + " '" + out.path + "' and " + other.flag + " '" +
               other.path + "' are the same file: give each output its own";
      return out.flag + " '" + out.path + "' is the same file as " +
             other.flag + " '" + other.path +
             "': an output never replaces an input; choose another name";
    }
  return "";
}
