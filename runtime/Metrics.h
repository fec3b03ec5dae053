//===- Metrics.h - per-step metrics file and log line -----------*- C++ -*-===//
//
// Each step leaves one JSON line in the --metrics file (tests compare its
// losses against PyTorch's, so they carry full float precision) and one human
// line on stdout.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_METRICS_H
#define FASTLLM_RUNTIME_METRICS_H

#include "runtime/Status.h"

#include <cstdint>
#include <cstdio>
#include <string>

namespace fastllm::rt {

struct StepRecord {
  int64_t step = 0; ///< 1-based
  double loss = 0;  ///< mean over the step's global batch
  double lr = 0;
  double gradNorm = 0; ///< before clipping
  double tokensPerSecond = 0;
  double stepMs = 0;
  int64_t memBytes = 0;
  /// Bytes the step's collectives moved, as the Communicator counts them
  /// (CommBytes): with ZeRO-1 and dp > 1 the reduce-scatter and the
  /// all-gather each count the full padded parameter array, the all-reduce
  /// the gradient norm's sum of squares. All 0 with dp = 1.
  int64_t reduceScatterBytes = 0, allGatherBytes = 0, allReduceBytes = 0;
  /// The global gradient norm was not finite: nothing was updated.
  bool skipped = false;
};

/// One JSON object, without a newline: the loss with %.9g (float precision),
/// lr and grad_norm exactly (shortest round trip). Non-finite values are
/// written as NaN/Infinity, which Python's json module reads.
std::string metricsJson(const StepRecord &r);

/// `step   12/300 | loss 5.123456 | lr 1.00e-03 | ... | ETA 0:01:23`.
std::string logLine(const StepRecord &r, int64_t totalSteps, double etaSeconds);

/// h:mm:ss.
std::string formatDuration(double seconds);

/// A metrics file, one flushed line per step so a crash loses nothing.
class MetricsFile {
public:
  /// Starts an empty file (a new one, through OutputFile), or appends to it
  /// (a resumed run) when `append`. Either way the path must name a regular
  /// file or nothing: a symlink, device, FIFO or directory is refused.
  static Expected<MetricsFile> create(const std::string &path,
                                      bool append = false);

  MetricsFile(MetricsFile &&other) noexcept;
  MetricsFile &operator=(MetricsFile &&other) noexcept;
  MetricsFile(const MetricsFile &) = delete;
  MetricsFile &operator=(const MetricsFile &) = delete;
  ~MetricsFile();

  Status append(const StepRecord &r);

private:
  MetricsFile() = default;
  std::string path;
  FILE *file = nullptr;
};

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_METRICS_H
