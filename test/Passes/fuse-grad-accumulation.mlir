// RUN: fastllm-opt %s --split-input-file --fastllm-fuse-grad-accumulation | FileCheck %s

// Tests that model.accumulate_grad of a matmul's product becomes one
// model.matmul_accumulate_grad at the accumulate's place (keeping its
// attributes), through autodiff's bf16-to-f32 cast and through a matrix
// transpose (operands swapped, flags flipped), that a product with another
// use or an op with memory effects in between keeps them apart, and that
// other widened bf16 gradients are accumulated without the cast.

model.parameter @w : tensor<4x8xf32>
// CHECK-LABEL: func.func @fp32
func.func @fp32(%x: tensor<6x4xf32>, %g: tensor<6x8xf32>) {
  // CHECK-NEXT: model.matmul_accumulate_grad @w, %arg0, %arg1 {model.backward, model.stage = 2 : i64, plan.slot = 1 : i64, transpose_lhs} : tensor<6x4xf32>, tensor<6x8xf32>
  // CHECK-NEXT: return
  %p = model.matmul %x, %g {transpose_lhs} : tensor<6x4xf32>, tensor<6x8xf32> -> tensor<4x8xf32>
  model.accumulate_grad @w, %p {model.backward, model.stage = 2 : i64, plan.slot = 1 : i64} : tensor<4x8xf32>
  return
}

// -----

model.parameter @w : tensor<4x8xf32>
// CHECK-LABEL: func.func @bf16
func.func @bf16(%x: tensor<6x4xbf16>, %g: tensor<6x8xbf16>) {
  // CHECK-NEXT: model.matmul_accumulate_grad @w, %arg0, %arg1 {transpose_lhs} : tensor<6x4xbf16>, tensor<6x8xbf16>
  // CHECK-NEXT: return
  %p = model.matmul %x, %g {transpose_lhs} : tensor<6x4xbf16>, tensor<6x8xbf16> -> tensor<4x8xbf16>
  %f = model.cast %p : tensor<4x8xbf16> -> tensor<4x8xf32>
  model.accumulate_grad @w, %f : tensor<4x8xf32>
  return
}

// -----

// (Xᵀ·G)ᵀ = Gᵀ·X: the tied embedding's gradient from the head.
model.parameter @w : tensor<8x4xf32>
// CHECK-LABEL: func.func @transposed
func.func @transposed(%x: tensor<6x4xbf16>, %g: tensor<6x8xbf16>) {
  // CHECK-NEXT: model.matmul_accumulate_grad @w, %arg1, %arg0 {transpose_lhs} : tensor<6x8xbf16>, tensor<6x4xbf16>
  // CHECK-NEXT: return
  %p = model.matmul %x, %g {transpose_lhs} : tensor<6x4xbf16>, tensor<6x8xbf16> -> tensor<4x8xbf16>
  %f = model.cast %p : tensor<4x8xbf16> -> tensor<4x8xf32>
  %t = model.transpose %f [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  model.accumulate_grad @w, %t : tensor<8x4xf32>
  return
}

// -----

model.parameter @w : tensor<4x8xf32>
// CHECK-LABEL: func.func @other_use
func.func @other_use(%x: tensor<4x6xf32>, %g: tensor<6x8xf32>) -> tensor<4x8xf32> {
  // CHECK-NOT: model.matmul_accumulate_grad
  // CHECK: model.matmul
  // CHECK-NEXT: model.accumulate_grad
  %p = model.matmul %x, %g : tensor<4x6xf32>, tensor<6x8xf32> -> tensor<4x8xf32>
  model.accumulate_grad @w, %p : tensor<4x8xf32>
  return %p : tensor<4x8xf32>
}

// -----

// The clear of a gradient slot between them: the matmul's operands would be
// read (and the gradient added) after it; left as it is.
model.parameter @w : tensor<4x8xf32>
// CHECK-LABEL: func.func @effects_between
func.func @effects_between(%x: tensor<4x6xf32>, %g: tensor<6x8xf32>) {
  // CHECK-NOT: model.matmul_accumulate_grad
  // CHECK: model.matmul
  // CHECK-NEXT: model.clear_grads
  // CHECK-NEXT: model.accumulate_grad
  %p = model.matmul %x, %g : tensor<4x6xf32>, tensor<6x8xf32> -> tensor<4x8xf32>
  model.clear_grads stage 0 slot 0
  model.accumulate_grad @w, %p : tensor<4x8xf32>
  return
}

// -----

// Any other widened bf16 gradient is added as bf16 (the accumulate widens).
model.parameter @b : tensor<8xf32>
// CHECK-LABEL: func.func @widened
func.func @widened(%g: tensor<4x8xbf16>) {
  // CHECK-NEXT: %[[S:.*]] = model.reduce_sum %arg0
  // CHECK-NEXT: model.accumulate_grad @b, %[[S]] : tensor<8xbf16>
  // CHECK-NEXT: return
  %s = model.reduce_sum %g dims [0] : tensor<4x8xbf16> -> tensor<8xbf16>
  %f = model.cast %s : tensor<8xbf16> -> tensor<8xf32>
  model.accumulate_grad @b, %f : tensor<8xf32>
  return
}
