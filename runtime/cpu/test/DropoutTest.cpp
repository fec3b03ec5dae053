//===- DropoutTest.cpp - dropout and its Philox words -----------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

// Tests Philox4x32-10 against Random123's known-answer vectors.
TEST(DropoutTest, PhiloxKnownAnswers) {
  using fastllm::rt::philox4x32;
  using fastllm::rt::Philox4x32;
  struct Kat {
    Philox4x32 counter;
    uint32_t k0, k1;
    Philox4x32 want;
  } kats[] = {
      {{{0, 0, 0, 0}},
       0,
       0,
       {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat &k : kats) {
    Philox4x32 got = philox4x32(k.counter, k.k0, k.k1);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got.v[i], k.want.v[i]) << i;
  }
  // The threshold is ceil(p * 2^32) of the float ratio; the scale 1/(1-p).
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.0f), 0u);
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.5f), 0x80000000u);
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.25f), 0x40000000u);
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.1f), 429496736u);
  EXPECT_EQ(fastllm::rt::dropoutScale(0.5f), 2.0f);
  EXPECT_EQ(fastllm::rt::dropoutScale(0.1f), float(1.0 / (1.0 - double(0.1f))));
}

/// cpu::dropout of `in` as `samples` samples, the ratio's threshold and
/// scale as generated code passes them.
std::vector<float> runDropout(const std::vector<float> &in, int64_t samples,
                              float p, uint32_t site, uint64_t seed,
                              int64_t step, int64_t firstSample,
                              bool splat = false, int64_t n = -1) {
  n = n < 0 ? int64_t(in.size()) : n;
  std::vector<float> out(n, -1.0f);
  dropout(out.data(), in.data(), splat, n, n / samples, site,
          fastllm::rt::dropoutThreshold(p), fastllm::rt::dropoutScale(p), seed,
          step, firstSample);
  return out;
}

// Tests that the kernel (16 Philox calls at a time) keeps exactly where
// dropoutWords' word >= threshold, element by element, for sample sizes
// around the kernel's 64-element blocks and the 4-word groups.
TEST(DropoutTest, MatchesThePhiloxWords) {
  const uint32_t threshold = fastllm::rt::dropoutThreshold(0.4f);
  for (int64_t per : {1, 3, 4, 63, 64, 65, 1000, 40003}) {
    const int64_t samples = 3, n = samples * per;
    std::vector<float> ones(n, 1.0f), out(n);
    dropout(out.data(), ones.data(), false, n, per, 0xdeadbeefu, threshold,
            1.0f, 0x0123456789abcdefull, 77, 1000);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      fastllm::rt::Philox4x32 w = fastllm::rt::dropoutWords(
          0x0123456789abcdefull, 77, 1000 + i / per, 0xdeadbeefu, i % per / 4);
      wrong += (out[i] != 0.0f) != (w.v[i % per % 4] >= threshold);
    }
    EXPECT_EQ(wrong, 0) << per;
  }
}

// Tests the keep rate and the scaling: over 2^20 ones, the kept fraction is
// 1 - p within 5 standard deviations, every kept value is exactly 1/(1-p)
// and every other exactly 0; the output's mean stays 1 (within 5 sigma).
TEST(DropoutTest, KeepRateAndScale) {
  const int64_t n = int64_t(1) << 20;
  std::vector<float> ones(n, 1.0f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<float> out = runDropout(ones, 8, p, 12345, 42, 3, 16);
    const float scale = float(1.0 / (1.0 - double(p)));
    int64_t kept = 0, other = 0;
    double sum = 0;
    for (float v : out) {
      kept += v == scale;
      other += v != scale && v != 0.0f;
      sum += v;
    }
    double q = 1.0 - p, sigma = std::sqrt(p * q / double(n));
    EXPECT_EQ(other, 0) << p;
    EXPECT_NEAR(double(kept) / n, q, 5 * sigma) << p;
    EXPECT_NEAR(sum / n, 1.0, 5 * sigma * scale) << p;
  }
  // Ratio 0 keeps everything, unscaled.
  std::vector<float> all = runDropout(ones, 8, 0.0f, 1, 2, 3, 4);
  EXPECT_EQ(all, ones);
}

// Tests that the mask is a function of (seed, step, global sample, site,
// index in the sample) alone: a batch split in micro-batches (or ranks) at
// their first global sample draws the same masks as the whole batch, and
// changing any part of the key changes about 2p(1-p) of the decisions, as
// independent masks would.
TEST(DropoutTest, MaskDependsOnTheKeyOnly) {
  const int64_t samples = 6, per = 1001; // not a multiple of 4
  std::vector<float> x = randomFloats(samples * per, 90);
  std::vector<float> whole = runDropout(x, samples, 0.3f, 77, 5, 9, 12);
  for (int64_t split : {1, 2, 3}) {
    std::vector<float> parts;
    for (int64_t first = 0; first < samples; first += split) {
      std::vector<float> part(x.begin() + first * per,
                              x.begin() + (first + split) * per);
      std::vector<float> got =
          runDropout(part, split, 0.3f, 77, 5, 9, 12 + first);
      parts.insert(parts.end(), got.begin(), got.end());
    }
    EXPECT_EQ(parts, whole) << split;
  }
  auto differing = [&](const std::vector<float> &other) {
    int64_t d = 0;
    for (size_t i = 0; i < whole.size(); ++i)
      d += (whole[i] == 0.0f) != (other[i] == 0.0f);
    return double(d) / double(whole.size());
  };
  const double expect = 2 * 0.3 * 0.7,
               sigma = std::sqrt(expect * (1 - expect) / double(whole.size()));
  for (auto [what, other] :
       {std::pair{"seed",
                  runDropout(x, samples, 0.3f, 77, uint64_t(5) << 32, 9, 12)},
        std::pair{"step", runDropout(x, samples, 0.3f, 77, 5, 10, 12)},
        std::pair{"sample", runDropout(x, samples, 0.3f, 77, 5, 9, 13)},
        std::pair{"site", runDropout(x, samples, 0.3f, 78, 5, 9, 12)}})
    EXPECT_NEAR(differing(other), expect, 6 * sigma) << what;
  // Within a batch, each sample's mask differs from its neighbour's.
  std::vector<float> ones(samples * per, 1.0f);
  std::vector<float> m = runDropout(ones, samples, 0.3f, 77, 5, 9, 12);
  EXPECT_FALSE(std::equal(m.begin(), m.begin() + per, m.begin() + per));
  // Kept values are x / (1 - p) exactly, dropped ones 0.
  const float scale = fastllm::rt::dropoutScale(0.3f);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_TRUE(whole[i] == 0.0f || whole[i] == x[i] * scale) << i;
}

// Tests that the backward, the same call on the gradient, drops exactly
// the forward's elements; a splat input is read as one value for all; and
// the result does not depend on the thread count.
TEST(DropoutTest, BackwardSplatAndThreads) {
  const int64_t samples = 4, per = 40000;
  std::vector<float> x = randomFloats(samples * per, 91),
                     dy = randomFloats(samples * per, 92);
  std::vector<float> y = runDropout(x, samples, 0.2f, 5, 6, 7, 8);
  std::vector<float> dx = runDropout(dy, samples, 0.2f, 5, 6, 7, 8);
  const float scale = fastllm::rt::dropoutScale(0.2f);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(dx[i], y[i] == 0.0f ? 0.0f : dy[i] * scale) << i;
  std::vector<float> splatIn = {2.0f};
  std::vector<float> splat =
      runDropout(splatIn, samples, 0.2f, 5, 6, 7, 8, true, samples * per);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(splat[i], y[i] == 0.0f ? 0.0f : 2.0f * scale) << i;
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> one = runDropout(x, samples, 0.2f, 5, 6, 7, 8);
  omp_set_num_threads(3);
  std::vector<float> three = runDropout(x, samples, 0.2f, 5, 6, 7, 8);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, y);
  EXPECT_EQ(three, y);
#endif
}

} // namespace
