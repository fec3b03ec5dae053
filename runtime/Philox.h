//===- Philox.h - counter-based random numbers for dropout ------*- C++ -*-===//
//
// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2,
// 3", SC11): a keyed bijection of a 128-bit counter, so any element's random
// word is a pure function of where it is, with no state carried between
// calls. That is what lets the backward of dropout regenerate the forward's
// mask instead of storing it, and lets every rank, micro-batch split and ZeRO
// stage draw the same mask for the same sample.
//
// Dropout's stream (runtime/ModelABI.h, StepContext) is keyed by the run's
// --seed and counted by (element / 4, dropout site, global sample, step):
//
//   key     = {seed & 0xffffffff, seed >> 32}
//   counter = {index within the sample / 4, site, global sample index, step}
//   word    = philox(counter, key)[index within the sample % 4]
//   keep    = word >= dropoutThreshold(p)    (u = word / 2^32 >= p)
//
// The same header is used by host C++ (the CPU kernels, tests) and CUDA
// device code; test/EndToEnd/dropout.py computes the same words in NumPy.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_PHILOX_H
#define FASTLLM_RUNTIME_PHILOX_H

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define FASTLLM_HOST_DEVICE __host__ __device__
#else
#define FASTLLM_HOST_DEVICE
#endif

namespace fastllm::rt {

struct Philox4x32 {
  uint32_t v[4];
};

/// Philox4x32-10 of `counter` under key (k0, k1), as Random123's
/// philox4x32_R(10, ...) (its known-answer vectors are in the tests).
FASTLLM_HOST_DEVICE inline Philox4x32 philox4x32(Philox4x32 c, uint32_t k0,
                                                 uint32_t k1) {
  constexpr uint64_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = kMul0 * c.v[0], p1 = kMul1 * c.v[2];
    Philox4x32 n;
    n.v[0] = uint32_t(p1 >> 32) ^ c.v[1] ^ k0;
    n.v[1] = uint32_t(p1);
    n.v[2] = uint32_t(p0 >> 32) ^ c.v[3] ^ k1;
    n.v[3] = uint32_t(p0);
    c = n;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

/// The smallest 32-bit word that is kept by dropout of ratio `p` in [0, 1):
/// word / 2^32 >= p, i.e. word >= ceil(p * 2^32). Computed (on the host, by
/// the compiler) in double from the float ratio the op carries, so every
/// target agrees on it exactly.
inline uint32_t dropoutThreshold(float p) {
  double t = std::ceil(double(p) * 4294967296.0);
  return t <= 0 ? 0u : t >= 4294967295.0 ? 0xffffffffu : uint32_t(t);
}

/// The factor kept elements are multiplied by, 1 / (1 - p), as PyTorch does.
inline float dropoutScale(float p) { return float(1.0 / (1.0 - double(p))); }

/// The four dropout words of elements [4 * group, 4 * group + 4) of global
/// sample `sample` at dropout site `site` in 0-based step `step`.
FASTLLM_HOST_DEVICE inline Philox4x32 dropoutWords(uint64_t seed, int64_t step,
                                                   int64_t sample,
                                                   uint32_t site,
                                                   int64_t group) {
  Philox4x32 c = {{uint32_t(group), site, uint32_t(sample), uint32_t(step)}};
  return philox4x32(c, uint32_t(seed), uint32_t(seed >> 32));
}

} // namespace fastllm::rt

#undef FASTLLM_HOST_DEVICE

#endif // FASTLLM_RUNTIME_PHILOX_H
