//===- Device.cpp - the CPU target's device: host memory ------------------===//

#include "runtime/Device.h"

#include <cstdlib>
#include <cstring>

using namespace fastllm::rt;

const char *fastllm::rt::deviceTarget() { return "cpu"; }

Status fastllm::rt::initDevice(int) { return Status(); }

Expected<Arena> fastllm::rt::allocateArena(int64_t bytes) {
  size_t size = (size_t(bytes) + 63) / 64 * 64;
  char *data = static_cast<char *>(std::aligned_alloc(64, size));
  if (!data)
    return errorf("cannot allocate the model's %lld-byte arena",
                  (long long)bytes);
  std::memset(data, 0, size);
  return Arena{ArenaPtr(data, [](char *p) { std::free(p); }), int64_t(size)};
}

void fastllm::rt::synchronizeDevice() {}
