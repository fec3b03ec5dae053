//===- SoftmaxTest.cpp - softmax and its gradient ---------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

struct SoftmaxCase {
  int64_t outer, n, inner;
};

// Tests softmax and log-softmax along the last and a middle dim, with -inf
// entries (probability 0), an all -inf slice (NaN) and huge logits.
TEST(SoftmaxTest, Forward) {
  for (SoftmaxCase c : {SoftmaxCase{5, 7, 1}, SoftmaxCase{2, 5, 3},
                        SoftmaxCase{3, 6, 300}, SoftmaxCase{40, 1000, 1}})
    for (bool log : {false, true}) {
      auto x = randomFloats(c.outer * c.n * c.inner, 80, -5.f, 5.f);
      x[0] = -kInfF;                    // one masked entry
      x[c.inner] += 1000.f;             // stability
      for (int64_t j = 0; j < c.n; ++j) // slice (o=1, c=0) fully masked
        x[(c.n + j) * c.inner] = -kInfF;
      std::vector<float> y(x.size());
      softmax(y.data(), x.data(), c.outer, c.n, c.inner, log);
      expectAllClose(y, refSoftmax(x, c.outer, c.n, c.inner, log), 1e-5, 1e-7,
                     "n=" + std::to_string(c.n) +
                         " log=" + std::to_string(log));
    }
}

// Tests softmaxGrad against the derivative written out in double and
// against finite differences of softmax.
TEST(SoftmaxTest, Grad) {
  for (SoftmaxCase c :
       {SoftmaxCase{5, 7, 1}, SoftmaxCase{2, 5, 3}, SoftmaxCase{2, 9, 300}})
    for (bool log : {false, true}) {
      int64_t size = c.outer * c.n * c.inner;
      auto x = randomFloats(size, 81), dy = randomFloats(size, 82);
      std::vector<float> y(size), dx(size);
      softmax(y.data(), x.data(), c.outer, c.n, c.inner, log);
      softmaxGrad(dx.data(), y.data(), dy.data(), c.outer, c.n, c.inner, log);
      std::vector<double> want(size);
      for (int64_t o = 0; o < c.outer; ++o)
        for (int64_t k = 0; k < c.inner; ++k) {
          auto at = [&](int64_t j) { return (o * c.n + j) * c.inner + k; };
          double s = 0;
          for (int64_t j = 0; j < c.n; ++j)
            s += log ? double(dy[at(j)]) : double(dy[at(j)]) * y[at(j)];
          for (int64_t j = 0; j < c.n; ++j)
            want[at(j)] = log ? dy[at(j)] - std::exp(double(y[at(j)])) * s
                              : y[at(j)] * (dy[at(j)] - s);
        }
      expectAllClose(dx, want, 1e-5, 1e-6, "log=" + std::to_string(log));
      checkFiniteDifferences(
          x, dx,
          [&](const std::vector<float> &xs) {
            std::vector<float> ys(size);
            softmax(ys.data(), xs.data(), c.outer, c.n, c.inner, log);
            return weighted(ys, dy);
          },
          1e-2, 2e-3, "log=" + std::to_string(log));
    }
}

} // namespace
