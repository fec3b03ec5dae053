//===- Optimizer.h - AdamW, clipping, learning-rate schedules ---*- C++ -*-===//
//
// Training must reproduce PyTorch step for step, so the update follows
// torch.optim.AdamW's fp32 arithmetic operation by operation (scalars prepared
// in double as Python does, then rounded to float as ATen's kernels do), and
// clipping follows torch.nn.utils.clip_grad_norm_.
//
// Every loop runs over fixed-size chunks of the flat arrays: sums are formed
// per chunk and added in chunk order, so results do not depend on the number
// of OpenMP threads (a resumed run must be bit-exact).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_OPTIMIZER_H
#define FASTLLM_RUNTIME_OPTIMIZER_H

#include "runtime/ModelABI.h"

#include <cstdint>
#include <vector>

namespace fastllm::rt {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  /// Applied only to trainable parameters with ParamInfo::weightDecay set.
  double weightDecay = 0.1;
};

class AdamW {
public:
  AdamW(const PlanInfo &plan, const AdamWConfig &config);

  /// The L2 norm of the trainable parameters' gradients (frozen ones have
  /// none in PyTorch), accumulated in double.
  double gradNorm(const float *grads) const;

  /// clip_grad_norm_(max_norm): scales the trainable gradients by
  /// max_norm / (totalNorm + 1e-6) when that is below 1.
  void clipGradients(float *grads, double totalNorm, double maxNorm) const;

  /// One AdamW update of the trainable parameters at 1-based step `t`; m and
  /// v start at zero. Frozen parameters and their moments are not touched.
  void step(float *params, const float *grads, float *m, float *v, double lr,
            int64_t t) const;

private:
  /// A piece of one trainable parameter, in elements of the flat arrays.
  struct Chunk {
    int64_t begin, end;
    bool decay;
  };
  std::vector<Chunk> chunks;
  AdamWConfig config;
};

enum class LrScheduleKind { Constant, Cosine };

/// The learning rate of 0-based step s of S = totalSteps, with W = warmup:
///   s < W:              lr * (s + 1) / W
///   constant, s >= W:   lr
///   cosine,   s >= W:   lr * 0.5 * (1 + cos(pi * (s - W) / max(1, S - W)))
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Constant;
  double lr = 0;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 1;

  double at(int64_t step) const;
};

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_OPTIMIZER_H
