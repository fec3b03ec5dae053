// RUN: fastllm-opt %s --split-input-file --fastllm-fold-transposes --verify-diagnostics | FileCheck %s

// Tests that a transpose of the last two dims feeding matmuls becomes their
// transpose flag (on either side; cleared where already set) and disappears, that other transposes and
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

// A matmul that already reads the transpose transposed (autodiff's
// dX = dY·(Wᵀ)ᵀ) reads W as it is: the flag is cleared, and the transpose,
// which the forward matmul also read, disappears.
// CHECK-LABEL: func.func @train_step
func.func @train_step(%x: tensor<2x8x16xf32>, %w: tensor<4x16xf32>, %dy: tensor<2x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x16xf32>) {
  // CHECK-NOT: model.transpose
  // CHECK: model.matmul %arg0, %arg1 {transpose_rhs} : tensor<2x8x16xf32>, tensor<4x16xf32> -> tensor<2x8x4xf32>
  // CHECK: model.matmul %arg2, %arg1 : tensor<2x8x4xf32>, tensor<4x16xf32> -> tensor<2x8x16xf32>
  %wt = model.transpose %w [1, 0] : tensor<4x16xf32> -> tensor<16x4xf32>
  %y = model.matmul %x, %wt : tensor<2x8x16xf32>, tensor<16x4xf32> -> tensor<2x8x4xf32>
  %dx = model.matmul %dy, %wt {transpose_rhs} : tensor<2x8x4xf32>, tensor<16x4xf32> -> tensor<2x8x16xf32>
  return %y, %dx : tensor<2x8x4xf32>, tensor<2x8x16xf32>
}

// -----

// As autodiff writes it: the backward matmul reads a transpose of the
// forward transpose. Both fold; no copy of the weight remains.
// CHECK-LABEL: func.func @train_step
func.func @train_step(%x: tensor<2x8x16xf32>, %w: tensor<4x16xf32>, %dy: tensor<2x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x16xf32>) {
  // CHECK-NOT: model.transpose
  // CHECK: model.matmul %arg0, %arg1 {transpose_rhs} : tensor<2x8x16xf32>, tensor<4x16xf32> -> tensor<2x8x4xf32>
  // CHECK: model.matmul %arg2, %arg1 : tensor<2x8x4xf32>, tensor<4x16xf32> -> tensor<2x8x16xf32>
  %wt = model.transpose %w [1, 0] : tensor<4x16xf32> -> tensor<16x4xf32>
  %y = model.matmul %x, %wt : tensor<2x8x16xf32>, tensor<16x4xf32> -> tensor<2x8x4xf32>
  %wtt = model.transpose %wt [1, 0] : tensor<16x4xf32> -> tensor<4x16xf32>
  %dx = model.matmul %dy, %wtt : tensor<2x8x4xf32>, tensor<4x16xf32> -> tensor<2x8x16xf32>
  return %y, %dx : tensor<2x8x4xf32>, tensor<2x8x16xf32>
}

// -----

// A transposed 2-D product nothing else reads is computed transposed:
// (Aᵀ·G)ᵀ = Gᵀ·A, as for a tied head's weight gradient. A product that
// something else reads keeps its transpose.
// CHECK-LABEL: func.func @train_step
func.func @train_step(%a: tensor<6x4xf32>, %g: tensor<6x5xf32>) -> (tensor<5x4xf32>, tensor<5x4xf32>, tensor<4x5xf32>) {
  // CHECK: %[[P:.*]] = model.matmul %arg1, %arg0 {transpose_lhs} : tensor<6x5xf32>, tensor<6x4xf32> -> tensor<5x4xf32>
  %p = model.matmul %a, %g {transpose_lhs} : tensor<6x4xf32>, tensor<6x5xf32> -> tensor<4x5xf32>
  %pt = model.transpose %p [1, 0] : tensor<4x5xf32> -> tensor<5x4xf32>
  // CHECK: %[[Q:.*]] = model.matmul %arg0, %arg1 {transpose_lhs} : tensor<6x4xf32>, tensor<6x5xf32> -> tensor<4x5xf32>
  // CHECK: %[[QT:.*]] = model.transpose %[[Q]] [1, 0]
  %q = model.matmul %a, %g {transpose_lhs} : tensor<6x4xf32>, tensor<6x5xf32> -> tensor<4x5xf32>
  %qt = model.transpose %q [1, 0] : tensor<4x5xf32> -> tensor<5x4xf32>
  // CHECK: return %[[P]], %[[QT]], %[[Q]]
  return %pt, %qt, %q : tensor<5x4xf32>, tensor<5x4xf32>, tensor<4x5xf32>
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
