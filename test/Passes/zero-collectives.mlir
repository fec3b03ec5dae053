// Tests the collectives fastllm-zero-collectives places in a four-stage
// step, that fastllm-verify-collectives accepts them, and the traffic
// fastllm-count-traffic records (docs/DESIGN.md section 3). Stage 0 holds the embedding @e (read again
// by the stage-3 head: a tied weight) and a scale @s whose gradient reads
// it; stages 1 and 2 hold @w1 and @w2; stage 3 holds @w3 and @g. Every
// stage's backward reads its weights. With one shared weight buffer
// (num-weight-buffers=1) nothing can be prefetched: every gather is waited
// at once, and only the tied stage 0 keeps its own slot.
//
// RUN: fastllm-opt %s --fastllm-zero-layout='dp=2' --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=ZERO1 --implicit-check-not=model.all_gather \
// RUN:       --implicit-check-not=model.reduce_scatter --implicit-check-not=model.wait --implicit-check-not=model.clear_grads
// RUN: fastllm-opt %s --fastllm-zero-layout='dp=2 zero-stage=2' --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=ZERO2 --implicit-check-not=model.all_gather
// RUN: fastllm-opt %s --fastllm-zero-layout='dp=2 zero-stage=2 num-grad-buffers=1' --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=GRAD1 --implicit-check-not=model.all_gather
// RUN: fastllm-opt %s --fastllm-zero-layout='dp=2 zero-stage=3' --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=ZERO3 --implicit-check-not=model.all_gather
// RUN: fastllm-opt %s --fastllm-zero-layout='dp=1 zero-stage=3' --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=DP1
// RUN: fastllm-opt %s --fastllm-zero-layout='dp=2 zero-stage=3 num-weight-buffers=1' --fastllm-zero-collectives --fastllm-verify-collectives --fastllm-count-traffic \
// RUN:   | FileCheck %s --check-prefix=ONEW

// One shared weight slot (0, sized for stage 3: 128) and stage 0's own
// (1, 192). Forward: 192 + 64 + 64 + 128; backward: stage 3 still holds slot
// 0, stages 2 and 1 are gathered again (64 + 64), stage 0 holds its own:
// 576 elements = 2304 B per micro-batch.
// ONEW: stage_weight_slot = array<i64: 1, 0, 0, 0>
// ONEW-SAME: weight_slot_elements = array<i64: 128, 192>
// ONEW-SAME: all_gather_bytes_per_micro_batch = 2304 : i64
// ONEW: %[[G0:.*]] = model.all_gather stage 0 into slot 1
// ONEW-NEXT: model.wait %[[G0]]
// ONEW: %[[G1:.*]] = model.all_gather stage 1 into slot 0
// ONEW-NEXT: model.wait %[[G1]]
// ONEW: %[[G2:.*]] = model.all_gather stage 2 into slot 0
// ONEW-NEXT: model.wait %[[G2]]
// ONEW: %[[G3:.*]] = model.all_gather stage 3 into slot 0
// ONEW-NEXT: model.wait %[[G3]]
// ONEW: %[[B2:.*]] = model.all_gather stage 2 into slot 0 {model.backward}
// ONEW-NEXT: model.wait %[[B2]]
// ONEW: %[[B1:.*]] = model.all_gather stage 1 into slot 0 {model.backward}
// ONEW-NEXT: model.wait %[[B1]]
// ONEW-NOT: model.all_gather

// The layout with dp = 2 (stages padded to 64 elements, tensors aligned to
// 16): stage 0 = @e 128 + @s 8 -> 16 = 144 -> 192; stage 1 = @w1 64;
// stage 2 = @w2 64; stage 3 = @w3 64 + @g 16 = 80 -> 128. 448 elements =
// 1792 B in all.

// ZeRO-1: nothing in the step; the runtime reduce-scatters and all-gathers
// the whole 1792 B once per step.
// ZERO1: param_elements = 448 : i64
// ZERO1-SAME: stage_elements = array<i64: 192, 64, 64, 128>
// ZERO1-SAME: stage_grad_slot = array<i64: -1, -1, -1, -1>
// ZERO1-SAME: all_gather_bytes_per_micro_batch = 0 : i64
// ZERO1-SAME: all_gather_bytes_per_step = 1792 : i64
// ZERO1-SAME: reduce_scatter_bytes_per_micro_batch = 0 : i64
// ZERO1-SAME: reduce_scatter_bytes_per_step = 1792 : i64
// ZERO1-LABEL: func.func @train_step
// ZERO1: model.accumulate_grad @e, %{{.*}} {model.backward} : tensor<16x8xf32>
// ZERO1-NEXT: return

// ZeRO-2, two gradient slots round-robin: stages 0 and 2 share slot 0 (192
// elements, for stage 0), stages 1 and 3 slot 1 (128, for stage 3). Every
// stage is reduce-scattered once per micro-batch: 448 * 4 B = 1792 B; the
// weights are all-gathered once per step.
// ZERO2: grad_slot_elements = array<i64: 192, 128>
// ZERO2-SAME: stage_elements = array<i64: 192, 64, 64, 128>
// ZERO2-SAME: stage_grad_slot = array<i64: 0, 1, 0, 1>
// ZERO2-SAME: stage_weight_slot = array<i64: -1, -1, -1, -1>
// ZERO2-SAME: all_gather_bytes_per_micro_batch = 0 : i64
// ZERO2-SAME: all_gather_bytes_per_step = 1792 : i64
// ZERO2-SAME: reduce_scatter_bytes_per_micro_batch = 1792 : i64
// ZERO2-SAME: reduce_scatter_bytes_per_step = 0 : i64
// ZERO2-LABEL: func.func @train_step
// ZERO2: %[[LOSS:.*]] = model.cross_entropy
// ZERO2-NEXT: model.constant {model.backward
// Stage 3's backward: clear its slot first, reduce-scatter it once done.
// ZERO2-NEXT: model.clear_grads stage 3 slot 1 {model.backward}
// ZERO2-NEXT: model.cross_entropy_grad
// ZERO2: model.accumulate_grad @g, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// ZERO2: model.accumulate_grad @w3, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// ZERO2-NEXT: %[[RS3:.*]] = model.reduce_scatter stage 3 from slot 1 {model.backward}
// Stage 2's slot 0 is free: nothing to wait for.
// ZERO2-NEXT: model.clear_grads stage 2 slot 0 {model.backward}
// ZERO2-NEXT: model.transpose
// ZERO2: model.accumulate_grad @w2, %{{.*}} {model.backward, model.stage = 2 : i64, plan.slot = 0 : i64}
// ZERO2-NEXT: %[[RS2:.*]] = model.reduce_scatter stage 2 from slot 0 {model.backward}
// Stage 1 reuses slot 1: stage 3's reduce-scatter must be done first.
// ZERO2-NEXT: model.wait %[[RS3]] {model.backward}
// ZERO2-NEXT: model.clear_grads stage 1 slot 1 {model.backward}
// ZERO2-NEXT: model.transpose
// ZERO2: model.accumulate_grad @w1, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 1 : i64}
// ZERO2-NEXT: %[[RS1:.*]] = model.reduce_scatter stage 1 from slot 1 {model.backward}
// Stage 0 reuses slot 0, after stage 2's reduce-scatter.
// ZERO2-NEXT: model.wait %[[RS2]] {model.backward}
// ZERO2-NEXT: model.clear_grads stage 0 slot 0 {model.backward}
// ZERO2-NEXT: model.mul
// ZERO2: model.accumulate_grad @s, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// ZERO2-NEXT: model.accumulate_grad @e, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// The last reduce-scatters are waited for at the end of the step.
// ZERO2-NEXT: %[[RS0:.*]] = model.reduce_scatter stage 0 from slot 0{{$}}
// ZERO2-NEXT: model.wait %[[RS1]]{{$}}
// ZERO2-NEXT: model.wait %[[RS0]]{{$}}
// ZERO2-NEXT: return %[[LOSS]]

// One gradient slot (192 elements): each reduce-scatter is waited before the
// next stage clears the slot.
// GRAD1: grad_slot_elements = array<i64: 192>
// GRAD1-SAME: stage_grad_slot = array<i64: 0, 0, 0, 0>
// GRAD1-SAME: reduce_scatter_bytes_per_micro_batch = 1792 : i64
// GRAD1-LABEL: func.func @train_step
// GRAD1: model.clear_grads stage 3 slot 0 {model.backward}
// GRAD1-NEXT: model.cross_entropy_grad
// GRAD1: model.accumulate_grad @w3, %{{.*}} plan.slot = 0 : i64}
// GRAD1-NEXT: %[[RS3:.*]] = model.reduce_scatter stage 3 from slot 0 {model.backward}
// GRAD1-NEXT: model.wait %[[RS3]] {model.backward}
// GRAD1-NEXT: model.clear_grads stage 2 slot 0 {model.backward}
// GRAD1: model.accumulate_grad @w2, %{{.*}} plan.slot = 0 : i64}
// GRAD1-NEXT: %[[RS2:.*]] = model.reduce_scatter stage 2 from slot 0 {model.backward}
// GRAD1-NEXT: model.wait %[[RS2]] {model.backward}
// GRAD1-NEXT: model.clear_grads stage 1 slot 0 {model.backward}
// GRAD1: model.accumulate_grad @w1, %{{.*}} plan.slot = 0 : i64}
// GRAD1-NEXT: %[[RS1:.*]] = model.reduce_scatter stage 1 from slot 0 {model.backward}
// GRAD1-NEXT: model.wait %[[RS1]] {model.backward}
// GRAD1-NEXT: model.clear_grads stage 0 slot 0 {model.backward}
// GRAD1: model.accumulate_grad @e, %{{.*}} plan.slot = 0 : i64}
// GRAD1-NEXT: %[[RS0:.*]] = model.reduce_scatter stage 0 from slot 0{{$}}
// GRAD1-NEXT: model.wait %[[RS0]]{{$}}
// GRAD1-NEXT: return

// ZeRO-3: stage 0, whose embedding the head reads, keeps weight slot 2 (192
// elements) of its own, gathered once and read by the head too (its tie
// slot); stages 1-3 share two weight slots round-robin (slot 0: stages 1 and
// 3, 128 elements; slot 1: stage 2, 64). Gradient slots as for ZeRO-2.
// All-gathers per micro-batch: each stage's forward (448 elements) and
// stage 1 again for its backward, stage 3 having overwritten slot 0
// meanwhile: 512 elements = 2048 B. Stages 0, 2 and 3 still hold their slot
// when their backward starts: no second gather.
// ZERO3: grad_slot_elements = array<i64: 192, 128>
// ZERO3-SAME: stage_grad_slot = array<i64: 0, 1, 0, 1>
// ZERO3-SAME: stage_tie_slot = array<i64: 2, -1, -1, -1>
// ZERO3-SAME: stage_weight_slot = array<i64: 2, 0, 1, 0>
// ZERO3-SAME: weight_slot_elements = array<i64: 128, 64, 192>
// ZERO3-SAME: all_gather_bytes_per_micro_batch = 2048 : i64
// ZERO3-SAME: all_gather_bytes_per_step = 0 : i64
// ZERO3-SAME: reduce_scatter_bytes_per_micro_batch = 1792 : i64
// ZERO3-SAME: reduce_scatter_bytes_per_step = 0 : i64
// ZERO3-LABEL: func.func @train_step
// Stage 0's weights arrive before its first op; stage 1's are prefetched
// during stage 0's compute.
// ZERO3-NEXT: %[[E0:.*]] = model.get_parameter @e {model.stage = 0 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: %[[AG0:.*]] = model.all_gather stage 0 into slot 2{{$}}
// ZERO3-NEXT: model.wait %[[AG0]]{{$}}
// ZERO3-NEXT: %[[AG1:.*]] = model.all_gather stage 1 into slot 0{{$}}
// ZERO3-NEXT: %[[X0:.*]] = model.gather %[[E0]][
// ZERO3-NEXT: %[[S:.*]] = model.get_parameter @s {model.stage = 0 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.mul %[[X0]], %[[S]] {model.stage = 0 : i64}
// Each later stage waits for its weights and prefetches the next stage's.
// ZERO3-NEXT: %[[W1:.*]] = model.get_parameter @w1 {model.stage = 1 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.wait %[[AG1]]{{$}}
// ZERO3-NEXT: %[[AG2:.*]] = model.all_gather stage 2 into slot 1{{$}}
// ZERO3-NEXT: model.matmul %{{.*}}, %[[W1]] {model.stage = 1 : i64}
// ZERO3-NEXT: %[[W2:.*]] = model.get_parameter @w2 {model.stage = 2 : i64, plan.slot = 1 : i64}
// ZERO3-NEXT: model.wait %[[AG2]]{{$}}
// Stage 3 goes into slot 0: stage 1's forward is over.
// ZERO3-NEXT: %[[AG3:.*]] = model.all_gather stage 3 into slot 0{{$}}
// ZERO3-NEXT: model.matmul %{{.*}}, %[[W2]] {model.stage = 2 : i64}
// ZERO3-NEXT: %[[W3:.*]] = model.get_parameter @w3 {model.stage = 3 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.wait %[[AG3]]{{$}}
// ZERO3-NEXT: model.matmul %{{.*}}, %[[W3]] {model.stage = 3 : i64}
// ZERO3-NEXT: model.get_parameter @g {model.stage = 3 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.mul
// The head reads the tied embedding from stage 0's slot, gathered already.
// ZERO3-NEXT: %[[E3:.*]] = model.get_parameter @e {model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.transpose %[[E3]] [1, 0] {model.stage = 3 : i64}
// ZERO3: %[[LOSS:.*]] = model.cross_entropy
// ZERO3-NEXT: model.constant {model.backward
// ZERO3-NEXT: model.clear_grads stage 3 slot 1 {model.backward}
// ZERO3-NEXT: model.cross_entropy_grad
// ZERO3: model.accumulate_grad @w3, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// ZERO3-NEXT: %[[RS3:.*]] = model.reduce_scatter stage 3 from slot 1 {model.backward}
// ZERO3-NEXT: model.clear_grads stage 2 slot 0 {model.backward}
// Stage 1's weights are gathered again into slot 0 (stage 3's backward is
// over) while stage 2's backward runs.
// ZERO3-NEXT: %[[RG1:.*]] = model.all_gather stage 1 into slot 0 {model.backward}
// ZERO3-NEXT: model.transpose %[[W2]] [1, 0] {model.backward, model.stage = 2 : i64}
// ZERO3: model.accumulate_grad @w2, %{{.*}} {model.backward, model.stage = 2 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: %[[RS2:.*]] = model.reduce_scatter stage 2 from slot 0 {model.backward}
// ZERO3-NEXT: model.wait %[[RG1]] {model.backward}
// ZERO3-NEXT: model.wait %[[RS3]] {model.backward}
// ZERO3-NEXT: model.clear_grads stage 1 slot 1 {model.backward}
// ZERO3-NEXT: model.transpose %[[W1]] [1, 0] {model.backward, model.stage = 1 : i64}
// ZERO3: model.accumulate_grad @w1, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 1 : i64}
// ZERO3-NEXT: %[[RS1:.*]] = model.reduce_scatter stage 1 from slot 1 {model.backward}
// ZERO3-NEXT: model.wait %[[RS2]] {model.backward}
// ZERO3-NEXT: model.clear_grads stage 0 slot 0 {model.backward}
// ZERO3-NEXT: model.mul %{{.*}}, %[[S]] {model.backward, model.stage = 0 : i64}
// ZERO3: model.accumulate_grad @e, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: %[[RS0:.*]] = model.reduce_scatter stage 0 from slot 0{{$}}
// ZERO3-NEXT: model.wait %[[RS1]]{{$}}
// ZERO3-NEXT: model.wait %[[RS0]]{{$}}
// ZERO3-NEXT: return %[[LOSS]]

// One rank moves nothing, whatever the collectives; stages are padded to 32
// elements: 144 -> 160, 64, 64, 80 -> 96.
// DP1: stage_elements = array<i64: 160, 64, 64, 96>
// DP1-SAME: all_gather_bytes_per_micro_batch = 0 : i64
// DP1-SAME: all_gather_bytes_per_step = 0 : i64
// DP1-SAME: reduce_scatter_bytes_per_micro_batch = 0 : i64
// DP1-SAME: reduce_scatter_bytes_per_step = 0 : i64
// DP1: model.all_gather stage 0 into slot 2
// DP1: model.reduce_scatter stage 0 from slot 0

model.parameter @e : tensor<16x8xf32> {model.stage = 0 : i64}
model.parameter @s : tensor<8xf32> {model.stage = 0 : i64}
model.parameter @w1 : tensor<8x8xf32> {model.stage = 1 : i64}
model.parameter @w2 : tensor<8x8xf32> {model.stage = 2 : i64}
model.parameter @w3 : tensor<8x8xf32> {model.stage = 3 : i64}
model.parameter @g : tensor<8xf32> {model.stage = 3 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  // Forward: stage 0 (embedding, scale), stages 1 and 2, stage 3 (the head,
  // tied to @e).
  %e = model.get_parameter @e : tensor<16x8xf32>
  %s = model.get_parameter @s : tensor<8xf32>
  %x0 = model.gather %e[%tok] dim 0 {model.stage = 0 : i64} : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %x = model.mul %x0, %s {model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %w1 = model.get_parameter @w1 : tensor<8x8xf32>
  %h1 = model.matmul %x, %w1 {model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %w2 = model.get_parameter @w2 : tensor<8x8xf32>
  %h2 = model.matmul %h1, %w2 {model.stage = 2 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %w3 = model.get_parameter @w3 : tensor<8x8xf32>
  %h3 = model.matmul %h2, %w3 {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %g = model.get_parameter @g : tensor<8xf32>
  %h4 = model.mul %h3, %g {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %et = model.transpose %e [1, 0] {model.stage = 3 : i64} : tensor<16x8xf32> -> tensor<8x16xf32>
  %lg = model.matmul %h4, %et {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  %loss = model.cross_entropy %lg, %tgt ignore_index -100 reduction mean {model.stage = 3 : i64} : tensor<2x4x16xf32>, tensor<2x4xi64> -> tensor<f32>
  // Backward of stage 3: the loss, the head (a gradient of @e), @g, @w3.
  %one = model.constant {model.backward} dense<1.000000e+00> : tensor<f32>
  %dlg = model.cross_entropy_grad %lg, %tgt, %one ignore_index -100 reduction mean {model.backward, model.stage = 3 : i64} : tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<f32>
  %ett = model.transpose %et [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x16xf32> -> tensor<16x8xf32>
  %dh4 = model.matmul %dlg, %ett {model.backward, model.stage = 3 : i64} : tensor<2x4x16xf32>, tensor<16x8xf32> -> tensor<2x4x8xf32>
  %h4r = model.reshape %h4 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %dlgr = model.reshape %dlg {model.backward, model.stage = 3 : i64} : tensor<2x4x16xf32> -> tensor<8x16xf32>
  %h4t = model.transpose %h4r [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %det = model.matmul %h4t, %dlgr {model.backward, model.stage = 3 : i64} : tensor<8x8xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %de_head = model.transpose %det [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x16xf32> -> tensor<16x8xf32>
  %dh3 = model.mul %dh4, %g {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %dg0 = model.mul %dh4, %h3 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %dg = model.reduce_sum %dg0 dims [0, 1] {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32> -> tensor<8xf32>
  model.accumulate_grad @g, %dg {model.backward} : tensor<8xf32>
  %w3t = model.transpose %w3 [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %dh2 = model.matmul %dh3, %w3t {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %h2r = model.reshape %h2 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %dh3r = model.reshape %dh3 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %h2t = model.transpose %h2r [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %dw3 = model.matmul %h2t, %dh3r {model.backward, model.stage = 3 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  model.accumulate_grad @w3, %dw3 {model.backward} : tensor<8x8xf32>
  // Backward of stage 2.
  %w2t = model.transpose %w2 [1, 0] {model.backward, model.stage = 2 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %dh1 = model.matmul %dh2, %w2t {model.backward, model.stage = 2 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %h1r = model.reshape %h1 {model.backward, model.stage = 2 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %dh2r = model.reshape %dh2 {model.backward, model.stage = 2 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %h1t = model.transpose %h1r [1, 0] {model.backward, model.stage = 2 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %dw2 = model.matmul %h1t, %dh2r {model.backward, model.stage = 2 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  model.accumulate_grad @w2, %dw2 {model.backward} : tensor<8x8xf32>
  // Backward of stage 1.
  %w1t = model.transpose %w1 [1, 0] {model.backward, model.stage = 1 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %dx = model.matmul %dh1, %w1t {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %xr = model.reshape %x {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %dh1r = model.reshape %dh1 {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %xt = model.transpose %xr [1, 0] {model.backward, model.stage = 1 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %dw1 = model.matmul %xt, %dh1r {model.backward, model.stage = 1 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  model.accumulate_grad @w1, %dw1 {model.backward} : tensor<8x8xf32>
  // Backward of stage 0: @s's gradient reads @s; the embedding's two uses
  // add up (the sum has no stage: it takes its accumulation's).
  %dx0 = model.mul %dx, %s {model.backward, model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %ds0 = model.mul %dx, %x0 {model.backward, model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %ds = model.reduce_sum %ds0 dims [0, 1] {model.backward, model.stage = 0 : i64} : tensor<2x4x8xf32> -> tensor<8xf32>
  %de_emb = model.gather_grad %dx0 at %tok dim 0 {model.backward, model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
  %de = model.add %de_head, %de_emb {model.backward} : tensor<16x8xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  model.accumulate_grad @s, %ds {model.backward} : tensor<8xf32>
  model.accumulate_grad @e, %de {model.backward} : tensor<16x8xf32>
  return %loss : tensor<f32>
}
