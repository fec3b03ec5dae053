//===- CpuFeatures.cpp - does this CPU run the code the kernels were built for
//
// The kernel library and the generated step are compiled for one CPU level
// (`compile --target-cpu`: portable, or native: the build machine). A binary
// copied to an older CPU would die of SIGILL in the middle of a step; the
// runtime asks this first and stops with a message instead. The check is
// compiled with this library's flags, so the instruction-set macros below
// are the ones its code may use; the function itself is built for the
// baseline x86-64 so that it runs anywhere.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Kernels.h"

namespace fastllm::rt::cpu {

#ifndef FASTLLM_CPU_TARGET
#define FASTLLM_CPU_TARGET "default"
#endif

const char *kernelCpuTarget() { return FASTLLM_CPU_TARGET; }

#if defined(__x86_64__)
#define FASTLLM_NEEDS(name)                                                    \
  if (!__builtin_cpu_supports(name))                                           \
    return name;
__attribute__((target("arch=x86-64"))) const char *missingCpuFeature() {
  __builtin_cpu_init();
#ifdef __SSE4_2__
  FASTLLM_NEEDS("sse4.2")
#endif
#ifdef __POPCNT__
  FASTLLM_NEEDS("popcnt")
#endif
#ifdef __AVX__
  FASTLLM_NEEDS("avx")
#endif
#ifdef __AVX2__
  FASTLLM_NEEDS("avx2")
#endif
#ifdef __FMA__
  FASTLLM_NEEDS("fma")
#endif
#ifdef __BMI__
  FASTLLM_NEEDS("bmi")
#endif
#ifdef __BMI2__
  FASTLLM_NEEDS("bmi2")
#endif
#ifdef __AVX512F__
  FASTLLM_NEEDS("avx512f")
#endif
#ifdef __AVX512BW__
  FASTLLM_NEEDS("avx512bw")
#endif
#ifdef __AVX512CD__
  FASTLLM_NEEDS("avx512cd")
#endif
#ifdef __AVX512DQ__
  FASTLLM_NEEDS("avx512dq")
#endif
#ifdef __AVX512VL__
  FASTLLM_NEEDS("avx512vl")
#endif
#ifdef __AVX512VNNI__
  FASTLLM_NEEDS("avx512vnni")
#endif
#ifdef __AVX512BF16__
  FASTLLM_NEEDS("avx512bf16")
#endif
#ifdef __AVX512IFMA__
  FASTLLM_NEEDS("avx512ifma")
#endif
#ifdef __AVX512VBMI__
  FASTLLM_NEEDS("avx512vbmi")
#endif
#ifdef __AVX512VBMI2__
  FASTLLM_NEEDS("avx512vbmi2")
#endif
#ifdef __AVX512BITALG__
  FASTLLM_NEEDS("avx512bitalg")
#endif
#ifdef __AVX512VPOPCNTDQ__
  FASTLLM_NEEDS("avx512vpopcntdq")
#endif
  return nullptr;
}
#undef FASTLLM_NEEDS
#else
// Other architectures: the compiler's baseline for the target, nothing to
// check at run time here.
const char *missingCpuFeature() { return nullptr; }
#endif

} // namespace fastllm::rt::cpu
