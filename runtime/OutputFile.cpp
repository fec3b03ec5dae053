//===- OutputFile.cpp - files written whole or not at all -----------------===//

#include "runtime/OutputFile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

std::string fastllm::rt::checkReplaceable(const std::string &path) {
  // The temporary's name is the target's and a suffix: a name that fits
  // but leaves no room for the suffix would fail only at the end of the
  // work (a run's weights after its last step).
  const size_t suffix = std::strlen(kTemporarySuffix) + 6;
  size_t slash = path.find_last_of('/');
  std::string folder = slash == std::string::npos ? "."
                       : slash == 0               ? "/"
                                                  : path.substr(0, slash);
  size_t name = path.size() - (slash == std::string::npos ? 0 : slash + 1);
  long nameMax = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  if (nameMax <= 0)
    nameMax = NAME_MAX;
  if (name + suffix > size_t(nameMax))
    return "'" + path.substr(slash == std::string::npos ? 0 : slash + 1, 40) +
           "...' is a name of " + std::to_string(name) +
           " bytes; files are written under the name and a suffix of " +
           std::to_string(suffix) + " bytes first, which must fit the " +
           "folder's limit of " + std::to_string(nameMax) +
           ": choose a shorter name";
  if (path.size() + suffix >= PATH_MAX)
    return "the path '" + path.substr(0, 40) + "...' is " +
           std::to_string(path.size()) + " bytes; with the temporary's " +
           "suffix it must stay under " + std::to_string(PATH_MAX);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return "";
    return "cannot inspect '" + path + "': " + std::strerror(errno);
  }
  const char *what = S_ISREG(st.st_mode)    ? nullptr
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)
                         ? "a device"
                         : "not a regular file";
  if (!what)
    return "";
  return "'" + path + "' is " + what +
         "; refusing to replace it (write to a regular file or a new path)";
}

void fastllm::rt::ignoreFileSizeSignal() { ::signal(SIGXFSZ, SIG_IGN); }

void fastllm::rt::reserveStandardStreams() {
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      // open() returns the lowest free number: this one.
      int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (opened != fd && opened >= 0)
        ::close(opened);
    }
}

std::string fastllm::rt::folderOf(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool fastllm::rt::readAt(int fd, void *buf, uint64_t size, uint64_t offset) {
  char *p = static_cast<char *>(buf);
  while (size > 0) {
    ssize_t got = ::pread(fd, p, size, offset);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    size -= uint64_t(got);
    offset += uint64_t(got);
  }
  return true;
}

void fastllm::rt::syncFolder(const std::string &folder) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace {
fastllm::rt::TemporaryHook temporaryHook = nullptr;
void tellHook(const std::string &tmp, bool created) {
  if (temporaryHook && !tmp.empty())
    temporaryHook(tmp, created);
}
} // namespace

void fastllm::rt::setTemporaryHook(TemporaryHook hook) { temporaryHook = hook; }

OutputFile::OutputFile(std::string path, bool durable, bool replace)
    : target(std::move(path)), durable(durable), replace(replace) {}

OutputFile::~OutputFile() {
  if (fd >= 0)
    ::close(fd);
  if (!tmp.empty() && !keepTemporary)
    ::unlink(tmp.c_str());
  tellHook(tmp, false);
}

bool OutputFile::fail(const std::string &what, int err) {
  message = what + (err ? std::string(": ") + std::strerror(err) : "");
  return false;
}

bool OutputFile::open() {
  if (target.empty())
    return fail("empty output path", 0);
  if (std::string why = checkReplaceable(target); !why.empty())
    return fail(why, 0);
  tmp = target + kTemporarySuffix + "XXXXXX";
  fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    int err = errno;
    tmp.clear();
    return fail("cannot create a temporary file beside '" + target + "'", err);
  }
  tellHook(tmp, true);
  // mkstemp creates 0600; the result should look like any file we create.
  mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0)
    return fail("cannot write '" + target + "'", errno);
  return true;
}

bool OutputFile::write(const void *data, size_t bytes) {
  if (fd < 0)
    return fail("cannot write '" + target + "': not open", 0);
  for (const char *p = static_cast<const char *>(data); bytes > 0;) {
    ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t(1) << 30));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return fail("cannot write '" + target + "'", n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= size_t(n);
  }
  return true;
}

size_t OutputFile::copyFrom(int source, uint64_t offset, size_t bytes) {
  if (fd < 0)
    return fail("cannot write '" + target + "': not open", 0), SIZE_MAX;
  size_t done = 0;
  while (done < bytes) {
    off64_t from = off64_t(offset + done);
    ssize_t n = ::copy_file_range(source, &from, fd, nullptr,
                                  std::min<size_t>(bytes - done, 1u << 30), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP ||
                  errno == EINVAL || errno == EBADF))
      break; // not here: the caller writes the rest
    if (n < 0)
      return fail("cannot write '" + target + "'", errno), SIZE_MAX;
    if (n == 0) // the source ended early: the caller's bytes say what is there
      break;
    done += size_t(n);
  }
  return done;
}

bool OutputFile::finishWithoutRename() {
  if (fd < 0)
    return fail("cannot write '" + target + "': not open", 0);
  int err = !durable || ::fsync(fd) == 0 ? 0 : errno;
  if (::close(fd) != 0 && !err)
    err = errno;
  fd = -1;
  if (err)
    return fail("cannot write '" + target + "'", err);
  keepTemporary = true;
  return true;
}

bool OutputFile::commit() {
  if (!finishWithoutRename())
    return false;
  keepTemporary = false;
  if (!replace) {
    // Atomically: only when nothing is there (renameat2's RENAME_NOREPLACE).
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(),
                    RENAME_NOREPLACE) == 0) {
      syncFolder(folderOf(target));
      tellHook(tmp, false);
      tmp.clear();
      return true;
    }
    if (errno == EEXIST) {
      keepTemporary = true; // the only copy of what was written
      return fail("'" + target +
                      "' appeared while this was written (another run's "
                      "output?) and is left as it is; what was written is "
                      "kept in '" +
                      tmp + "'",
                  0);
    }
    if (errno != EINVAL && errno != ENOSYS) // (else: a plain rename)
      return fail("cannot write '" + target + "'", errno);
  }
  if (std::string why = renameInto(tmp, target); !why.empty())
    return fail(why, 0);
  tellHook(tmp, false);
  tmp.clear(); // renamed: nothing left to remove
  return true;
}

std::string fastllm::rt::renameInto(const std::string &from,
                                    const std::string &to, bool replace) {
  if (std::string why = checkReplaceable(to); !why.empty())
    return why;
  if (!replace) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(),
                    RENAME_NOREPLACE) == 0) {
      syncFolder(folderOf(to));
      return "";
    }
    if (errno == EEXIST)
      return "'" + to + "' appeared while this was written (another " +
             "run's output?) and is left as it is; pass --overwrite to " +
             "replace it";
    if (errno != EINVAL && errno != ENOSYS) // (else: a plain rename)
      return "cannot write '" + to + "': " + std::strerror(errno);
  }
  if (std::rename(from.c_str(), to.c_str()) != 0)
    return "cannot write '" + to + "': " + std::strerror(errno);
  syncFolder(folderOf(to));
  return "";
}

std::string fastllm::rt::writeFileAtomically(const std::string &path,
                                             const void *data, size_t bytes) {
  OutputFile file(path);
  if (!file.open() || !file.write(data, bytes) || !file.commit())
    return file.error();
  return "";
}
