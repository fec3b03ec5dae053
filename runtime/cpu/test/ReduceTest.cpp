//===- ReduceTest.cpp - reduce ----------------------------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

#include <numeric>

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

template <typename T>
std::vector<double> refReduce(const std::vector<T> &in, const Shape &shape,
                              const std::vector<bool> &reduced,
                              ReduceKind kind) {
  Shape outShape;
  for (size_t d = 0; d < shape.size(); ++d)
    outShape.push_back(reduced[d] ? 1 : shape[d]);
  Shape outStrides = contiguous(outShape);
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (reduced[d])
      count *= shape[d];
  std::vector<double> out(numel(outShape),
                          kind == ReduceKind::Max ? -kInf : 0.0);
  for (int64_t i = 0; i < numel(shape); ++i) {
    Shape index = unravel(i, shape);
    for (size_t d = 0; d < shape.size(); ++d)
      if (reduced[d])
        index[d] = 0;
    double &o = out[dot(index, outStrides)];
    double v = double(in[i]);
    o = kind != ReduceKind::Max          ? o + v
        : std::isnan(v) || std::isnan(o) ? std::nan("")
                                         : std::max(o, v);
  }
  if (kind == ReduceKind::Mean)
    for (double &o : out)
      o /= double(count);
  return out;
}

template <typename T>
void checkReduce(const std::vector<T> &in, const Shape &shape,
                 const std::vector<bool> &reduced, ReduceKind kind,
                 double rtol) {
  std::vector<double> want = refReduce(in, shape, reduced, kind);
  std::vector<T> out(want.size());
  bool flags[kMaxRank];
  std::copy(reduced.begin(), reduced.end(), flags);
  reduce(out.data(), in.data(), int(shape.size()), shape.data(), flags, kind);
  expectAllClose(out, want, rtol, rtol, "kind " + std::to_string(int(kind)));
}

// Tests every subset of reduced dims of a rank-3 tensor, for each kind.
TEST(ReduceTest, AllDimSubsets) {
  Shape shape{3, 4, 5};
  auto in = randomFloats(60, 70);
  for (int mask = 0; mask < 8; ++mask)
    for (ReduceKind kind :
         {ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max}) {
      SCOPED_TRACE("mask " + std::to_string(mask));
      checkReduce(in, shape, {bool(mask & 4), bool(mask & 2), bool(mask & 1)},
                  kind, 1e-6);
    }
}

// Tests size-1 dims, threaded full and partial reductions, integer sums and
// NaN propagation in Max.
TEST(ReduceTest, ShapesTypesAndNaN) {
  auto small = randomFloats(24, 71);
  checkReduce(small, {2, 1, 3, 1, 4}, {true, false, false, true, true},
              ReduceKind::Sum, 1e-6);
  checkReduce(small, {2, 1, 3, 1, 4}, {false, true, true, false, false},
              ReduceKind::Mean, 1e-6);
  auto big = randomFloats(100003, 72);
  checkReduce(big, {100003}, {true}, ReduceKind::Sum, 1e-6);
  checkReduce(big, {100003}, {true}, ReduceKind::Max, 0);
  auto mat = randomFloats(300 * 257, 73);
  for (ReduceKind kind : {ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max}) {
    checkReduce(mat, {300, 257}, {true, false}, kind, 1e-6);
    checkReduce(mat, {300, 257}, {false, true}, kind, 1e-6);
    checkReduce(mat, {3, 100, 257}, {false, true, false}, kind, 1e-6);
  }
  std::vector<int64_t> ints(60);
  std::iota(ints.begin(), ints.end(), -30);
  checkReduce(ints, {3, 4, 5}, {false, true, true}, ReduceKind::Sum, 0);
  checkReduce(ints, {3, 4, 5}, {true, false, true}, ReduceKind::Max, 0);

  small[10] = std::nanf("");
  checkReduce(small, {4, 6}, {false, true}, ReduceKind::Max, 0);
  checkReduce(small, {4, 6}, {true, false}, ReduceKind::Max, 0);
}

// Tests reducing an empty dim: Sum gives 0, Mean NaN, as in PyTorch.
TEST(ReduceTest, EmptyReducedDim) {
  Shape shape{3, 0};
  bool flags[] = {false, true};
  std::vector<float> out(3, 7.f);
  reduce(out.data(), static_cast<const float *>(nullptr), 2, shape.data(),
         flags, ReduceKind::Sum);
  EXPECT_EQ(out, std::vector<float>(3, 0.f));
  reduce(out.data(), static_cast<const float *>(nullptr), 2, shape.data(),
         flags, ReduceKind::Mean);
  EXPECT_TRUE(std::isnan(out[0]));
}

} // namespace
