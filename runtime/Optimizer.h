//===- Optimizer.h - AdamW, clipping, learning-rate schedules ---*- C++ -*-===//
//
// Training must reproduce PyTorch step for step, so the update follows
// torch.optim.AdamW's fp32 arithmetic operation by operation (scalars prepared
// in double as Python does, then rounded to float as ATen's kernels do), and
// clipping follows torch.nn.utils.clip_grad_norm_.
//
// With ZeRO, each rank updates only its shard: the optimizer works on the
// shard arrays (master weights, moments, reduced gradients) of one rank, and
// on the pieces of the trainable parameters that fall into that shard. A
// parameter may cross a shard boundary; padding and frozen parameters belong
// to no piece and are never touched. With dp = 1 the shard is the whole flat
// array.
//
// Every loop runs over fixed-size chunks of those pieces, in the order of the
// plan's parameter table: sums are formed per chunk and added in chunk order,
// so results do not depend on the number of OpenMP threads (a resumed run
// must be bit-exact).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_OPTIMIZER_H
#define FASTLLM_RUNTIME_OPTIMIZER_H

#include "runtime/ModelABI.h"

#include <cmath>

#include <cstdint>
#include <vector>

// The update is one function for both targets: nvcc compiles it for the
// device too.
#ifdef __CUDACC__
#define FASTLLM_HOST_DEVICE __host__ __device__
#else
#define FASTLLM_HOST_DEVICE
#endif

namespace fastllm::rt {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  /// Applied only to trainable parameters with ParamInfo::weightDecay set
  /// (rank >= 2), changed by the regexes below.
  double weightDecay = 0.1;
  /// --decay: parameters whose name matches decay too; --no-decay: those
  /// whose name matches do not (it wins). POSIX extended regexes, searched
  /// in the name (as --train and --freeze); empty: none.
  std::string decayRegex, noDecayRegex;
};

/// Whether parameter `p` decays under `config` (its rank >= 2 default,
/// then --decay, then --no-decay). Regexes are valid (checkDecayRegex).
bool decays(const ParamInfo &p, const AdamWConfig &config);

/// "" when `regex` is a valid POSIX extended regex, else why not.
std::string checkDecayRegex(const std::string &regex);

/// The fp32 scalars of one AdamW step, prepared as PyTorch prepares them.
struct AdamWScalars {
  float decay, lerpWeight, beta2, oneMinusBeta2, correction2Sqrt, eps,
      negStepSize;
  bool smallWeight, anyDecay;
};

/// torch.optim.AdamW's fp32 update of one element (master weight p, moments
/// m and v, gradient g), operation by operation.
FASTLLM_HOST_DEVICE inline void adamwUpdate(const AdamWScalars &s, bool decays,
                                            float g, float &p, float &m,
                                            float &v) {
  // param.mul_(1 - lr * weight_decay)
  float pj = decays && s.anyDecay ? p * s.decay : p;
  // exp_avg.lerp_(grad, 1 - beta1), in ATen's two-sided lerp form.
  float mj = m;
  mj = s.smallWeight ? mj + s.lerpWeight * (g - mj)
                     : g - (g - mj) * (1.0f - s.lerpWeight);
  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
  float vj = v * s.beta2;
  vj = vj + s.oneMinusBeta2 * g * g;
  // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
  float denom = sqrtf(vj) / s.correction2Sqrt + s.eps;
  // param.addcdiv_(exp_avg, denom, value=-step_size)
  p = pj + s.negStepSize * mj / denom;
  m = mj;
  v = vj;
}

class AdamW {
public:
  /// The optimizer of rank `rank`'s shard of a valid plan (validatePlan):
  /// every array below has shardElements(plan) elements.
  AdamW(const PlanInfo &plan, const AdamWConfig &config, int64_t rank = 0);

  /// The sum of squares of the trainable gradients in this rank's shard
  /// (frozen parameters have none in PyTorch), accumulated in double. The
  /// global norm is the square root of its sum over ranks.
  double sumOfSquares(const float *gradShard) const;
  /// sqrt(sumOfSquares): the norm when this rank holds everything (dp = 1).
  double gradNorm(const float *gradShard) const;

  /// clip_grad_norm_(max_norm): scales the trainable gradients by
  /// max_norm / (totalNorm + 1e-6) when that is below 1. totalNorm is the
  /// global norm, so every rank scales by the same factor.
  void clipGradients(float *gradShard, double totalNorm, double maxNorm) const;

  /// One AdamW update of the trainable master weights at 1-based step `t`;
  /// m and v start at zero. Frozen parameters, padding and their moments are
  /// not touched.
  void step(float *master, const float *gradShard, float *m, float *v,
            double lr, int64_t t) const;

  /// Trainable elements in this rank's shard.
  int64_t trainableElements() const;

  /// A piece of one trainable parameter, in elements of the shard arrays.
  struct Chunk {
    int64_t begin, end;
    bool decay;
  };
  /// The pieces, in the plan's parameter order (for device versions of the
  /// loops above).
  const std::vector<Chunk> &pieces() const { return chunks; }
  /// The scalars of step t (1-based) at learning rate lr.
  AdamWScalars scalarsAt(double lr, int64_t t) const;
  /// clip_grad_norm_'s factor for the global norm, or 1 when it does not
  /// clip.
  static float clipCoefficient(double totalNorm, double maxNorm);

private:
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
