//===- HostTensorTest.cpp - import-time tensor arithmetic -----------------===//
//
// The importer folds shape subgraphs with these helpers; a wrong broadcast
// index or rounding would silently change a mask or a position table.
//
//===----------------------------------------------------------------------===//

#include "frontend/HostTensor.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::fastllm;

TEST(HostTensor, BroadcastShapesFollowNumPy) {
  auto s = broadcastShapes({2, 1, 4}, {3, 1});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(SmallVector<int64_t>(*s), (SmallVector<int64_t>{2, 3, 4}));
  EXPECT_FALSE(broadcastShapes({2, 3}, {4}).has_value());
  auto scalar = broadcastShapes({}, {5});
  ASSERT_TRUE(scalar.has_value());
  EXPECT_EQ(SmallVector<int64_t>(*scalar), (SmallVector<int64_t>{5}));
}

TEST(HostTensor, BroadcastSourceIndexRepeatsSizeOneDims) {
  // Element [1, 2] of a [2, 3] result reads [0, 2] of a [1, 3] operand and
  // [1, 0] of a [2, 1] operand.
  EXPECT_EQ(broadcastSourceIndex({1, 2}, {1, 3}), 2);
  EXPECT_EQ(broadcastSourceIndex({1, 2}, {2, 1}), 1);
  EXPECT_EQ(broadcastSourceIndex({1, 2}, {3}), 2);
  EXPECT_EQ(broadcastSourceIndex({1, 2}, {}), 0);
}

TEST(HostTensor, ForEachIndexIsRowMajor) {
  std::vector<std::pair<SmallVector<int64_t>, int64_t>> seen;
  forEachIndex({2, 3}, [&](ArrayRef<int64_t> index, int64_t k) {
    seen.push_back({SmallVector<int64_t>(index), k});
  });
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[4].first, (SmallVector<int64_t>{1, 1}));
  EXPECT_EQ(seen[4].second, 4);
  EXPECT_EQ(stridesOf({2, 3, 4}), (SmallVector<int64_t>{12, 4, 1}));
}

TEST(HostTensor, RoundsToTheElementType) {
  MLIRContext context;
  Builder b(&context);
  // 0.1 is not representable: f32 and bf16 round it differently.
  EXPECT_EQ(roundToType(b.getF32Type(), 0.1), (double)0.1f);
  EXPECT_NE(roundToType(b.getBF16Type(), 0.1), (double)0.1f);
  EXPECT_EQ(roundToType(b.getBF16Type(), 0.1), 0.10009765625);
  EXPECT_EQ(roundToType(b.getI64Type(), -2.7), -2.0); // toward zero
  EXPECT_EQ(roundToType(b.getI1Type(), 0.5), 1.0);
}

TEST(HostTensor, SplatAttrsStaySmall) {
  MLIRContext context;
  Builder b(&context);
  HostTensor ones = HostTensor::filled(b.getI1Type(), {64, 64}, 1);
  DenseElementsAttr attr = ones.toAttr();
  EXPECT_TRUE(attr.isSplat());
  EXPECT_EQ(attr.getType(), RankedTensorType::get({64, 64}, b.getI1Type()));

  HostTensor iota = HostTensor::filled(b.getI64Type(), {3}, 0);
  for (int64_t k = 0; k < 3; ++k)
    iota.setInt(k, k - 1);
  auto values = iota.toAttr().getValues<int64_t>();
  EXPECT_EQ(SmallVector<int64_t>(values.begin(), values.end()),
            (SmallVector<int64_t>{-1, 0, 1}));
}
