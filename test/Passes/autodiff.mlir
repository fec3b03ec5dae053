// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff | FileCheck %s

// Tests that a tied parameter read twice gets one accumulated gradient that
// sums both uses, and that @forward is kept next to @train_step.

model.parameter @w : tensor<4x4xf32>
// CHECK-LABEL: func.func @forward
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xf32>) -> tensor<f32>
func.func @forward(%x: tensor<2x4xf32>) -> tensor<f32> {
  // CHECK: %[[W:.*]] = model.get_parameter @w
  %w = model.get_parameter @w : tensor<4x4xf32>
  // CHECK: %[[H:.*]] = model.matmul %[[X]], %[[W]]
  %h = model.matmul %x, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
  // CHECK: %[[Y:.*]] = model.matmul %[[H]], %[[W]]
  %y = model.matmul %h, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
  // CHECK: %[[L:.*]] = model.reduce_sum %[[Y]] dims [0, 1]
  %l = model.reduce_sum %y dims [0, 1] : tensor<2x4xf32> -> tensor<f32>
  // The seed, d(loss)/d(loss) = 1, broadcast back over the reduced dims.
  // CHECK: %[[ONE:.*]] = model.constant {model.backward} dense<1.000000e+00> : tensor<f32>
  // CHECK: %[[G0:.*]] = model.reshape %[[ONE]] {model.backward} : tensor<f32> -> tensor<1x1xf32>
  // CHECK: %[[GY:.*]] = model.broadcast %[[G0]] {model.backward} : tensor<1x1xf32> -> tensor<2x4xf32>
  // Second matmul: dH = dY W^T, dW2 = H^T dY.
  // CHECK: %[[WT:.*]] = model.transpose %[[W]] [1, 0]
  // CHECK: %[[GH:.*]] = model.matmul %[[GY]], %[[WT]]
  // CHECK: %[[HT:.*]] = model.transpose %[[H]] [1, 0]
  // CHECK: %[[GW2:.*]] = model.matmul %[[HT]], %[[GY]]
  // First matmul: dW1 = X^T dH, and the two uses add up.
  // CHECK: %[[XT:.*]] = model.transpose %[[X]] [1, 0]
  // CHECK: %[[GW1:.*]] = model.matmul %[[XT]], %[[GH]]
  // CHECK: %[[GW:.*]] = model.add %[[GW2]], %[[GW1]]
  // CHECK: model.accumulate_grad @w, %[[GW]] {model.backward} : tensor<4x4xf32>
  // CHECK-NOT: accumulate_grad
  // CHECK: return %[[L]] : tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that gradients of broadcast operands are summed back to the
// operand's shape (a bias added to every row), and that nothing is computed
// for the input, which no parameter depends on.

model.parameter @b : tensor<4xf32>
// CHECK-LABEL: func.func @train_step
func.func @forward(%x: tensor<2x4xf32>) -> tensor<f32> {
  %b = model.get_parameter @b : tensor<4xf32>
  %y = model.add %x, %b : tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  %e = model.exp %y : tensor<2x4xf32>
  %l = model.reduce_mean %e dims [0, 1] : tensor<2x4xf32> -> tensor<f32>
  // CHECK: %[[E:.*]] = model.exp
  // CHECK: model.constant {model.backward} dense<1.250000e-01>
  // CHECK: %[[GE:.*]] = model.broadcast
  // CHECK: %[[GY:.*]] = model.mul %[[GE]], %[[E]]
  // CHECK: %[[GB:.*]] = model.reduce_sum %[[GY]] dims [0] {model.backward} : tensor<2x4xf32> -> tensor<4xf32>
  // CHECK: model.accumulate_grad @b, %[[GB]] {model.backward} : tensor<4xf32>
  return %l : tensor<f32>
}

// -----

// Tests that the loss, layer norm and embedding get their dedicated backward
// ops, and that integer inputs (tokens, targets) get no gradient.

model.parameter @wte : tensor<16x8xf32>
model.parameter @g : tensor<8xf32>
// CHECK-LABEL: func.func @train_step
func.func @forward(%tok: tensor<2x3xi64>, %tgt: tensor<2x3xi64>) -> tensor<f32> {
  %wte = model.get_parameter @wte : tensor<16x8xf32>
  %g = model.get_parameter @g : tensor<8xf32>
  %x = model.gather %wte[%tok] dim 0 : tensor<16x8xf32>, tensor<2x3xi64> -> tensor<2x3x8xf32>
  %n = model.layer_norm %x, %g dim 2 eps 1.0e-5 : (tensor<2x3x8xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  %wt = model.transpose %wte [1, 0] : tensor<16x8xf32> -> tensor<8x16xf32>
  %logits = model.matmul %n, %wt : tensor<2x3x8xf32>, tensor<8x16xf32> -> tensor<2x3x16xf32>
  %l = model.cross_entropy %logits, %tgt ignore_index -100 reduction mean : tensor<2x3x16xf32>, tensor<2x3xi64> -> tensor<f32>
  // CHECK: %[[DL:.*]] = model.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} ignore_index -100 reduction mean
  // CHECK: %[[DX:.*]], %[[DG:.*]], %{{.*}} = model.layer_norm_grad
  // CHECK: %[[DE:.*]] = model.gather_grad %[[DX]] at %{{.*}} dim 0 {model.backward} : tensor<2x3x8xf32>, tensor<2x3xi64> -> tensor<16x8xf32>
  // The head's and the embedding's gradients of the tied weight add up.
  // CHECK: %[[DW:.*]] = model.add %{{.*}}, %[[DE]]
  // CHECK: model.accumulate_grad @g, %[[DG]]
  // CHECK: model.accumulate_grad @wte, %[[DW]]
  return %l : tensor<f32>
}
