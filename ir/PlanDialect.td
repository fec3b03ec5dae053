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

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/DialectBase.td"

def Plan_Dialect : Dialect {
  let name = "plan";
  let cppNamespace = "::mlir::fastllm::plan";
  let summary = "The training program's plan: layout, arena, traffic";
  let description = [{
    Attributes only; no ops. Each is set by the pass that decides it and
    read by the later passes and the emitter. On the module, one typed
    attribute per part of the plan (the scalars of runtime/PlanFields.def
    with that part, and the part's tables):

    - `plan.layout = #plan.layout<{...}>` (fastllm-zero-layout): data
      parallelism, ZeRO stage, the flat layout's length, alignment, the
      stages (`stage_offsets`, `stage_elements`, `stage_grad_slot`,
      `stage_weight_slot`, `stage_tie_slot`) and the slots' sizes
      (`grad_slot_elements`, `weight_slot_elements`).
    - `plan.arena = #plan.arena<{...}>` (fastllm-plan-memory): the arena's
      size, every region's offset, the slots' offsets and which arguments
      of `@train_step` are the tokens and the targets.
    - `plan.traffic = #plan.traffic<{...}>` (fastllm-count-traffic): the
      bytes one rank's collectives move.
    - `plan.data = #plan.data<{...}>` (fastllm-prepare-emission): batch,
      sequence length and vocabulary.

    On ops:

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
  let useDefaultAttributePrinterParser = 1;
}

// One part of the module's plan: its fields as a dictionary whose keys and
// types the attribute verifies (every field of the part, nothing else).
class Plan_PartAttr<string name, string attrMnemonic, string part>
    : AttrDef<Plan_Dialect, name> {
  let mnemonic = attrMnemonic;
  let summary = "The plan's " # part;
  let parameters = (ins "DictionaryAttr":$fields);
  let assemblyFormat = "`<` $fields `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The plan part this attribute holds.
    static constexpr ::mlir::fastllm::PlanPart kPart =
        ::mlir::fastllm::PlanPart::}] # name # [{;
  }];
}

def Plan_LayoutAttr : Plan_PartAttr<"Layout", "layout",
    "parameter layout: ZeRO, stages and slot sizes (fastllm-zero-layout)">;
def Plan_ArenaAttr : Plan_PartAttr<"Arena", "arena",
    "arena: regions, slot offsets, input roles (fastllm-plan-memory)">;
def Plan_TrafficAttr : Plan_PartAttr<"Traffic", "traffic",
    "collective traffic per rank (fastllm-count-traffic)">;
def Plan_DataAttr : Plan_PartAttr<"Data", "data",
    "data sizes: batch, sequence, vocabulary (fastllm-prepare-emission)">;

#endif // FASTLLM_PLAN_DIALECT
