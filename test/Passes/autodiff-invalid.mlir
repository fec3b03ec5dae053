// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff --verify-diagnostics

// Tests that autodiff rejects modules it cannot build a training step for.

// expected-error @+1 {{no func.func @forward to differentiate}}
module {
  func.func @main() {
    return
  }
}

// -----

// expected-error @+1 {{@forward must return one scalar float loss, got 'tensor<2xf32>'}}
func.func @forward(%x: tensor<2xf32>) -> tensor<2xf32> {
  return %x : tensor<2xf32>
}

// -----

model.parameter @w : tensor<2xf32>
// expected-error @+1 {{the loss does not depend on any trainable parameter}}
func.func @forward(%x: tensor<2xf32>) -> tensor<f32> {
  %l = model.reduce_sum %x dims [0] : tensor<2xf32> -> tensor<f32>
  return %l : tensor<f32>
}
