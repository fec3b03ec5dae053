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

// expected-error @+1 {{'plan.memory' is not a plan: no integer 'batch_size'}}
module attributes {plan.memory = {}} {
  model.parameter @w : tensor<4xf32>
}

// -----

// expected-error @+1 {{'plan.memory' belongs on the module}}
model.parameter @w : tensor<4xf32> {plan.memory = {}}
