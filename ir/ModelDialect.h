//===- ModelDialect.h - the model dialect -----------------------*- C++ -*-===//

#ifndef FASTLLM_IR_MODELDIALECT_H
#define FASTLLM_IR_MODELDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

#include "ir/GradientInterface.h.inc"
#include "ir/ModelDialect.h.inc"
#include "ir/ModelEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "ir/ModelAttrs.h.inc"

#define GET_TYPEDEF_CLASSES
#include "ir/ModelTypes.h.inc"

namespace mlir::fastllm::model {
/// Model_Pointwise (ModelBase.td): the op's result elements are functions of
/// its operands' elements at the same broadcast index.
template <typename ConcreteType>
class PointwiseTrait : public OpTrait::TraitBase<ConcreteType, PointwiseTrait> {
};
} // namespace mlir::fastllm::model

#define GET_OP_CLASSES
#include "ir/ModelOps.h.inc"

namespace mlir::fastllm::model {
/// Set on a model.parameter whose initial value's bytes are still in the
/// exporter's layout: the [in, out] transpose of its [out, in] type (a
/// folded weight the importer found in a read-only mapping of the model's
/// files and did not transpose in place). codegen/Weights.cpp transposes it
/// while writing weights.safetensors; nothing may read its elements as the
/// parameter's.
constexpr llvm::StringLiteral kInitialValueTransposedAttr =
    "model.initial_value_transposed";

/// Set on a model.parameter that keeps the exporter's generated name
/// (`onnx::MatMul_N`) although the module whose MatMul nodes read it is
/// known from their scopes ("stack.layers.0.self_attn"): codegen/Weights.cpp
/// records it in weights.safetensors' metadata as `fastllm.module.NAME`.
constexpr llvm::StringLiteral kModuleScopeAttr = "model.module_scope";

/// The value whose buffer `v` names: `v` seen through every view
/// (ViewLikeOpInterface: model.reshape) back to the op that owns memory, or
/// to a block argument.
inline Value bufferRoot(Value v) {
  while (auto view = v.getDefiningOp<ViewLikeOpInterface>())
    v = view.getViewSource();
  return v;
}
} // namespace mlir::fastllm::model

#endif // FASTLLM_IR_MODELDIALECT_H
