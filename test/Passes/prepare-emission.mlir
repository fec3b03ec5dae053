// RUN: fastllm-opt %s --split-input-file --fastllm-zero-layout --fastllm-plan-memory --fastllm-prepare-emission --verify-diagnostics | FileCheck %s

// Tests that fastllm-prepare-emission records the emitter's decisions in the
// IR: the data's sizes and the vocabulary (the smallest bound on token ids:
// the classes of the loss on the targets, the rows of the table the tokens
// index), and AdamW's weight decay per parameter (matrices yes, vectors no,
// a decision already recorded kept).

// CHECK: plan.data = #plan.data<{batch_size = 2 : i64
// CHECK-SAME: seq_len = 3 : i64
// CHECK-SAME: vocab_size = 10 : i64
// CHECK: model.parameter @emb {{.*}}plan.weight_decay = true
// CHECK: model.parameter @gain {{.*}}plan.weight_decay = false
// CHECK: model.parameter @kept {{.*}}plan.weight_decay = true
model.parameter @emb : tensor<16x10xf32>
model.parameter @gain : tensor<10xf32>
model.parameter @kept : tensor<10xf32> {plan.weight_decay = true}
func.func @train_step(%tok: tensor<2x3xi64>, %tgt: tensor<2x3xi64>) -> tensor<f32> {
  %e = model.get_parameter @emb : tensor<16x10xf32>
  %g = model.get_parameter @gain : tensor<10xf32>
  %k = model.get_parameter @kept : tensor<10xf32>
  %x = model.gather %e[%tok] dim 0 : tensor<16x10xf32>, tensor<2x3xi64> -> tensor<2x3x10xf32>
  %y = model.mul %x, %g : tensor<2x3x10xf32>, tensor<10xf32> -> tensor<2x3x10xf32>
  %z = model.add %y, %k : tensor<2x3x10xf32>, tensor<10xf32> -> tensor<2x3x10xf32>
  %flat = model.reshape %z : tensor<2x3x10xf32> -> tensor<6x10xf32>
  %t = model.reshape %tgt : tensor<2x3xi64> -> tensor<6xi64>
  %l = model.cross_entropy %flat, %t ignore_index -100 reduction mean : tensor<6x10xf32>, tensor<6xi64> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Nothing bounds the token ids: no loss reads the targets, no table the
// tokens.
// expected-error @+2 {{cannot tell the vocabulary size: no loss on the targets and no gather of the tokens}}
// expected-note @+1 {{the model must look its token ids up in a table (nn.Embedding, a gather) or take a cross-entropy over the targets' classes}}
func.func @train_step(%tok: tensor<2x3xi64>, %tgt: tensor<2x3xi64>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}

// -----

// expected-error @+1 {{the tokens and targets inputs must be int64}}
func.func @train_step(%tok: tensor<2x3xi32>, %tgt: tensor<2x3xi32>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}

// -----

// expected-error @+1 {{tokens and targets must both be [batch, seq]}}
func.func @train_step(%tok: tensor<6xi64>, %tgt: tensor<6xi64>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}
