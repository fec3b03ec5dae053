// Tests the model FLOPs fastllm-count-traffic records for a one-layer
// attention model after autodiff, worked out by hand (passes/CountTraffic.cpp
// says what is counted). Tokens [2, 4], embedding 16 x 8, q/k/v 8 x 8, one
// causal attention over B = 2 problems of t = 4 (tri = 4*5/2 = 10 pairs),
// d = dv = 8, and a head 8 x 16.
//
// Forward matmuls, 2*M*N*K: q, k, v 3 * 2*(2*4*8)*8 = 3072; head
// 2*(2*4*16)*8 = 2048; 5120 in all. Backward: each matmul's two gradients
// (of its input, of its weight) cost as much as it did: 10240. Attention
// forward 2*B*tri*(d + dv) = 2*2*10*16 = 640; backward 2*B*tri*(3d + 2dv)
// = 2*2*10*40 = 1600. Total 5120 + 10240 + 640 + 1600 = 17600, none of it
// bf16 in fp32 and all of it with --fastllm-mixed-precision.
//
// RUN: fastllm-opt %s --fastllm-autodiff --fastllm-partition-stages \
// RUN:   --fastllm-zero-layout --fastllm-zero-collectives \
// RUN:   --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=FP32
// RUN: fastllm-opt %s --fastllm-mixed-precision --fastllm-autodiff \
// RUN:   --fastllm-partition-stages --fastllm-zero-layout \
// RUN:   --fastllm-zero-collectives --fastllm-verify-collectives \
// RUN:   --fastllm-count-traffic | FileCheck %s --check-prefix=BF16

// FP32: plan.traffic = #plan.traffic<{
// FP32-SAME: bf16_flops_per_micro_batch = 0 : i64
// FP32-SAME: flops_per_micro_batch = 17600 : i64
// BF16: plan.traffic = #plan.traffic<{
// BF16-SAME: bf16_flops_per_micro_batch = 17600 : i64
// BF16-SAME: flops_per_micro_batch = 17600 : i64

model.parameter @wte : tensor<16x8xf32>
model.parameter @wq : tensor<8x8xf32>
model.parameter @wk : tensor<8x8xf32>
model.parameter @wv : tensor<8x8xf32>
model.parameter @head : tensor<8x16xf32>
func.func @forward(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %wte = model.get_parameter @wte : tensor<16x8xf32>
  %x = model.gather %wte[%tok] dim 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %wq = model.get_parameter @wq : tensor<8x8xf32>
  %q = model.matmul %x, %wq : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %wk = model.get_parameter @wk : tensor<8x8xf32>
  %k = model.matmul %x, %wk : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %wv = model.get_parameter @wv : tensor<8x8xf32>
  %v = model.matmul %x, %wv : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %o, %lse = model.causal_attention %q, %k, %v scale 3.535534e-01 : tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>, tensor<2x4xf32>
  %head = model.get_parameter @head : tensor<8x16xf32>
  %logits = model.matmul %o, %head : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  %loss = model.cross_entropy %logits, %tgt reduction mean : tensor<2x4x16xf32>, tensor<2x4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}
