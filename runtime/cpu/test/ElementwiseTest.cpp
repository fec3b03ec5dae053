//===- ElementwiseTest.cpp - elementwise with broadcasting ------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

#include <numeric>

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

/// The reference: out[i] = f(in_k[i·s_k]...) by unravelling every index.
template <typename Out, typename F, typename... T>
std::vector<Out> refElementwise(const Shape &shape, F f,
                                std::pair<std::vector<T> *, Shape>... in) {
  std::vector<Out> out(numel(shape));
  for (int64_t i = 0; i < numel(shape); ++i) {
    Shape index = unravel(i, shape);
    out[i] = static_cast<Out>(f((*in.first)[dot(index, in.second)]...));
  }
  return out;
}

// Tests a binary op where each input broadcasts along a different dim.
TEST(ElementwiseTest, BroadcastsBothWays) {
  Shape shape{3, 4, 5}, sa{5, 0, 1}, sb{0, 5, 1};
  auto a = randomFloats(15, 1), b = randomFloats(20, 2);
  auto f = [](float x, float y) { return x * y + 1.f; };
  std::vector<float> out(60);
  elementwise(out.data(), 3, shape.data(), f, In<float>{a.data(), sa.data()},
              In<float>{b.data(), sb.data()});
  expectAllClose(
      out,
      refElementwise<float>(shape, f, std::pair{&a, sa}, std::pair{&b, sb}), 0,
      0);
}

// Tests scalar, row and column broadcasts and a transposed (strided) input in
// one fused three-input expression.
TEST(ElementwiseTest, FusedWithScalarColumnAndTransposedInputs) {
  Shape shape{7, 9};
  std::vector<float> scalar{0.5f};
  auto col = randomFloats(7, 3), t = randomFloats(63, 4);
  Shape sScalar{0, 0}, sCol{1, 0}, sT{1, 7}; // t is stored as [9, 7]
  auto f = [](float s, float c, float x) { return gelu(x * s + c, false); };
  std::vector<float> out(63);
  elementwise(
      out.data(), 2, shape.data(), f, In<float>{scalar.data(), sScalar.data()},
      In<float>{col.data(), sCol.data()}, In<float>{t.data(), sT.data()});
  expectAllClose(out,
                 refElementwise<float>(shape, f, std::pair{&scalar, sScalar},
                                       std::pair{&col, sCol},
                                       std::pair{&t, sT}),
                 1e-6, 1e-7);
}

// Tests that rank 0 computes the single element.
TEST(ElementwiseTest, RankZero) {
  float a = 3.f, b = -2.f, out = 0.f;
  elementwise(
      &out, 0, nullptr, [](float x, float y) { return x - y; },
      In<float>{&a, nullptr}, In<float>{&b, nullptr});
  EXPECT_EQ(out, 5.f);
}

// Tests select, compare and cast: bool and int64 operands, bool output.
TEST(ElementwiseTest, MixedElementTypes) {
  Shape shape{4, 6}, full{6, 1}, row{0, 1};
  std::vector<bool> condBits{1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1,
                             0, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0};
  std::vector<char> cond(condBits.begin(), condBits.end());
  const bool *condData = reinterpret_cast<const bool *>(cond.data());
  auto a = randomFloats(24, 5), b = randomFloats(6, 6);
  std::vector<float> sel(24);
  elementwise(
      sel.data(), 2, shape.data(),
      [](bool c, float x, float y) { return c ? x : y; },
      In<bool>{condData, full.data()}, In<float>{a.data(), full.data()},
      In<float>{b.data(), row.data()});
  std::vector<char> cmpOut(24);
  elementwise(
      reinterpret_cast<bool *>(cmpOut.data()), 2, shape.data(),
      [](float x, float y) { return x > y; }, In<float>{a.data(), full.data()},
      In<float>{b.data(), row.data()});
  std::vector<int64_t> ints(24);
  std::iota(ints.begin(), ints.end(), -12);
  std::vector<float> cast(24);
  elementwise(
      cast.data(), 2, shape.data(),
      [](int64_t v) { return static_cast<float>(v); },
      In<int64_t>{ints.data(), full.data()});
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(sel[i], cond[i] ? a[i] : b[i % 6]) << i;
    EXPECT_EQ(bool(cmpOut[i]), a[i] > b[i % 6]) << i;
    EXPECT_EQ(cast[i], float(i - 12)) << i;
  }
}

// Tests the threaded path: several blocks per row, rows split between
// threads mid-row, a broadcast column that changes with every row, and a
// strided inner dim.
TEST(ElementwiseTest, LargeShapesAcrossBlocksAndThreads) {
  Shape shape{3, 50001}, full{50001, 1}, col{1, 0}, row{0, 1};
  auto a = randomFloats(3 * 50001, 7), c = randomFloats(3, 8),
       r = randomFloats(50001, 9);
  auto f = [](float x, float y, float z) { return x * y - z; };
  std::vector<float> out(3 * 50001);
  elementwise(out.data(), 2, shape.data(), f, In<float>{a.data(), full.data()},
              In<float>{c.data(), col.data()}, In<float>{r.data(), row.data()});
  expectAllClose(out,
                 refElementwise<float>(shape, f, std::pair{&a, full},
                                       std::pair{&c, col}, std::pair{&r, row}),
                 0, 0);

  Shape tShape{257, 300}, tStrides{1, 257};
  auto t = randomFloats(257 * 300, 10);
  auto neg = [](float x) { return -x; };
  std::vector<float> tOut(257 * 300);
  elementwise(tOut.data(), 2, tShape.data(), neg,
              In<float>{t.data(), tStrides.data()});
  expectAllClose(
      tOut, refElementwise<float>(tShape, neg, std::pair{&t, tStrides}), 0, 0);
}

// Tests that the output may be the (contiguous) input, and that an empty
// shape writes nothing.
TEST(ElementwiseTest, InPlaceAndEmpty) {
  Shape shape{5, 40000}, strides{40000, 1};
  auto a = randomFloats(200000, 11);
  auto want = a;
  for (float &x : want)
    x = x * 2.f + 1.f;
  elementwise(
      a.data(), 2, shape.data(), [](float x) { return x * 2.f + 1.f; },
      In<float>{a.data(), strides.data()});
  expectAllClose(a, want, 0, 0);

  Shape empty{3, 0};
  float sentinel = 42.f;
  elementwise(
      &sentinel, 2, empty.data(), [](float x) { return x; },
      In<float>{a.data(), strides.data()});
  EXPECT_EQ(sentinel, 42.f);
}

} // namespace
