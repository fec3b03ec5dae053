//===- Stream.h - streams and errors of the CUDA emulation ------*- C++ -*-===//
//
// What the emulated libraries (runtime, cuBLASLt, NCCL) share: running work
// on a stream in that stream's order, and reporting a misuse of an API.
//
// Streams run in one of two modes, chosen by FASTLLM_CUDA_EMU_STREAMS:
//  - `inorder` (the default): work runs on the calling host thread at the
//    moment it is enqueued. Every stream is then trivially in order, and
//    every event has completed when it is recorded.
//  - `threads`: each stream has a host thread of its own that runs its work
//    in enqueue order; streams are ordered with each other only by events
//    (cudaStreamWaitEvent) and the legacy default stream's implicit
//    synchronisation, as on a GPU. A missing wait then shows up as a race.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_EMU_STREAM_H
#define FASTLLM_RUNTIME_CUDA_EMU_STREAM_H

#include <cuda_runtime_api.h>

#include <functional>

namespace fastllm::emu {

/// Runs `work` on stream `s` (0 and cudaStreamLegacy: the legacy default
/// stream) after all work enqueued on it before, in the current stream mode.
/// `work` runs on another host thread in `threads` mode: it must capture by
/// value what it reads.
void enqueue(cudaStream_t s, std::function<void()> work);

/// Whether streams run on host threads of their own (FASTLLM_CUDA_EMU_STREAMS
/// = threads).
bool threadedStreams();

/// Prints `cuda emulation: error: ` and the formatted message to stderr and
/// aborts the process: for a use of an API that a GPU would reject or leave
/// undefined (and that the real library may not even report).
[[noreturn]] void fatal(const char *format, ...)
    __attribute__((format(printf, 1, 2)));

} // namespace fastllm::emu

#endif // FASTLLM_RUNTIME_CUDA_EMU_STREAM_H
