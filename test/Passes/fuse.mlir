// RUN: fastllm-opt %s --split-input-file --fastllm-fuse | FileCheck %s

// Tests that the erf form of GELU, as PyTorch's exporter writes it
// (x / sqrt2 -> erf -> + 1 -> * x -> * 0.5), becomes one model.gelu.

// CHECK-LABEL: func.func @gelu_erf
// CHECK-SAME: (%[[X:.*]]: tensor<2x8xf32>)
// CHECK-NEXT: %[[G:.*]] = model.gelu %[[X]] approximate none
// CHECK-NEXT: return %[[G]]
func.func @gelu_erf(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %s2 = model.constant dense<1.41421354> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  %half = model.constant dense<0.5> : tensor<f32>
  %0 = model.div %x, %s2 : tensor<2x8xf32>, tensor<f32> -> tensor<2x8xf32>
  %1 = model.erf %0 : tensor<2x8xf32>
  %2 = model.add %1, %one : tensor<2x8xf32>, tensor<f32> -> tensor<2x8xf32>
  %3 = model.mul %x, %2 : tensor<2x8xf32>, tensor<2x8xf32> -> tensor<2x8xf32>
  %4 = model.mul %3, %half : tensor<2x8xf32>, tensor<f32> -> tensor<2x8xf32>
  return %4 : tensor<2x8xf32>
}

// -----

// Tests that the factors may come in another order and the division may be a
// multiplication by 1/sqrt(2).

// CHECK-LABEL: func.func @gelu_erf_commuted
// CHECK-NEXT: model.gelu %{{.*}} approximate none
// CHECK-NEXT: return
func.func @gelu_erf_commuted(%x: tensor<8xf32>) -> tensor<8xf32> {
  %r2 = model.constant dense<0.707106769> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  %half = model.constant dense<0.5> : tensor<f32>
  %0 = model.mul %r2, %x : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %1 = model.erf %0 : tensor<8xf32>
  %2 = model.add %one, %1 : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %3 = model.mul %half, %x : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %4 = model.mul %3, %2 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  return %4 : tensor<8xf32>
}

// -----

// Tests the tanh form with x^3 written as x * x * x (the exporter's form) and
// as pow(x, 3).

// CHECK-LABEL: func.func @gelu_tanh
// CHECK-NEXT: %[[A:.*]] = model.gelu %{{.*}} approximate tanh
// CHECK-NEXT: %[[B:.*]] = model.gelu %{{.*}} approximate tanh
// CHECK-NEXT: model.add %[[A]], %[[B]]
func.func @gelu_tanh(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %c = model.constant dense<0.044715> : tensor<f32>
  %k = model.constant dense<0.797884583> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  %half = model.constant dense<0.5> : tensor<f32>
  %three = model.constant dense<3.0> : tensor<f32>
  %0 = model.mul %x, %x : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %1 = model.mul %0, %x : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %2 = model.mul %1, %c : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %3 = model.add %x, %2 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %4 = model.mul %3, %k : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %5 = model.tanh %4 : tensor<8xf32>
  %6 = model.add %5, %one : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %7 = model.mul %x, %6 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %8 = model.mul %7, %half : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %p = model.pow %y, %three : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %q = model.mul %c, %p : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %r = model.add %q, %y : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s = model.mul %k, %r : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %t = model.tanh %s : tensor<8xf32>
  %u = model.add %one, %t : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %v = model.mul %half, %y : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %w = model.mul %v, %u : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %sum = model.add %8, %w : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  return %sum : tensor<8xf32>
}

// -----

// Tests near-misses that must NOT become GELU: a wrong constant (0.4), erf of
// another value, and an intermediate that has a second use.

// CHECK-LABEL: func.func @gelu_near_misses
// CHECK-NOT: model.gelu
// CHECK: return
func.func @gelu_near_misses(%x: tensor<8xf32>, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %s2 = model.constant dense<1.41421354> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  %half = model.constant dense<0.5> : tensor<f32>
  %wrong = model.constant dense<0.4> : tensor<f32>
  // 0.4 instead of 0.5
  %0 = model.div %x, %s2 : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %1 = model.erf %0 : tensor<8xf32>
  %2 = model.add %1, %one : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %3 = model.mul %x, %2 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %4 = model.mul %3, %wrong : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  // erf(y / sqrt2) times x
  %5 = model.div %y, %s2 : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %6 = model.erf %5 : tensor<8xf32>
  %7 = model.add %6, %one : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %8 = model.mul %x, %7 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %9 = model.mul %8, %half : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  // 1 + erf(..) is also returned
  %10 = model.div %x, %s2 : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %11 = model.erf %10 : tensor<8xf32>
  %12 = model.add %11, %one : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %13 = model.mul %x, %12 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %14 = model.mul %13, %half : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  return %4, %9, %14, %12 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Tests that RMSNorm as exporters write it (pow 2, mean over the last dim
// with keepdims, + eps, sqrt, 1/., * x, * w) becomes model.rms_norm, and also
// with rsqrt and with x * x.

// CHECK-LABEL: func.func @rms_norm
// CHECK-SAME: (%[[X:.*]]: tensor<2x4x8xf32>, %[[W:.*]]: tensor<8xf32>)
// CHECK-NEXT: %[[A:.*]] = model.rms_norm %[[X]], %[[W]] dim 2 eps 9.99999997E-7
// CHECK-NEXT: %[[B:.*]] = model.rms_norm %[[X]], %[[W]] dim 2 eps 9.99999974E-6
// CHECK-NEXT: model.add %[[A]], %[[B]]
func.func @rms_norm(%x: tensor<2x4x8xf32>, %w: tensor<8xf32>) -> tensor<2x4x8xf32> {
  %two = model.constant dense<2.0> : tensor<f32>
  %eps = model.constant dense<1.0e-6> : tensor<f32>
  %eps5 = model.constant dense<1.0e-5> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  %0 = model.pow %x, %two : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  %1 = model.reduce_mean %0 dims [2] keep_dims : tensor<2x4x8xf32> -> tensor<2x4x1xf32>
  %2 = model.add %1, %eps : tensor<2x4x1xf32>, tensor<f32> -> tensor<2x4x1xf32>
  %3 = model.sqrt %2 : tensor<2x4x1xf32>
  %4 = model.div %one, %3 : tensor<f32>, tensor<2x4x1xf32> -> tensor<2x4x1xf32>
  %5 = model.mul %x, %4 : tensor<2x4x8xf32>, tensor<2x4x1xf32> -> tensor<2x4x8xf32>
  %6 = model.mul %5, %w : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %7 = model.mul %x, %x : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %8 = model.reduce_mean %7 dims [2] keep_dims : tensor<2x4x8xf32> -> tensor<2x4x1xf32>
  %9 = model.add %eps5, %8 : tensor<f32>, tensor<2x4x1xf32> -> tensor<2x4x1xf32>
  %10 = model.rsqrt %9 : tensor<2x4x1xf32>
  %11 = model.mul %w, %x : tensor<8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %12 = model.mul %11, %10 : tensor<2x4x8xf32>, tensor<2x4x1xf32> -> tensor<2x4x8xf32>
  %13 = model.add %6, %12 : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  return %13 : tensor<2x4x8xf32>
}

// -----

// Tests RMSNorm near-misses: statistics over a non-trailing dim, of another
// value than the one normalised, and without keep_dims-shaped broadcasting.

// CHECK-LABEL: func.func @rms_norm_near_misses
// CHECK-NOT: model.rms_norm
// CHECK: return
func.func @rms_norm_near_misses(%x: tensor<2x8xf32>, %y: tensor<2x8xf32>, %w: tensor<8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  %two = model.constant dense<2.0> : tensor<f32>
  %eps = model.constant dense<1.0e-6> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  // mean over dim 0
  %0 = model.pow %x, %two : tensor<2x8xf32>, tensor<f32> -> tensor<2x8xf32>
  %1 = model.reduce_mean %0 dims [0] keep_dims : tensor<2x8xf32> -> tensor<1x8xf32>
  %2 = model.add %1, %eps : tensor<1x8xf32>, tensor<f32> -> tensor<1x8xf32>
  %3 = model.sqrt %2 : tensor<1x8xf32>
  %4 = model.div %one, %3 : tensor<f32>, tensor<1x8xf32> -> tensor<1x8xf32>
  %5 = model.mul %x, %4 : tensor<2x8xf32>, tensor<1x8xf32> -> tensor<2x8xf32>
  %6 = model.mul %5, %w : tensor<2x8xf32>, tensor<8xf32> -> tensor<2x8xf32>
  // statistics of y, applied to x
  %7 = model.pow %y, %two : tensor<2x8xf32>, tensor<f32> -> tensor<2x8xf32>
  %8 = model.reduce_mean %7 dims [1] keep_dims : tensor<2x8xf32> -> tensor<2x1xf32>
  %9 = model.add %8, %eps : tensor<2x1xf32>, tensor<f32> -> tensor<2x1xf32>
  %10 = model.sqrt %9 : tensor<2x1xf32>
  %11 = model.div %one, %10 : tensor<f32>, tensor<2x1xf32> -> tensor<2x1xf32>
  %12 = model.mul %x, %11 : tensor<2x8xf32>, tensor<2x1xf32> -> tensor<2x8xf32>
  %13 = model.mul %12, %w : tensor<2x8xf32>, tensor<8xf32> -> tensor<2x8xf32>
  return %6, %13 : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// Tests SiLU in both operand orders, SwiGLU's gate times up-projection
// staying a plain multiply, and sigmoid of another value not matching.

// CHECK-LABEL: func.func @silu
// CHECK-SAME: (%[[A:.*]]: tensor<8xf32>, %[[B:.*]]: tensor<8xf32>)
// CHECK-NEXT: %[[S:.*]] = model.silu %[[A]]
// CHECK-NEXT: %[[G:.*]] = model.mul %[[S]], %[[B]]
// CHECK-NEXT: %[[T:.*]] = model.silu %[[B]]
// CHECK-NEXT: %[[N:.*]] = model.sigmoid %[[B]]
// CHECK-NEXT: %[[M:.*]] = model.mul %[[A]], %[[N]]
func.func @silu(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %0 = model.sigmoid %a : tensor<8xf32>
  %1 = model.mul %a, %0 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %2 = model.mul %1, %b : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %3 = model.sigmoid %b : tensor<8xf32>
  %4 = model.mul %3, %b : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %5 = model.sigmoid %b : tensor<8xf32>
  %6 = model.mul %a, %5 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  return %2, %4, %6 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Tests that 1/sqrt(x), as a division or a reciprocal (torch.rsqrt exports
// the latter), becomes model.rsqrt, and that a sqrt with another use stays.

// CHECK-LABEL: func.func @rsqrt
// CHECK-SAME: (%[[X:.*]]: tensor<8xf32>, %[[Y:.*]]: tensor<8xf32>)
// CHECK-NEXT: %[[A:.*]] = model.rsqrt %[[X]]
// CHECK-NEXT: %[[B:.*]] = model.rsqrt %[[Y]]
// CHECK-NEXT: %[[S:.*]] = model.sqrt %[[X]]
// CHECK-NEXT: %[[C:.*]] = model.reciprocal %[[S]]
func.func @rsqrt(%x: tensor<8xf32>, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %one = model.constant dense<1.0> : tensor<f32>
  %0 = model.sqrt %x : tensor<8xf32>
  %1 = model.div %one, %0 : tensor<f32>, tensor<8xf32> -> tensor<8xf32>
  %2 = model.sqrt %y : tensor<8xf32>
  %3 = model.reciprocal %2 : tensor<8xf32>
  %4 = model.sqrt %x : tensor<8xf32>
  %5 = model.reciprocal %4 : tensor<8xf32>
  return %1, %3, %5, %4 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
