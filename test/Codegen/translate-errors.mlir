// RUN: fastllm-opt translate --fastllm-to-cpu %s -split-input-file -verify-diagnostics

// What the step printer refuses, each with a diagnostic on the op at fault.

// expected-error @below {{the module has no plan.layout; run fastllm-zero-layout}}
module {
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  // expected-error @below {{has no planned offset or weight decay}}
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32>
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {plan.offset = 0 : i64, plan.weight_decay = true}
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    %w = model.get_parameter @w {plan.offsets = array<i64: 0>} : tensor<8x8xf32>
    // expected-error @below {{has no planned buffer; run fastllm-plan-memory}}
    %e = model.gather %w[%tok] dim 0 : tensor<8x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {plan.offset = 0 : i64, plan.weight_decay = true}
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    %w = model.get_parameter @w {plan.offsets = array<i64: 0>} : tensor<8x8xf32>
    // expected-error @below {{element type 'bf16' is not supported by the cpu target}}
    %h = model.cast %w {plan.offsets = array<i64: 1536>} : tensor<8x8xf32> -> tensor<8x8xbf16>
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {plan.offset = 0 : i64, plan.weight_decay = true}
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    %w = model.get_parameter @w {plan.offsets = array<i64: 0>} : tensor<8x8xf32>
    %s = model.slice %w start [0, 0] limit [3, 8] stride [1, 1] {plan.offsets = array<i64: 1536>} : tensor<8x8xf32> -> tensor<3x8xf32>
    // expected-error @below {{is not a multiple of the micro-batch 2: dropout keys its mask by sample}}
    %d = model.dropout %s ratio 1.000000e-01 site 0 {plan.offsets = array<i64: 1664>} : tensor<3x8xf32>
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {plan.offset = 0 : i64, plan.weight_decay = true}
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    // expected-error @below {{names a slot or stage the plan does not have}}
    model.clear_grads stage 0 slot 0
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {plan.offset = 0 : i64, plan.weight_decay = true}
  func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
    // expected-error @below {{holds a constant that compile's plan.mlir leaves out (large constants are elided there); `compile --emit source` writes the step's source with it}}
    %c = model.constant dense_resource<__elided__> : tensor<100xf32>
    %z = model.constant dense<0.0> : tensor<f32>
    return %z : tensor<f32>
  }
}
