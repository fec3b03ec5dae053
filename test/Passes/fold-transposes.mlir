// RUN: fastllm-opt %s --split-input-file --fastllm-fold-transposes --verify-diagnostics | FileCheck %s

// Tests that a transpose of the last two dims feeding matmuls becomes their
// transpose flag (on either side) and disappears, that other transposes and
// other users keep it, and that the flags change the shapes a matmul checks.

// CHECK-LABEL: func.func @train_step
func.func @train_step(%x: tensor<2x8x16xf32>, %w: tensor<4x16xf32>, %g: tensor<2x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2x16x4xf32>) {
  // CHECK-NOT: model.transpose %arg1
  // CHECK: model.matmul %arg0, %arg1 {transpose_rhs} : tensor<2x8x16xf32>, tensor<4x16xf32> -> tensor<2x8x4xf32>
  %wt = model.transpose %w [1, 0] : tensor<4x16xf32> -> tensor<16x4xf32>
  %y = model.matmul %x, %wt : tensor<2x8x16xf32>, tensor<16x4xf32> -> tensor<2x8x4xf32>
  // CHECK: model.matmul %arg0, %arg2 {transpose_lhs} : tensor<2x8x16xf32>, tensor<2x8x4xf32> -> tensor<2x16x4xf32>
  %xt = model.transpose %x [0, 2, 1] : tensor<2x8x16xf32> -> tensor<2x16x8xf32>
  %dw = model.matmul %xt, %g : tensor<2x16x8xf32>, tensor<2x8x4xf32> -> tensor<2x16x4xf32>
  return %y, %dw : tensor<2x8x4xf32>, tensor<2x16x4xf32>
}

// -----

// A transpose that moves batch dims, or that something else reads, stays.
// CHECK-LABEL: func.func @train_step
func.func @train_step(%x: tensor<2x4x8xf32>, %w: tensor<8x3xf32>) -> (tensor<4x2x3xf32>, tensor<8x4xf32>) {
  // CHECK: %[[T:.*]] = model.transpose %arg0 [1, 0, 2]
  // CHECK: model.matmul %[[T]], %arg1 : tensor<4x2x8xf32>
  %t = model.transpose %x [1, 0, 2] : tensor<2x4x8xf32> -> tensor<4x2x8xf32>
  %y = model.matmul %t, %w : tensor<4x2x8xf32>, tensor<8x3xf32> -> tensor<4x2x3xf32>
  %a = model.reduce_sum %x dims [0] : tensor<2x4x8xf32> -> tensor<4x8xf32>
  // CHECK: %[[AT:.*]] = model.transpose %{{.*}} [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  // CHECK: model.exp %[[AT]]
  %at = model.transpose %a [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %e = model.exp %at : tensor<8x4xf32>
  return %y, %e : tensor<4x2x3xf32>, tensor<8x4xf32>
}

// -----

func.func @bad(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{contraction dims differ}}
  %y = model.matmul %x, %w {transpose_rhs} : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}
