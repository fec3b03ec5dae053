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
#include <string_view>

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
  int64_t tokens = 0;          ///< consumed since step 0, all ranks: step*G*T
  double flopsPerStep = 0;     ///< the plan's model FLOPs of a global step
  double modelTflops = 0;      ///< per rank: its FLOPs / step time / 1e12
  double mfu = -1;             ///< modelTflops / peak; < 0: no peak known
  int64_t arenaBytes = 0;      ///< the plan's arena
  int64_t rssPeakBytes = -1;   ///< the process's peak RSS (CPU); < 0: none
  int64_t deviceMemBytes = -1; ///< device memory in use (CUDA); < 0: none
  std::string timestamp;       ///< ISO 8601 UTC, when the step ended
  std::string clock;           ///< local wall-clock hh:mm:ss, for the log
  double valLoss = 0;          ///< the validation loss after this step,
  bool hasValLoss = false;     ///< when it was evaluated
};

/// The peak TFLOP/s of `device` (a CUDA device name) for a step of `flops`
/// of which `bf16Flops` are bf16: each precision's dense peak, weighted by
/// the time its FLOPs would take at that peak. 0 for a device not in the
/// table (H100 SXM and PCIe, H200, A100).
double defaultPeakTflops(const std::string &device, double flops,
                         double bf16Flops);

/// One JSON object, without a newline: the loss with %.9g (float precision),
/// lr and grad_norm exactly (shortest round trip). Non-finite values are
/// written as NaN/Infinity, which Python's json module reads.
std::string metricsJson(const StepRecord &r);

/// The loss as metricsJson writes it ("3.14159274", "NaN"): a checkpoint's
/// manifest records its step's loss so that `--resume` can tell the run's
/// own metrics file from another run's with the same steps.
std::string lossText(double loss);

/// One metrics line parsed (the bare NaN/Infinity/-Infinity metricsJson
/// writes, which JSON lacks, are read as strings of that text): its
/// "step" and the text of its "loss", or an error for any other line.
struct MetricsLine {
  uint64_t step = 0;
  std::string loss; ///< empty when the line has none
};
Expected<MetricsLine> parseMetricsLine(std::string_view line);

/// `step   12/300 | loss 5.123456 | lr 1.00e-03 | ... | ETA 0:01:23`, with
/// the tokens so far, TFLOP/s, MFU (when known), memory and the time.
std::string logLine(const StepRecord &r, int64_t totalSteps, double etaSeconds);

/// h:mm:ss.
std::string formatDuration(double seconds);

/// A metrics file, one flushed line per step so a crash loses nothing.
class MetricsFile {
public:
  /// Starts an empty file (a new one, through OutputFile), or appends to it
  /// (a resumed run) when `append`. Either way the path must name a regular
  /// file or nothing: a symlink, device, FIFO or directory is refused.
  /// `replace` false: a new file is put in place only where none is (a
  /// second run started at the same moment with the same --metrics fails
  /// instead of writing into the first one's file).
  static Expected<MetricsFile> create(const std::string &path,
                                      bool append = false,
                                      bool replace = true);

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
