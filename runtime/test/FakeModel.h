//===- FakeModel.h - a model with known gradients ---------------*- C++ -*-===//
//
// The test binary links this file in place of generated code. The model is a
// linear least-squares fit: for token t followed by target u,
//
//   loss = mean over the micro-batch's tokens of 0.5 * |embed[t] + bias -
//   code[u]|^2
//
// with embed [V, D] (trainable, decayed), bias [D] (trainable, not decayed)
// and code [V, D] (frozen). Its gradient is the mean residual, so tests can
// check the runtime's data, accumulation and optimizer against closed forms.
//
// The plan is ZeRO-1 over dp ranks with two stages, each padded to a
// multiple of dp * 32 elements:
//
//   stage 0: bias [0, 4), embed [4, 68), padding   (96 elements at dp = 1,
//            128 at dp = 2 and 4, where embed crosses shard boundaries)
//   stage 1: code, padding                         (64, 64, 128 elements)
//
// The table lists embed, bias, code: not in offset order. The step checks
// that every padding element of params is zero (takePaddingViolations) and
// writes NaN into the padding of grads, which the runtime must ignore.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_TEST_FAKEMODEL_H
#define FASTLLM_RUNTIME_TEST_FAKEMODEL_H

#include "runtime/ModelABI.h"

#include <cstdint>
#include <vector>

namespace fake {

constexpr int64_t kVocab = 16, kDim = 4;

/// Element offsets of the parameters in the flat arrays for dp ranks.
struct Layout {
  int64_t bias, embed, code, stage1, paramElements;
};
Layout layout(int64_t dp);

/// The dp = 1 layout, which setShape(batch, seq) lays out.
constexpr int64_t kBiasOffset = 0, kEmbedOffset = kDim, kCodeOffset = 96,
                  kParamElements = 160;

/// Lays out fastllm_plan() for micro-batches of `batch` x `seq` tokens per
/// rank and `dp` ranks.
void setShape(int64_t batch, int64_t seq, int64_t dp = 1);

/// Steps since the last call that found a nonzero padding element in params.
int64_t takePaddingViolations();

/// From now on, counting fastllm_step calls from 0: the calls listed in
/// `nanGradient` add NaN to bias's gradient (the loss stays finite), and
/// call `signalAt` raises `signal` (0: none) before computing.
void scheduleFaults(std::vector<int64_t> nanGradient, int64_t signalAt = -1,
                    int signal = 0);

/// The StepContext of every fastllm_step call since the last take, in order.
std::vector<fastllm::rt::StepContext> takeStepContexts();

} // namespace fake

#endif // FASTLLM_RUNTIME_TEST_FAKEMODEL_H
