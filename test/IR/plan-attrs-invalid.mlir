// RUN: fastllm-opt %s --split-input-file --verify-diagnostics

// Tests that the plan dialect verifies the `plan.*` attributes wherever they
// appear: a misspelt name, a wrong type or a plan missing a field is an
// error, never silently ignored.

// expected-error @+1 {{has an unknown plan attribute 'plan.ofset'}}
model.parameter @w : tensor<4xf32> {plan.ofset = 0 : i64}

// -----

// expected-error @+1 {{'plan.offset' must be an i64, got "zero"}}
model.parameter @w : tensor<4xf32> {plan.offset = "zero"}

// -----

// expected-error @+1 {{'plan.offset' must be at least 0, got -4}}
model.parameter @w : tensor<4xf32> {plan.offset = -4 : i64}

// -----

// expected-error @+1 {{'plan.weight_decay' must be true or false}}
model.parameter @w : tensor<4xf32> {plan.weight_decay = 1 : i64}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'plan.weight_decay' belongs on a model.parameter}}
  %y = model.neg %x {plan.weight_decay = true} : tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'plan.offsets' must be an array<i64> with one offset per result (1)}}
  %y = model.neg %x {plan.offsets = array<i64: 0, 64>} : tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// The module's plan: one typed attribute per part, each holding exactly its
// fields with their types.

// expected-error @+1 {{'plan.layout' is not a plan layout: no i64 'data_parallel'}}
module attributes {plan.layout = #plan.layout<{}>} {
  model.parameter @w : tensor<4xf32>
}

// -----

// expected-error @+1 {{'plan.data' is not a plan data: no i64 'seq_len'}}
module attributes {plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 3 : i32, vocab_size = 10 : i64}>} {
  model.parameter @w : tensor<4xf32>
}

// -----

// expected-error @+1 {{'plan.traffic' is not a plan traffic: unknown field 'all_reduce_bytes'}}
module attributes {plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_reduce_bytes = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<4xf32>
}

// -----

// expected-error @+1 {{'plan.layout' is not a plan layout: the stage_* arrays differ in length}}
module attributes {plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 32 : i64, stage_elements = array<i64: 32>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0, 32>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>} {
  model.parameter @w : tensor<4xf32>
}

// -----

// expected-error @+1 {{'plan.traffic' must be a #plan.traffic attribute}}
module attributes {plan.traffic = {all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}} {
  model.parameter @w : tensor<4xf32>
}

// -----

// expected-error @+1 {{'plan.traffic' belongs on the module}}
model.parameter @w : tensor<4xf32> {plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>}

// -----

// expected-error @+1 {{has an unknown plan attribute 'plan.memory'}}
module attributes {plan.memory = {}} {
  model.parameter @w : tensor<4xf32>
}
