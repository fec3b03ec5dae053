// RUN: fastllm-opt %s --fastllm-zero-layout='dp=4' --fastllm-plan-memory | FileCheck %s

// Tests the ZeRO layout: parameters ordered by stage, each stage padded to a
// multiple of dp * 32 = 128 elements (so it splits into 4 equal shards, a
// parameter may cross a shard boundary), the full weight and gradient arrays,
// and shards of a quarter of the array for master weights, moments and
// reduced gradients.

// Stage 0: @a (100 -> 112 aligned) padded to 128; stage 1: @b (200 -> 208)
// and @c (8 -> 16) = 224 padded to 256. Total 384 elements = 1536 B full,
// 96 elements = 384 B per shard.
// CHECK: plan.arena = #plan.arena<{{{.*}}adam_m_offset = 3456 : i64, adam_v_offset = 3840 : i64,
// CHECK-SAME: grad_shard_offset = 4224 : i64
// CHECK-SAME: grads_offset = 1536 : i64
// CHECK-SAME: master_offset = 3072 : i64
// CHECK-SAME: params_offset = 0 : i64
// CHECK-SAME: plan.layout = #plan.layout<{{{.*}}data_parallel = 4 : i64
// CHECK-SAME: param_elements = 384 : i64
// CHECK-SAME: stage_elements = array<i64: 128, 256>
// CHECK-SAME: stage_offsets = array<i64: 0, 128>
// CHECK: model.parameter @b {{.*}}{model.stage = 1 : i64, plan.offset = 128 : i64}
// CHECK: model.parameter @a {{.*}}{model.stage = 0 : i64, plan.offset = 0 : i64}
// CHECK: model.parameter @c {{.*}}{model.stage = 1 : i64, plan.offset = 336 : i64}
model.parameter @b : tensor<200xf32> {model.stage = 1 : i64}
model.parameter @a : tensor<100xf32> {model.stage = 0 : i64}
model.parameter @c : tensor<8xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}
