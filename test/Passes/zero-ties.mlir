// Tests parameters read in more than one stage under ZeRO-2 and 3, from
// autodiff on (what compile runs): each read's model.accumulate_grad runs in
// the stage of the read, so a stage whose parameters later stages read (its
// ties) gets a gradient slot of its own, cleared before the first backward
// that adds into it (the latest reading stage's) and reduce-scattered once,
// after its own backward; ZeRO-3 also gives it a weight slot of its own (the
// tie slot), gathered once and read by every reading stage, forward and
// backward. fastllm-verify-collectives proves each plan.
//
// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff --fastllm-zero-layout='dp=2' \
// RUN:   --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=ZERO1 --implicit-check-not=model.clear_grads
// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff --fastllm-zero-layout='dp=2 zero-stage=2' \
// RUN:   --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic | FileCheck %s --check-prefix=ZERO2
// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff --fastllm-zero-layout='dp=2 zero-stage=2 num-grad-buffers=1' \
// RUN:   --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic | FileCheck %s --check-prefix=GRAD1
// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff --fastllm-zero-layout='dp=2 zero-stage=3' \
// RUN:   --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic | FileCheck %s --check-prefix=ZERO3
// RUN: fastllm-opt %s --split-input-file --fastllm-autodiff \
// RUN:   --fastllm-zero-layout='dp=2 zero-stage=3 num-grad-buffers=1 num-weight-buffers=1' \
// RUN:   --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic | FileCheck %s --check-prefix=ONE

// A tied embedding and head three stages apart (layers-per-stage below 1 on
// a two-block GPT), the head reading the embedding through a
// model.get_parameter of its own, as the importer reads a folded transposed
// copy. dp = 2: stage 0 = @emb 80 -> 128; stages 1-3 = 64 each.
//
// ZeRO-1: no slots; the head's accumulation runs in stage 3 all the same.
// ZERO1: stage_grad_slot = array<i64: -1, -1, -1, -1>
// ZERO1: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 3 : i64}
// ZERO1: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64}
//
// ZeRO-2: stages 1-3 share two slots round-robin (1 -> 0, 2 -> 1, 3 -> 0);
// stage 0 has slot 2 of its own, cleared with stage 3's before the head's
// backward, which adds into it; one reduce-scatter of stage 0, at the end.
// ZERO2: grad_slot_elements = array<i64: 64, 64, 128>
// ZERO2-SAME: stage_grad_slot = array<i64: 2, 0, 1, 0>
// ZERO2-LABEL: func.func @train_step
// ZERO2: model.cross_entropy {{.*}}{model.stage = 3 : i64}
// ZERO2-NEXT: model.constant
// ZERO2-NEXT: model.clear_grads stage 3 slot 0 {model.backward}
// ZERO2-NEXT: model.clear_grads stage 0 slot 2 {model.backward}
// ZERO2-NEXT: model.cross_entropy_grad
// ZERO2: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO2: model.accumulate_grad @g, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 0 : i64}
// ZERO2-NEXT: model.reduce_scatter stage 3 from slot 0
// ZERO2-NOT: model.clear_grads stage 0
// ZERO2: model.gather_grad
// ZERO2-NEXT: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 2 : i64}
// ZERO2-NEXT: model.reduce_scatter stage 0 from slot 2
//
// One gradient buffer: stages 1-3 share slot 0, stage 0 keeps slot 1.
// GRAD1: grad_slot_elements = array<i64: 64, 128>
// GRAD1-SAME: stage_grad_slot = array<i64: 1, 0, 0, 0>
// GRAD1: model.clear_grads stage 0 slot 1 {model.backward}
// GRAD1-NEXT: model.cross_entropy_grad
// GRAD1: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// GRAD1: model.clear_grads stage 2 slot 0
// GRAD1: model.clear_grads stage 1 slot 0
// GRAD1: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 1 : i64}
// GRAD1-NEXT: model.reduce_scatter stage 0 from slot 1
//
// ZeRO-3: stage 0's tie slot (2) is gathered once; the head reads it.
// ZERO3: stage_grad_slot = array<i64: 2, 0, 1, 0>
// ZERO3-SAME: stage_tie_slot = array<i64: 2, -1, -1, -1>
// ZERO3-SAME: stage_weight_slot = array<i64: 2, 0, 1, 0>
// ZERO3-SAME: all_gather_bytes_per_micro_batch = 1536
// ZERO3-LABEL: func.func @train_step
// ZERO3: model.all_gather stage 0 into slot 2
// ZERO3-NOT: model.all_gather stage 0
// ZERO3: model.get_parameter @emb {model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO3: model.clear_grads stage 0 slot 2 {model.backward}
// ZERO3: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO3: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.reduce_scatter stage 0 from slot 2
//
// One buffer of each kind: stages 1-3 share weight and gradient slot 0,
// stage 0 keeps slot 1 of each kind.
// ONE: stage_grad_slot = array<i64: 1, 0, 0, 0>
// ONE-SAME: stage_tie_slot = array<i64: 1, -1, -1, -1>
// ONE-SAME: stage_weight_slot = array<i64: 1, 0, 0, 0>
// ONE: model.get_parameter @emb {model.stage = 3 : i64, plan.slot = 1 : i64}
// ONE: model.clear_grads stage 0 slot 1 {model.backward}
// ONE: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// ONE: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 1 : i64}
// ONE-NEXT: model.reduce_scatter stage 0 from slot 1
model.parameter @emb : tensor<10x8xf32> {model.stage = 0 : i64}
model.parameter @w1 : tensor<8x8xf32> {model.stage = 1 : i64}
model.parameter @w2 : tensor<8x8xf32> {model.stage = 2 : i64}
model.parameter @g : tensor<8xf32> {model.stage = 3 : i64}
func.func @forward(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %e = model.get_parameter @emb {model.stage = 0 : i64} : tensor<10x8xf32>
  %x0 = model.gather %e[%tok] dim 0 {model.stage = 0 : i64} : tensor<10x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %w1 = model.get_parameter @w1 {model.stage = 1 : i64} : tensor<8x8xf32>
  %x1 = model.matmul %x0, %w1 {model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %w2 = model.get_parameter @w2 {model.stage = 2 : i64} : tensor<8x8xf32>
  %x2 = model.matmul %x1, %w2 {model.stage = 2 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %g = model.get_parameter @g {model.stage = 3 : i64} : tensor<8xf32>
  %x3 = model.mul %x2, %g {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %h = model.get_parameter @emb {model.stage = 3 : i64} : tensor<10x8xf32>
  %ht = model.transpose %h [1, 0] {model.stage = 3 : i64} : tensor<10x8xf32> -> tensor<8x10xf32>
  %logits = model.matmul %x3, %ht {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x10xf32> -> tensor<2x4x10xf32>
  %l = model.cross_entropy %logits, %tgt ignore_index -100 reduction mean {model.stage = 3 : i64} : tensor<2x4x10xf32>, tensor<2x4xi64> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// ALBERT-style: three layers (stages 1-3) run one block, whose weight @w
// each layer reads through a model.get_parameter of its own (an exporter's
// Identity copies kept one weight) and whose gain @g all read through one
// (so autodiff sums its gradients and accumulates once, in stage 1); the
// head @h is stage 4. dp = 2: stage 0 = @emb 80 -> 128, stage 1 = @w 64 +
// @g 16 -> 128, stage 4 = @h 80 -> 128; stages 2 and 3 hold nothing.
//
// ZERO1: stage_grad_slot = array<i64: -1, -1, -1, -1, -1>
// ZERO1: model.accumulate_grad @w, %{{.*}} {model.backward, model.stage = 3 : i64}
// ZERO1: model.accumulate_grad @w, %{{.*}} {model.backward, model.stage = 2 : i64}
// ZERO1: model.accumulate_grad @w, %{{.*}} {model.backward, model.stage = 1 : i64}
// ZERO1: model.accumulate_grad @g, %{{.*}} {model.backward, model.stage = 1 : i64}
//
// ZeRO-2: stage 1's own slot (2) is cleared before stage 3's backward, takes
// the three layers' additions, and is reduced once, after stage 1's.
// ZERO2: grad_slot_elements = array<i64: 128, 128, 128>
// ZERO2-SAME: stage_grad_slot = array<i64: 0, 2, -1, -1, 1>
// ZERO2-LABEL: func.func @train_step
// ZERO2: model.reduce_scatter stage 4 from slot 1
// ZERO2-NEXT: model.clear_grads stage 1 slot 2 {model.backward}
// ZERO2-NEXT: model.mul {{.*}}model.stage = 3 : i64
// ZERO2-NOT: model.clear_grads
// ZERO2: model.accumulate_grad @w, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO2-NOT: model.clear_grads
// ZERO2: model.accumulate_grad @w, %{{.*}} {model.backward, model.stage = 2 : i64, plan.slot = 2 : i64}
// ZERO2-NOT: model.clear_grads
// ZERO2: model.accumulate_grad @w, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 2 : i64}
// ZERO2-NEXT: model.accumulate_grad @g, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 2 : i64}
// ZERO2-NEXT: model.reduce_scatter stage 1 from slot 2
// ZERO2-NEXT: model.clear_grads stage 0 slot 0
//
// One gradient buffer: stages 0 and 4 share slot 0, stage 1 keeps slot 1.
// GRAD1: grad_slot_elements = array<i64: 128, 128>
// GRAD1-SAME: stage_grad_slot = array<i64: 0, 1, -1, -1, 0>
// GRAD1: model.reduce_scatter stage 4 from slot 0
// GRAD1-NEXT: model.clear_grads stage 1 slot 1 {model.backward}
// GRAD1: model.accumulate_grad @g, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 1 : i64}
// GRAD1-NEXT: model.reduce_scatter stage 1 from slot 1
//
// ZeRO-3: stage 1's tie slot (2) is gathered once, before stage 1's forward;
// stages 2 and 3 read @w and @g there, forward and backward.
// ZERO3: stage_tie_slot = array<i64: -1, 2, -1, -1, -1>
// ZERO3-SAME: stage_weight_slot = array<i64: 0, 2, -1, -1, 1>
// ZERO3: weight_slot_elements = array<i64: 128, 128, 128>
// ZERO3-LABEL: func.func @train_step
// ZERO3: model.all_gather stage 1 into slot 2
// ZERO3-NOT: model.all_gather stage 1
// ZERO3: model.get_parameter @w {model.stage = 2 : i64, plan.slot = 2 : i64}
// ZERO3: model.get_parameter @g {model.stage = 2 : i64, plan.slot = 2 : i64}
// ZERO3: model.get_parameter @w {model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO3: model.get_parameter @g {model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO3: model.clear_grads stage 1 slot 2 {model.backward}
// ZERO3: model.accumulate_grad @g, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.reduce_scatter stage 1 from slot 2
//
// ONE: stage_grad_slot = array<i64: 0, 1, -1, -1, 0>
// ONE-SAME: stage_tie_slot = array<i64: -1, 1, -1, -1, -1>
// ONE-SAME: stage_weight_slot = array<i64: 0, 1, -1, -1, 0>
// ONE: model.all_gather stage 1 into slot 1
// ONE: model.all_gather stage 4 into slot 0
// ONE: model.clear_grads stage 1 slot 1 {model.backward}
// ONE: model.reduce_scatter stage 1 from slot 1
model.parameter @emb : tensor<10x8xf32> {model.stage = 0 : i64}
model.parameter @w : tensor<8x8xf32> {model.stage = 1 : i64}
model.parameter @g : tensor<8xf32> {model.stage = 1 : i64}
model.parameter @h : tensor<8x10xf32> {model.stage = 4 : i64}
func.func @forward(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %e = model.get_parameter @emb {model.stage = 0 : i64} : tensor<10x8xf32>
  %x0 = model.gather %e[%tok] dim 0 {model.stage = 0 : i64} : tensor<10x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %g = model.get_parameter @g {model.stage = 1 : i64} : tensor<8xf32>
  %w1 = model.get_parameter @w {model.stage = 1 : i64} : tensor<8x8xf32>
  %m1 = model.matmul %x0, %w1 {model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %x1 = model.mul %m1, %g {model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %w2 = model.get_parameter @w {model.stage = 2 : i64} : tensor<8x8xf32>
  %m2 = model.matmul %x1, %w2 {model.stage = 2 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %x2 = model.mul %m2, %g {model.stage = 2 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %w3 = model.get_parameter @w {model.stage = 3 : i64} : tensor<8x8xf32>
  %m3 = model.matmul %x2, %w3 {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %x3 = model.mul %m3, %g {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %h = model.get_parameter @h {model.stage = 4 : i64} : tensor<8x10xf32>
  %logits = model.matmul %x3, %h {model.stage = 4 : i64} : tensor<2x4x8xf32>, tensor<8x10xf32> -> tensor<2x4x10xf32>
  %l = model.cross_entropy %logits, %tgt ignore_index -100 reduction mean {model.stage = 4 : i64} : tensor<2x4x10xf32>, tensor<2x4xi64> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// One stage in all (the tied head in the embedding's stage): no ties, one
// slot of each kind, one clear, one reduce-scatter, one gather.
// ZERO1: stage_grad_slot = array<i64: -1>
// ZERO2: grad_slot_elements = array<i64: 192>
// ZERO2-SAME: stage_grad_slot = array<i64: 0>
// ZERO2-LABEL: func.func @train_step
// ZERO2-COUNT-1: model.clear_grads stage 0 slot 0
// ZERO2-NOT: model.clear_grads
// ZERO2: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// ZERO2: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// ZERO2-NEXT: model.reduce_scatter stage 0 from slot 0
// GRAD1: stage_grad_slot = array<i64: 0>
// ZERO3: stage_tie_slot = array<i64: -1>
// ZERO3-SAME: stage_weight_slot = array<i64: 0>
// ZERO3-LABEL: func.func @train_step
// ZERO3-COUNT-1: model.all_gather stage 0 into slot 0
// ZERO3-NOT: model.all_gather
// ZERO3: model.reduce_scatter stage 0 from slot 0
// ONE: stage_grad_slot = array<i64: 0>
// ONE-SAME: stage_tie_slot = array<i64: -1>
// ONE-SAME: stage_weight_slot = array<i64: 0>
model.parameter @emb : tensor<10x8xf32> {model.stage = 0 : i64}
model.parameter @w1 : tensor<8x8xf32> {model.stage = 0 : i64}
func.func @forward(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %e = model.get_parameter @emb {model.stage = 0 : i64} : tensor<10x8xf32>
  %x0 = model.gather %e[%tok] dim 0 {model.stage = 0 : i64} : tensor<10x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %w1 = model.get_parameter @w1 {model.stage = 0 : i64} : tensor<8x8xf32>
  %x1 = model.matmul %x0, %w1 {model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %h = model.get_parameter @emb {model.stage = 0 : i64} : tensor<10x8xf32>
  %ht = model.transpose %h [1, 0] {model.stage = 0 : i64} : tensor<10x8xf32> -> tensor<8x10xf32>
  %logits = model.matmul %x1, %ht {model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<8x10xf32> -> tensor<2x4x10xf32>
  %l = model.cross_entropy %logits, %tgt ignore_index -100 reduction mean {model.stage = 0 : i64} : tensor<2x4x10xf32>, tensor<2x4xi64> -> tensor<f32>
  return %l : tensor<f32>
}
