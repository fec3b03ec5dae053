//===- KernelMath.h - what the CPU and CUDA kernels share -------*- C++ -*-===//
//
// The kernel contract both libraries and generated code use, defined once:
// the scalar approximations of exp, tanh, erf and the activations built on
// them (host and device functions, so a CUDA kernel computes what the CPU
// does, up to the contraction of a*b + c into one fused multiply-add), and
// the NaN-propagating max of the row kernels. The shape rules are
// runtime/KernelPlans.h's.
//
// std::exp, std::tanh and std::erf are opaque library calls, so a CPU loop
// that uses them stays scalar unless a vector math library is configured.
// These versions are plain arithmetic and selects: loops calling them
// vectorize with any flags. Each is within a few ulp of the libm function
// (runtime/cpu/test/MathTest.cpp checks the bounds), as close as ATen's own
// vectorized versions come. NaN and +-inf behave as in libm; the selects are
// spelled out because std::min, std::max and std::numeric_limits are
// host-only functions in CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_KERNELMATH_H
#define FASTLLM_RUNTIME_KERNELMATH_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

/// Host and device under nvcc; a plain function for the host compiler.
#if defined(__CUDACC__)
#define FASTLLM_HOST_DEVICE __host__ __device__
#else
#define FASTLLM_HOST_DEVICE
#endif

namespace fastllm::rt {

namespace detail {
/// The float whose IEEE bits are `bits`.
FASTLLM_HOST_DEVICE inline float floatFromBits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

/// std::max(std::min(x, hi), lo): NaN stays NaN.
FASTLLM_HOST_DEVICE inline float clampNan(float x, float lo, float hi) {
  float c = hi < x ? hi : x;
  return c < lo ? lo : c;
}
} // namespace detail

/// e^x with Cephes' polynomial after Cody-Waite reduction; relative error
/// below 3e-7 (2 ulp). Results below FLT_MIN flush to zero; ±inf and NaN
/// behave as in std::exp.
FASTLLM_HOST_DEVICE inline float fastExp(float x) {
  constexpr float kLo = -87.33654f; // log(FLT_MIN)
  constexpr float kHi = 88.72284f;  // log(FLT_MAX)
  float xc = x > kLo ? (x < kHi ? x : kHi) : kLo;
  float t = xc * 1.44269504088896341f;
  int32_t n = static_cast<int32_t>(t + (t < 0.f ? -0.5f : 0.5f));
  n = n < 127 ? n : 127;
  float fn = static_cast<float>(n);
  float r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  float y = p * detail::floatFromBits(static_cast<uint32_t>(n + 127) << 23);
  y = x < kLo ? 0.f : y;
  y = x > kHi ? INFINITY : y;
  return x == x ? y : x;
}

/// tanh(x) as Eigen's rational approximation: x·P(x²)/Q(x²), odd, so small
/// arguments keep full relative accuracy (3e-7). Clamping at ±9, as ONNX
/// Runtime's MLAS does, makes large arguments give exactly ±1.
FASTLLM_HOST_DEVICE inline float fastTanh(float x) {
  float c = detail::clampNan(x, -9.f, 9.f);
  float c2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * c2 + 2.00018790482477e-13f;
  p = p * c2 + -8.60467152213735e-11f;
  p = p * c2 + 5.12229709037114e-08f;
  p = p * c2 + 1.48572235717979e-05f;
  p = p * c2 + 6.37261928875436e-04f;
  p = p * c2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * c2 + 1.18534705686654e-04f;
  q = q * c2 + 2.26843463243900e-03f;
  q = q * c2 + 4.89352518554385e-03f;
  return c * p / q;
}

/// erf(x) as Eigen's rational approximation; absolute error below 4e-7
/// (erf is ±1 in float beyond |x| = 4).
FASTLLM_HOST_DEVICE inline float fastErf(float x) {
  float c = detail::clampNan(x, -4.f, 4.f);
  float c2 = c * c;
  float p = -2.72614225801306e-10f;
  p = p * c2 + 2.77068142495902e-08f;
  p = p * c2 + -2.10102402082508e-06f;
  p = p * c2 + -5.69250639462346e-05f;
  p = p * c2 + -7.34990630326855e-04f;
  p = p * c2 + -2.95459980854025e-03f;
  p = p * c2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * c2 + -2.13374055278905e-04f;
  q = q * c2 + -1.68282697438203e-03f;
  q = q * c2 + -7.37332916720468e-03f;
  q = q * c2 + -1.42647390514189e-02f;
  return c * p / q;
}

FASTLLM_HOST_DEVICE inline float sigmoid(float x) {
  return 1.f / (1.f + fastExp(-x));
}

/// x·sigmoid(x), in PyTorch's form x / (1 + e^-x).
FASTLLM_HOST_DEVICE inline float silu(float x) {
  return x / (1.f + fastExp(-x));
}

/// GELU: x·Φ(x) (erf form), or PyTorch's approximate='tanh' form
/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
FASTLLM_HOST_DEVICE inline float gelu(float x, bool tanhApprox) {
  if (tanhApprox) {
    float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + fastTanh(inner));
  }
  return 0.5f * x * (1.f + fastErf(x * 0.7071067811865476f));
}

/// g · d/dx gelu(x, tanhApprox): the exact derivative of the form chosen,
/// Φ(x) + x·φ(x) for erf, as in ATen's GeluBackward.
FASTLLM_HOST_DEVICE inline float geluGrad(float x, float g, bool tanhApprox) {
  if (tanhApprox) {
    constexpr float kBeta = 0.7978845608028654f; // √(2/π)
    constexpr float kKappa = 0.044715f;
    float x2 = x * x;
    float th = fastTanh(kBeta * (x + kKappa * x2 * x));
    float left = 0.5f * x;
    float right = 1.f + th;
    float dLeft = 0.5f * right;
    float dRight = left * (1.f - th * th) * kBeta * (1.f + 3.f * kKappa * x2);
    return g * (dLeft + dRight);
  }
  float cdf = 0.5f * (1.f + fastErf(x * 0.7071067811865476f));
  float pdf = 0.3989422804014327f * fastExp(-0.5f * x * x);
  return g * (cdf + x * pdf);
}

namespace detail {

/// max(acc, x) that returns NaN once either is NaN, as torch.max does.
template <typename T> FASTLLM_HOST_DEVICE T maxNan(T acc, T x) {
  return (x > acc || x != x) ? x : acc;
}

/// The identity of max: -inf where T has it, else T's lowest value (host
/// only, as std::numeric_limits).
template <typename T> T lowest() {
  return std::numeric_limits<T>::has_infinity
             ? -std::numeric_limits<T>::infinity()
             : std::numeric_limits<T>::lowest();
}

} // namespace detail

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_KERNELMATH_H
