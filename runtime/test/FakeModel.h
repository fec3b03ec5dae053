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
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_TEST_FAKEMODEL_H
#define FASTLLM_RUNTIME_TEST_FAKEMODEL_H

#include "runtime/ModelABI.h"

#include <cstdint>

namespace fake {

constexpr int64_t kVocab = 16, kDim = 4;
/// Element offsets of the parameters in the flat arrays.
constexpr int64_t kEmbedOffset = 0, kBiasOffset = kVocab * kDim,
                  kCodeOffset = kBiasOffset + kDim,
                  kParamElements = kCodeOffset + kVocab * kDim;

/// Lays out fastllm_plan() for micro-batches of `batch` x `seq` tokens.
void setShape(int64_t batch, int64_t seq);

} // namespace fake

#endif // FASTLLM_RUNTIME_TEST_FAKEMODEL_H
