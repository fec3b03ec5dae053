//===- KernelsTest.cpp - Tests of the CPU kernel library ------------------===//
//
// Every kernel is compared with a naive reference written here from the
// math: plain loops over multi-indices in double precision, sharing no code
// with the kernels. Gradient kernels are also checked against central
// differences of the forward kernels.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

extern "C" char *openblas_get_corename(void);

using namespace fastllm::rt::cpu;

namespace {

using Shape = std::vector<int64_t>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

int64_t numel(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Shape contiguous(const Shape &shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

Shape unravel(int64_t flat, const Shape &shape) {
  Shape index(shape.size());
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

int64_t dot(const Shape &index, const Shape &strides) {
  int64_t s = 0;
  for (size_t d = 0; d < index.size(); ++d)
    s += index[d] * strides[d];
  return s;
}

std::vector<float> randomFloats(int64_t n, unsigned seed, float lo = -2.f,
                                float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// |got - want| <= atol + rtol·|want| elementwise; NaN and ±inf must match.
template <typename G, typename W>
void expectAllClose(const G &got, const W &want, double rtol, double atol,
                    const std::string &what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = double(got[i]), w = double(want[i]);
    bool ok = std::isnan(w)   ? std::isnan(g)
              : std::isinf(w) ? g == w
                              : std::abs(g - w) <= atol + rtol * std::abs(w);
    if (!ok && failures++ < 8)
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want "
                    << w;
  }
  EXPECT_EQ(failures, 0) << what;
}

//===----------------------------------------------------------------------===//
// Scalar math
//===----------------------------------------------------------------------===//

// Tests that fastExp stays within 3e-7 relative of exp over the whole float
// range, flushes below FLT_MIN and handles ±inf and NaN.
TEST(MathTest, FastExpMatchesLibm) {
  double worst = 0;
  for (float x = -87.3f; x < 88.7f; x += 0.00123f) {
    double want = std::exp(double(x));
    worst = std::max(worst, std::abs(fastExp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fastExp(0.f), 1.f);
  EXPECT_EQ(fastExp(-kInfF), 0.f);
  EXPECT_EQ(fastExp(-100.f), 0.f);
  EXPECT_EQ(fastExp(kInfF), kInfF);
  EXPECT_EQ(fastExp(89.f), kInfF);
  EXPECT_TRUE(std::isnan(fastExp(std::nanf(""))));
}

// Tests that fastTanh keeps relative accuracy near 0 and saturates to ±1.
TEST(MathTest, FastTanhMatchesLibm) {
  double worst = 0;
  for (float x = -10.f; x < 10.f; x += 0.000731f) {
    double want = std::tanh(double(x));
    if (want != 0)
      worst = std::max(worst, std::abs(fastTanh(x) - want) / std::abs(want));
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_FLOAT_EQ(fastTanh(1e-6f), 1e-6f);
  EXPECT_EQ(fastTanh(20.f), 1.f);
  EXPECT_EQ(fastTanh(-kInfF), -1.f);
  EXPECT_TRUE(std::isnan(fastTanh(std::nanf(""))));
}

// Tests that fastErf is within 4e-7 absolute of erf and saturates to ±1.
TEST(MathTest, FastErfMatchesLibm) {
  double worst = 0;
  for (float x = -6.f; x < 6.f; x += 0.000419f)
    worst = std::max(worst, std::abs(fastErf(x) - std::erf(double(x))));
  EXPECT_LT(worst, 4e-7);
  EXPECT_NEAR(fastErf(kInfF), 1.f, 1e-7);
  EXPECT_NEAR(fastErf(-kInfF), -1.f, 1e-7);
  EXPECT_TRUE(std::isnan(fastErf(std::nanf(""))));
}

double refGelu(double x, bool tanhApprox) {
  if (tanhApprox)
    return 0.5 * x *
           (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

// Tests the activation helpers against their textbook definitions.
TEST(MathTest, ActivationsMatchDefinitions) {
  for (float x = -12.f; x < 12.f; x += 0.0137f) {
    double xd = x;
    EXPECT_NEAR(sigmoid(x), 1 / (1 + std::exp(-xd)), 2e-7) << x;
    EXPECT_NEAR(silu(x), xd / (1 + std::exp(-xd)), 1e-6 + 1e-6 * std::abs(xd))
        << x;
    for (bool t : {false, true})
      EXPECT_NEAR(gelu(x, t), refGelu(xd, t), 1e-6 + 1e-6 * std::abs(xd))
          << x << " tanh=" << t;
  }
  EXPECT_EQ(sigmoid(-kInfF), 0.f);
  EXPECT_EQ(sigmoid(kInfF), 1.f);
}

// Tests geluGrad against the analytic derivatives and against central
// differences of the double-precision definitions. Where tanh is within a
// few ulp of ±1, 1 - tanh² is float rounding noise times up to ~10, hence
// the 1e-5 bound.
TEST(MathTest, GeluGradIsTheDerivative) {
  for (float x = -8.f; x < 8.f; x += 0.0173f) {
    double xd = x;
    double pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    double erfForm = 0.5 * (1 + std::erf(xd / std::sqrt(2.0))) + xd * pdf;
    double u = std::sqrt(2 / M_PI) * (xd + 0.044715 * xd * xd * xd);
    double th = std::tanh(u);
    double tanhForm = 0.5 * (1 + th) + 0.5 * xd * (1 - th * th) *
                                           std::sqrt(2 / M_PI) *
                                           (1 + 3 * 0.044715 * xd * xd);
    EXPECT_NEAR(geluGrad(x, 1.5f, false), 1.5 * erfForm, 2e-6) << x;
    EXPECT_NEAR(geluGrad(x, 1.5f, true), 1.5 * tanhForm, 1e-5) << x;
    for (bool t : {false, true}) {
      double h = 1e-5;
      double fd = (refGelu(xd + h, t) - refGelu(xd - h, t)) / (2 * h);
      EXPECT_NEAR(geluGrad(x, 1.f, t), fd, 1e-5) << x << " tanh=" << t;
    }
  }
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

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

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

struct MatmulCase {
  Shape batch, aStrides, bStrides;
  int64_t m, n, k;
};

std::vector<double> refMatmul(const std::vector<float> &a,
                              const std::vector<float> &b, const MatmulCase &c,
                              bool transA, bool transB) {
  int64_t m = c.m, n = c.n, k = c.k;
  std::vector<double> out(numel(c.batch) * m * n);
  for (int64_t bi = 0; bi < numel(c.batch); ++bi) {
    Shape index = unravel(bi, c.batch);
    int64_t ao = dot(index, c.aStrides), bo = dot(index, c.bStrides);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += double(a[ao + (transA ? p * m + i : i * k + p)]) *
               b[bo + (transB ? j * k + p : p * n + j)];
        out[(bi * m + i) * n + j] = s;
      }
  }
  return out;
}

/// Elements a strided batch of [rows, cols] matrices spans.
int64_t spanOf(const Shape &batch, const Shape &strides, int64_t matrix) {
  int64_t last = 0;
  for (size_t d = 0; d < batch.size(); ++d)
    last += (batch[d] - 1) * strides[d];
  return last + matrix;
}

void checkMatmul(const MatmulCase &c, unsigned seed) {
  for (bool transA : {false, true})
    for (bool transB : {false, true}) {
      auto a = randomFloats(spanOf(c.batch, c.aStrides, c.m * c.k), seed);
      auto b = randomFloats(spanOf(c.batch, c.bStrides, c.k * c.n), seed + 1);
      std::vector<float> out(numel(c.batch) * c.m * c.n, kInfF);
      matmul(out.data(), a.data(), b.data(), int(c.batch.size()),
             c.batch.data(), c.aStrides.data(), c.bStrides.data(), c.m, c.n,
             c.k, transA, transB);
      expectAllClose(out, refMatmul(a, b, c, transA, transB), 1e-5, 2e-6 * c.k,
                     "transA=" + std::to_string(transA) +
                         " transB=" + std::to_string(transB));
      // addMatmul adds the same product into what the buffer holds.
      auto acc = randomFloats(out.size(), seed + 2);
      std::vector<double> want = refMatmul(a, b, c, transA, transB);
      for (size_t i = 0; i < want.size(); ++i)
        want[i] += acc[i];
      addMatmul(acc.data(), a.data(), b.data(), int(c.batch.size()),
                c.batch.data(), c.aStrides.data(), c.bStrides.data(), c.m, c.n,
                c.k, transA, transB);
      expectAllClose(acc, want, 1e-5, 2e-6 * (c.k + 1),
                     "addMatmul transA=" + std::to_string(transA) +
                         " transB=" + std::to_string(transB));
    }
}

// Tests a single small product in all four transpositions.
TEST(MatmulTest, NoBatch) { checkMatmul({{}, {}, {}, 5, 7, 3}, 20); }

// Tests a batch where B broadcasts along the first batch dim and A along
// none, and one where A broadcasts along everything.
TEST(MatmulTest, BatchBroadcast) {
  checkMatmul({{2, 3}, {3 * 15, 15}, {0, 12}, 5, 4, 3}, 21);
  checkMatmul({{2, 3}, {0, 0}, {3 * 12, 12}, 5, 4, 3}, 22);
}

// Tests the case that folds the batch into one taller product (contiguous
// A, B shared by all).
TEST(MatmulTest, SharedWeightFoldsBatch) {
  checkMatmul({{4, 3}, {3 * 6 * 5, 6 * 5}, {0, 0}, 6, 7, 5}, 23);
}

// Tests products large enough to be split into bands (by rows, by columns,
// and an odd batch split in two), and many small products run in parallel.
TEST(MatmulTest, ThreadedSplits) {
  checkMatmul({{}, {}, {}, 130, 70, 90}, 24);
  checkMatmul({{}, {}, {}, 20, 300, 64}, 25);
  checkMatmul({{5}, {64 * 40}, {40 * 48}, 64, 48, 40}, 26);
  checkMatmul(
      {{4, 12}, {12 * 17 * 8, 17 * 8}, {12 * 8 * 19, 8 * 19}, 17, 19, 8}, 27);
}

// Tests that an empty contraction gives zeros.
TEST(MatmulTest, EmptyContraction) {
  std::vector<float> out(6, 1.f);
  matmul(out.data(), nullptr, nullptr, 0, nullptr, nullptr, nullptr, 2, 3, 0,
         false, false);
  for (float v : out)
    EXPECT_EQ(v, 0.f);
}

// Tests that addMatmul with an empty contraction leaves the buffer as it is.
TEST(MatmulTest, AddMatmulEmptyContraction) {
  std::vector<float> acc = {1.f, -2.f, 3.f, 4.f, 5.f, 6.f};
  const std::vector<float> before = acc;
  addMatmul(acc.data(), nullptr, nullptr, 0, nullptr, nullptr, nullptr, 2, 3,
            0, false, false);
  EXPECT_EQ(acc, before);
}

// Tests that OpenBLAS runs vector kernels: Debian's 0.3.21 falls back to its
// SSE3 "Prescott" kernels on CPUs it does not know, which matmul corrects.
TEST(MatmulTest, BlasUsesVectorKernels) {
  std::vector<float> a(4, 1.f), out(4);
  matmul(out.data(), a.data(), a.data(), 0, nullptr, nullptr, nullptr, 2, 2, 2,
         false, false);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    EXPECT_STRNE(openblas_get_corename(), "Prescott");
}

//===----------------------------------------------------------------------===//
// Transpose, slice, concat, gather, fill
//===----------------------------------------------------------------------===//

template <typename T>
std::vector<T> refTranspose(const std::vector<T> &in, const Shape &inShape,
                            const Shape &perm) {
  Shape outShape(perm.size()), inStrides = contiguous(inShape);
  for (size_t d = 0; d < perm.size(); ++d)
    outShape[d] = inShape[perm[d]];
  std::vector<T> out(in.size());
  for (int64_t i = 0; i < numel(outShape); ++i) {
    Shape index = unravel(i, outShape);
    int64_t src = 0;
    for (size_t d = 0; d < perm.size(); ++d)
      src += index[d] * inStrides[perm[d]];
    out[i] = in[src];
  }
  return out;
}

template <typename T>
void checkTranspose(const Shape &inShape, const Shape &perm) {
  std::vector<T> in(numel(inShape));
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<T>(i * 7 % 1000 + 1);
  std::vector<T> out(in.size());
  transpose(out.data(), in.data(), int(inShape.size()), inShape.data(),
            perm.data());
  EXPECT_EQ(out, refTranspose(in, inShape, perm));
}

// Tests every permutation of a rank-3 tensor.
TEST(TransposeTest, AllRank3Permutations) {
  Shape perm{0, 1, 2};
  do
    checkTranspose<float>({3, 4, 5}, perm);
  while (std::next_permutation(perm.begin(), perm.end()));
}

// Tests attention-style rank-4 permutations, size-1 dims, ranks 0 and 1,
// other element types, and large shapes on the tiled threaded path.
TEST(TransposeTest, ShapesAndTypes) {
  for (Shape perm : {Shape{0, 2, 1, 3}, Shape{0, 1, 3, 2}, Shape{3, 2, 1, 0},
                     Shape{1, 0, 3, 2}, Shape{2, 0, 3, 1}})
    checkTranspose<float>({2, 3, 4, 5}, perm);
  checkTranspose<float>({1, 5, 1, 3}, {2, 3, 0, 1});
  checkTranspose<float>({}, {});
  checkTranspose<float>({7}, {0});
  checkTranspose<int64_t>({3, 5, 4}, {2, 0, 1});
  checkTranspose<uint8_t>({6, 35}, {1, 0});
  checkTranspose<float>({3, 130, 257}, {0, 2, 1});
  checkTranspose<float>({100, 700}, {1, 0});
  checkTranspose<double>({2, 70, 3, 90}, {0, 3, 2, 1});

  std::vector<char> bits{1, 0, 0, 1, 1, 1};
  std::vector<char> out(6);
  Shape shape{2, 3}, perm{1, 0};
  transpose(reinterpret_cast<bool *>(out.data()),
            reinterpret_cast<const bool *>(bits.data()), 2, shape.data(),
            perm.data());
  EXPECT_EQ(out, (std::vector<char>{1, 1, 0, 1, 0, 1}));
}

struct SliceCase {
  Shape inShape, start, stride, outShape;
};

// Tests slice and sliceGrad with steps of 1, 2 and -2 against indexing by
// hand.
TEST(SliceTest, SliceAndGrad) {
  for (const SliceCase &c :
       {SliceCase{{5, 6, 7}, {1, 0, 6}, {2, 1, -2}, {2, 6, 4}},
        SliceCase{{4, 9}, {0, 2}, {1, 1}, {4, 5}},
        SliceCase{{300, 400}, {10, 1}, {1, 3}, {250, 133}},
        SliceCase{{}, {}, {}, {}}}) {
    int rank = int(c.inShape.size());
    auto in = randomFloats(numel(c.inShape), 30);
    std::vector<float> out(numel(c.outShape)), want(out.size());
    Shape inStrides = contiguous(c.inShape);
    for (int64_t i = 0; i < numel(c.outShape); ++i) {
      Shape index = unravel(i, c.outShape);
      int64_t src = 0;
      for (int d = 0; d < rank; ++d)
        src += (c.start[d] + index[d] * c.stride[d]) * inStrides[d];
      want[i] = in[src];
    }
    slice(out.data(), in.data(), rank, c.inShape.data(), c.start.data(),
          c.stride.data(), c.outShape.data());
    expectAllClose(out, want, 0, 0, "slice");

    std::vector<float> din(in.size(), 99.f), wantGrad(in.size(), 0.f);
    for (int64_t i = 0; i < numel(c.outShape); ++i) {
      Shape index = unravel(i, c.outShape);
      int64_t dst = 0;
      for (int d = 0; d < rank; ++d)
        dst += (c.start[d] + index[d] * c.stride[d]) * inStrides[d];
      wantGrad[dst] = out[i];
    }
    sliceGrad(din.data(), out.data(), rank, c.inShape.data(), c.start.data(),
              c.stride.data(), c.outShape.data());
    expectAllClose(din, wantGrad, 0, 0, "sliceGrad");
  }
}

// Tests concatenation along a middle dim of three inputs, one of size 0.
TEST(ConcatTest, MiddleDim) {
  int64_t outer = 4, inner = 5;
  Shape sizes{2, 1, 0, 3};
  std::vector<std::vector<float>> ins;
  std::vector<const float *> ptrs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ins.push_back(randomFloats(outer * sizes[i] * inner, 40 + i));
    ptrs.push_back(ins.back().data());
  }
  int64_t total = 6;
  std::vector<float> out(outer * total * inner), want(out.size());
  for (int64_t o = 0; o < outer; ++o) {
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i)
      for (int64_t j = 0; j < sizes[i]; ++j, ++at)
        for (int64_t c = 0; c < inner; ++c)
          want[(o * total + at) * inner + c] =
              ins[i][(o * sizes[i] + j) * inner + c];
  }
  concat(out.data(), int(sizes.size()), ptrs.data(), sizes.data(), outer,
         inner);
  expectAllClose(out, want, 0, 0);
}

template <typename Idx>
void checkGather(int64_t outer, int64_t dimSize, const std::vector<Idx> &idx,
                 int64_t inner) {
  int64_t numIdx = int64_t(idx.size());
  auto in = randomFloats(outer * dimSize * inner, 50);
  std::vector<float> out(outer * numIdx * inner), want(out.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < numIdx; ++j)
      for (int64_t c = 0; c < inner; ++c) {
        int64_t row = idx[j] < 0 ? idx[j] + dimSize : idx[j];
        want[(o * numIdx + j) * inner + c] =
            in[(o * dimSize + row) * inner + c];
      }
  gather(out.data(), in.data(), idx.data(), outer, dimSize, numIdx, inner);
  expectAllClose(out, want, 0, 0, "gather");

  auto dout = randomFloats(out.size(), 51);
  std::vector<double> wantGrad(in.size(), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < numIdx; ++j)
      for (int64_t c = 0; c < inner; ++c) {
        int64_t row = idx[j] < 0 ? idx[j] + dimSize : idx[j];
        wantGrad[(o * dimSize + row) * inner + c] +=
            dout[(o * numIdx + j) * inner + c];
      }
  std::vector<float> din(in.size(), 99.f);
  gatherGrad(din.data(), dout.data(), idx.data(), outer, dimSize, numIdx,
             inner);
  // Up to 20 rows add into one in float.
  expectAllClose(din, wantGrad, 1e-6, 1e-5, "gatherGrad");
}

// Tests gather and its scatter-add gradient with negative and repeated
// indices, along the last dim, and at embedding-like sizes.
TEST(GatherTest, GatherAndGrad) {
  checkGather<int64_t>(2, 7, {6, -1, 0, 2, 2}, 3);
  checkGather<int32_t>(4, 9, {8, 0, -9, 3, 3, 3}, 1);
  std::vector<int64_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int64_t(i * 37 % 50);
  checkGather<int64_t>(1, 50, tokens, 700);
  checkGather<int32_t>(3, 11, {10, 1, 1, -2}, 2000);
}

// Tests fill, copy and addInto on a size that runs threaded.
TEST(FillCopyTest, FlatKernels) {
  const int64_t n = 100003;
  std::vector<float> a(n), b = randomFloats(n, 60), acc = randomFloats(n, 61);
  fill(a.data(), n, 2.5f);
  EXPECT_TRUE(
      std::all_of(a.begin(), a.end(), [](float v) { return v == 2.5f; }));
  copy(a.data(), b.data(), n);
  EXPECT_EQ(a, b);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i)
    want[i] = acc[i] + b[i];
  addInto(acc.data(), b.data(), n);
  expectAllClose(acc, want, 0, 0);
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

// Tests Philox4x32-10 against Random123's known-answer vectors.
TEST(DropoutTest, PhiloxKnownAnswers) {
  using fastllm::rt::philox4x32;
  using fastllm::rt::Philox4x32;
  struct Kat {
    Philox4x32 counter;
    uint32_t k0, k1;
    Philox4x32 want;
  } kats[] = {
      {{{0, 0, 0, 0}}, 0, 0,
       {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff,
       0xffffffff, {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822,
       0x299f31d0, {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat &k : kats) {
    Philox4x32 got = philox4x32(k.counter, k.k0, k.k1);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got.v[i], k.want.v[i]) << i;
  }
  // The threshold is ceil(p * 2^32) of the float ratio; the scale 1/(1-p).
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.0f), 0u);
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.5f), 0x80000000u);
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.25f), 0x40000000u);
  EXPECT_EQ(fastllm::rt::dropoutThreshold(0.1f), 429496736u);
  EXPECT_EQ(fastllm::rt::dropoutScale(0.5f), 2.0f);
  EXPECT_EQ(fastllm::rt::dropoutScale(0.1f), float(1.0 / (1.0 - double(0.1f))));
}

/// cpu::dropout of `in` as `samples` samples, the ratio's threshold and
/// scale as generated code passes them.
std::vector<float> runDropout(const std::vector<float> &in, int64_t samples,
                              float p, uint32_t site, uint64_t seed,
                              int64_t step, int64_t firstSample,
                              bool splat = false, int64_t n = -1) {
  n = n < 0 ? int64_t(in.size()) : n;
  std::vector<float> out(n, -1.0f);
  dropout(out.data(), in.data(), splat, n, n / samples, site,
          fastllm::rt::dropoutThreshold(p), fastllm::rt::dropoutScale(p),
          seed, step, firstSample);
  return out;
}

// Tests that the kernel (16 Philox calls at a time) keeps exactly where
// dropoutWords' word >= threshold, element by element, for sample sizes
// around the kernel's 64-element blocks and the 4-word groups.
TEST(DropoutTest, MatchesThePhiloxWords) {
  const uint32_t threshold = fastllm::rt::dropoutThreshold(0.4f);
  for (int64_t per : {1, 3, 4, 63, 64, 65, 1000, 40003}) {
    const int64_t samples = 3, n = samples * per;
    std::vector<float> ones(n, 1.0f), out(n);
    dropout(out.data(), ones.data(), false, n, per, 0xdeadbeefu, threshold,
            1.0f, 0x0123456789abcdefull, 77, 1000);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      fastllm::rt::Philox4x32 w = fastllm::rt::dropoutWords(
          0x0123456789abcdefull, 77, 1000 + i / per, 0xdeadbeefu, i % per / 4);
      wrong += (out[i] != 0.0f) != (w.v[i % per % 4] >= threshold);
    }
    EXPECT_EQ(wrong, 0) << per;
  }
}

// Tests the keep rate and the scaling: over 2^20 ones, the kept fraction is
// 1 - p within 5 standard deviations, every kept value is exactly 1/(1-p)
// and every other exactly 0; the output's mean stays 1 (within 5 sigma).
TEST(DropoutTest, KeepRateAndScale) {
  const int64_t n = int64_t(1) << 20;
  std::vector<float> ones(n, 1.0f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<float> out = runDropout(ones, 8, p, 12345, 42, 3, 16);
    const float scale = float(1.0 / (1.0 - double(p)));
    int64_t kept = 0, other = 0;
    double sum = 0;
    for (float v : out) {
      kept += v == scale;
      other += v != scale && v != 0.0f;
      sum += v;
    }
    double q = 1.0 - p, sigma = std::sqrt(p * q / double(n));
    EXPECT_EQ(other, 0) << p;
    EXPECT_NEAR(double(kept) / n, q, 5 * sigma) << p;
    EXPECT_NEAR(sum / n, 1.0, 5 * sigma * scale) << p;
  }
  // Ratio 0 keeps everything, unscaled.
  std::vector<float> all = runDropout(ones, 8, 0.0f, 1, 2, 3, 4);
  EXPECT_EQ(all, ones);
}

// Tests that the mask is a function of (seed, step, global sample, site,
// index in the sample) alone: a batch split in micro-batches (or ranks) at
// their first global sample draws the same masks as the whole batch, and
// changing any part of the key changes about 2p(1-p) of the decisions, as
// independent masks would.
TEST(DropoutTest, MaskDependsOnTheKeyOnly) {
  const int64_t samples = 6, per = 1001; // not a multiple of 4
  std::vector<float> x = randomFloats(samples * per, 90);
  std::vector<float> whole = runDropout(x, samples, 0.3f, 77, 5, 9, 12);
  for (int64_t split : {1, 2, 3}) {
    std::vector<float> parts;
    for (int64_t first = 0; first < samples; first += split) {
      std::vector<float> part(x.begin() + first * per,
                              x.begin() + (first + split) * per);
      std::vector<float> got = runDropout(part, split, 0.3f, 77, 5, 9, 12 + first);
      parts.insert(parts.end(), got.begin(), got.end());
    }
    EXPECT_EQ(parts, whole) << split;
  }
  auto differing = [&](const std::vector<float> &other) {
    int64_t d = 0;
    for (size_t i = 0; i < whole.size(); ++i)
      d += (whole[i] == 0.0f) != (other[i] == 0.0f);
    return double(d) / double(whole.size());
  };
  const double expect = 2 * 0.3 * 0.7,
               sigma = std::sqrt(expect * (1 - expect) / double(whole.size()));
  for (auto [what, other] :
       {std::pair{"seed", runDropout(x, samples, 0.3f, 77, uint64_t(5) << 32, 9, 12)},
        std::pair{"step", runDropout(x, samples, 0.3f, 77, 5, 10, 12)},
        std::pair{"sample", runDropout(x, samples, 0.3f, 77, 5, 9, 13)},
        std::pair{"site", runDropout(x, samples, 0.3f, 78, 5, 9, 12)}})
    EXPECT_NEAR(differing(other), expect, 6 * sigma) << what;
  // Within a batch, each sample's mask differs from its neighbour's.
  std::vector<float> ones(samples * per, 1.0f);
  std::vector<float> m = runDropout(ones, samples, 0.3f, 77, 5, 9, 12);
  EXPECT_FALSE(std::equal(m.begin(), m.begin() + per, m.begin() + per));
  // Kept values are x / (1 - p) exactly, dropped ones 0.
  const float scale = fastllm::rt::dropoutScale(0.3f);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_TRUE(whole[i] == 0.0f || whole[i] == x[i] * scale) << i;
}

// Tests that the backward, the same call on the gradient, drops exactly
// the forward's elements; a splat input is read as one value for all; and
// the result does not depend on the thread count.
TEST(DropoutTest, BackwardSplatAndThreads) {
  const int64_t samples = 4, per = 40000;
  std::vector<float> x = randomFloats(samples * per, 91),
                     dy = randomFloats(samples * per, 92);
  std::vector<float> y = runDropout(x, samples, 0.2f, 5, 6, 7, 8);
  std::vector<float> dx = runDropout(dy, samples, 0.2f, 5, 6, 7, 8);
  const float scale = fastllm::rt::dropoutScale(0.2f);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(dx[i], y[i] == 0.0f ? 0.0f : dy[i] * scale) << i;
  std::vector<float> splatIn = {2.0f};
  std::vector<float> splat =
      runDropout(splatIn, samples, 0.2f, 5, 6, 7, 8, true, samples * per);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(splat[i], y[i] == 0.0f ? 0.0f : 2.0f * scale) << i;
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> one = runDropout(x, samples, 0.2f, 5, 6, 7, 8);
  omp_set_num_threads(3);
  std::vector<float> three = runDropout(x, samples, 0.2f, 5, 6, 7, 8);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, y);
  EXPECT_EQ(three, y);
#endif
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

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

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

std::vector<double> refSoftmax(const std::vector<float> &x, int64_t outer,
                               int64_t n, int64_t inner, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + c; };
      double m = -kInf;
      for (int64_t j = 0; j < n; ++j)
        m = std::max(m, double(x[at(j)]));
      double s = 0;
      for (int64_t j = 0; j < n; ++j)
        s += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j)
        y[at(j)] =
            log ? x[at(j)] - m - std::log(s) : std::exp(x[at(j)] - m) / s;
    }
  return y;
}

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

/// Σ w·f(x) in double: the scalar whose gradient the finite differences take.
double weighted(const std::vector<float> &y, const std::vector<float> &w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i)
    s += double(y[i]) * w[i];
  return s;
}

/// Central differences of x ↦ Σ w·forward(x) at a few elements of x.
void checkFiniteDifferences(
    std::vector<float> x, const std::vector<float> &grad,
    const std::function<double(const std::vector<float> &)> &objective,
    double h, double tol, const std::string &what) {
  for (size_t i : {size_t(0), x.size() / 3, x.size() / 2, x.size() - 1}) {
    float saved = x[i], hi = saved + float(h), lo = saved - float(h);
    x[i] = hi;
    double up = objective(x);
    x[i] = lo;
    double down = objective(x);
    x[i] = saved;
    double fd = (up - down) / (double(hi) - double(lo));
    EXPECT_NEAR(grad[i], fd, tol * (1 + std::abs(fd)))
        << what << " element " << i;
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

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

std::vector<double> refLayerNorm(const std::vector<float> &x,
                                 const std::vector<float> &scale,
                                 const float *bias, int64_t rows, int64_t cols,
                                 double eps, bool rms) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i)
      mean += xr[i];
    mean = rms ? 0 : mean / cols;
    for (int64_t i = 0; i < cols; ++i)
      var += (xr[i] - mean) * (xr[i] - mean);
    var /= cols;
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = (xr[i] - mean) / std::sqrt(var + eps) * scale[i] +
                        (bias ? bias[i] : 0.0);
  }
  return y;
}

/// The gradients of Σ dy·layerNorm(x) (or rmsNorm) in double, from the
/// chain rule written out per row.
void refLayerNormGrad(const std::vector<float> &x,
                      const std::vector<float> &scale,
                      const std::vector<float> &dy, int64_t rows, int64_t cols,
                      double eps, bool rms, std::vector<double> &dx,
                      std::vector<double> &dscale, std::vector<double> &dbias) {
  dx.assign(x.size(), 0);
  dscale.assign(cols, 0);
  dbias.assign(cols, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x.data() + r * cols, *gr = dy.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i)
      mean += xr[i];
    mean = rms ? 0 : mean / cols;
    for (int64_t i = 0; i < cols; ++i)
      var += (xr[i] - mean) * (xr[i] - mean);
    var /= cols;
    double rstd = 1 / std::sqrt(var + eps);
    // y_i = (x_i - mean)·rstd·s_i; dy_i/dx_j = s_i·rstd·(δij - [!rms]/n
    //        - (x_i - mean)(x_j - mean)·rstd²/n).
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < cols; ++i) {
        double d = (i == j) - (rms ? 0.0 : 1.0 / cols) -
                   (xr[i] - mean) * (xr[j] - mean) * rstd * rstd / cols;
        sum += gr[i] * scale[i] * rstd * d;
      }
      dx[r * cols + j] = sum;
    }
    for (int64_t i = 0; i < cols; ++i) {
      dscale[i] += gr[i] * (xr[i] - mean) * rstd;
      dbias[i] += gr[i];
    }
  }
}

struct NormCase {
  int64_t rows, cols;
};

// Tests layerNorm with and without bias, and rmsNorm, against the
// definitions.
TEST(NormTest, Forward) {
  for (NormCase c : {NormCase{5, 37}, NormCase{64, 768}}) {
    auto x = randomFloats(c.rows * c.cols, 90, -3.f, 5.f);
    auto scale = randomFloats(c.cols, 91), bias = randomFloats(c.cols, 92);
    std::vector<float> y(x.size());
    layerNorm(y.data(), x.data(), scale.data(), bias.data(), c.rows, c.cols,
              1e-5f);
    expectAllClose(
        y, refLayerNorm(x, scale, bias.data(), c.rows, c.cols, 1e-5, false),
        1e-5, 1e-5, "layerNorm");
    layerNorm(y.data(), x.data(), scale.data(), nullptr, c.rows, c.cols, 1e-5f);
    expectAllClose(y,
                   refLayerNorm(x, scale, nullptr, c.rows, c.cols, 1e-5, false),
                   1e-5, 1e-5, "layerNorm without bias");
    rmsNorm(y.data(), x.data(), scale.data(), c.rows, c.cols, 1e-6f);
    expectAllClose(y,
                   refLayerNorm(x, scale, nullptr, c.rows, c.cols, 1e-6, true),
                   1e-5, 1e-5, "rmsNorm");
  }
}

// Tests layerNormGrad and rmsNormGrad against the chain rule in double and
// against finite differences of the forward kernels.
TEST(NormTest, Grad) {
  for (NormCase c : {NormCase{5, 37}, NormCase{200, 300}}) {
    auto x = randomFloats(c.rows * c.cols, 93, -3.f, 5.f);
    auto scale = randomFloats(c.cols, 94), bias = randomFloats(c.cols, 95);
    auto dy = randomFloats(x.size(), 96);
    std::vector<double> wantDx, wantScale, wantBias;
    std::vector<float> dx(x.size()), dscale(c.cols, 9.f), dbias(c.cols, 9.f);
    const float eps = 1e-5f;

    layerNormGrad(dx.data(), dscale.data(), dbias.data(), x.data(),
                  scale.data(), dy.data(), c.rows, c.cols, eps);
    refLayerNormGrad(x, scale, dy, c.rows, c.cols, eps, false, wantDx,
                     wantScale, wantBias);
    expectAllClose(dx, wantDx, 1e-4, 1e-5, "layerNorm dx");
    expectAllClose(dscale, wantScale, 1e-5, 1e-5, "layerNorm dscale");
    expectAllClose(dbias, wantBias, 1e-5, 1e-5, "layerNorm dbias");
    auto lnLoss = [&](const std::vector<float> &xs,
                      const std::vector<float> &ss,
                      const std::vector<float> &bs) {
      std::vector<float> y(xs.size());
      layerNorm(y.data(), xs.data(), ss.data(), bs.data(), c.rows, c.cols, eps);
      return weighted(y, dy);
    };
    checkFiniteDifferences(
        x, dx, [&](const auto &xs) { return lnLoss(xs, scale, bias); }, 1e-2,
        2e-3, "layerNorm dx");
    checkFiniteDifferences(
        scale, dscale, [&](const auto &ss) { return lnLoss(x, ss, bias); },
        1e-2, 2e-3, "layerNorm dscale");
    checkFiniteDifferences(
        bias, dbias, [&](const auto &bs) { return lnLoss(x, scale, bs); }, 1e-2,
        2e-3, "layerNorm dbias");
    layerNormGrad(dx.data(), dscale.data(), nullptr, x.data(), scale.data(),
                  dy.data(), c.rows, c.cols, eps);
    expectAllClose(dscale, wantScale, 1e-5, 1e-5, "layerNorm without dbias");

    rmsNormGrad(dx.data(), dscale.data(), x.data(), scale.data(), dy.data(),
                c.rows, c.cols, eps);
    refLayerNormGrad(x, scale, dy, c.rows, c.cols, eps, true, wantDx, wantScale,
                     wantBias);
    expectAllClose(dx, wantDx, 1e-4, 1e-5, "rmsNorm dx");
    expectAllClose(dscale, wantScale, 1e-5, 1e-5, "rmsNorm dscale");
    auto rmsLoss = [&](const std::vector<float> &xs,
                       const std::vector<float> &ss) {
      std::vector<float> y(xs.size());
      rmsNorm(y.data(), xs.data(), ss.data(), c.rows, c.cols, eps);
      return weighted(y, dy);
    };
    checkFiniteDifferences(
        x, dx, [&](const auto &xs) { return rmsLoss(xs, scale); }, 1e-2, 2e-3,
        "rmsNorm dx");
    checkFiniteDifferences(
        scale, dscale, [&](const auto &ss) { return rmsLoss(x, ss); }, 1e-2,
        2e-3, "rmsNorm dscale");
  }
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

constexpr int64_t kIgnore = -100;

/// Per-row cross-entropy (logSoftmax = false) or NLL in double; NaN marks an
/// ignored row.
template <typename Idx>
std::vector<double>
refRowLosses(const std::vector<float> &x, const std::vector<Idx> &targets,
             int64_t classes, bool fromLogits, bool hasIgnore) {
  std::vector<double> loss;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (hasIgnore && targets[r] == kIgnore) {
      loss.push_back(std::nan(""));
      continue;
    }
    const float *xr = x.data() + r * classes;
    double lse = 0;
    if (fromLogits) {
      double m = *std::max_element(xr, xr + classes);
      double s = 0;
      for (int64_t i = 0; i < classes; ++i)
        s += std::exp(xr[i] - m);
      lse = m + std::log(s);
    }
    loss.push_back(lse - xr[targets[r]]);
  }
  return loss;
}

/// Reduces per-row losses as F.cross_entropy does.
std::vector<double> refReduceLoss(const std::vector<double> &rows,
                                  Reduction r) {
  if (r == Reduction::None) {
    std::vector<double> out;
    for (double v : rows)
      out.push_back(std::isnan(v) ? 0.0 : v);
    return out;
  }
  double sum = 0, count = 0;
  for (double v : rows)
    if (!std::isnan(v)) {
      sum += v;
      count += 1;
    }
  return {r == Reduction::Sum ? sum : sum / count};
}

template <typename Idx>
void checkLosses(int64_t classes, const std::vector<Idx> &targets,
                 bool hasIgnore, unsigned seed) {
  int64_t rows = int64_t(targets.size());
  auto logits = randomFloats(rows * classes, seed, -4.f, 4.f);
  for (int64_t i = 0; i < classes; ++i) // stability; the loss is unchanged
    logits[i] += 1000.f;
  std::vector<float> logProbs(logits.size());
  softmax(logProbs.data(), logits.data(), rows, classes, 1, /*log=*/true);
  for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    std::string what = "reduction " + std::to_string(int(r));
    int64_t lossSize = r == Reduction::None ? rows : 1;
    std::vector<float> loss(lossSize);
    crossEntropy(loss.data(), logits.data(), targets.data(), rows, classes,
                 hasIgnore, kIgnore, r);
    auto ceRows = refRowLosses(logits, targets, classes, true, hasIgnore);
    expectAllClose(loss, refReduceLoss(ceRows, r), 1e-5, 1e-6, "CE " + what);
    nllLoss(loss.data(), logProbs.data(), targets.data(), rows, classes,
            hasIgnore, kIgnore, r);
    expectAllClose(
        loss,
        refReduceLoss(
            refRowLosses(logProbs, targets, classes, false, hasIgnore), r),
        1e-6, 1e-6, "NLL " + what);

    // Gradients: d/dx of Σ dloss·loss. The reference is the softmax minus
    // the one-hot target (or the negated one-hot) scaled per row.
    auto dloss = randomFloats(lossSize, seed + 1, 0.5f, 1.5f);
    double count = 0;
    for (double v : ceRows)
      count += !std::isnan(v);
    std::vector<double> wantCE(logits.size(), 0.0), wantNLL(logits.size(), 0.0);
    auto probs = refSoftmax(logits, rows, classes, 1, false);
    for (int64_t row = 0; row < rows; ++row) {
      if (std::isnan(ceRows[row]))
        continue;
      double g = r == Reduction::None  ? dloss[row]
                 : r == Reduction::Sum ? dloss[0]
                                       : dloss[0] / count;
      for (int64_t i = 0; i < classes; ++i)
        wantCE[row * classes + i] =
            g * (probs[row * classes + i] - (i == targets[row]));
      wantNLL[row * classes + targets[row]] = -g;
    }
    std::vector<float> grad(logits.size(), 9.f);
    crossEntropyGrad(grad.data(), logits.data(), targets.data(), dloss.data(),
                     rows, classes, hasIgnore, kIgnore, r);
    expectAllClose(grad, wantCE, 1e-5, 1e-7, "CE grad " + what);
    checkFiniteDifferences(
        logits, grad,
        [&](const std::vector<float> &xs) {
          std::vector<float> l(lossSize);
          crossEntropy(l.data(), xs.data(), targets.data(), rows, classes,
                       hasIgnore, kIgnore, r);
          return weighted(l, dloss);
        },
        1e-2, 2e-3, "CE grad " + what);
    std::fill(grad.begin(), grad.end(), 9.f);
    nllLossGrad(grad.data(), targets.data(), dloss.data(), rows, classes,
                hasIgnore, kIgnore, r);
    expectAllClose(grad, wantNLL, 1e-6, 0, "NLL grad " + what);
  }
}

// Tests cross-entropy and NLL, forward and backward, for every reduction,
// with ignored targets, both index types, and a vocabulary-sized row.
TEST(LossTest, CrossEntropyAndNll) {
  checkLosses<int64_t>(11, {3, 0, kIgnore, 10, 5, kIgnore}, true, 100);
  checkLosses<int32_t>(11, {3, 0, 7, 10, 5, 1}, false, 101);
  std::vector<int64_t> targets(12);
  for (size_t i = 0; i < targets.size(); ++i)
    targets[i] = int64_t(i * 4099 % 5000);
  targets[4] = kIgnore;
  checkLosses<int64_t>(5000, targets, true, 102);
}

// Tests that Mean over only ignored targets is NaN, with zero gradient.
TEST(LossTest, AllIgnored) {
  std::vector<int64_t> targets{kIgnore, kIgnore};
  auto logits = randomFloats(6, 103);
  float loss = 0, dloss = 1;
  crossEntropy(&loss, logits.data(), targets.data(), 2, 3, true, kIgnore,
               Reduction::Mean);
  EXPECT_TRUE(std::isnan(loss));
  std::vector<float> grad(6, 9.f);
  crossEntropyGrad(grad.data(), logits.data(), targets.data(), &dloss, 2, 3,
                   true, kIgnore, Reduction::Mean);
  EXPECT_EQ(grad, std::vector<float>(6, 0.f));
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

struct AttentionCase {
  int64_t batch, t, d, dv;
  float scale;
};

std::string describe(const AttentionCase &c) {
  return "batch=" + std::to_string(c.batch) + " t=" + std::to_string(c.t) +
         " d=" + std::to_string(c.d) + " dv=" + std::to_string(c.dv);
}

/// Causal attention and its gradients in double, as the unfused PyTorch
/// chain computes them: explicit [t, t] scores, -inf above the diagonal,
/// softmax, products; the backward from the chain rule through each step.
struct RefAttention {
  std::vector<double> out, lse, dq, dk, dv;

  RefAttention(const AttentionCase &c, const std::vector<float> &q,
               const std::vector<float> &k, const std::vector<float> &v,
               const std::vector<float> &dout) {
    const int64_t t = c.t, d = c.d, dvs = c.dv;
    out.assign(c.batch * t * dvs, 0);
    lse.assign(c.batch * t, 0);
    dq.assign(q.size(), 0);
    dk.assign(k.size(), 0);
    dv.assign(v.size(), 0);
    std::vector<double> p(t * t), dp(t * t), ds(t * t);
    for (int64_t b = 0; b < c.batch; ++b) {
      const float *qb = q.data() + b * t * d, *kb = k.data() + b * t * d;
      const float *vb = v.data() + b * t * dvs, *gb = dout.data() + b * t * dvs;
      for (int64_t i = 0; i < t; ++i) {
        double *s = p.data() + i * t;
        for (int64_t j = 0; j < t; ++j) {
          double dotIJ = 0;
          for (int64_t x = 0; x < d; ++x)
            dotIJ += double(qb[i * d + x]) * kb[j * d + x];
          s[j] = j > i ? -kInf : dotIJ * c.scale;
        }
        double m = *std::max_element(s, s + t), sum = 0;
        for (int64_t j = 0; j < t; ++j)
          sum += std::exp(s[j] - m);
        lse[b * t + i] = m + std::log(sum);
        for (int64_t j = 0; j < t; ++j)
          s[j] = std::exp(s[j] - m) / sum;
      }
      // out = p v; dp = dout vᵀ; dv = pᵀ dout.
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          double dpIJ = 0;
          for (int64_t x = 0; x < dvs; ++x) {
            out[(b * t + i) * dvs + x] += p[i * t + j] * vb[j * dvs + x];
            dv[(b * t + j) * dvs + x] += p[i * t + j] * gb[i * dvs + x];
            dpIJ += double(gb[i * dvs + x]) * vb[j * dvs + x];
          }
          dp[i * t + j] = dpIJ;
        }
      // Softmax backward, then the masked entries get no gradient.
      for (int64_t i = 0; i < t; ++i) {
        double dot = 0;
        for (int64_t j = 0; j < t; ++j)
          dot += dp[i * t + j] * p[i * t + j];
        for (int64_t j = 0; j < t; ++j)
          ds[i * t + j] = j > i ? 0 : p[i * t + j] * (dp[i * t + j] - dot);
      }
      // The scores were (q kᵀ)·scale.
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j)
          for (int64_t x = 0; x < d; ++x) {
            dq[(b * t + i) * d + x] += c.scale * ds[i * t + j] * kb[j * d + x];
            dk[(b * t + j) * d + x] += c.scale * ds[i * t + j] * qb[i * d + x];
          }
    }
  }
};

/// The inputs and the kernels' outputs for one case.
struct AttentionRun {
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;

  AttentionRun(const AttentionCase &c, unsigned seed, float range = 2.f)
      : q(randomFloats(c.batch * c.t * c.d, seed, -range, range)),
        k(randomFloats(c.batch * c.t * c.d, seed + 1, -range, range)),
        v(randomFloats(c.batch * c.t * c.dv, seed + 2)),
        dout(randomFloats(c.batch * c.t * c.dv, seed + 3)),
        out(c.batch * c.t * c.dv, kInfF), lse(c.batch * c.t, kInfF),
        dq(q.size(), kInfF), dk(k.size(), kInfF), dv(v.size(), kInfF) {
    causalAttention(out.data(), lse.data(), q.data(), k.data(), v.data(),
                    c.batch, c.t, c.d, c.dv, c.scale);
    causalAttentionGrad(dq.data(), dk.data(), dv.data(), q.data(), k.data(),
                        v.data(), out.data(), lse.data(), dout.data(), c.batch,
                        c.t, c.d, c.dv, c.scale);
  }
};

/// Within rtol 1e-5 of `want`, or within `tol` times the largest |want|
/// (at least 1): sums that cancel to near zero keep float rounding of the
/// size of their terms.
void expectCloseToScale(const std::vector<float> &got,
                        const std::vector<double> &want, double tol,
                        const std::string &what) {
  double largest = 1;
  for (double w : want)
    largest = std::max(largest, std::abs(w));
  expectAllClose(got, want, 1e-5, tol * largest, what);
}

void checkAttention(const AttentionCase &c, unsigned seed, double tol = 2e-6,
                    float range = 2.f) {
  AttentionRun run(c, seed, range);
  RefAttention ref(c, run.q, run.k, run.v, run.dout);
  std::string what = describe(c);
  expectCloseToScale(run.out, ref.out, tol, what + " out");
  expectCloseToScale(run.lse, ref.lse, tol, what + " lse");
  expectCloseToScale(run.dq, ref.dq, tol, what + " dq");
  expectCloseToScale(run.dk, ref.dk, tol, what + " dk");
  expectCloseToScale(run.dv, ref.dv, tol, what + " dv");
}

// Tests causalAttention and its gradients against the unfused computation in
// double: one row; d != dv; exactly one and two blocks (of 32 rows), one row
// past a block and t not a multiple of the block; 64-row blocks (large
// t·d), again with t not a multiple; batch 1 and 2 (the backward splits each
// problem's blocks into groups) and 9 (it does not); scores in the tens
// (peaked rows, where float rounding of the scores shows most).
TEST(AttentionTest, MatchesUnfusedReference) {
  checkAttention({1, 1, 4, 4, 0.5f}, 120);
  checkAttention({2, 5, 3, 7, 0.6f}, 121);
  checkAttention({3, 32, 16, 16, 0.25f}, 122);
  checkAttention({2, 64, 16, 8, 0.25f}, 123);
  checkAttention({1, 33, 8, 12, 0.3f}, 124);
  checkAttention({2, 130, 32, 24, 0.17f}, 125);
  checkAttention({1, 200, 8, 8, 0.35f}, 126);
  checkAttention({9, 100, 16, 20, 0.25f}, 127);
  checkAttention({2, 257, 64, 64, 0.125f}, 128);
  checkAttention({1, 300, 128, 120, 0.09f}, 129);
  checkAttention({2, 150, 32, 32, 1.f}, 130, 8e-6);
}

// Tests the gradients against central differences of the forward kernel, so
// that the backward formulas themselves are checked, not only their coding.
TEST(AttentionTest, GradIsTheDerivative) {
  for (AttentionCase c :
       {AttentionCase{2, 5, 3, 7, 0.6f}, AttentionCase{1, 70, 8, 6, 0.4f}}) {
    AttentionRun run(c, 131);
    auto objective = [&](const std::vector<float> &q,
                         const std::vector<float> &k,
                         const std::vector<float> &v) {
      std::vector<float> out(run.out.size()), lse(run.lse.size());
      causalAttention(out.data(), lse.data(), q.data(), k.data(), v.data(),
                      c.batch, c.t, c.d, c.dv, c.scale);
      return weighted(out, run.dout);
    };
    std::string what = describe(c);
    checkFiniteDifferences(
        run.q, run.dq,
        [&](const auto &qs) { return objective(qs, run.k, run.v); }, 1e-2, 2e-3,
        what + " dq");
    checkFiniteDifferences(
        run.k, run.dk,
        [&](const auto &ks) { return objective(run.q, ks, run.v); }, 1e-2, 2e-3,
        what + " dk");
    checkFiniteDifferences(
        run.v, run.dv,
        [&](const auto &vs) { return objective(run.q, run.k, vs); }, 1e-2, 2e-3,
        what + " dv");
  }
}

#ifdef _OPENMP
// Tests that attention and its gradients are bitwise the same on 1 and 3
// threads, with the backward splitting problems into groups (batch 3, with
// 32- and 64-row blocks) and not (batch 9).
TEST(AttentionTest, SameBitsOnAnyTeam) {
  for (AttentionCase c : {AttentionCase{3, 300, 32, 40, 0.2f},
                          AttentionCase{3, 300, 128, 128, 0.1f},
                          AttentionCase{9, 130, 16, 16, 0.25f}}) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    AttentionRun one(c, 140);
    omp_set_num_threads(3);
    AttentionRun three(c, 140);
    omp_set_num_threads(saved);
    EXPECT_EQ(one.out, three.out) << describe(c);
    EXPECT_EQ(one.lse, three.lse) << describe(c);
    EXPECT_EQ(one.dq, three.dq) << describe(c);
    EXPECT_EQ(one.dk, three.dk) << describe(c);
    EXPECT_EQ(one.dv, three.dv) << describe(c);
  }
}
#endif

//===----------------------------------------------------------------------===//
// Thread-count independence
//===----------------------------------------------------------------------===//

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
