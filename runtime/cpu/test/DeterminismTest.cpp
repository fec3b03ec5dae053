//===- DeterminismTest.cpp - thread-count independence ----------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

#ifdef _OPENMP
// Tests that results are bitwise the same on 1 and 3 threads for the kernels
// that combine partial sums or split their work by the team size.
TEST(DeterminismTest, SameBitsOnAnyTeam) {
  const int64_t rows = 512, cols = 384;
  auto x = randomFloats(rows * cols, 110), dy = randomFloats(rows * cols, 111);
  auto scale = randomFloats(cols, 112);
  std::vector<int64_t> targets(rows);
  for (int64_t i = 0; i < rows; ++i)
    targets[i] = i * 7 % cols;
  auto a = randomFloats(2 * 600 * 96, 113), b = randomFloats(96 * 150, 114);
  auto run = [&] {
    std::vector<float> out(rows * cols + 3 * cols + 3 + 2 * 600 * 150);
    float *dx = out.data(), *dscale = dx + rows * cols, *dbias = dscale + cols;
    layerNormGrad(dx, dscale, dbias, x.data(), scale.data(), dy.data(), rows,
                  cols, 1e-5f);
    rmsNormGrad(dx, dbias + cols, x.data(), scale.data(), dy.data(), rows, cols,
                1e-5f);
    bool all[] = {true, true};
    Shape shape{rows, cols};
    reduce(dbias + 2 * cols, x.data(), 2, shape.data(), all, ReduceKind::Sum);
    crossEntropy(dbias + 2 * cols + 1, x.data(), targets.data(), rows, cols,
                 false, 0, Reduction::Mean);
    // Two products of 600 rows, in bands whatever the team (BLAS may sum
    // a band in another order than the whole).
    Shape batch{2}, aStrides{600 * 96}, bStrides{0};
    matmul(dbias + 2 * cols + 3, a.data(), b.data(), 1, batch.data(),
           aStrides.data(), bStrides.data(), 600, 150, 96, true, false);
    return out;
  };
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = run();
  omp_set_num_threads(3);
  auto three = run();
  omp_set_num_threads(saved);
  EXPECT_EQ(one, three);
}
#endif

} // namespace
