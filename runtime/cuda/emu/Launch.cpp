//===- Launch.cpp - grids, blocks and threads of the CUDA emulation -------===//
//
// A launch runs its grid on its stream, one block after another on the
// stream's host thread. A block's threads are fibers (Boost.Context) with
// stacks from a per host thread pool; a thread runs until it finishes or
// waits in __syncthreads or a warp operation (Device.h), then the scheduler
// picks the next one. Two schedules, chosen by FASTLLM_CUDA_EMU_SCHEDULE:
//
//  - `inorder` (default): rounds over the threads in index order, each
//    running to its next wait.
//  - `adversarial`: the warps from last to first, lanes from last to first,
//    and a warp keeps running (past every warp operation it completes) until
//    all its threads wait at the block's barrier or have finished. A warp
//    thus runs ahead of the others as far as the barriers let it, and reads
//    or overwrites shared memory early wherever a barrier is missing.
//
// FASTLLM_CUDA_EMU_DROP_BARRIER=FILE:LINE turns the __syncthreads at that
// line (FILE: the source's base name) into nothing: the test that proves
// the schedules catch a missing barrier.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/emu/Launch.h"
#include "runtime/cuda/emu/Device.h"
#include "runtime/cuda/emu/Stream.h"

#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace ctx = boost::context;
using namespace fastllm::emu;

// Defined in Runtime.cpp: the launch limits and the kernel's opt-in.
namespace fastllm::emu {
void setLastError(cudaError_t err);
size_t optedInSharedBytes(const void *kernel);
} // namespace fastllm::emu

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kDefaultSharedBytes = 48 * 1024;
constexpr size_t kMaxSharedBytes = 227 * 1024; // an H100's opt-in limit

enum class Schedule { InOrder, Adversarial };

Schedule schedule() {
  static const Schedule s = [] {
    const char *v = std::getenv("FASTLLM_CUDA_EMU_SCHEDULE");
    if (!v || !*v || !std::strcmp(v, "inorder"))
      return Schedule::InOrder;
    if (!std::strcmp(v, "adversarial"))
      return Schedule::Adversarial;
    fatal("FASTLLM_CUDA_EMU_SCHEDULE=%s: expected inorder or adversarial", v);
  }();
  return s;
}

/// The __syncthreads to leave out (FASTLLM_CUDA_EMU_DROP_BARRIER).
struct DroppedBarrier {
  std::string file;
  int line = 0;
};

const DroppedBarrier &droppedBarrier() {
  static const DroppedBarrier d = [] {
    DroppedBarrier d;
    const char *v = std::getenv("FASTLLM_CUDA_EMU_DROP_BARRIER");
    if (!v || !*v)
      return d;
    const char *colon = std::strrchr(v, ':');
    char *end = nullptr;
    long line = colon ? std::strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == v || *end || line <= 0)
      fatal("FASTLLM_CUDA_EMU_DROP_BARRIER=%s: expected FILE:LINE", v);
    d.file.assign(v, colon);
    d.line = int(line);
    return d;
  }();
  return d;
}

const char *baseName(const char *path) {
  const char *slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

enum class State { Ready, AtBarrier, InWarpOp, Done };

/// A warp operation a thread waits in.
struct PendingOp {
  WarpOpKind kind;
  unsigned mask;
  uint64_t bits;
  int size, arg, width;
  unsigned char key[32];
  int keyBytes;
  const char *file;
  int line;
  uint64_t result;
};

/// A cp.async copy not yet done: it belongs to the group `group` (the
/// thread's commits before it was issued).
struct AsyncCopy {
  void *dst;
  const void *src;
  int bytes, srcBytes;
  int group;
};

struct Thread {
  ctx::fiber fiber; ///< the thread, while it is suspended
  ctx::fiber sink;  ///< the scheduler, while the thread runs
  uint3 index;
  State state = State::Ready;
  bool started = false;
  PendingOp op;
  const char *barrierFile = nullptr;
  int barrierLine = 0;
  std::vector<AsyncCopy> asyncCopies; ///< issued, not yet waited for
  int commits = 0;                    ///< cp.async.commit_group so far
};

/// Stacks for the fibers, kept between blocks and launches.
class StackPool {
public:
  ctx::stack_context take() {
    if (free.empty())
      return ctx::protected_fixedsize_stack(kStackBytes).allocate();
    ctx::stack_context s = free.back();
    free.pop_back();
    return s;
  }
  void give(ctx::stack_context s) { free.push_back(s); }
  ~StackPool() {
    for (ctx::stack_context &s : free)
      ctx::protected_fixedsize_stack(kStackBytes).deallocate(s);
  }

private:
  std::vector<ctx::stack_context> free;
};

thread_local StackPool stackPool;

/// Boost.Context's stack allocator interface over the pool.
struct PooledStack {
  ctx::stack_context allocate() { return stackPool.take(); }
  void deallocate(ctx::stack_context &s) noexcept { stackPool.give(s); }
};

/// The block the current host thread is running.
struct Block {
  const LaunchSpec *spec;
  uint3 index;
  std::vector<Thread> threads;
  int warps = 0;
  /// Per warp, how many of its lanes wait in a warp operation: the lanes'
  /// operations are compared only once enough of them are there.
  std::vector<int> inWarpOp;
  int atBarrier = 0;
  int done = 0;
  std::vector<unsigned char> *shared;
  Thread *current = nullptr;
};

thread_local Block *currentBlock = nullptr;

Thread &self() {
  if (!currentBlock || !currentBlock->current)
    fatal("a device function was called outside a kernel");
  return *currentBlock->current;
}

int linearIndex(const Block &b, const Thread &t) {
  return int(&t - b.threads.data());
}

[[noreturn]] void blockFatal(const Block &b, const Thread *t, const char *file,
                             int line, const char *message) {
  char where[160] = "";
  if (t)
    std::snprintf(where, sizeof(where), " thread (%u,%u,%u)", t->index.x,
                  t->index.y, t->index.z);
  fatal("%s:%d: kernel %s, block (%u,%u,%u)%s: %s", baseName(file), line,
        b.spec->name, b.index.x, b.index.y, b.index.z, where, message);
}

/// Gives control back to the scheduler until this thread is resumed.
void yield(Thread &t) { t.sink = std::move(t.sink).resume(); }

const char *opName(WarpOpKind k) {
  switch (k) {
  case WarpOpKind::SyncWarp:
    return "__syncwarp";
  case WarpOpKind::ShuffleXor:
    return "__shfl_xor_sync";
  case WarpOpKind::ShuffleDown:
    return "__shfl_down_sync";
  case WarpOpKind::ShuffleUp:
    return "__shfl_up_sync";
  case WarpOpKind::ShuffleIdx:
    return "__shfl_sync";
  case WarpOpKind::Wmma:
    return "a wmma operation";
  case WarpOpKind::Combine:
    return "a warp-collective instruction (mma.sync, ldmatrix)";
  }
  return "a warp operation";
}

/// The lane a shuffle of `lane` reads, or -1 for its own value.
int sourceLane(const PendingOp &op, int lane) {
  const int width = op.width;
  const int first = lane / width * width, last = first + width - 1;
  switch (op.kind) {
  case WarpOpKind::ShuffleXor: {
    int src = lane ^ op.arg;
    return src <= last && src >= 0 && src < 32 ? src : -1;
  }
  case WarpOpKind::ShuffleDown: {
    int src = lane + op.arg;
    return src <= last ? src : -1;
  }
  case WarpOpKind::ShuffleUp: {
    int src = lane - op.arg;
    return src >= first ? src : -1;
  }
  case WarpOpKind::ShuffleIdx:
    return first + ((op.arg % width) + width) % width;
  default:
    return -1;
  }
}

/// Completes the warp operation of warp `w` that `mask` names when every
/// lane of it is there; returns whether it did.
bool tryCompleteWarpOp(Block &b, int w, const Thread &arriving) {
  const PendingOp &mine = arriving.op;
  Thread *lanes = &b.threads[size_t(w) * 32];
  const int width =
      int(std::min<size_t>(32, b.threads.size() - size_t(w) * 32));
  for (int l = 0; l < 32; ++l) {
    if (!(mine.mask >> l & 1))
      continue;
    if (l >= width)
      blockFatal(b, &arriving, mine.file, mine.line,
                 "the warp operation's mask names a lane the block does not "
                 "have");
    const Thread &t = lanes[l];
    if (t.state == State::Done) {
      char m[160];
      std::snprintf(m, sizeof(m),
                    "%s with mask 0x%08x: lane %d has exited and never "
                    "reaches it",
                    opName(mine.kind), mine.mask, l);
      blockFatal(b, &arriving, mine.file, mine.line, m);
    }
    if (t.state != State::InWarpOp)
      return false;
    const PendingOp &o = t.op;
    if (o.kind != mine.kind || o.mask != mine.mask || o.size != mine.size ||
        o.keyBytes != mine.keyBytes ||
        std::memcmp(o.key, mine.key, size_t(mine.keyBytes)) ||
        ((mine.kind == WarpOpKind::Wmma || mine.kind == WarpOpKind::Combine) &&
         o.arg != mine.arg)) {
      char m[320];
      std::snprintf(m, sizeof(m),
                    "%s with mask 0x%08x meets lane %d in %s with mask 0x%08x "
                    "at %s:%d (the lanes of a warp operation must make the "
                    "same call with the same mask and arguments)",
                    opName(mine.kind), mine.mask, l, opName(o.kind), o.mask,
                    baseName(o.file), o.line);
      blockFatal(b, &arriving, mine.file, mine.line, m);
    }
  }
  // A lane waiting in another operation that names any of these lanes
  // could never complete: they are in this one.
  for (int l = 0; l < width; ++l) {
    const Thread &t = lanes[l];
    if (mine.mask >> l & 1 || t.state != State::InWarpOp ||
        !(t.op.mask & mine.mask))
      continue;
    char m[320];
    std::snprintf(m, sizeof(m),
                  "%s with mask 0x%08x meets lane %d in %s with mask 0x%08x "
                  "at %s:%d (the lanes of a warp operation must make the "
                  "same call with the same mask and arguments)",
                  opName(mine.kind), mine.mask, l, opName(t.op.kind), t.op.mask,
                  baseName(t.op.file), t.op.line);
    blockFatal(b, &arriving, mine.file, mine.line, m);
  }
  if (mine.kind == WarpOpKind::Combine) {
    // Every lane's operands, then the instruction, once, for the warp.
    void *data[32];
    for (int l = 0; l < 32; ++l)
      data[l] = reinterpret_cast<void *>(uintptr_t(lanes[l].op.bits));
    WarpCombineFn fn;
    std::memcpy(&fn, mine.key, sizeof(fn));
    fn(data);
  }
  for (int l = 0; l < 32; ++l) {
    if (!(mine.mask >> l & 1))
      continue;
    Thread &t = lanes[l];
    if (mine.kind != WarpOpKind::SyncWarp && mine.kind != WarpOpKind::Wmma &&
        mine.kind != WarpOpKind::Combine) {
      int src = sourceLane(t.op, l);
      if (src >= 0 && !(mine.mask >> src & 1)) {
        char m[160];
        std::snprintf(m, sizeof(m),
                      "%s with mask 0x%08x: lane %d reads lane %d, which the "
                      "mask leaves out (undefined on a GPU)",
                      opName(mine.kind), mine.mask, l, src);
        blockFatal(b, &t, mine.file, mine.line, m);
      }
      t.op.result = src >= 0 ? lanes[src].op.bits : t.op.bits;
    }
    t.state = State::Ready;
  }
  b.inWarpOp[size_t(w)] -= __builtin_popcount(mine.mask);
  return true;
}

void runThread(Block &b, Thread &t) {
  threadIdx = t.index;
  b.current = &t;
  if (!t.started) {
    t.started = true;
    t.fiber = ctx::fiber(std::allocator_arg, PooledStack(),
                         [&t, &b](ctx::fiber &&sink) {
                           t.sink = std::move(sink);
                           b.spec->body();
                           t.state = State::Done;
                           ++b.done;
                           return std::move(t.sink);
                         });
  }
  t.fiber = std::move(t.fiber).resume();
  b.current = nullptr;
}

/// Explains why no thread of `b` can run and aborts.
[[noreturn]] void deadlock(Block &b) {
  for (Thread &t : b.threads) {
    if (t.state == State::InWarpOp) {
      for (int l = 0; l < 32; ++l) {
        if (!(t.op.mask >> l & 1))
          continue;
        const Thread &o = b.threads[size_t(linearIndex(b, t)) / 32 * 32 + l];
        if (o.state == State::InWarpOp)
          continue;
        char m[256];
        std::snprintf(
            m, sizeof(m), "%s with mask 0x%08x never completes: lane %d %s",
            opName(t.op.kind), t.op.mask, l,
            o.state == State::Done ? "has exited" : "waits at __syncthreads");
        blockFatal(b, &t, t.op.file, t.op.line, m);
      }
    }
  }
  for (Thread &t : b.threads)
    if (t.state == State::AtBarrier) {
      char m[160];
      std::snprintf(m, sizeof(m),
                    "__syncthreads never completes: %d of the block's %zu "
                    "threads have exited without reaching it",
                    b.done, b.threads.size());
      blockFatal(b, &t, t.barrierFile, t.barrierLine, m);
    }
  blockFatal(b, nullptr, __FILE__, __LINE__, "no thread can run");
}

void runBlock(Block &b) {
  const size_t n = b.threads.size();
  if (schedule() == Schedule::InOrder) {
    while (size_t(b.done) < n) {
      bool ran = false;
      for (Thread &t : b.threads)
        if (t.state == State::Ready) {
          runThread(b, t);
          ran = true;
        }
      if (!ran)
        deadlock(b);
    }
    return;
  }
  while (size_t(b.done) < n) {
    bool ran = false;
    for (int w = b.warps - 1; w >= 0; --w) {
      const size_t first = size_t(w) * 32, end = std::min(n, first + 32);
      for (bool more = true; more;) {
        more = false;
        for (size_t i = end; i-- > first;)
          if (b.threads[i].state == State::Ready) {
            runThread(b, b.threads[i]);
            ran = more = true;
          }
      }
    }
    if (!ran)
      deadlock(b);
  }
}

void runGrid(const LaunchSpec &spec) {
  std::vector<unsigned char> shared(spec.sharedBytes + 128);
  Block b;
  b.spec = &spec;
  b.shared = &shared;
  const size_t n = size_t(spec.block.x) * spec.block.y * spec.block.z;
  b.warps = int((n + 31) / 32);
  Block *outer = currentBlock;
  currentBlock = &b;
  blockDim = spec.block;
  gridDim = spec.grid;
  for (unsigned z = 0; z < spec.grid.z; ++z)
    for (unsigned y = 0; y < spec.grid.y; ++y)
      for (unsigned x = 0; x < spec.grid.x; ++x) {
        b.index = make_uint3(x, y, z);
        blockIdx = b.index;
        b.threads.clear();
        b.threads.resize(n);
        size_t i = 0;
        for (unsigned tz = 0; tz < spec.block.z; ++tz)
          for (unsigned ty = 0; ty < spec.block.y; ++ty)
            for (unsigned tx = 0; tx < spec.block.x; ++tx)
              b.threads[i++].index = make_uint3(tx, ty, tz);
        b.atBarrier = b.done = 0;
        b.inWarpOp.assign(size_t(b.warps), 0);
        std::memset(shared.data(), 0xff, shared.size());
        runBlock(b);
      }
  currentBlock = outer;
}

} // namespace

void fastllm::emu::syncThreads(const char *file, int line) {
  Thread &t = self();
  Block &b = *currentBlock;
  const DroppedBarrier &drop = droppedBarrier();
  if (drop.line == line && drop.file == baseName(file))
    return;
  t.state = State::AtBarrier;
  t.barrierFile = file;
  t.barrierLine = line;
  if (size_t(++b.atBarrier) == b.threads.size()) {
    // Everyone is here: release the block, this thread first.
    b.atBarrier = 0;
    for (Thread &o : b.threads)
      o.state = State::Ready;
    if (schedule() == Schedule::InOrder)
      yield(t); // the others run up to here before anyone goes on
    return;
  }
  yield(t);
}

uint64_t fastllm::emu::warpOp(WarpOpKind kind, unsigned mask, uint64_t bits,
                              int size, int arg, int width, const void *key,
                              int keyBytes, const char *file, int line) {
  Thread &t = self();
  Block &b = *currentBlock;
  const int lane = linearIndex(b, t) % 32;
  if (!(mask >> lane & 1)) {
    char m[128];
    std::snprintf(m, sizeof(m),
                  "%s with mask 0x%08x: the calling lane %d is "
                  "not in the mask",
                  opName(kind), mask, lane);
    blockFatal(b, &t, file, line, m);
  }
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    char m[128];
    std::snprintf(m, sizeof(m), "%s: width %d is not a power of 2 up to 32",
                  opName(kind), width);
    blockFatal(b, &t, file, line, m);
  }
  if (keyBytes > int(sizeof(t.op.key)))
    blockFatal(b, &t, file, line, "warp operation key too large");
  t.op.kind = kind;
  t.op.mask = mask;
  t.op.bits = bits;
  t.op.size = size;
  t.op.arg = arg;
  t.op.width = width;
  t.op.keyBytes = keyBytes;
  if (keyBytes)
    std::memcpy(t.op.key, key, size_t(keyBytes));
  t.op.file = file;
  t.op.line = line;
  t.state = State::InWarpOp;
  const int w = linearIndex(b, t) / 32;
  // A lane that exited is reported by the check below, once the others
  // are there; one that never comes, by the deadlock check.
  const bool complete = ++b.inWarpOp[size_t(w)] >= __builtin_popcount(mask) &&
                        tryCompleteWarpOp(b, w, t);
  if (!complete || schedule() == Schedule::InOrder)
    yield(t);
  return t.op.result;
}

void fastllm::emu::warpCombine(WarpCombineFn fn, int tag, void *data,
                               const char *file, int line) {
  // The function is the key every lane must pass alike; the tag (the
  // instruction's variant) is compared as a WMMA operation's is.
  warpOp(WarpOpKind::Combine, 0xffffffffu, uint64_t(uintptr_t(data)), 8, tag,
         32, &fn, int(sizeof(fn)), file, line);
}

void fastllm::emu::asyncCopy(void *dst, const void *src, int bytes,
                             int srcBytes) {
  Thread &t = self();
  if ((bytes != 4 && bytes != 8 && bytes != 16) || srcBytes < 0 ||
      srcBytes > bytes)
    deviceFatal(__FILE__, __LINE__, "cp.async of %d bytes (%d from global)",
                bytes, srcBytes);
  if (reinterpret_cast<uintptr_t>(dst) % unsigned(bytes) ||
      (srcBytes && reinterpret_cast<uintptr_t>(src) % unsigned(bytes)))
    deviceFatal(__FILE__, __LINE__,
                "cp.async of %d bytes: %p -> %p is not %d-byte aligned", bytes,
                src, dst, bytes);
  t.asyncCopies.push_back({dst, src, bytes, srcBytes, t.commits});
  // The adversarial schedule lands the copy at once, so that one into a
  // buffer other warps still read (a missing barrier before the refill)
  // shows; the in-order one at the wait, so that a read before the wait
  // shows.
  if (schedule() == Schedule::Adversarial)
    asyncWait(-1); // every copy, committed or not
}

void fastllm::emu::asyncCommit() { ++self().commits; }

void fastllm::emu::asyncWait(int pending) {
  Thread &t = self();
  const int done = t.commits - pending; // groups below this one complete
  auto keep = t.asyncCopies.begin();
  for (AsyncCopy &c : t.asyncCopies) {
    if (c.group < done) {
      std::memcpy(c.dst, c.src, size_t(c.srcBytes));
      std::memset(static_cast<char *>(c.dst) + c.srcBytes, 0,
                  size_t(c.bytes - c.srcBytes));
    } else {
      *keep++ = c;
    }
  }
  t.asyncCopies.erase(keep, t.asyncCopies.end());
}

void *fastllm::emu::dynamicShared() {
  Block &b = *currentBlock;
  (void)self();
  uintptr_t p = reinterpret_cast<uintptr_t>(b.shared->data());
  return reinterpret_cast<void *>((p + 127) / 128 * 128);
}

void fastllm::emu::deviceFatal(const char *file, int line, const char *format,
                               ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  if (!currentBlock)
    fatal("%s:%d: %s", baseName(file), line, message);
  blockFatal(*currentBlock, currentBlock->current, file, line, message);
}

void fastllm::emu::launch(LaunchSpec spec) {
  const dim3 g = spec.grid, k = spec.block;
  const unsigned long long threads = (unsigned long long)k.x * k.y * k.z;
  if (!k.x || !k.y || !k.z || k.x > 1024 || k.y > 1024 || k.z > 64 ||
      threads > 1024 || !g.x || !g.y || !g.z || g.x > 2147483647u ||
      g.y > 65535 || g.z > 65535) {
    setLastError(cudaErrorInvalidConfiguration);
    return;
  }
  const size_t limit =
      std::max(kDefaultSharedBytes, optedInSharedBytes(spec.kernel));
  if (spec.sharedBytes > std::min(limit, kMaxSharedBytes)) {
    setLastError(cudaErrorInvalidValue);
    return;
  }
  auto shared = std::make_shared<LaunchSpec>(std::move(spec));
  cudaStream_t s = shared->stream;
  enqueue(s, [shared] { runGrid(*shared); });
}
