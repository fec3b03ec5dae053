//===- Metrics.cpp - per-step metrics file and log line -------------------===//

#include "runtime/Metrics.h"

#include "runtime/OutputFile.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

using namespace fastllm::rt;

namespace {

/// `x` printed with `format`, or in the shortest form that reads back as the
/// same double when `format` is null.
std::string number(double x, const char *format = nullptr) {
  if (std::isnan(x))
    return "NaN";
  if (std::isinf(x))
    return x > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  if (format)
    return std::string(buf, std::snprintf(buf, sizeof(buf), format, x));
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), x).ptr);
}

} // namespace

std::string fastllm::rt::metricsJson(const StepRecord &r) {
  return "{\"step\": " + std::to_string(r.step) +
         ", \"loss\": " + number(r.loss, "%.9g") + ", \"lr\": " + number(r.lr) +
         ", \"grad_norm\": " + number(r.gradNorm) +
         ", \"tokens_per_s\": " + number(r.tokensPerSecond, "%.1f") +
         ", \"step_ms\": " + number(r.stepMs, "%.3f") +
         ", \"mem_bytes\": " + std::to_string(r.memBytes) +
         ", \"reduce_scatter_bytes\": " + std::to_string(r.reduceScatterBytes) +
         ", \"all_gather_bytes\": " + std::to_string(r.allGatherBytes) +
         ", \"all_reduce_bytes\": " + std::to_string(r.allReduceBytes) +
         ", \"skipped\": " + (r.skipped ? "true" : "false") + "}";
}

std::string fastllm::rt::formatDuration(double seconds) {
  long long s = std::isfinite(seconds) && seconds > 0 ? llround(seconds) : 0;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, s / 60 % 60,
                s % 60);
  return buf;
}

std::string fastllm::rt::logLine(const StepRecord &r, int64_t totalSteps,
                                 double etaSeconds) {
  int width = int(std::to_string(totalSteps).size());
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %*lld/%lld | loss %.6f | lr %.2e | grad_norm %.4g | "
                "%.0f tok/s | %.1f ms | ETA %s",
                width, (long long)r.step, (long long)totalSteps, r.loss, r.lr,
                r.gradNorm, r.tokensPerSecond, r.stepMs,
                formatDuration(etaSeconds).c_str());
  if (r.skipped)
    return std::string(buf) +
           " | SKIPPED: non-finite gradient norm, nothing updated";
  return buf;
}

Expected<MetricsFile> MetricsFile::create(const std::string &path,
                                          bool append) {
  MetricsFile m;
  m.path = path;
  auto refuse = [&](const std::string &why) {
    return Status::error("metrics file: " + why);
  };
  if (std::string why = checkReplaceable(path); !why.empty())
    return refuse(why);
  if (!append)
    if (std::string why = writeFileAtomically(path, ""); !why.empty())
      return refuse(why);
  // O_NOFOLLOW and O_NONBLOCK: whatever replaced the checked entry since, a
  // symlink is not followed and a FIFO does not block the open; fstat then
  // tells what was opened.
  int fd = ::open(path.c_str(),
                  O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
                      O_CLOEXEC,
                  0666);
  if (fd < 0)
    return errorf("cannot open metrics file '%s': %s", path.c_str(),
                  std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      fcntl(fd, F_SETFL, O_APPEND) != 0) {
    ::close(fd);
    return refuse("'" + path +
                  "' is not a regular file; refusing to write "
                  "to it");
  }
  m.file = fdopen(fd, "a");
  if (!m.file) {
    int err = errno;
    ::close(fd);
    return errorf("cannot open metrics file '%s': %s", path.c_str(),
                  std::strerror(err));
  }
  return m;
}

MetricsFile::MetricsFile(MetricsFile &&other) noexcept {
  *this = std::move(other);
}

MetricsFile &MetricsFile::operator=(MetricsFile &&other) noexcept {
  std::swap(path, other.path);
  std::swap(file, other.file);
  return *this;
}

MetricsFile::~MetricsFile() {
  if (file)
    std::fclose(file);
}

Status MetricsFile::append(const StepRecord &r) {
  std::string line = metricsJson(r) + "\n";
  if (std::fputs(line.c_str(), file) < 0 || std::fflush(file) != 0)
    return errorf("cannot write metrics file '%s': %s", path.c_str(),
                  std::strerror(errno));
  return Status();
}
