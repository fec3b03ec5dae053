//===- Elementwise.cpp - the header templates' float instances --*- C++ -*-===//
//
// runtime/cpu/Kernels.h defines elementwise, fill, copy, addInto and dropout
// itself; their float instances (FASTLLM_CPU_HEADER_INSTANCES: elementwise's
// per-element-type driver for one to four float inputs, and the others) are
// compiled here once, with the library's flags, and declared extern to every
// other includer.
//
//===----------------------------------------------------------------------===//

#define FASTLLM_CPU_DEFINE_HEADER_INSTANCES
#include "runtime/cpu/Kernels.h"

namespace fastllm::rt::cpu {

#define FASTLLM_CPU_INSTANCE(...) __VA_ARGS__;
FASTLLM_CPU_HEADER_INSTANCES(FASTLLM_CPU_INSTANCE)
#undef FASTLLM_CPU_INSTANCE

} // namespace fastllm::rt::cpu
