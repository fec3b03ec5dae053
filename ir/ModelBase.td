//===- ModelBase.td - the model dialect ---------------------*- tablegen -*-===//
//
// The model dialect holds a transformer's training graph as the ONNX frontend
// imports it: tensor-level ops on statically shaped tensors, named parameters
// declared once per module, and constants.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_IR_MODELBASE_TD
#define FASTLLM_IR_MODELBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Model_Dialect : Dialect {
  let name = "model";
  let cppNamespace = "::mlir::fastllm::model";
  let summary = "Tensor-level ops of a transformer training graph";
  let description = [{
    Every value is a ranked tensor with a static shape. Elementwise ops
    broadcast their operands with NumPy (ONNX multidirectional) rules; the
    result type always spells out the broadcast shape. Parameters are declared
    once per module by `model.parameter` and read in functions by
    `model.get_parameter`, so a tied weight is one parameter with several uses.
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  // The plan's attributes (PlanDialect.td) are verified wherever model IR is.
  let dependentDialects = ["::mlir::fastllm::plan::PlanDialect"];
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

def Model_RequestType : TypeDef<Model_Dialect, "Request"> {
  let mnemonic = "request";
  let summary = "a collective in flight";
  let description = [{
    What `model.all_gather` and `model.reduce_scatter` return: the collective
    runs in the background until the one `model.wait` on it.
  }];
}

class Model_Op<string mnemonic, list<Trait> traits = []>
    : Op<Model_Dialect, mnemonic, traits>;

/// Each result element is a function of the operands' elements at the same
/// index, operands broadcasting to the result's shape with NumPy rules (the
/// shape aligned right, a size-1 dim repeated): the ops model.fused_elementwise
/// may hold.
def Model_Pointwise : NativeOpTrait<"PointwiseTrait"> {
  let cppNamespace = "::mlir::fastllm::model";
}

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Model_CmpPredicate : I32EnumAttr<"CmpPredicate", "comparison predicate", [
    I32EnumAttrCase<"eq", 0>, I32EnumAttrCase<"ne", 1>,
    I32EnumAttrCase<"lt", 2>, I32EnumAttrCase<"le", 3>,
    I32EnumAttrCase<"gt", 4>, I32EnumAttrCase<"ge", 5>]> {
  let cppNamespace = "::mlir::fastllm::model";
  let genSpecializedAttr = 0;
}
def Model_CmpPredicateAttr : EnumAttr<Model_Dialect, Model_CmpPredicate, "cmp">;

def Model_GeluApproximation : I32EnumAttr<"GeluApproximation",
    "how GELU is computed", [
    I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"tanh", 1>]> {
  let cppNamespace = "::mlir::fastllm::model";
  let genSpecializedAttr = 0;
}
def Model_GeluApproximationAttr
    : EnumAttr<Model_Dialect, Model_GeluApproximation, "gelu_approx">;

def Model_LossReduction : I32EnumAttr<"LossReduction",
    "how per-element losses are reduced", [
    I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"sum", 1>,
    I32EnumAttrCase<"mean", 2>]> {
  let cppNamespace = "::mlir::fastllm::model";
  let genSpecializedAttr = 0;
}
def Model_LossReductionAttr
    : EnumAttr<Model_Dialect, Model_LossReduction, "reduction">;

#endif // FASTLLM_IR_MODELBASE_TD
