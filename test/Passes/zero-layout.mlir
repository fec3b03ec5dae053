// Tests fastllm-zero-layout's plan (docs/DESIGN.md section 3): the flat layout
// (tensors aligned to 16 elements, stages padded to a multiple of dp * 32
// elements), the gradient and weight slots (round-robin over the stages
// that have parameters, each sized for the largest stage it serves, never
// more than there are stages to serve), ZeRO-3's own slot for a stage whose
// parameters a later stage reads (the tie slot), the stage of every op and
// the slot of every read and accumulation, and the stage order ZeRO-2/3
// need.
//
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=4 zero-stage=2' \
// RUN:   | FileCheck %s --check-prefix=ZERO2
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=4 zero-stage=2 num-grad-buffers=1' \
// RUN:   | FileCheck %s --check-prefix=GRAD1
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=4 zero-stage=2 num-grad-buffers=5' \
// RUN:   | FileCheck %s --check-prefix=GRAD5
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=4 zero-stage=3' \
// RUN:   | FileCheck %s --check-prefix=ZERO3
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=4 zero-stage=3 num-weight-buffers=1' \
// RUN:   | FileCheck %s --check-prefix=WEIGHT1
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=4 zero-stage=3 num-weight-buffers=5' \
// RUN:   | FileCheck %s --check-prefix=WEIGHT5
// RUN: fastllm-opt %s --split-input-file --verify-diagnostics --fastllm-zero-layout='dp=3 zero-stage=2' \
// RUN:   | FileCheck %s --check-prefix=DP3
// The whole messages of the order errors, which name the ZeRO stage.
// RUN: not fastllm-opt %s --split-input-file --fastllm-zero-layout='dp=4 zero-stage=2' 2>&1 >/dev/null \
// RUN:   | FileCheck %s --check-prefix=ORDER
// ZeRO-1 reduces once per step: it takes the stages in any order.
// RUN: sed -n '/^\/\/ BEGIN ORDER$/,$p' %s | fastllm-opt --split-input-file --fastllm-zero-layout='dp=4' \
// RUN:   | FileCheck %s --check-prefix=ZERO1

// Four stages; the head (stage 3) reads the embedding @emb of stage 0.
// dp = 4: stages are padded to 128 elements.
//   stage 0: @emb 80, @pos 8 -> 16: 96 -> 128 (offset 0)
//   stage 1: @w1 64, @b1 8 -> 16: 80 -> 128 (offset 128)
//   stage 2: @w2 256 (offset 256)
//   stage 3: @w3 256, @lb 40 -> 48: 304 -> 384 (offset 512)
// 896 elements in all.
// ZERO2-LABEL: module attributes
// ZERO2-SAME: grad_slot_elements = array<i64: 256, 384>
// ZERO2-SAME: param_elements = 896 : i64
// ZERO2-SAME: stage_elements = array<i64: 128, 128, 256, 384>
// ZERO2-SAME: stage_grad_slot = array<i64: 0, 1, 0, 1>
// ZERO2-SAME: stage_offsets = array<i64: 0, 128, 256, 512>
// ZERO2-SAME: stage_tie_slot = array<i64: -1, -1, -1, -1>, stage_weight_slot = array<i64: -1, -1, -1, -1>
// ZERO2-SAME: weight_slot_elements = array<i64>
// ZERO2-NEXT: model.parameter @emb {{.*}} {model.stage = 0 : i64, plan.offset = 0 : i64}
// ZERO2-NEXT: model.parameter @pos {{.*}} {model.stage = 0 : i64, plan.offset = 80 : i64}
// ZERO2-NEXT: model.parameter @w1 {{.*}} {model.stage = 1 : i64, plan.offset = 128 : i64}
// ZERO2-NEXT: model.parameter @b1 {{.*}} {model.stage = 1 : i64, plan.offset = 192 : i64}
// ZERO2-NEXT: model.parameter @w2 {{.*}} {model.stage = 2 : i64, plan.offset = 256 : i64}
// ZERO2-NEXT: model.parameter @w3 {{.*}} {model.stage = 3 : i64, plan.offset = 512 : i64}
// ZERO2-NEXT: model.parameter @lb {{.*}} {model.stage = 3 : i64, plan.offset = 768 : i64}
// ZeRO-2 reads no slot: the reads take their users' stage and are kept.
// ZERO2: model.get_parameter @emb {model.stage = 0 : i64} : tensor<10x8xf32>
// ZERO2-NEXT: model.get_parameter @pos {model.stage = 0 : i64} : tensor<8xf32>
// ZERO2: model.get_parameter @w1 {model.stage = 1 : i64} : tensor<8x8xf32>
// ZERO2: model.get_parameter @lb {model.stage = 3 : i64} : tensor<4x10xf32>
// The seed takes the stage of the op after it, the sum of the tied
// embedding's two gradients that of its accumulation.
// ZERO2: model.constant {model.backward, model.stage = 3 : i64}
// ZERO2: model.accumulate_grad @lb, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// ZERO2: model.accumulate_grad @w3, %{{.*}} {model.backward, model.stage = 3 : i64, plan.slot = 1 : i64}
// ZERO2: model.accumulate_grad @w2, %{{.*}} {model.backward, model.stage = 2 : i64, plan.slot = 0 : i64}
// ZERO2: model.accumulate_grad @b1, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 1 : i64}
// ZERO2: model.accumulate_grad @w1, %{{.*}} {model.backward, model.stage = 1 : i64, plan.slot = 1 : i64}
// ZERO2: model.add %{{.*}}, %{{.*}} {model.backward, model.stage = 0 : i64} : tensor<10x8xf32>
// ZERO2: model.accumulate_grad @pos, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// ZERO2: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}

// One gradient slot, for the largest stage.
// GRAD1-LABEL: module attributes
// GRAD1-SAME: grad_slot_elements = array<i64: 384>
// GRAD1-SAME: stage_grad_slot = array<i64: 0, 0, 0, 0>
// GRAD1: model.accumulate_grad @lb, %{{.*}} plan.slot = 0 : i64}

// Five gradient buffers asked for, four stages to serve: four slots.
// GRAD5-LABEL: module attributes
// GRAD5-SAME: grad_slot_elements = array<i64: 128, 128, 256, 384>
// GRAD5-SAME: stage_grad_slot = array<i64: 0, 1, 2, 3>
// GRAD5: model.accumulate_grad @lb, %{{.*}} plan.slot = 3 : i64}
// GRAD5: model.accumulate_grad @w2, %{{.*}} plan.slot = 2 : i64}
// GRAD5: model.accumulate_grad @emb, %{{.*}} plan.slot = 0 : i64}

// ZeRO-3: stage 0 keeps a weight slot of its own, 2 (128 elements), which
// the head reads too; stages 1-3 share two weight slots round-robin: slot 0
// for stages 1 and 3 (384 elements), slot 1 for stage 2 (256). Gradient
// slots as for ZeRO-2. Each stage reads through a model.get_parameter of
// its own, placed before its first use and marked with its slot.
// ZERO3-LABEL: module attributes
// ZERO3-SAME: grad_slot_elements = array<i64: 256, 384>
// ZERO3-SAME: stage_grad_slot = array<i64: 0, 1, 0, 1>
// ZERO3-SAME: stage_tie_slot = array<i64: 2, -1, -1, -1>, stage_weight_slot = array<i64: 2, 0, 1, 0>
// ZERO3-SAME: weight_slot_elements = array<i64: 384, 256, 128>
// ZERO3-LABEL: func.func @train_step
// ZERO3-NEXT: %[[E0:.*]] = model.get_parameter @emb {model.stage = 0 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.gather %[[E0]][
// ZERO3-NEXT: %[[P:.*]] = model.get_parameter @pos {model.stage = 0 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.add %{{.*}}, %[[P]] {model.stage = 0 : i64}
// ZERO3-NEXT: %[[W1:.*]] = model.get_parameter @w1 {model.stage = 1 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.matmul %{{.*}}, %[[W1]] {model.stage = 1 : i64}
// ZERO3-NEXT: model.get_parameter @b1 {model.stage = 1 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.add
// ZERO3-NEXT: model.get_parameter @w2 {model.stage = 2 : i64, plan.slot = 1 : i64}
// ZERO3-NEXT: model.matmul
// ZERO3-NEXT: %[[W3:.*]] = model.get_parameter @w3 {model.stage = 3 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.matmul
// ZERO3-NEXT: %[[E3:.*]] = model.get_parameter @emb {model.stage = 3 : i64, plan.slot = 2 : i64}
// ZERO3-NEXT: model.transpose %[[E3]] [1, 0] {model.stage = 3 : i64}
// ZERO3-NEXT: model.matmul
// ZERO3-NEXT: model.get_parameter @lb {model.stage = 3 : i64, plan.slot = 0 : i64}
// ZERO3-NEXT: model.add
// The backward reads the forward's model.get_parameter of its stage.
// ZERO3: model.transpose %[[W3]] [1, 0] {model.backward, model.stage = 3 : i64}
// ZERO3: model.transpose %[[W1]] [1, 0] {model.backward, model.stage = 1 : i64}
// ZERO3: model.accumulate_grad @emb, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}

// One weight buffer: stages 1-3 share slot 0, sized for stage 3; stage 0
// keeps slot 1.
// WEIGHT1-LABEL: module attributes
// WEIGHT1-SAME: stage_tie_slot = array<i64: 1, -1, -1, -1>, stage_weight_slot = array<i64: 1, 0, 0, 0>
// WEIGHT1-SAME: weight_slot_elements = array<i64: 384, 128>
// WEIGHT1: model.get_parameter @emb {model.stage = 0 : i64, plan.slot = 1 : i64}
// WEIGHT1: model.get_parameter @w2 {model.stage = 2 : i64, plan.slot = 0 : i64}
// WEIGHT1: model.get_parameter @emb {model.stage = 3 : i64, plan.slot = 1 : i64}

// Five weight buffers asked for, three stages to share them: three shared
// slots, and stage 0's own.
// WEIGHT5-LABEL: module attributes
// WEIGHT5-SAME: stage_tie_slot = array<i64: 3, -1, -1, -1>, stage_weight_slot = array<i64: 3, 0, 1, 2>
// WEIGHT5-SAME: weight_slot_elements = array<i64: 128, 256, 384, 128>
// WEIGHT5: model.get_parameter @w3 {model.stage = 3 : i64, plan.slot = 2 : i64}
// WEIGHT5: model.get_parameter @emb {model.stage = 3 : i64, plan.slot = 3 : i64}

// dp = 3: stages are padded to 96 elements (a multiple of the 16-element
// tensor alignment too): 96 -> 96, 80 -> 96, 256 -> 288, 304 -> 384.
// DP3-LABEL: module attributes
// DP3-SAME: data_parallel = 3 : i64
// DP3-SAME: grad_slot_elements = array<i64: 288, 384>
// DP3-SAME: param_elements = 864 : i64
// DP3-SAME: stage_elements = array<i64: 96, 96, 288, 384>
// DP3-SAME: stage_offsets = array<i64: 0, 96, 192, 480>
// DP3-NEXT: model.parameter @emb {{.*}}plan.offset = 0 : i64}
// DP3-NEXT: model.parameter @pos {{.*}}plan.offset = 80 : i64}
// DP3-NEXT: model.parameter @w1 {{.*}}plan.offset = 96 : i64}
// DP3-NEXT: model.parameter @b1 {{.*}}plan.offset = 160 : i64}
// DP3-NEXT: model.parameter @w2 {{.*}}plan.offset = 192 : i64}
// DP3-NEXT: model.parameter @w3 {{.*}}plan.offset = 480 : i64}
// DP3-NEXT: model.parameter @lb {{.*}}plan.offset = 736 : i64}

model.parameter @emb : tensor<10x8xf32> {model.stage = 0 : i64}
model.parameter @pos : tensor<8xf32> {model.stage = 0 : i64}
model.parameter @w1 : tensor<8x8xf32> {model.stage = 1 : i64}
model.parameter @b1 : tensor<8xf32> {model.stage = 1 : i64}
model.parameter @w2 : tensor<8x32xf32> {model.stage = 2 : i64}
model.parameter @w3 : tensor<32x8xf32> {model.stage = 3 : i64}
model.parameter @lb : tensor<4x10xf32> {model.stage = 3 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %0 = model.get_parameter @emb : tensor<10x8xf32>
  %1 = model.get_parameter @pos : tensor<8xf32>
  %2 = model.gather %0[%tok] dim 0 {model.stage = 0 : i64} : tensor<10x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %3 = model.add %2, %1 {model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %4 = model.get_parameter @w1 : tensor<8x8xf32>
  %5 = model.get_parameter @b1 : tensor<8xf32>
  %6 = model.matmul %3, %4 {model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %7 = model.add %6, %5 {model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %8 = model.get_parameter @w2 : tensor<8x32xf32>
  %9 = model.matmul %7, %8 {model.stage = 2 : i64} : tensor<2x4x8xf32>, tensor<8x32xf32> -> tensor<2x4x32xf32>
  %10 = model.get_parameter @w3 : tensor<32x8xf32>
  %11 = model.matmul %9, %10 {model.stage = 3 : i64} : tensor<2x4x32xf32>, tensor<32x8xf32> -> tensor<2x4x8xf32>
  %12 = model.transpose %0 [1, 0] {model.stage = 3 : i64} : tensor<10x8xf32> -> tensor<8x10xf32>
  %13 = model.matmul %11, %12 {model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x10xf32> -> tensor<2x4x10xf32>
  %14 = model.get_parameter @lb : tensor<4x10xf32>
  %15 = model.add %13, %14 {model.stage = 3 : i64} : tensor<2x4x10xf32>, tensor<4x10xf32> -> tensor<2x4x10xf32>
  %16 = model.cross_entropy %15, %tgt ignore_index -100 reduction mean {model.stage = 3 : i64} : tensor<2x4x10xf32>, tensor<2x4xi64> -> tensor<f32>
  %17 = model.constant {model.backward} dense<1.000000e+00> : tensor<f32>
  %18 = model.cross_entropy_grad %15, %tgt, %17 ignore_index -100 reduction mean {model.backward, model.stage = 3 : i64} : tensor<2x4x10xf32>, tensor<2x4xi64>, tensor<f32>
  %19 = model.reduce_sum %18 dims [0] {model.backward, model.stage = 3 : i64} : tensor<2x4x10xf32> -> tensor<4x10xf32>
  model.accumulate_grad @lb, %19 {model.backward} : tensor<4x10xf32>
  %20 = model.transpose %12 [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x10xf32> -> tensor<10x8xf32>
  %21 = model.matmul %18, %20 {model.backward, model.stage = 3 : i64} : tensor<2x4x10xf32>, tensor<10x8xf32> -> tensor<2x4x8xf32>
  %22 = model.reshape %11 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %23 = model.reshape %18 {model.backward, model.stage = 3 : i64} : tensor<2x4x10xf32> -> tensor<8x10xf32>
  %24 = model.transpose %22 [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %25 = model.matmul %24, %23 {model.backward, model.stage = 3 : i64} : tensor<8x8xf32>, tensor<8x10xf32> -> tensor<8x10xf32>
  %26 = model.transpose %25 [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x10xf32> -> tensor<10x8xf32>
  %27 = model.transpose %10 [1, 0] {model.backward, model.stage = 3 : i64} : tensor<32x8xf32> -> tensor<8x32xf32>
  %28 = model.matmul %21, %27 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32>, tensor<8x32xf32> -> tensor<2x4x32xf32>
  %29 = model.reshape %9 {model.backward, model.stage = 3 : i64} : tensor<2x4x32xf32> -> tensor<8x32xf32>
  %30 = model.reshape %21 {model.backward, model.stage = 3 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %31 = model.transpose %29 [1, 0] {model.backward, model.stage = 3 : i64} : tensor<8x32xf32> -> tensor<32x8xf32>
  %32 = model.matmul %31, %30 {model.backward, model.stage = 3 : i64} : tensor<32x8xf32>, tensor<8x8xf32> -> tensor<32x8xf32>
  model.accumulate_grad @w3, %32 {model.backward} : tensor<32x8xf32>
  %33 = model.transpose %8 [1, 0] {model.backward, model.stage = 2 : i64} : tensor<8x32xf32> -> tensor<32x8xf32>
  %34 = model.matmul %28, %33 {model.backward, model.stage = 2 : i64} : tensor<2x4x32xf32>, tensor<32x8xf32> -> tensor<2x4x8xf32>
  %35 = model.reshape %7 {model.backward, model.stage = 2 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %36 = model.reshape %28 {model.backward, model.stage = 2 : i64} : tensor<2x4x32xf32> -> tensor<8x32xf32>
  %37 = model.transpose %35 [1, 0] {model.backward, model.stage = 2 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %38 = model.matmul %37, %36 {model.backward, model.stage = 2 : i64} : tensor<8x8xf32>, tensor<8x32xf32> -> tensor<8x32xf32>
  model.accumulate_grad @w2, %38 {model.backward} : tensor<8x32xf32>
  %39 = model.reduce_sum %34 dims [0, 1] {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32> -> tensor<8xf32>
  %40 = model.transpose %4 [1, 0] {model.backward, model.stage = 1 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %41 = model.matmul %34, %40 {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %42 = model.reshape %3 {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %43 = model.reshape %34 {model.backward, model.stage = 1 : i64} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %44 = model.transpose %42 [1, 0] {model.backward, model.stage = 1 : i64} : tensor<8x8xf32> -> tensor<8x8xf32>
  %45 = model.matmul %44, %43 {model.backward, model.stage = 1 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  model.accumulate_grad @b1, %39 {model.backward} : tensor<8xf32>
  model.accumulate_grad @w1, %45 {model.backward} : tensor<8x8xf32>
  %46 = model.reduce_sum %41 dims [0, 1] {model.backward, model.stage = 0 : i64} : tensor<2x4x8xf32> -> tensor<8xf32>
  %47 = model.gather_grad %41 at %tok dim 0 {model.backward, model.stage = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<10x8xf32>
  %48 = model.add %26, %47 {model.backward} : tensor<10x8xf32>, tensor<10x8xf32> -> tensor<10x8xf32>
  model.accumulate_grad @pos, %46 {model.backward} : tensor<8xf32>
  model.accumulate_grad @emb, %48 {model.backward} : tensor<10x8xf32>
  return %16 : tensor<f32>
}

// -----

// Stage 1 has no parameters: the round-robin skips it (no slot), and no
// stage reads another's (no tie slot).
//   stage 0: @p0 128 (offset 0); stage 1: nothing; stage 2: @p2 384
//   (offset 128); stage 3: @p3 16 -> 128 (offset 512).
// ZERO2-LABEL: module attributes
// ZERO2-SAME: grad_slot_elements = array<i64: 128, 384>
// ZERO2-SAME: param_elements = 640 : i64
// ZERO2-SAME: stage_elements = array<i64: 128, 0, 384, 128>
// ZERO2-SAME: stage_grad_slot = array<i64: 0, -1, 1, 0>
// ZERO2-SAME: stage_offsets = array<i64: 0, 128, 128, 512>
// An untagged op takes the stage of the next tagged one (stage 0 here).
// ZERO2: model.accumulate_grad @p2, %{{.*}} {model.backward, model.stage = 2 : i64, plan.slot = 1 : i64}
// ZERO2-NEXT: model.exp %{{.*}} {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>
// ZERO2-NEXT: model.exp %{{.*}} {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>
// ZERO2-NEXT: model.accumulate_grad @p0, %{{.*}} {model.backward, model.stage = 0 : i64, plan.slot = 0 : i64}
// GRAD1-LABEL: module attributes
// GRAD1-SAME: grad_slot_elements = array<i64: 384>
// GRAD1-SAME: stage_grad_slot = array<i64: 0, -1, 0, 0>
// Five gradient buffers, three stages to serve: three slots.
// GRAD5-LABEL: module attributes
// GRAD5-SAME: grad_slot_elements = array<i64: 128, 384, 128>
// GRAD5-SAME: stage_grad_slot = array<i64: 0, -1, 1, 2>
// ZERO3-LABEL: module attributes
// ZERO3-SAME: stage_grad_slot = array<i64: 0, -1, 1, 0>
// ZERO3-SAME: stage_tie_slot = array<i64: -1, -1, -1, -1>, stage_weight_slot = array<i64: 0, -1, 1, 0>
// ZERO3-SAME: weight_slot_elements = array<i64: 128, 384>
// ZERO3: model.get_parameter @p2 {model.stage = 2 : i64, plan.slot = 1 : i64}
// ZERO3: model.get_parameter @p3 {model.stage = 3 : i64, plan.slot = 0 : i64}
// WEIGHT1-LABEL: module attributes
// WEIGHT1-SAME: stage_tie_slot = array<i64: -1, -1, -1, -1>, stage_weight_slot = array<i64: 0, -1, 0, 0>
// WEIGHT1-SAME: weight_slot_elements = array<i64: 384>
// WEIGHT5-LABEL: module attributes
// WEIGHT5-SAME: stage_weight_slot = array<i64: 0, -1, 1, 2>
// WEIGHT5-SAME: weight_slot_elements = array<i64: 128, 384, 128>
// DP3-LABEL: module attributes
// DP3-SAME: grad_slot_elements = array<i64: 192, 384>
// DP3-SAME: stage_elements = array<i64: 192, 0, 384, 96>
// DP3-SAME: stage_offsets = array<i64: 0, 192, 192, 576>
model.parameter @p0 : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @p2 : tensor<3x8x16xf32> {model.stage = 2 : i64}
model.parameter @p3 : tensor<16xf32> {model.stage = 3 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a0 = model.get_parameter @p0 : tensor<8x16xf32>
  %x0 = model.exp %a0 {model.stage = 0 : i64} : tensor<8x16xf32>
  %x1 = model.exp %x0 {model.stage = 1 : i64} : tensor<8x16xf32>
  %a2 = model.get_parameter @p2 : tensor<3x8x16xf32>
  %x2 = model.mul %a2, %x1 {model.stage = 2 : i64} : tensor<3x8x16xf32>, tensor<8x16xf32> -> tensor<3x8x16xf32>
  %a3 = model.get_parameter @p3 : tensor<16xf32>
  %x3 = model.mul %x2, %a3 {model.stage = 3 : i64} : tensor<3x8x16xf32>, tensor<16xf32> -> tensor<3x8x16xf32>
  %l = model.reduce_sum %x3 dims [0, 1, 2] {model.stage = 3 : i64} : tensor<3x8x16xf32> -> tensor<f32>
  %g3 = model.reduce_sum %x2 dims [0, 1] {model.backward, model.stage = 3 : i64} : tensor<3x8x16xf32> -> tensor<16xf32>
  model.accumulate_grad @p3, %g3 {model.backward} : tensor<16xf32>
  %g2 = model.exp %x2 {model.backward, model.stage = 2 : i64} : tensor<3x8x16xf32>
  model.accumulate_grad @p2, %g2 {model.backward} : tensor<3x8x16xf32>
  %g1 = model.exp %x1 {model.backward} : tensor<8x16xf32>
  %g0 = model.exp %x0 {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>
  model.accumulate_grad @p0, %g0 {model.backward} : tensor<8x16xf32>
  return %l : tensor<f32>
}

// -----
// BEGIN ORDER

// ZeRO-2/3 need the backward to run the stages in reverse order: here
// stage 0's backward runs before stage 1's.
// ORDER: error: 'model.reduce_sum' op in the backward of stage 1 runs after the backward of stage 0 (adding the gradient of @a); ZeRO-2 needs the backward to run the stages in reverse order; --zero-stage 1 takes the stages in any order
// ZERO1-LABEL: module attributes
// ZERO1-SAME: stage_grad_slot = array<i64: -1, -1>
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %x = model.exp %a {model.stage = 0 : i64} : tensor<8x16xf32>
  %y = model.mul %x, %b {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %l = model.reduce_sum %y dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  %ga = model.mul %x, %a {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  model.accumulate_grad @a, %ga {model.backward} : tensor<8x16xf32>
  // expected-error @+1 {{'model.reduce_sum' op in the backward of stage 1 runs after the backward of stage 0}}
  %gb = model.reduce_sum %x dims [0] {model.backward, model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<16xf32>
  model.accumulate_grad @b, %gb {model.backward} : tensor<16xf32>
  return %l : tensor<f32>
}

// -----

// The forward must run the stages in order.
// ORDER: error: 'model.exp' op in the forward of stage 0 runs after the forward of stage 1; ZeRO-2 needs the forward to run the stages in order; --zero-stage 1 takes the stages in any order
// ZERO1-LABEL: module attributes
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %eb = model.exp %b {model.stage = 1 : i64} : tensor<16xf32>
  // expected-error @+1 {{'model.exp' op in the forward of stage 0 runs after the forward of stage 1}}
  %x = model.exp %a {model.stage = 0 : i64} : tensor<8x16xf32>
  %y = model.mul %x, %eb {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %l = model.reduce_sum %y dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// No forward op after the backward started.
// ORDER: error: 'model.exp' op of the forward runs after the backward started (adding the gradient of @b); ZeRO-2 needs the forward first; --zero-stage 1 takes the stages in any order
// ZERO1-LABEL: module attributes
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %x = model.exp %a {model.stage = 0 : i64} : tensor<8x16xf32>
  %y = model.mul %x, %b {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %l = model.reduce_sum %y dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  %gb = model.reduce_sum %x dims [0] {model.backward, model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<16xf32>
  model.accumulate_grad @b, %gb {model.backward} : tensor<16xf32>
  // expected-error @+1 {{'model.exp' op of the forward runs after the backward started}}
  %z = model.exp %y {model.stage = 1 : i64} : tensor<8x16xf32>
  %ga = model.mul %x, %a {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  model.accumulate_grad @a, %ga {model.backward} : tensor<8x16xf32>
  return %l : tensor<f32>
}
