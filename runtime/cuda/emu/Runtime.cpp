//===- Runtime.cpp - the CUDA runtime subset, emulated --------------------===//
//
// The part of libcudart the project calls, implemented on the host for one
// emulated H100 per process: device memory is host memory (so device,
// managed and host pointers are all readable by the host, as with
// cudaMemcpyDefault), streams and events follow Stream.h, and the device
// attributes are an H100 SXM's. Arguments a GPU would refuse get the error
// code the CUDA runtime documents; a call or attribute the emulation does not
// know is reported (fatal), never ignored.
//
// FASTLLM_CUDA_EMU_DROP_STREAM_WAITS=1 turns cudaStreamWaitEvent into
// nothing: the test that proves the threads mode catches a missing wait.
//
// Streams in `threads` mode: every stream, the legacy default one included,
// owns a host thread that runs its work items in order. A work item may
// depend on other streams reaching a count of completed items (an event
// recorded there, or the legacy stream's implicit synchronisation with the
// blocking streams); the thread waits for those first.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/emu/Stream.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

using namespace fastllm::emu;

//===----------------------------------------------------------------------===//
// Streams
//===----------------------------------------------------------------------===//

struct CUstream_st {
  struct Item {
    std::function<void()> work;
    /// (stream, count): run only once that stream has completed `count`.
    std::vector<std::pair<CUstream_st *, uint64_t>> after;
  };
  explicit CUstream_st(bool blocking) : blocking(blocking) {}

  const bool blocking; ///< synchronises with the legacy default stream
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  std::deque<Item> queue;
  std::thread worker;
  bool stopping = false;
};

struct CUevent_st {
  CUstream_st *stream = nullptr; ///< where it was last recorded
  uint64_t target = 0;           ///< complete once the stream completed this
  bool timing = true;
  std::chrono::steady_clock::time_point when;
};

namespace {

/// One lock for every stream's counters and queues: streams are few and
/// their work items coarse (a kernel, a copy, a collective). Never
/// destroyed: stream threads may still wait on them while the process exits.
std::mutex &lock = *new std::mutex;
std::condition_variable &changed = *new std::condition_variable;
CUstream_st &legacyStream = *new CUstream_st(true);
std::set<CUstream_st *> &streams = *new std::set<CUstream_st *>{&legacyStream};

bool threaded() {
  static const bool t = [] {
    const char *v = std::getenv("FASTLLM_CUDA_EMU_STREAMS");
    if (!v || !*v || !std::strcmp(v, "inorder"))
      return false;
    if (!std::strcmp(v, "threads"))
      return true;
    fatal("FASTLLM_CUDA_EMU_STREAMS=%s: expected inorder or threads", v);
  }();
  return t;
}

CUstream_st *resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy)
    return &legacyStream;
  if (s == cudaStreamPerThread)
    fatal("cudaStreamPerThread is not emulated");
  std::lock_guard<std::mutex> guard(lock);
  if (!streams.count(s))
    fatal("stream %p is not a live stream (destroyed, or never created)",
          static_cast<void *>(s));
  return s;
}

bool ready(const CUstream_st::Item &item) {
  for (auto &[s, count] : item.after)
    if (s->completed < count)
      return false;
  return true;
}

void serve(CUstream_st *s) {
  std::unique_lock<std::mutex> guard(lock);
  for (;;) {
    changed.wait(guard, [&] {
      return s->stopping || (!s->queue.empty() && ready(s->queue.front()));
    });
    if (s->queue.empty())
      return; // stopping, and drained
    CUstream_st::Item item = std::move(s->queue.front());
    s->queue.pop_front();
    guard.unlock();
    if (item.work)
      item.work();
    guard.lock();
    ++s->completed;
    changed.notify_all();
  }
}

/// Enqueues `item` on `s` with the legacy stream's implicit ordering.
void push(CUstream_st *s, CUstream_st::Item item) {
  std::unique_lock<std::mutex> guard(lock);
  if (s == &legacyStream) {
    for (CUstream_st *o : streams)
      if (o != s && o->blocking)
        item.after.push_back({o, o->enqueued});
  } else if (s->blocking) {
    item.after.push_back({&legacyStream, legacyStream.enqueued});
  }
  ++s->enqueued;
  if (!threaded()) {
    // In order: everything before has run, so every dependency holds.
    guard.unlock();
    if (item.work)
      item.work();
    guard.lock();
    ++s->completed;
    return;
  }
  s->queue.push_back(std::move(item));
  if (!s->worker.joinable())
    s->worker = std::thread(serve, s);
  changed.notify_all();
}

void waitFor(CUstream_st *s, uint64_t count) {
  std::unique_lock<std::mutex> guard(lock);
  changed.wait(guard, [&] { return s->completed >= count; });
}

void synchronize(CUstream_st *s) {
  uint64_t count;
  {
    std::lock_guard<std::mutex> guard(lock);
    count = s->enqueued;
  }
  waitFor(s, count);
}

void synchronizeAll() {
  std::vector<CUstream_st *> all;
  {
    std::lock_guard<std::mutex> guard(lock);
    all.assign(streams.begin(), streams.end());
  }
  for (CUstream_st *s : all)
    synchronize(s);
}

thread_local cudaError_t lastError = cudaSuccess;

cudaError_t fail(cudaError_t err) {
  lastError = err;
  return err;
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

/// An H100 SXM's memory, of which the emulated allocations take their share.
constexpr size_t kDeviceBytes = size_t(80) << 30;

struct Allocation {
  size_t bytes;
  bool managed;
};
std::mutex memoryLock;
std::map<const char *, Allocation> allocations;
size_t allocatedBytes = 0;

cudaError_t allocate(void **p, size_t bytes, bool managed) {
  if (!p)
    return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0)
    return cudaSuccess;
  std::lock_guard<std::mutex> guard(memoryLock);
  if (bytes > kDeviceBytes - allocatedBytes)
    return fail(cudaErrorMemoryAllocation);
  // 256-byte alignment, as cudaMalloc guarantees.
  void *mem = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!mem)
    return fail(cudaErrorMemoryAllocation);
  allocations[static_cast<const char *>(mem)] = {bytes, managed};
  allocatedBytes += bytes;
  *p = mem;
  return cudaSuccess;
}

cudaError_t release(void *p) {
  if (!p)
    return cudaSuccess;
  std::lock_guard<std::mutex> guard(memoryLock);
  auto it = allocations.find(static_cast<const char *>(p));
  if (it == allocations.end())
    return fail(cudaErrorInvalidValue);
  allocatedBytes -= it->second.bytes;
  allocations.erase(it);
  std::free(p);
  return cudaSuccess;
}

/// The allocation holding [p, p + bytes), or null.
const Allocation *findAllocation(const void *p, size_t bytes) {
  std::lock_guard<std::mutex> guard(memoryLock);
  const char *c = static_cast<const char *>(p);
  auto it = allocations.upper_bound(c);
  if (it == allocations.begin())
    return nullptr;
  --it;
  if (c + bytes > it->first + it->second.bytes)
    return nullptr;
  return &it->second;
}

std::mutex funcLock;
std::map<const void *, size_t> optedIn;

} // namespace

void fastllm::emu::enqueue(cudaStream_t s, std::function<void()> work) {
  push(resolve(s), {std::move(work), {}});
}

bool fastllm::emu::threadedStreams() { return threaded(); }

void fastllm::emu::fatal(const char *format, ...) {
  std::fflush(stdout);
  std::fprintf(stderr, "cuda emulation: error: ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::abort();
}

namespace fastllm::emu {
void setLastError(cudaError_t err) { lastError = err; }

size_t optedInSharedBytes(const void *kernel) {
  std::lock_guard<std::mutex> guard(funcLock);
  auto it = optedIn.find(kernel);
  return it == optedIn.end() ? 0 : it->second;
}
} // namespace fastllm::emu

//===----------------------------------------------------------------------===//
// The API
//===----------------------------------------------------------------------===//

cudaError_t cudaGetLastError() {
  cudaError_t err = lastError;
  lastError = cudaSuccess;
  return err;
}

cudaError_t cudaPeekAtLastError() { return lastError; }

const char *cudaGetErrorName(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return "cudaSuccess";
  case cudaErrorInvalidValue:
    return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation:
    return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidConfiguration:
    return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevice:
    return "cudaErrorInvalidDevice";
  case cudaErrorNotReady:
    return "cudaErrorNotReady";
  case cudaErrorInvalidResourceHandle:
    return "cudaErrorInvalidResourceHandle";
  default:
    return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorInvalidConfiguration:
    return "invalid configuration argument";
  case cudaErrorInvalidDevice:
    return "invalid device ordinal";
  case cudaErrorNotReady:
    return "device not ready";
  case cudaErrorInvalidResourceHandle:
    return "invalid resource handle";
  default:
    return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count)
    return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *device) {
  if (!device)
    return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr,
                                   int device) {
  if (!value)
    return fail(cudaErrorInvalidValue);
  if (device != 0)
    return fail(cudaErrorInvalidDevice);
  switch (attr) { // an H100 SXM5 80GB's
  case cudaDevAttrMaxThreadsPerBlock:
    *value = 1024;
    break;
  case cudaDevAttrMaxSharedMemoryPerBlock:
    *value = 48 * 1024;
    break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin:
    *value = 227 * 1024;
    break;
  case cudaDevAttrMultiProcessorCount:
    *value = 132;
    break;
  case cudaDevAttrWarpSize:
    *value = 32;
    break;
  case cudaDevAttrComputeCapabilityMajor:
    *value = 9;
    break;
  case cudaDevAttrComputeCapabilityMinor:
    *value = 0;
    break;
  case cudaDevAttrMaxGridDimX:
    *value = 2147483647;
    break;
  case cudaDevAttrMaxGridDimY:
  case cudaDevAttrMaxGridDimZ:
    *value = 65535;
    break;
  case cudaDevAttrConcurrentManagedAccess:
  case cudaDevAttrManagedMemory:
    *value = 1;
    break;
  default:
    fatal("cudaDeviceGetAttribute: attribute %d is not emulated", int(attr));
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  synchronizeAll();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  return allocate(devPtr, size, false);
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)
    return fail(cudaErrorInvalidValue);
  return allocate(devPtr, size, true);
}

cudaError_t cudaFree(void *devPtr) {
  // cudaFree waits for the device, as it does on a GPU.
  synchronizeAll();
  return release(devPtr);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
  resolve(stream);
  return allocate(devPtr, size, false);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
  if (devPtr && !findAllocation(devPtr, 1))
    return fail(cudaErrorInvalidValue);
  enqueue(stream, [devPtr] { release(devPtr); });
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  if (!free || !total)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> guard(memoryLock);
  *total = kDeviceBytes;
  *free = kDeviceBytes - allocatedBytes;
  return cudaSuccess;
}

cudaError_t cudaMemAdvise(const void *devPtr, size_t count,
                          cudaMemoryAdvise advice, cudaMemLocation location) {
  const Allocation *a = findAllocation(devPtr, count);
  if (!a || !a->managed)
    return fail(cudaErrorInvalidValue);
  if (advice != cudaMemAdviseSetPreferredLocation &&
      advice != cudaMemAdviseSetReadMostly &&
      advice != cudaMemAdviseSetAccessedBy)
    fatal("cudaMemAdvise: advice %d is not emulated", int(advice));
  if (location.type == cudaMemLocationTypeDevice && location.id != 0)
    return fail(cudaErrorInvalidDevice);
  return cudaSuccess;
}

namespace {
cudaError_t checkCopyKind(cudaMemcpyKind kind) {
  switch (kind) {
  case cudaMemcpyHostToHost:
  case cudaMemcpyHostToDevice:
  case cudaMemcpyDeviceToHost:
  case cudaMemcpyDeviceToDevice:
  case cudaMemcpyDefault:
    return cudaSuccess;
  }
  return fail(cudaErrorInvalidMemcpyDirection);
}

/// Copies of overlapping ranges are undefined in CUDA.
void checkOverlap(const char *what, const void *dst, const void *src,
                  size_t count) {
  const char *d = static_cast<const char *>(dst);
  const char *s = static_cast<const char *>(src);
  if (d != s && d < s + count && s < d + count)
    fatal("%s: the %zu-byte ranges at %p and %p overlap", what, count, dst,
          src);
}
} // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                       cudaMemcpyKind kind) {
  if (cudaError_t err = checkCopyKind(kind))
    return err;
  if (count == 0)
    return cudaSuccess;
  checkOverlap("cudaMemcpy", dst, src, count);
  // Synchronous, ordered on the legacy stream.
  enqueue(nullptr, [=] { std::memmove(dst, src, count); });
  synchronize(&legacyStream);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t err = checkCopyKind(kind))
    return err;
  if (count == 0)
    return cudaSuccess;
  checkOverlap("cudaMemcpyAsync", dst, src, count);
  enqueue(stream, [=] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  if (count && !findAllocation(devPtr, count))
    return fail(cudaErrorInvalidValue);
  enqueue(nullptr, [=] { std::memset(devPtr, value, count); });
  synchronize(&legacyStream);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
                            cudaStream_t stream) {
  if (count && !findAllocation(devPtr, count))
    return fail(cudaErrorInvalidValue);
  enqueue(stream, [=] { std::memset(devPtr, value, count); });
  return cudaSuccess;
}

namespace {
/// The one memory pool: stream-ordered allocations come from the heap.
struct CUmemPoolHandle_st_tag {};
CUmemPoolHandle_st_tag defaultPool;
} // namespace

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  if (!memPool)
    return fail(cudaErrorInvalidValue);
  if (device != 0)
    return fail(cudaErrorInvalidDevice);
  *memPool = reinterpret_cast<cudaMemPool_t>(&defaultPool);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr,
                                    void *value) {
  if (memPool != reinterpret_cast<cudaMemPool_t>(&defaultPool) || !value)
    return fail(cudaErrorInvalidValue);
  if (attr != cudaMemPoolAttrReleaseThreshold)
    fatal("cudaMemPoolSetAttribute: attribute %d is not emulated", int(attr));
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr,
                                 int value) {
  if (!func)
    return fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    fatal("cudaFuncSetAttribute: attribute %d is not emulated", int(attr));
  if (value < 0 || value > 227 * 1024)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> guard(funcLock);
  optedIn[func] = size_t(value);
  return cudaSuccess;
}

cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol) {
  if (!devPtr || !symbol)
    return fail(cudaErrorInvalidSymbol);
  // A __device__ variable is a host variable in the emulation.
  *devPtr = const_cast<void *>(symbol);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream,
                                      unsigned int flags) {
  if (!pStream ||
      (flags != cudaStreamDefault && flags != cudaStreamNonBlocking))
    return fail(cudaErrorInvalidValue);
  auto *s = new CUstream_st(flags == cudaStreamDefault);
  std::lock_guard<std::mutex> guard(lock);
  streams.insert(s);
  *pStream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  CUstream_st *s = resolve(stream);
  if (s == &legacyStream)
    return fail(cudaErrorInvalidResourceHandle);
  // Work already enqueued still runs, as on a GPU.
  synchronize(s);
  std::thread worker;
  {
    std::lock_guard<std::mutex> guard(lock);
    streams.erase(s);
    s->stopping = true;
    worker = std::move(s->worker);
  }
  changed.notify_all();
  if (worker.joinable())
    worker.join();
  // Events recorded on it may still be queried: they hold the pointer. The
  // stream object stays (a few bytes per destroyed stream).
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  synchronize(resolve(stream));
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> guard(lock);
  return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (!event ||
      (flags & ~unsigned(cudaEventDisableTiming | cudaEventBlockingSync)))
    return fail(cudaErrorInvalidValue);
  auto *e = new CUevent_st;
  e->timing = !(flags & cudaEventDisableTiming);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event)
    return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = resolve(stream);
  {
    std::lock_guard<std::mutex> guard(lock);
    event->stream = s;
    event->target = s->enqueued + 1; // the marker below
  }
  push(s, {[event] { event->when = std::chrono::steady_clock::now(); }, {}});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event)
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> guard(lock);
  return !event->stream || event->stream->completed >= event->target
             ? cudaSuccess
             : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event)
    return fail(cudaErrorInvalidResourceHandle);
  if (event->stream)
    waitFor(event->stream, event->target);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                 cudaEvent_t end) {
  if (!ms || !start || !end)
    return fail(cudaErrorInvalidValue);
  if (!start->timing || !end->timing || !start->stream || !end->stream)
    return fail(cudaErrorInvalidResourceHandle);
  if (cudaEventQuery(start) != cudaSuccess ||
      cudaEventQuery(end) != cudaSuccess)
    return fail(cudaErrorNotReady);
  *ms =
      std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event)
    return fail(cudaErrorInvalidResourceHandle);
  // A pending marker still writes `when`: free it once the stream has
  // passed it, as CUDA frees a destroyed event once it completes.
  CUstream_st *s = event->stream;
  if (s && cudaEventQuery(event) != cudaSuccess) {
    push(s, {[event] { delete event; }, {}});
    return cudaSuccess;
  }
  delete event;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags) {
  if (!event || flags != 0)
    return fail(cudaErrorInvalidValue);
  CUstream_st *s = resolve(stream);
  // FASTLLM_CUDA_EMU_DROP_STREAM_WAITS=1: every wait is left out, to show
  // that the threads mode catches a missing one (the test of that mode).
  static const bool dropWaits = [] {
    const char *v = std::getenv("FASTLLM_CUDA_EMU_DROP_STREAM_WAITS");
    return v && !std::strcmp(v, "1");
  }();
  if (dropWaits)
    return cudaSuccess;
  CUstream_st::Item wait;
  {
    std::lock_guard<std::mutex> guard(lock);
    if (event->stream)
      wait.after.push_back({event->stream, event->target});
  }
  push(s, std::move(wait));
  return cudaSuccess;
}
