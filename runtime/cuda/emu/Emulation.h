//===- Emulation.h - what an emulated CUDA source is compiled with -*- C++ -*-//
//
// Included first into every CUDA source that the host compiler builds for
// the emulation (-include, with -x c++ -DFASTLLM_CUDA_EMULATION): the CUDA
// toolkit's own headers for every type, constant and host function
// declaration (so the emulated libraries implement exactly the declared
// API, and bf16 converts with the toolkit's host conversions), then the
// device side of runtime/cuda/emu/.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_EMU_EMULATION_H
#define FASTLLM_RUNTIME_CUDA_EMU_EMULATION_H

#ifndef FASTLLM_CUDA_EMULATION
#error "compile emulated CUDA sources with -DFASTLLM_CUDA_EMULATION"
#endif

#include <cuda_runtime.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <cuda_bf16.h>
#pragma GCC diagnostic pop

// In host compilation the toolkit defines __shared__ as nothing: a block's
// shared arrays become per host thread statics, which every fiber of the
// block (all on that host thread) shares.
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#include "runtime/cuda/emu/Device.h"
#include "runtime/cuda/emu/Wmma.h"

#endif // FASTLLM_RUNTIME_CUDA_EMU_EMULATION_H
