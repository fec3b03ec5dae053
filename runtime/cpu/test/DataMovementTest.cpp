//===- DataMovementTest.cpp - transpose, slice, concat, gather --*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

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

} // namespace
