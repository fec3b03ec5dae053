// RUN: fastllm-opt %s --fastllm-mixed-precision | FileCheck %s
// RUN: fastllm-opt %s --fastllm-mixed-precision --fastllm-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: not fastllm-opt %s --fastllm-mixed-precision='compute=fp16' 2>&1 | FileCheck %s --check-prefix=BAD

// Tests the bf16 rewrite of @forward: parameter reads are cast to bf16 and
// every op fed by them computes in bf16 (a constant it meets is cast too),
// the loss reads bf16 logits and stays fp32, and after autodiff every
// parameter's gradient is cast back to fp32 before it is accumulated.

model.parameter @wte : tensor<16x8xf32>
model.parameter @g : tensor<8xf32>
// CHECK-LABEL: func.func @forward
func.func @forward(%tok: tensor<2x3xi64>, %tgt: tensor<2x3xi64>) -> tensor<f32> {
  // CHECK: %[[WTE:.*]] = model.get_parameter @wte : tensor<16x8xf32>
  // CHECK-NEXT: %[[WTE16:.*]] = model.cast %[[WTE]] : tensor<16x8xf32> -> tensor<16x8xbf16>
  // CHECK: %[[G:.*]] = model.get_parameter @g : tensor<8xf32>
  // CHECK-NEXT: %[[G16:.*]] = model.cast %[[G]] : tensor<8xf32> -> tensor<8xbf16>
  %wte = model.get_parameter @wte : tensor<16x8xf32>
  %g = model.get_parameter @g : tensor<8xf32>
  // CHECK: model.gather %[[WTE16]][%{{.*}}] dim 0 : tensor<16x8xbf16>, tensor<2x3xi64> -> tensor<2x3x8xbf16>
  %x = model.gather %wte[%tok] dim 0 : tensor<16x8xf32>, tensor<2x3xi64> -> tensor<2x3x8xf32>
  // CHECK: model.layer_norm %{{.*}}, %[[G16]] dim 2 {{.*}} -> tensor<2x3x8xbf16>
  %n = model.layer_norm %x, %g dim 2 eps 1.0e-5 : (tensor<2x3x8xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  // CHECK: %[[HALF:.*]] = model.constant dense<5.000000e-01> : tensor<f32>
  // CHECK: %[[HALF16:.*]] = model.cast %[[HALF]] : tensor<f32> -> tensor<bf16>
  // CHECK: model.mul %{{.*}}, %[[HALF16]] : tensor<2x3x8xbf16>, tensor<bf16> -> tensor<2x3x8xbf16>
  %half = model.constant dense<0.5> : tensor<f32>
  %s = model.mul %n, %half : tensor<2x3x8xf32>, tensor<f32> -> tensor<2x3x8xf32>
  %wt = model.transpose %wte [1, 0] : tensor<16x8xf32> -> tensor<8x16xf32>
  // CHECK: %[[LOGITS:.*]] = model.matmul {{.*}} -> tensor<2x3x16xbf16>
  %logits = model.matmul %s, %wt : tensor<2x3x8xf32>, tensor<8x16xf32> -> tensor<2x3x16xf32>
  // CHECK: %[[L:.*]] = model.cross_entropy %[[LOGITS]], %{{.*}} : tensor<2x3x16xbf16>, tensor<2x3xi64> -> tensor<f32>
  %l = model.cross_entropy %logits, %tgt ignore_index -100 reduction mean : tensor<2x3x16xf32>, tensor<2x3xi64> -> tensor<f32>
  // CHECK: return %[[L]] : tensor<f32>
  return %l : tensor<f32>
}

// GRAD-LABEL: func.func @train_step
// GRAD: model.cross_entropy_grad {{.*}} : tensor<2x3x16xbf16>, tensor<2x3xi64>, tensor<f32>
// GRAD-DAG: %[[DG:.*]] = model.cast %{{.*}} {model.backward} : tensor<8xbf16> -> tensor<8xf32>
// GRAD-DAG: model.accumulate_grad @g, %[[DG]] {model.backward} : tensor<8xf32>
// GRAD-DAG: %[[DW:.*]] = model.cast %{{.*}} {model.backward} : tensor<16x8xbf16> -> tensor<16x8xf32>
// GRAD-DAG: model.accumulate_grad @wte, %[[DW]] {model.backward} : tensor<16x8xf32>

// BAD: error: compute must be bf16, got 'fp16'
