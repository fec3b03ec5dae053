// RUN: fastllm-opt %s | fastllm-opt | FileCheck %s
// RUN: fastllm-opt %s --mlir-print-op-generic | fastllm-opt | FileCheck %s

// Tests that the ops autodiff and fusion create (backward ops, fused
// attention, gradient accumulation) round-trip in custom and generic form.

model.parameter @w : tensor<8xf32>
// CHECK-LABEL: func.func @backward
func.func @backward(%x: tensor<2x4x8xf32>, %g: tensor<8xf32>, %dy: tensor<2x4x8xf32>,
                    %logits: tensor<4x16xf32>, %t: tensor<4xi64>, %dl: tensor<f32>,
                    %q: tensor<2x3x4xf32>, %v: tensor<2x3x5xf32>, %do: tensor<2x3x5xf32>,
                    %idx: tensor<2x4xi64>) {
  // CHECK: model.softmax_grad %{{.*}}, %{{.*}} dim 2 : tensor<2x4x8xf32>
  %0 = model.softmax_grad %x, %dy dim 2 : tensor<2x4x8xf32>
  // CHECK: model.log_softmax_grad %{{.*}}, %{{.*}} dim 1 : tensor<2x4x8xf32>
  %1 = model.log_softmax_grad %x, %dy dim 1 : tensor<2x4x8xf32>
  // CHECK: model.layer_norm_grad %{{.*}}, %{{.*}}, %{{.*}} dim 2 eps 9.99999974E-6 : tensor<2x4x8xf32>, tensor<8xf32>
  %2:3 = model.layer_norm_grad %x, %g, %dy dim 2 eps 1.0e-5 : tensor<2x4x8xf32>, tensor<8xf32>
  // CHECK: model.rms_norm_grad %{{.*}}, %{{.*}}, %{{.*}} dim 2 eps 9.99999997E-7 : tensor<2x4x8xf32>, tensor<8xf32>
  %3:2 = model.rms_norm_grad %x, %g, %dy dim 2 eps 1.0e-6 : tensor<2x4x8xf32>, tensor<8xf32>
  // CHECK: model.gelu_grad %{{.*}}, %{{.*}} approximate tanh : tensor<2x4x8xf32>
  %4 = model.gelu_grad %x, %dy approximate tanh : tensor<2x4x8xf32>
  // CHECK: model.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} ignore_index -100 reduction mean : tensor<4x16xf32>, tensor<4xi64>, tensor<f32>
  %5 = model.cross_entropy_grad %logits, %t, %dl ignore_index -100 reduction mean : tensor<4x16xf32>, tensor<4xi64>, tensor<f32>
  // CHECK: model.nll_loss_grad %{{.*}}, %{{.*}} reduction sum : tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  %6 = model.nll_loss_grad %t, %dl reduction sum : tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  // CHECK: model.gather_grad %{{.*}} at %{{.*}} dim 0 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
  %7 = model.gather_grad %dy at %idx dim 0 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
  // CHECK: model.slice_grad %{{.*}} start [0, 1, 0] limit [2, 4, 8] stride [1, 2, 1] : tensor<2x2x8xf32> -> tensor<2x4x8xf32>
  %s = model.slice %x start [0, 1, 0] limit [2, 4, 8] stride [1, 2, 1] : tensor<2x4x8xf32> -> tensor<2x2x8xf32>
  %8 = model.slice_grad %s start [0, 1, 0] limit [2, 4, 8] stride [1, 2, 1] : tensor<2x2x8xf32> -> tensor<2x4x8xf32>
  // CHECK: model.causal_attention %{{.*}}, %{{.*}}, %{{.*}} scale 5.000000e-01 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x5xf32> -> tensor<2x3x5xf32>, tensor<2x3xf32>
  %o, %lse = model.causal_attention %q, %q, %v scale 0.5 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x5xf32> -> tensor<2x3x5xf32>, tensor<2x3xf32>
  // CHECK: model.causal_attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} scale 5.000000e-01 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x5xf32>, tensor<2x3x5xf32>, tensor<2x3xf32>
  %9:3 = model.causal_attention_grad %q, %q, %v, %o, %lse, %do scale 0.5 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x5xf32>, tensor<2x3x5xf32>, tensor<2x3xf32>
  // CHECK: model.accumulate_grad @w, %{{.*}} : tensor<8xf32>
  model.accumulate_grad @w, %g : tensor<8xf32>
  return
}
