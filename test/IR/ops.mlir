// RUN: fastllm-opt %s | fastllm-opt | FileCheck %s
// RUN: fastllm-opt %s --mlir-print-op-generic | fastllm-opt | FileCheck %s

// Tests that every model-dialect op parses, verifies and prints back in its
// custom form, both from the custom and from the generic form.

// CHECK: model.parameter @wte : tensor<16x8xf32> = dense<1.000000e+00> : tensor<16x8xf32>
model.parameter @wte : tensor<16x8xf32> = dense<1.0> : tensor<16x8xf32>
// CHECK: model.parameter @"onnx::MatMul_7" : tensor<8x8xf32>{{$}}
model.parameter @"onnx::MatMul_7" : tensor<8x8xf32>
// CHECK: model.parameter @ln.g : tensor<8xf32> = dense<1.000000e+00> : tensor<8xf32>
model.parameter @ln.g : tensor<8xf32> = dense<1.0> : tensor<8xf32>

// CHECK-LABEL: func.func @forward
func.func @forward(%tokens: tensor<2x4xi64>, %targets: tensor<2x4xi64>) -> tensor<f32> {
  // CHECK: model.get_parameter @wte : tensor<16x8xf32>
  %wte = model.get_parameter @wte : tensor<16x8xf32>
  // CHECK: model.get_parameter @"onnx::MatMul_7" : tensor<8x8xf32>
  %w = model.get_parameter @"onnx::MatMul_7" : tensor<8x8xf32>
  %g = model.get_parameter @ln.g : tensor<8xf32>
  // CHECK: model.constant dense<2.000000e+00> : tensor<f32>
  %two = model.constant dense<2.0> : tensor<f32>
  // CHECK: model.constant dense<[true, false]> : tensor<2xi1>
  %bools = model.constant dense<[true, false]> : tensor<2xi1>

  // CHECK: model.gather %{{.*}}[%{{.*}}] dim 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %x = model.gather %wte[%tokens] dim 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>

  // CHECK: model.add %{{.*}}, %{{.*}} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %0 = model.add %x, %g : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  // CHECK: model.sub
  %1 = model.sub %0, %two : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  // CHECK: model.mul
  %2 = model.mul %1, %1 : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: model.div
  %3 = model.div %2, %two : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  // CHECK: model.pow
  %4 = model.pow %3, %two : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  // CHECK: model.and %{{.*}}, %{{.*}} : tensor<2xi1>, tensor<2xi1> -> tensor<2xi1>
  %b0 = model.and %bools, %bools : tensor<2xi1>, tensor<2xi1> -> tensor<2xi1>
  // CHECK: model.or
  %b1 = model.or %b0, %bools : tensor<2xi1>, tensor<2xi1> -> tensor<2xi1>
  // CHECK: model.not %{{.*}} : tensor<2xi1>
  %b2 = model.not %b1 : tensor<2xi1>
  // CHECK: model.cmp lt, %{{.*}}, %{{.*}} : tensor<2x4xi64>, tensor<2x4xi64> -> tensor<2x4xi1>
  %m = model.cmp lt, %tokens, %targets : tensor<2x4xi64>, tensor<2x4xi64> -> tensor<2x4xi1>
  // CHECK: model.cmp ge
  %m2 = model.cmp ge, %tokens, %targets : tensor<2x4xi64>, tensor<2x4xi64> -> tensor<2x4xi1>
  // CHECK: model.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x4x1xi1>, tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  %mr = model.reshape %m : tensor<2x4xi1> -> tensor<2x4x1xi1>
  %5 = model.select %mr, %4, %two : tensor<2x4x1xi1>, tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>

  // CHECK: model.sqrt %{{.*}} : tensor<2x4x8xf32>
  %u0 = model.sqrt %5 : tensor<2x4x8xf32>
  // CHECK: model.rsqrt
  %u1 = model.rsqrt %u0 : tensor<2x4x8xf32>
  // CHECK: model.reciprocal
  %u2 = model.reciprocal %u1 : tensor<2x4x8xf32>
  // CHECK: model.neg
  %u3 = model.neg %u2 : tensor<2x4x8xf32>
  // CHECK: model.exp
  %u4 = model.exp %u3 : tensor<2x4x8xf32>
  // CHECK: model.log
  %u5 = model.log %u4 : tensor<2x4x8xf32>
  // CHECK: model.tanh
  %u6 = model.tanh %u5 : tensor<2x4x8xf32>
  // CHECK: model.erf
  %u7 = model.erf %u6 : tensor<2x4x8xf32>
  // CHECK: model.sigmoid
  %u8 = model.sigmoid %u7 : tensor<2x4x8xf32>
  // CHECK: model.relu
  %u9 = model.relu %u8 : tensor<2x4x8xf32>
  // CHECK: model.silu
  %u10 = model.silu %u9 : tensor<2x4x8xf32>
  // CHECK: model.sin
  %u11 = model.sin %u10 : tensor<2x4x8xf32>
  // CHECK: model.cos
  %u12 = model.cos %u11 : tensor<2x4x8xf32>
  // CHECK: model.gelu %{{.*}} approximate none : tensor<2x4x8xf32>
  %u13 = model.gelu %u12 approximate none : tensor<2x4x8xf32>
  // CHECK: model.gelu %{{.*}} approximate tanh : tensor<2x4x8xf32>
  %u14 = model.gelu %u13 approximate tanh : tensor<2x4x8xf32>
  // CHECK: model.neg %{{.*}} : tensor<2x4xi64>
  %ineg = model.neg %tokens : tensor<2x4xi64>

  // CHECK: model.matmul %{{.*}}, %{{.*}} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %6 = model.matmul %u14, %w : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  // CHECK: model.transpose %{{.*}} [0, 2, 1] : tensor<2x4x8xf32> -> tensor<2x8x4xf32>
  %7 = model.transpose %6 [0, 2, 1] : tensor<2x4x8xf32> -> tensor<2x8x4xf32>
  // CHECK: model.matmul %{{.*}}, %{{.*}} : tensor<2x4x8xf32>, tensor<2x8x4xf32> -> tensor<2x4x4xf32>
  %scores = model.matmul %6, %7 : tensor<2x4x8xf32>, tensor<2x8x4xf32> -> tensor<2x4x4xf32>
  // CHECK: model.reshape %{{.*}} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %8 = model.reshape %6 : tensor<2x4x8xf32> -> tensor<8x8xf32>
  // CHECK: model.slice %{{.*}} start [0, 2] limit [8, 8] stride [1, 3] : tensor<8x8xf32> -> tensor<8x2xf32>
  %9 = model.slice %8 start [0, 2] limit [8, 8] stride [1, 3] : tensor<8x8xf32> -> tensor<8x2xf32>
  // CHECK: model.concat %{{.*}}, %{{.*}} dim 1 : (tensor<8x2xf32>, tensor<8x8xf32>) -> tensor<8x10xf32>
  %10 = model.concat %9, %8 dim 1 : (tensor<8x2xf32>, tensor<8x8xf32>) -> tensor<8x10xf32>
  // CHECK: model.split %{{.*}} dim 1 sizes [3, 7] : tensor<8x10xf32> -> tensor<8x3xf32>, tensor<8x7xf32>
  %11:2 = model.split %10 dim 1 sizes [3, 7] : tensor<8x10xf32> -> tensor<8x3xf32>, tensor<8x7xf32>
  // CHECK: model.broadcast %{{.*}} : tensor<8x3xf32> -> tensor<2x8x3xf32>
  %12 = model.broadcast %11#0 : tensor<8x3xf32> -> tensor<2x8x3xf32>
  // CHECK: model.cast %{{.*}} : tensor<2x4xi64> -> tensor<2x4xf32>
  %13 = model.cast %tokens : tensor<2x4xi64> -> tensor<2x4xf32>

  // CHECK: model.reduce_sum %{{.*}} dims [1] keep_dims : tensor<2x8x3xf32> -> tensor<2x1x3xf32>
  %r0 = model.reduce_sum %12 dims [1] keep_dims : tensor<2x8x3xf32> -> tensor<2x1x3xf32>
  // CHECK: model.reduce_mean %{{.*}} dims [0, 2] : tensor<2x8x3xf32> -> tensor<8xf32>
  %r1 = model.reduce_mean %12 dims [0, 2] : tensor<2x8x3xf32> -> tensor<8xf32>
  // CHECK: model.reduce_max %{{.*}} dims [0, 1, 2] : tensor<2x8x3xf32> -> tensor<f32>
  %r2 = model.reduce_max %12 dims [0, 1, 2] : tensor<2x8x3xf32> -> tensor<f32>
  // CHECK: model.softmax %{{.*}} dim 2 : tensor<2x4x4xf32>
  %s0 = model.softmax %scores dim 2 : tensor<2x4x4xf32>
  // CHECK: model.log_softmax %{{.*}} dim 2 : tensor<2x4x4xf32>
  %s1 = model.log_softmax %s0 dim 2 : tensor<2x4x4xf32>
  // CHECK: model.layer_norm %{{.*}}, %{{.*}}, %{{.*}} dim 2 eps 9.99999974E-6 : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %n0 = model.layer_norm %6, %g, %g dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: model.layer_norm %{{.*}}, %{{.*}} dim 2 eps 9.99999974E-6 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %n1 = model.layer_norm %n0, %g dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: model.rms_norm %{{.*}}, %{{.*}} dim 2 eps 9.99999997E-7 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %n2 = model.rms_norm %n1, %g dim 2 eps 1.0e-6 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>

  %logits = model.matmul %n2, %w : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  // CHECK: model.cross_entropy %{{.*}}, %{{.*}} ignore_index -100 reduction mean : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<f32>
  %loss = model.cross_entropy %logits, %targets ignore_index -100 reduction mean : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<f32>
  // CHECK: model.cross_entropy %{{.*}}, %{{.*}} reduction none : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<2x4xf32>
  %per = model.cross_entropy %logits, %targets reduction none : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<2x4xf32>
  %logp = model.log_softmax %logits dim 2 : tensor<2x4x8xf32>
  // CHECK: model.nll_loss %{{.*}}, %{{.*}} reduction sum : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<f32>
  %nll = model.nll_loss %logp, %targets reduction sum : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<f32>
  // CHECK: model.fused_elementwise(%{{.*}}, %{{.*}}) : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32> {
  // CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<2x4x8xf32>, %[[B:.*]]: tensor<8xf32>):
  // CHECK-NEXT: %[[S:.*]] = model.add %[[A]], %[[B]] : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  // CHECK-NEXT: %[[T:.*]] = model.tanh %[[S]] : tensor<2x4x8xf32>
  // CHECK-NEXT: model.yield %[[T]] : tensor<2x4x8xf32>
  %fused = model.fused_elementwise (%logits, %g) : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32> {
  ^bb0(%a: tensor<2x4x8xf32>, %b: tensor<8xf32>):
    %s = model.add %a, %b : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
    %t = model.tanh %s : tensor<2x4x8xf32>
    model.yield %t : tensor<2x4x8xf32>
  }
  return %loss : tensor<f32>
}
