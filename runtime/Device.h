//===- Device.h - the machine the generated step runs on --------*- C++ -*-===//
//
// The runtime is the same for every target; what differs between the CPU and
// the CUDA build of a training binary is declared here and defined once per
// target (runtime/cpu/Device.cpp, runtime/cuda/Device.cu), in the target's
// library that the binary links beside the generated step.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_DEVICE_H
#define FASTLLM_RUNTIME_DEVICE_H

#include "runtime/Optimizer.h"
#include "runtime/ShardComm.h"
#include "runtime/Status.h"

#include <cstdint>
#include <memory>
#include <string>

namespace fastllm::rt {

/// The PlanInfo::target this build trains: "cpu" or "cuda".
const char *deviceTarget();

/// The device as the plan line shows it: the target, and for the CUDA
/// emulation that it is emulated (and how).
const char *deviceDescription();

/// The device's name as its driver gives it (CUDA: "NVIDIA H100 80GB HBM3"),
/// for the peak TFLOP/s table; "" on the CPU and under the CUDA emulation.
std::string deviceName();

/// The peak TFLOP/s MFU divides by when neither --peak-tflops nor the
/// device's table gives one: on the CPU, the fp32 matrix-product rate of
/// the kernels' own matmul on all their threads, measured now (the best of
/// a few 512x512x512 products, about 20 ms); 0 on CUDA (no MFU then).
double measuredPeakTflops();

/// Device memory in use now on this rank's GPU (its total minus its free
/// memory, other processes' included), or -1 on the CPU, which has none.
int64_t deviceMemoryInUse();

/// Prepares the device for the process that is local rank `localRank` on
/// its machine (CUDA: picks GPU localRank % count). An error names what is
/// missing (no GPU, a driver too old).
Status initDevice(int localRank);

/// The arena: zeroed, 64-byte aligned, read and written by the runtime's
/// host code and by the step (CUDA: managed memory).
using ArenaPtr = std::unique_ptr<char, void (*)(char *)>;
struct Arena {
  ArenaPtr data;
  /// What the allocation measurably took: the bytes the C library's
  /// allocator handed out for it, header and page rounding included (CPU),
  /// the drop in the GPU's free memory once it is resident (CUDA).
  int64_t measuredBytes;
};
Expected<Arena> allocateArena(int64_t bytes);

/// Returns once the work the step started on the device is done, so that
/// host code may read or write the arena.
void synchronizeDevice();

/// ZeRO's collectives on this target's memory: MPI for the CPU; NCCL for
/// CUDA, bootstrapped through `comm`, with a watchdog that ends the job when
/// one outlives `timeoutSeconds`, naming rank, step and collective.
Expected<std::unique_ptr<ShardComm>> createShardComm(Communicator &comm,
                                                     double timeoutSeconds);

/// Elementwise work on arena memory, ordered after the device's earlier work
/// (CPU: done when the call returns; CUDA: enqueued on the step's stream).
void deviceFill(float *out, int64_t n, float value);
void deviceCopy(float *out, const float *in, int64_t n);
/// out[i] = in[i] * scale (out == in allowed).
void deviceScale(float *out, const float *in, int64_t n, float scale);
/// out[i] += in[i] * scale.
void deviceAddScaled(float *out, const float *in, int64_t n, float scale);

/// The optimizer's loops over this rank's shard, where the shard lives (the
/// CPU runs AdamW's own; CUDA runs the same per-element arithmetic,
/// adamwUpdate, in kernels over AdamW::pieces()).
double deviceSumOfSquares(const AdamW &opt, const float *gradShard);
void deviceClipGradients(const AdamW &opt, float *gradShard, double totalNorm,
                         double maxNorm);
void deviceAdamWStep(const AdamW &opt, float *master, const float *gradShard,
                     float *m, float *v, double lr, int64_t t);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_DEVICE_H
