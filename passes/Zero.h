//===- Zero.h - stages, phases and slots of the training step ---*- C++ -*-===//
//
// The attributes the distributed plan lives in (docs/DESIGN.md section 3):
//   model.stage     op or parameter: the stage it belongs to
//   model.backward  op of @train_step: built by autodiff (the backward phase)
//   plan.slot       ZeRO-3 model.get_parameter: the weight slot it reads;
//                   ZeRO-2/3 model.accumulate_grad: the gradient slot it adds
//                   into
// fastllm-zero-layout sets them, fastllm-zero-collectives schedules the
// collectives from them and fastllm-verify-collectives checks the result.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_PASSES_ZERO_H
#define FASTLLM_PASSES_ZERO_H

#include "ir/Plan.h"

#include "mlir/IR/Operation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <algorithm>
#include <string>

namespace mlir::fastllm {

constexpr llvm::StringLiteral kStageAttr = "model.stage";
constexpr llvm::StringLiteral kLayerAttr = "model.layer";
constexpr llvm::StringLiteral kBackwardAttr = "model.backward";

/// The op's model.stage, or -1 when it has none.
inline int64_t stageOf(Operation *op) {
  auto a = op->getAttrOfType<IntegerAttr>(kStageAttr);
  return a ? a.getInt() : -1;
}

/// The stage a parameter belongs to: its model.stage, 0 when the model was
/// not partitioned.
inline int64_t parameterStage(Operation *param) {
  return std::max<int64_t>(stageOf(param), 0);
}

/// Gives `to` the stage and layer of `from` (an op built for `from` runs in
/// its stage).
inline void copyStage(Operation *from, Operation *to) {
  for (llvm::StringRef attr : {kStageAttr, kLayerAttr})
    if (Attribute a = from->getAttr(attr))
      to->setAttr(attr, a);
}

inline bool isBackward(Operation *op) { return op->hasAttr(kBackwardAttr); }

/// Whether every op strictly between `from` and `to` (same block, `from`
/// first) is free of memory effects: a fusion may then read `from`'s inputs
/// at `to` instead, since no collective can have refilled the weight slot a
/// model.get_parameter points into, nor a gradient slot been cleared.
inline bool quietBetween(Operation *from, Operation *to) {
  for (Operation *op = from->getNextNode(); op != to; op = op->getNextNode())
    if (!isMemoryEffectFree(op))
      return false;
  return true;
}

/// How a message names the ONNX node an op was imported from:
/// " (ONNX node 'NAME')" from the NameLoc the importer gives it (fusion and
/// autodiff keep it inside theirs), or "" for an op with none.
inline std::string onnxNodeOf(Operation *op) {
  if (auto name = op->getLoc()->findInstanceOf<NameLoc>())
    return (" (ONNX node '" + name.getName().getValue() + "')").str();
  return "";
}

/// The op's plan.slot, or -1 when it has none.
inline int64_t slotOf(Operation *op) {
  auto a = op->getAttrOfType<IntegerAttr>(kSlotAttr);
  return a ? a.getInt() : -1;
}

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_ZERO_H
