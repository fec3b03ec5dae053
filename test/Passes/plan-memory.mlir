// RUN: fastllm-opt %s --fastllm-zero-layout --fastllm-plan-memory | FileCheck %s

// Tests that buffers whose lifetimes do not overlap share an offset, that
// overlapping ones never do, that a reshape aliases its input, and that the
// regions (params, grads, m, v, tokens, targets, activations) are laid out
// end to end, 64-byte aligned.

// One stage of 4 parameters, padded to dp * 32 = 32 elements (128 B): the
// full weight and gradient arrays, then four 128 B shards (dp = 1), the
// token and target regions (2x4 i64 = 64 B each), then the activations.
// CHECK: plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 896 : i64,
// CHECK-SAME: activations_unshared_bytes = 1152 : i64
// CHECK-SAME: adam_m_offset = 384 : i64
// CHECK-SAME: adam_v_offset = 512 : i64
// CHECK-SAME: arena_bytes = 1920 : i64
// CHECK-SAME: grad_shard_offset = 640 : i64
// CHECK-SAME: grads_offset = 128 : i64
// CHECK-SAME: master_offset = 256 : i64
// CHECK-SAME: params_offset = 0 : i64
// CHECK-SAME: targets_arg = 1 : i64
// CHECK-SAME: targets_offset = 832 : i64
// CHECK-SAME: tokens_arg = 0 : i64
// CHECK-SAME: tokens_offset = 768 : i64
// CHECK-SAME: plan.layout = #plan.layout<{{{.*}}data_parallel = 1 : i64
// CHECK-SAME: param_elements = 32 : i64
// CHECK-SAME: stage_elements = array<i64: 32>
// CHECK-SAME: stage_offsets = array<i64: 0>
// CHECK-SAME: zero_stage = 1 : i64}>
// CHECK: model.parameter @w {{.*}} {plan.offset = 0 : i64}
model.parameter @w : tensor<4xf32>
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %w = model.get_parameter @w : tensor<4xf32>
  // Lifetimes (op index): a [1,1] (unused), a2 [2,3], b [3,5] (through the
  // reshape), l [5,6]. a2 and b overlap at the add; a and l share a2's
  // memory because their lifetimes are disjoint from it and each other.
  // CHECK: model.cast %{{.*}} {plan.offsets = array<i64: 896>}
  %a = model.cast %tok : tensor<2x4xi64> -> tensor<2x4xf32>
  // CHECK: model.broadcast %{{.*}} {plan.offsets = array<i64: 896>}
  %a2 = model.broadcast %w : tensor<4xf32> -> tensor<32x4xf32>
  // CHECK: model.add {{.*}} {plan.offsets = array<i64: 1408>}
  %b = model.add %a2, %a2 : tensor<32x4xf32>, tensor<32x4xf32> -> tensor<32x4xf32>
  // CHECK: model.reshape %{{.*}} : tensor<32x4xf32> -> tensor<128xf32>
  %r = model.reshape %b : tensor<32x4xf32> -> tensor<128xf32>
  // CHECK: model.reduce_sum {{.*}} {plan.offsets = array<i64: 896>}
  %l = model.reduce_sum %r dims [0] : tensor<128xf32> -> tensor<f32>
  return %l : tensor<f32>
}

