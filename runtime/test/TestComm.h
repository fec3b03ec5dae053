//===- TestComm.h - the test process's Communicator -------------*- C++ -*-===//

#ifndef FASTLLM_RUNTIME_TEST_TESTCOMM_H
#define FASTLLM_RUNTIME_TEST_TESTCOMM_H

#include "runtime/Comm.h"

#include <cstdio>
#include <cstdlib>

namespace fastllm::rt::test {

/// A 1-rank world, created on first use (MPI initialises once per process,
/// so tests share it) and finalised at exit.
inline Communicator &testComm() {
  static std::unique_ptr<Communicator> comm = [] {
    Expected<std::unique_ptr<Communicator>> c =
        Communicator::create(nullptr, nullptr);
    if (!c) {
      std::fprintf(stderr, "%s\n", c.status().message().c_str());
      std::abort();
    }
    return std::move(*c);
  }();
  return *comm;
}

} // namespace fastllm::rt::test

#endif // FASTLLM_RUNTIME_TEST_TESTCOMM_H
