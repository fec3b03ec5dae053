//===- Data.h - token file and samplers -------------------------*- C++ -*-===//
//
// The training data is one file of little-endian token ids, after the header
// `fastllm-opt data` writes (runtime/TokenFileFormat.h) or raw. It is
// memory-mapped (corpora are larger than memory is worth spending on them) and
// checked once at startup, so that a bad id fails the launch with its position
// instead of indexing out of the embedding table hours into a run.
//
// Sample offsets are pure functions of (step, sample index) (and the seed),
// never of earlier draws: a resumed run and every data-parallel rank compute
// the same global batch without coordination.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_DATA_H
#define FASTLLM_RUNTIME_DATA_H

#include "runtime/Status.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastllm::rt {

enum class TokenDtype { U16, U32 };
enum class SamplerKind { Sequential, Random };

/// A read-only memory map of a token file.
class TokenFile {
public:
  /// Maps `path` and validates it: a regular file whose ids (after its
  /// header, if it has one) are a multiple of the dtype's size, with at least
  /// seqLen + 2 tokens (one sample and its shifted targets, with the
  /// sequential formula's modulus >= 1) and every id below vocabSize. A
  /// header's width wins over `dtype` unless `dtypeGiven` (the user's
  /// --data-dtype), which must then agree; its vocabulary must not exceed
  /// the model's.
  static Expected<TokenFile> open(const std::string &path, TokenDtype dtype,
                                  int64_t seqLen, int64_t vocabSize,
                                  bool dtypeGiven = false);

  TokenFile(TokenFile &&other) noexcept;
  TokenFile &operator=(TokenFile &&other) noexcept;
  TokenFile(const TokenFile &) = delete;
  TokenFile &operator=(const TokenFile &) = delete;
  ~TokenFile();

  int64_t size() const { return numTokens; }
  /// Widens tokens [begin, begin + count) to int64, the models' index type.
  void read(int64_t begin, int64_t count, int64_t *out) const;

private:
  TokenFile() = default;
  const void *base = nullptr; ///< the mapping
  const void *ids = nullptr;  ///< the first id, after any header
  size_t bytes = 0;
  TokenDtype dtype = TokenDtype::U16;
  int64_t numTokens = 0;
};

/// Where each sample of each step starts. A step's global batch has
/// G = dp * gradAccum * batchSize samples of T = seqLen tokens; with
/// M = numTokens - T - 1:
///   sequential: sample i of step s starts at ((s * G + i) * T) mod M,
///   random:     a splitmix64 hash of (seed, s, i) mapped onto [0, M).
/// Rank r owns samples [r * G / dp, (r + 1) * G / dp), taken in micro-batches
/// of batchSize.
class Sampler {
public:
  Sampler(SamplerKind kind, uint64_t seed, int64_t numTokens, int64_t seqLen,
          int64_t batchSize, int64_t gradAccum, int64_t dp);

  int64_t batchSize() const { return batch; }
  int64_t seqLen() const { return seq; }
  int64_t globalBatch() const { return batch * gradAccum * dp; }
  /// Token offset of global sample `sample` of 0-based step `step`.
  int64_t offset(int64_t step, int64_t sample) const;
  /// Global index of row `row` of micro-batch `micro` on rank `rank`.
  int64_t sampleIndex(int64_t rank, int64_t micro, int64_t row) const {
    return rank * (globalBatch() / dp) + micro * batch + row;
  }

private:
  SamplerKind kind;
  uint64_t seed;
  int64_t modulus, seq, batch, gradAccum, dp;
};

/// Writes micro-batch `micro` of `rank` for 0-based `step` as int64
/// [batchSize, seqLen] row-major: the inputs to `tokens`, the same tokens
/// shifted by one to `targets`.
void fillMicroBatch(const TokenFile &data, const Sampler &sampler, int64_t step,
                    int64_t rank, int64_t micro, int64_t *tokens,
                    int64_t *targets);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_DATA_H
