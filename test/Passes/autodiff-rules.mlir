// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff | FileCheck %s

// One case per gradient rule family: each @forward reads a parameter, applies
// the op, and sums the result into the loss; the checks pin the backward the
// rule builds (the numbers are checked against PyTorch by
// test/EndToEnd/gradcheck.py).

model.parameter @p : tensor<3x4xf32>
// Tests that sqrt reuses its result: dx = g * 0.5 / y.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[Y:.*]] = model.sqrt %[[P:.*]] : tensor<3x4xf32>
// CHECK: %[[H:.*]] = model.mul %{{.*}}, %{{.*}} : tensor<3x4xf32>, tensor<f32>
// CHECK: %[[D:.*]] = model.div %[[H]], %[[Y]]
// CHECK: model.accumulate_grad @p, %[[D]]
func.func @forward() -> tensor<f32> {
  %p = model.get_parameter @p : tensor<3x4xf32>
  %y = model.sqrt %p : tensor<3x4xf32>
  %l = model.reduce_sum %y dims [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @p : tensor<3x4xf32>
// Tests that tanh's rule is g * (1 - y^2) on the forward result.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[Y:.*]] = model.tanh
// CHECK: %[[Y2:.*]] = model.mul %[[Y]], %[[Y]]
// CHECK: %[[S:.*]] = model.sub %{{.*}}, %[[Y2]]
// CHECK: %[[D:.*]] = model.mul %{{.*}}, %[[S]]
// CHECK: model.accumulate_grad @p, %[[D]]
func.func @forward() -> tensor<f32> {
  %p = model.get_parameter @p : tensor<3x4xf32>
  %y = model.tanh %p : tensor<3x4xf32>
  %l = model.reduce_sum %y dims [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @p : tensor<3x4xf32>
// Tests that pow by the constant 2 becomes 2 * x * g, with no pow.
// CHECK-LABEL: func.func @train_step
// CHECK-NOT: model.pow %{{.*}} : tensor<3x4xf32>, tensor<f32> -> tensor<3x4xf32>{{.*}}accumulate
// CHECK: %[[GX:.*]] = model.mul %{{.*}}, %[[P:.*]] : tensor<3x4xf32>, tensor<3x4xf32>
// CHECK: model.constant {model.backward} dense<2.000000e+00>
// CHECK: %[[D:.*]] = model.mul %[[GX]], %{{.*}} : tensor<3x4xf32>, tensor<f32>
// CHECK: model.accumulate_grad @p, %[[D]]
func.func @forward() -> tensor<f32> {
  %p = model.get_parameter @p : tensor<3x4xf32>
  %two = model.constant dense<2.0> : tensor<f32>
  %y = model.pow %p, %two : tensor<3x4xf32>, tensor<f32> -> tensor<3x4xf32>
  %l = model.reduce_sum %y dims [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @p : tensor<3x4xf32>
// Tests that transpose's gradient is the inverse permutation and reshape's
// is a reshape back.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[R:.*]] = model.reshape %{{.*}} : tensor<2x6xf32> -> tensor<4x3xf32>
// CHECK: %[[T:.*]] = model.transpose %[[R]] [1, 0] {model.backward} : tensor<4x3xf32> -> tensor<3x4xf32>
// CHECK: model.accumulate_grad @p, %[[T]]
func.func @forward() -> tensor<f32> {
  %p = model.get_parameter @p : tensor<3x4xf32>
  %t = model.transpose %p [1, 0] : tensor<3x4xf32> -> tensor<4x3xf32>
  %r = model.reshape %t : tensor<4x3xf32> -> tensor<2x6xf32>
  %e = model.exp %r : tensor<2x6xf32>
  %l = model.reduce_sum %e dims [0, 1] : tensor<2x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @p : tensor<3x4xf32>
// Tests that slice's gradient places the result gradient back with
// slice_grad, and that concat's slices it apart again.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[S:.*]] = model.slice_grad %{{.*}} start [0, 1] limit [3, 4] stride [1, 2] {model.backward} : tensor<3x2xf32> -> tensor<3x4xf32>
// CHECK: %[[A:.*]] = model.slice %{{.*}} start [0, 0] limit [3, 4] stride [1, 1] {model.backward} : tensor<3x8xf32> -> tensor<3x4xf32>
// CHECK: %[[B:.*]] = model.slice %{{.*}} start [0, 4] limit [3, 8] stride [1, 1] {model.backward} : tensor<3x8xf32> -> tensor<3x4xf32>
// CHECK: %[[SA:.*]] = model.add %[[S]], %[[A]]
// CHECK: %[[D:.*]] = model.add %[[SA]], %[[B]]
// CHECK: model.accumulate_grad @p, %[[D]]
func.func @forward() -> tensor<f32> {
  %p = model.get_parameter @p {model.backward} : tensor<3x4xf32>
  %c = model.concat %p, %p dim 1 : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x8xf32>
  %s = model.slice %p start [0, 1] limit [3, 4] stride [1, 2] {model.backward} : tensor<3x4xf32> -> tensor<3x2xf32>
  %l1 = model.reduce_sum %c dims [0, 1] : tensor<3x8xf32> -> tensor<f32>
  %l2 = model.reduce_sum %s dims [0, 1] : tensor<3x2xf32> -> tensor<f32>
  %l = model.add %l1, %l2 : tensor<f32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @p : tensor<3x4xf32>
// Tests that split's gradient concatenates the pieces' gradients, with
// zeros for a piece that does not reach the loss.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[Z:.*]] = model.constant {model.backward} dense<0.000000e+00> : tensor<3x3xf32>
// CHECK: %[[C:.*]] = model.concat %{{.*}}, %[[Z]] dim 1 {model.backward} : (tensor<3x1xf32>, tensor<3x3xf32>) -> tensor<3x4xf32>
// CHECK: model.accumulate_grad @p, %[[C]]
func.func @forward() -> tensor<f32> {
  %p = model.get_parameter @p : tensor<3x4xf32>
  %a, %b = model.split %p dim 1 sizes [1, 3] : tensor<3x4xf32> -> tensor<3x1xf32>, tensor<3x3xf32>
  %l = model.reduce_sum %a dims [0, 1] : tensor<3x1xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @p : tensor<3x4xf32>
// Tests that softmax and log_softmax get their fused backward ops, and that
// the mask of a select routes the gradient to the chosen branch only.
// CHECK-LABEL: func.func @train_step
// CHECK: model.log_softmax_grad
// CHECK: model.softmax_grad
// CHECK: model.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<3x4xi1>, tensor<3x4xf32>, tensor<f32> -> tensor<3x4xf32>
// CHECK: model.accumulate_grad @p
func.func @forward(%m: tensor<3x4xi1>) -> tensor<f32> {
  %p = model.get_parameter @p : tensor<3x4xf32>
  %z = model.constant dense<0.0> : tensor<f32>
  %s = model.select %m, %p, %z : tensor<3x4xi1>, tensor<3x4xf32>, tensor<f32> -> tensor<3x4xf32>
  %y = model.softmax %s dim 1 : tensor<3x4xf32>
  %ly = model.log_softmax %y dim 1 : tensor<3x4xf32>
  %l = model.reduce_sum %ly dims [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

model.parameter @x : tensor<2x4x8xf32>
model.parameter @g : tensor<8xf32>
// Tests the fused backward ops of RMSNorm, GELU and causal attention.
// CHECK-LABEL: func.func @train_step
// CHECK: model.causal_attention_grad
// CHECK: model.gelu_grad %{{.*}}, %{{.*}} approximate tanh
// CHECK: %[[DX:.*]], %[[DG:.*]] = model.rms_norm_grad
// CHECK: model.accumulate_grad @g, %[[DG]]
// CHECK: model.accumulate_grad @x
func.func @forward() -> tensor<f32> {
  %x = model.get_parameter @x : tensor<2x4x8xf32>
  %g = model.get_parameter @g : tensor<8xf32>
  %n = model.rms_norm %x, %g dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %a = model.gelu %n approximate tanh : tensor<2x4x8xf32>
  %o, %lse = model.causal_attention %a, %a, %a scale 0.25 : tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>, tensor<2x4xf32>
  %l = model.reduce_sum %o dims [0, 1, 2] : tensor<2x4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
