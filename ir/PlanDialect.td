//===- PlanDialect.td - the plan dialect -------------------*- tablegen -*-===//
//
// The plan dialect owns the attributes in which the passes record the
// training program's plan, so that each is declared once and verified
// wherever it appears (a misspelt or mistyped `plan.*` attribute is an
// error, not ignored).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_PLAN_DIALECT
#define FASTLLM_PLAN_DIALECT

include "mlir/IR/DialectBase.td"

def Plan_Dialect : Dialect {
  let name = "plan";
  let cppNamespace = "::mlir::fastllm::plan";
  let summary = "The training program's plan: layout, arena, traffic";
  let description = [{
    Discardable attributes only; no ops. Each attribute below is set by the
    pass that decides it and read by the later passes and the emitter:

    - `plan.memory` on the module: the plan's scalars (one per line of
      runtime/PlanFields.def, plus `tokens_arg` and `targets_arg`) and its
      tables (`stage_*`, `grad_slot_*`, `weight_slot_*`), a dictionary that
      fastllm-zero-layout creates, fastllm-verify-collectives completes with
      the traffic, fastllm-plan-memory with the arena and
      fastllm-prepare-emission with the sizes of the data.
    - `plan.offset` on `model.parameter`: its element offset in the flat
      arrays (or in the frozen array).
    - `plan.weight_decay` on `model.parameter`: whether AdamW decays it.
    - `plan.slot` on `model.get_parameter` (ZeRO-3: the weight slot it reads)
      and on gradient accumulations (ZeRO-2/3: the slot it adds into).
    - `plan.offsets` on an op of `@train_step`: each result's byte offset in
      the arena (-1: none).
    - `plan.grad_offset` on a gradient accumulation: the byte offset of the
      gradient it adds into.

    ```mlir
    model.parameter @w : tensor<4xf32> {plan.offset = 0 : i64, plan.weight_decay = false}
    ```
  }];
  let hasOperationAttrVerify = 1;
}

#endif // FASTLLM_PLAN_DIALECT
