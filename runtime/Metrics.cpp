//===- Metrics.cpp - per-step metrics file and log line -------------------===//

#include "runtime/Metrics.h"

#include "runtime/Json.h"
#include "runtime/OutputFile.h"

#include <algorithm>
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

std::string fastllm::rt::lossText(double loss) {
  return number(loss, "%.9g");
}

Expected<MetricsLine> fastllm::rt::parseMetricsLine(std::string_view line) {
  // Quote the non-finite literals outside strings; nothing else changes.
  std::string quoted;
  quoted.reserve(line.size() + 8);
  bool inString = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (inString) {
      quoted += c;
      if (c == '\\' && i + 1 < line.size())
        quoted += line[++i];
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"')
      inString = true;
    std::string_view rest = line.substr(i);
    bool done = false;
    for (std::string_view word : {"-Infinity", "Infinity", "NaN"})
      if (!done && rest.substr(0, word.size()) == word) {
        quoted += '"' + std::string(word) + '"';
        i += word.size() - 1;
        done = true;
      }
    if (!done)
      quoted += c;
  }
  Expected<JsonValue> v = parseJson(quoted);
  if (!v)
    return v.status();
  const JsonValue *step = v->get("step");
  std::optional<uint64_t> number = step ? step->asUint64() : std::nullopt;
  if (!number)
    return Status::error("no \"step\"");
  MetricsLine out;
  out.step = *number;
  if (const JsonValue *loss = v->get("loss");
      loss && (loss->kind == JsonValue::Kind::Number ||
               loss->kind == JsonValue::Kind::String))
    out.loss = loss->text;
  return out;
}

std::string fastllm::rt::metricsJson(const StepRecord &r) {
  return "{\"step\": " + std::to_string(r.step) +
         ", \"loss\": " + lossText(r.loss) + ", \"lr\": " + number(r.lr) +
         ", \"grad_norm\": " + number(r.gradNorm) +
         ", \"tokens_per_s\": " + number(r.tokensPerSecond, "%.1f") +
         ", \"step_ms\": " + number(r.stepMs, "%.3f") +
         ", \"mem_bytes\": " + std::to_string(r.memBytes) +
         ", \"reduce_scatter_bytes\": " + std::to_string(r.reduceScatterBytes) +
         ", \"all_gather_bytes\": " + std::to_string(r.allGatherBytes) +
         ", \"all_reduce_bytes\": " + std::to_string(r.allReduceBytes) +
         ", \"skipped\": " + (r.skipped ? "true" : "false") +
         ", \"tokens\": " + std::to_string(r.tokens) +
         ", \"flops_per_step\": " + number(r.flopsPerStep, "%.0f") +
         ", \"model_tflops\": " + number(r.modelTflops, "%.6g") +
         (r.mfu >= 0 ? ", \"mfu\": " + number(r.mfu, "%.6g") : "") +
         ", \"arena_bytes\": " + std::to_string(r.arenaBytes) +
         (r.rssPeakBytes >= 0
              ? ", \"rss_peak_bytes\": " + std::to_string(r.rssPeakBytes)
              : "") +
         (r.deviceMemBytes >= 0
              ? ", \"device_mem_bytes\": " + std::to_string(r.deviceMemBytes)
              : "") +
         (r.hasValLoss ? ", \"val_loss\": " + number(r.valLoss, "%.9g") : "") +
         ", \"time\": \"" + r.timestamp + "\"}";
}

double fastllm::rt::defaultPeakTflops(const std::string &device, double flops,
                                      double bf16Flops) {
  struct Peak {
    const char *has, *hasNot;
    double bf16, fp32;
  };
  // Dense (no sparsity) peaks from NVIDIA's data sheets, TFLOP/s. fp32
  // matmuls run in full fp32 (CUBLAS_COMPUTE_32F), not TF32.
  static const Peak kPeaks[] = {{"H200", nullptr, 989.4, 66.9},
                                {"H100 PCIe", nullptr, 756.0, 51.2},
                                {"H100", "NVL", 989.4, 66.9},
                                {"A100", nullptr, 312.0, 19.5}};
  for (const Peak &p : kPeaks)
    if (device.find(p.has) != std::string::npos &&
        !(p.hasNot && device.find(p.hasNot) != std::string::npos)) {
      double seconds = bf16Flops / p.bf16 + (flops - bf16Flops) / p.fp32;
      return seconds > 0 ? flops / seconds : p.fp32;
    }
  return 0;
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
  char buf[512];
  char mfu[32] = "";
  // One decimal from 1% up; below, two significant digits (a CPU run
  // against a GPU's peak is 0.012%, not 0.0%).
  if (r.mfu >= 0)
    std::snprintf(mfu, sizeof(mfu),
                  100 * r.mfu >= 1 || r.mfu == 0 ? " | MFU %.1f%%"
                                                 : " | MFU %.2g%%",
                  100 * r.mfu);
  int64_t mem = r.deviceMemBytes >= 0 ? r.deviceMemBytes : r.rssPeakBytes;
  std::snprintf(buf, sizeof(buf),
                "%s step %*lld/%lld | loss %.6f | lr %.2e | grad_norm %.4g | "
                "%lld tok | %.0f tok/s | %.3g TFLOP/s%s | %s %.1f MiB | "
                "%.1f ms | ETA %s",
                r.clock.c_str(), width, (long long)r.step,
                (long long)totalSteps, r.loss, r.lr, r.gradNorm,
                (long long)r.tokens, r.tokensPerSecond, r.modelTflops, mfu,
                r.deviceMemBytes >= 0 ? "gpu mem" : "peak rss",
                double(std::max<int64_t>(mem, 0)) / 1048576.0, r.stepMs,
                formatDuration(etaSeconds).c_str());
  if (r.skipped)
    return std::string(buf) +
           " | SKIPPED: non-finite gradient norm, nothing updated";
  return buf;
}

Expected<MetricsFile> MetricsFile::create(const std::string &path,
                                          bool append, bool replace) {
  MetricsFile m;
  m.path = path;
  auto refuse = [&](const std::string &why) {
    return Status::error("metrics file: " + why);
  };
  if (std::string why = checkReplaceable(path); !why.empty())
    return refuse(why);
  if (!append) {
    OutputFile empty(path, /*durable=*/true, replace);
    if (!empty.open())
      return refuse(empty.error());
    if (!empty.commit()) {
      // (The kept temporary is empty: nothing of this run's to keep.)
      ::unlink(empty.temporaryPath().c_str());
      struct stat there;
      return refuse(!replace && ::lstat(path.c_str(), &there) == 0
                        ? "'" + path + "' appeared since the run started "
                              "(another run writing the same --metrics?) "
                              "and is left as it is"
                        : empty.error());
    }
  }
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
  // A line goes in whole or not at all: a write cut short (a full disk) is
  // taken back, so the file stays lines a reader and --resume take.
  std::string line = metricsJson(r) + "\n";
  int fd = fileno(file);
  off_t before = ::lseek(fd, 0, SEEK_END);
  for (size_t done = 0; done < line.size();) {
    ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      if (before >= 0)
        (void)::ftruncate(fd, before);
      return errorf("cannot write metrics file '%s': %s", path.c_str(),
                    std::strerror(err));
    }
    done += size_t(n);
  }
  return Status();
}
