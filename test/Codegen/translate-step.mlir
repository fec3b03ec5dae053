// RUN: fastllm-opt translate --fastllm-to-cpu %s | FileCheck %s
// RUN: fastllm-opt translate --fastllm-to-cuda %s | FileCheck %s --check-prefix=CUDA

// The step printer from a hand-written planned module (what
// fastllm-training-pipeline leaves): the plan table from the plan.* attributes of the module and the
// parameters' plan.offset / plan.weight_decay, one kernel call per op with
// its shape arguments worked out from the types, pointers at the planned
// offsets, views naming their source, gradients added at plan.grad_offset.

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 1 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: -1>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 1 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {model.stage = 0 : i64, plan.offset = 0 : i64, plan.weight_decay = true}
  model.parameter @g : tensor<8xf32> = dense<1.0> : tensor<8xf32> {model.stage = 0 : i64, plan.offset = 256 : i64, plan.weight_decay = false}
  func.func @train_step(%tok: tensor<2x4xi64> {model.name = "tokens"}, %tgt: tensor<2x4xi64> {model.name = "targets"}) -> tensor<f32> {
    %w = model.get_parameter @w {plan.offsets = array<i64: 0>} : tensor<8x8xf32>
    %g = model.get_parameter @g {plan.offsets = array<i64: 256>} : tensor<8xf32>
    %e = model.gather %w[%tok] dim 0 {plan.offsets = array<i64: 1536>} : tensor<8x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
    %n = model.rms_norm %e, %g dim 2 eps 1.0e-5 {plan.offsets = array<i64: 1792>} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
    %o, %lse = model.causal_attention %n, %n, %n scale 0.5 {plan.offsets = array<i64: 2048, 2304>} : tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>, tensor<2x4xf32>
    %h = model.matmul %o, %w {plan.offsets = array<i64: 1536>} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
    %r = model.reshape %h : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %t = model.reshape %tgt : tensor<2x4xi64> -> tensor<8xi64>
    %loss = model.cross_entropy %r, %t reduction mean {plan.offsets = array<i64: 2368>} : tensor<8x8xf32>, tensor<8xi64> -> tensor<f32>
    %one = model.constant dense<1.0> : tensor<f32>
    %d = model.cross_entropy_grad %r, %t, %one reduction mean {plan.offsets = array<i64: 1792>} : tensor<8x8xf32>, tensor<8xi64>, tensor<f32>
    model.matmul_accumulate_grad @w, %r, %d {plan.grad_offset = 320 : i64, transpose_lhs} : tensor<8x8xf32>, tensor<8x8xf32>
    %s = model.reduce_sum %d dims [0] {plan.offsets = array<i64: 2048>} : tensor<8x8xf32> -> tensor<8xf32>
    model.accumulate_grad @g, %s {plan.grad_offset = 576 : i64} : tensor<8xf32>
    return %loss : tensor<f32>
  }
}

// CHECK:      static_assert(kAbiVersion ==
// The trace table: one row per kernel call, in program order, named by its op
// (this module has no model.stage / model.layer: -1; nothing is backward).
// CHECK:      constexpr int32_t kNumTraceOps = 9;
// CHECK-NEXT: const TraceOp kTraceOps[] = {
// CHECK-NEXT:     {"gather", -1, -1, 0},
// CHECK-NEXT:     {"rms_norm", -1, -1, 0},
// CHECK-NEXT:     {"causal_attention", -1, -1, 0},
// CHECK-NEXT:     {"matmul", -1, -1, 0},
// CHECK-NEXT:     {"cross_entropy", -1, -1, 0},
// CHECK-NEXT:     {"cross_entropy_grad", -1, -1, 0},
// CHECK-NEXT:     {"matmul_accumulate_grad", -1, -1, 0},
// CHECK-NEXT:     {"reduce_sum", -1, -1, 0},
// CHECK-NEXT:     {"accumulate_grad", -1, -1, 0},
// CHECK-NEXT: };
// CHECK:      const ParamInfo kParams[] = {
// CHECK-NEXT:     {"w", 1, 2, {8, 8}, 64, 0, 1, 1},
// CHECK-NEXT:     {"g", 1, 1, {8}, 8, 256, 1, 0},
// CHECK:      const StageInfo kStages[] = {
// CHECK-NEXT:     {0, 72, -1, -1},
// CHECK:      PlanInfo makePlan() {
// CHECK:        p.batchSize = 2;
// CHECK:        p.arenaBytes = 2560;
// CHECK:        p.target = "cpu";
// CHECK:        p.tokensInput = "tokens";
// CHECK:        p.numParams = 2;
// CHECK:        p.numTraceOps = kNumTraceOps;
// CHECK-NEXT:   p.traceOps = kTraceOps;
// The constant of the loss's seed gradient: one float (a splat).
// CHECK:      alignas(64) const float [[ONE:c[0-9]+]][1] = {1.000000000e+00f};
// CHECK:      extern "C" float fastllm_step(
// The trace hooks: one null test before and after each kernel call when off.
// CHECK:        const TraceHooks *trace = context->trace;
// CHECK:        const int64_t *[[TOK:a0]] = reinterpret_cast<const int64_t *>(arena + 1408);
// CHECK-NEXT:   const int64_t *[[TGT:a1]] = reinterpret_cast<const int64_t *>(arena + 1472);
// CHECK-NEXT:   float *[[W:v[0-9]+]] = reinterpret_cast<float *>(arena + 0); // kParams[0]
// CHECK-NEXT:   float *[[G:v[0-9]+]] = reinterpret_cast<float *>(arena + 256); // kParams[1]
// Rows of an [8, 8] table gathered by 8 indices: outer 1, 8 rows, 8 indices, rows of 8.
// CHECK-NEXT:   if (trace) trace->begin(trace->context, 0);
// CHECK-NEXT:   float *[[E:v[0-9]+]] = reinterpret_cast<float *>(arena + 1536);
// CHECK-NEXT:   gather<float, int64_t>([[E]], [[W]], [[TOK]], 1, 8, 8, 8);
// CHECK-NEXT:   if (trace) trace->end(trace->context, 0);
// CHECK-NEXT:   if (trace) trace->begin(trace->context, 1);
// CHECK-NEXT:   float *[[N:v[0-9]+]] = reinterpret_cast<float *>(arena + 1792);
// CHECK-NEXT:   rmsNorm([[N]], [[E]], [[G]], 8, 8, 9.999999747e-06f);
// CHECK-NEXT:   if (trace) trace->end(trace->context, 1);
// CHECK-NEXT:   if (trace) trace->begin(trace->context, 2);
// Two results, two offsets; batch 2, 4 positions, head dims 8 and 8.
// CHECK-NEXT:   float *[[O:v[0-9]+]] = reinterpret_cast<float *>(arena + 2048);
// CHECK-NEXT:   float *[[LSE:v[0-9]+]] = reinterpret_cast<float *>(arena + 2304);
// CHECK-NEXT:   causalAttention([[O]], [[LSE]], [[N]], [[N]], [[N]], 2, 4, 8, 8, 5.000000000e-01f);
// [2, 4, 8] x [8, 8]: one batch dim of 2, the weight broadcast (stride 0).
// CHECK:          static const int64_t bs[] = {2}, as[] = {32}, bs2[] = {0};
// CHECK-NEXT:     matmul([[H:v[0-9]+]], [[O]], [[W]], 1, bs, as, bs2, 4, 8, 8, false, false);
// The reshapes are views: the loss reads the matmul's buffer.
// CHECK:        crossEntropy<int64_t>([[LOSS:v[0-9]+]], [[H]], [[TGT]], 8, 8, false, 0, Reduction::Mean);
// CHECK:        crossEntropyGrad<int64_t>([[D:v[0-9]+]], [[H]], [[TGT]], [[ONE]], 8, 8, false, 0, Reduction::Mean);
// CHECK:          addMatmul(reinterpret_cast<float *>(arena + 320), [[H]], [[D]], 0, bs, as, bs2, 8, 8, 8, true, false); // kParams[0]
// CHECK:          static const bool reduced[] = {true, false};
// CHECK-NEXT:     reduce([[S:v[0-9]+]], [[D]], 2, shape, reduced, ReduceKind::Sum);
// CHECK:        addInto(reinterpret_cast<float *>(arena + 576), [[S]], 8); // kParams[1]
// CHECK-NEXT:   if (trace) trace->end(trace->context, 8);
// CHECK-NEXT:   return [[LOSS]][0];

// The CUDA target: the same calls on the CUDA library; constants on the device, found
// once; the loss copied back.
// CUDA:       #include "runtime/cuda/Generated.cuh"
// CUDA:       using namespace fastllm::rt::cuda;
// CUDA:       p.target = "cuda";
// CUDA:       __device__ const float g[[K:[0-9]+]][1] = {1.000000000e+00f};
// CUDA:       static const float *c[[K]] = deviceAddress(g[[K]]);
// CUDA:       causalAttention(
// CUDA:       return readScalar([[LOSS:v[0-9]+]]);
