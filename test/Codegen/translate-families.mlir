// RUN: fastllm-opt translate --fastllm-to-cpu %s | FileCheck %s
// RUN: fastllm-opt translate --fastllm-to-cuda %s | FileCheck %s --check-prefix=CUDA

// The op families the step printer has one function each for, from
// hand-written planned IR: pointwise ops and fused chains (functors),
// data movement, softmax, normalisation, dropout and the collectives of a
// ZeRO-2 plan (a gradient slot, cleared, then reduce-scattered).

module attributes {plan.arena = #plan.arena<{activations_bytes = 1024 : i64, activations_offset = 1536 : i64, activations_unshared_bytes = 2048 : i64, adam_m_offset = 576 : i64, adam_v_offset = 896 : i64, arena_bytes = 2560 : i64, frozen_offset = -1 : i64, grad_shard_offset = 1216 : i64, grad_slot_offsets = array<i64: 1216>, grads_offset = 320 : i64, master_offset = 576 : i64, params_offset = 0 : i64, targets_arg = 1 : i64, targets_offset = 1472 : i64, tokens_arg = 0 : i64, tokens_offset = 1408 : i64, weight_slot_offsets = array<i64>}>, plan.data = #plan.data<{batch_size = 2 : i64, seq_len = 4 : i64, vocab_size = 8 : i64}>, plan.layout = #plan.layout<{alignment = 64 : i64, data_parallel = 2 : i64, frozen_elements = 0 : i64, full_precision_gradients = 1 : i64, grad_slot_elements = array<i64: 72>, param_elements = 72 : i64, stage_elements = array<i64: 72>, stage_grad_slot = array<i64: 0>, stage_offsets = array<i64: 0>, stage_tie_slot = array<i64: -1>, stage_weight_slot = array<i64: -1>, weight_slot_elements = array<i64>, zero_stage = 2 : i64}>, plan.traffic = #plan.traffic<{bf16_flops_per_micro_batch = 0 : i64, flops_per_micro_batch = 0 : i64, all_gather_bytes_per_micro_batch = 0 : i64, all_gather_bytes_per_step = 0 : i64, reduce_scatter_bytes_per_micro_batch = 0 : i64, reduce_scatter_bytes_per_step = 0 : i64}>} {
  model.parameter @w : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32> {model.stage = 0 : i64, plan.offset = 0 : i64, plan.weight_decay = true}
  model.parameter @g : tensor<8xf32> = dense<1.0> : tensor<8xf32> {model.stage = 0 : i64, plan.offset = 256 : i64, plan.weight_decay = false}
  func.func @train_step(%tok: tensor<2x4xi64> {model.name = "tokens"}, %tgt: tensor<2x4xi64> {model.name = "targets"}) -> tensor<f32> {
    model.clear_grads stage 0 slot 0
    %w = model.get_parameter @w {plan.offsets = array<i64: 0>} : tensor<8x8xf32>
    %g = model.get_parameter @g {plan.offsets = array<i64: 256>} : tensor<8xf32>
    %e = model.gather %w[%tok] dim 0 {plan.offsets = array<i64: 1536>} : tensor<8x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
    %a = model.add %e, %g {plan.offsets = array<i64: 1792>} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
    %f = model.fused_elementwise(%a, %g) {plan.offsets = array<i64: 2048>} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32> {
    ^bb0(%x: tensor<2x4x8xf32>, %y: tensor<8xf32>):
      %m = model.mul %x, %y : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
      %t = model.tanh %m : tensor<2x4x8xf32>
      model.yield %t : tensor<2x4x8xf32>
    }
    %tr = model.transpose %f [0, 2, 1] {plan.offsets = array<i64: 1536>} : tensor<2x4x8xf32> -> tensor<2x8x4xf32>
    %sl = model.slice %tr start [0, 1, 0] limit [2, 8, 4] stride [1, 2, 1] {plan.offsets = array<i64: 1792>} : tensor<2x8x4xf32> -> tensor<2x4x4xf32>
    %p:2 = model.split %f dim 2 sizes [3, 5] {plan.offsets = array<i64: 1536, 1664>} : tensor<2x4x8xf32> -> tensor<2x4x3xf32>, tensor<2x4x5xf32>
    %c = model.concat %p#1, %p#0 dim 2 {plan.offsets = array<i64: 1792>} : (tensor<2x4x5xf32>, tensor<2x4x3xf32>) -> tensor<2x4x8xf32>
    %sm = model.softmax %c dim 1 {plan.offsets = array<i64: 1536>} : tensor<2x4x8xf32>
    %ln = model.layer_norm %sm, %g, %g dim 2 eps 1.0e-5 {plan.offsets = array<i64: 1792>} : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
    %dr = model.dropout %ln ratio 1.000000e-01 site 7 {plan.offsets = array<i64: 2048>} : tensor<2x4x8xf32>
    %r = model.reshape %dr : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %t = model.reshape %tgt : tensor<2x4xi64> -> tensor<8xi64>
    %loss = model.nll_loss %r, %t reduction sum {plan.offsets = array<i64: 2368>} : tensor<8x8xf32>, tensor<8xi64> -> tensor<f32>
    %rs = model.reduce_scatter stage 0 from slot 0
    model.wait %rs
    return %loss : tensor<f32>
  }
}

// One pointwise op: a functor computing its expression, operand strides
// from broadcasting ([8] against [2, 4, 8]: 0, 0, 1).
// CHECK:      struct [[ADD:F[0-9]+]] {
// CHECK-NEXT:   float operator()(float x0, float x1) const {
// CHECK-NEXT:     return x0 + x1;
// A fused chain: one local per op, in order.
// CHECK:      struct [[FUSED:F[0-9]+]] {
// CHECK-NEXT:   float operator()(float x0, float x1) const {
// CHECK-NEXT:     float t0 = x0 * x1;
// CHECK-NEXT:     float t1 = fastTanh(t0);
// CHECK-NEXT:     return t1;
// CHECK:      extern "C" float fastllm_step(
// CHECK:      fill(reinterpret_cast<float *>(arena + 1216), 72, 0.0f); // stage 0
// CHECK:          static const int64_t s1[] = {0, 0, 1};
// CHECK:          elementwise([[A:v[0-9]+]], 3, shape, [[ADD]]{}, In<float>{{[{]}}[[E:v[0-9]+]], s0}, In<float>{{[{]}}[[G:v[0-9]+]], s1});
// CHECK:          elementwise([[F:v[0-9]+]], 3, shape, [[FUSED]]{}, In<float>{{[{]}}[[A]], s0}, In<float>{{[{]}}[[G]], s1});
// CHECK:          static const int64_t shape[] = {2, 4, 8}, perm[] = {0, 2, 1};
// CHECK-NEXT:     transpose([[TR:v[0-9]+]], [[F]], 3, shape, perm);
// Rows 1, 3, 5, 7 of the transposed [2, 8, 4].
// CHECK:          static const int64_t big[] = {2, 8, 4}, start[] = {0, 1, 0}, stride[] = {1, 2, 1}, small[] = {2, 4, 4};
// CHECK-NEXT:     slice({{v[0-9]+}}, [[TR]], 3, big, start, stride, small);
// A split is a slice per result, the second starting at 3, each a span of
// its own.
// CHECK:          static const int64_t big[] = {2, 4, 8}, start[] = {0, 0, 0}, stride[] = {1, 1, 1}, small[] = {2, 4, 3};
// CHECK-NEXT:     slice([[P0:v[0-9]+]], [[F]], 3, big, start, stride, small);
// CHECK-NEXT:   }
// CHECK-NEXT:   if (trace) trace->end(trace->context, [[S0:[0-9]+]]);
// CHECK-NEXT:   if (trace) trace->begin(trace->context, {{[0-9]+}});
// CHECK-NEXT:   {
// CHECK-NEXT:     static const int64_t big[] = {2, 4, 8}, start[] = {0, 0, 3}, stride[] = {1, 1, 1}, small[] = {2, 4, 5};
// CHECK-NEXT:     slice([[P1:v[0-9]+]], [[F]], 3, big, start, stride, small);
// 8 rows of 5 then 3 columns: outer 8, inner 1.
// CHECK:          static const int64_t sizes[] = {5, 3};
// CHECK-NEXT:     const float *ins[] = {[[P1]], [[P0]]};
// CHECK-NEXT:     concat([[C:v[0-9]+]], 2, ins, sizes, 8, 1);
// Softmax over dim 1 of [2, 4, 8]: outer 2, n 4, inner 8.
// CHECK:        softmax([[SM:v[0-9]+]], [[C]], 2, 4, 8, false);
// CHECK:        layerNorm([[LN:v[0-9]+]], [[SM]], [[G]], [[G]], 8, 8, 9.999999747e-06f);
// 64 elements, 32 per sample of a micro-batch of 2, site 7.
// CHECK:        dropout([[DR:v[0-9]+]], [[LN]], false, 64, 32, 7u, context->evaluating ? 0u : {{0x[0-9a-f]+}}u, context->evaluating ? 1.0f : 1.111111{{[0-9]+}}e+00f, context->seed, context->step, context->firstSample);
// CHECK:        nllLoss<int64_t>([[LOSS:v[0-9]+]], [[DR]], {{a1}}, 8, 8, false, 0, Reduction::Sum);
// A collective is no kernel call: the hooks frame the loss alone.
// CHECK-NEXT:   if (trace) trace->end(trace->context, [[LAST:[0-9]+]]);
// CHECK-NEXT:   int32_t [[REQ:r[0-9]+]] = comm->reduceScatter(comm->context, 0, 0);
// CHECK-NEXT:   comm->wait(comm->context, [[REQ]]);
// CHECK-NEXT:   return [[LOSS]][0];

// The CUDA target: functors run on the device too.
// CUDA:       struct F0 {
// CUDA-NEXT:    __host__ __device__ float operator()(float x0, float x1) const {
// CUDA:       return readScalar(
