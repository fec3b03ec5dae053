// RUN: fastllm-opt %s --split-input-file --fastllm-zero-layout --fastllm-plan-memory --verify-diagnostics
// RUN: not fastllm-opt %s --split-input-file --fastllm-plan-memory 2>&1 | FileCheck %s --check-prefix=LAYOUT

// Tests that the planner refuses what it cannot lay out.

// LAYOUT: error: the module has no plan.layout; run fastllm-zero-layout
// expected-error @+1 {{no func.func @train_step to lay out; run fastllm-autodiff first}}
module {
  func.func @forward() {
    return
  }
}

// -----

// expected-error @+1 {{has element type 'bf16'; parameters must be f32}}
model.parameter @w : tensor<4xbf16>
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}

// -----

// expected-error @+1 {{the training step must take exactly two integer inputs (tokens and targets)}}
func.func @train_step(%tok: tensor<2x4xi64>, %x: tensor<2x4xf32>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}

// -----

// The token ids alone: the exporter dropped the targets the graph did not
// read, and the message says so.
// expected-error @+2 {{the training step must take exactly two integer inputs (tokens and targets)}}
// expected-note @+1 {{the exporter drops an input the graph does not read}}
func.func @train_step(%tok: tensor<2x4xi64>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}
