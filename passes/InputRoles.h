//===- InputRoles.h - which step input holds the tokens, which the targets
//-===//
//
// The roles of the training step's two integer inputs, from the graph (the
// token ids index an embedding table, the targets label a loss) or from
// --input-tokens / --input-targets where the graph cannot tell.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_PASSES_INPUTROLES_H
#define FASTLLM_PASSES_INPUTROLES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/LogicalResult.h"

namespace mlir::fastllm {

/// Argument numbers of @train_step's token and target inputs.
struct InputRoles {
  unsigned tokens, targets;
};

/// Decides the roles of `step`'s two integer inputs. `tokensName` and
/// `targetsName` (input names as exported; empty: not given) decide where
/// the graph does not, and must agree with it where it does. Emits an error
/// (with a note naming the flag that fixes it) and fails otherwise.
FailureOr<InputRoles> assignInputRoles(func::FuncOp step, StringRef tokensName,
                                       StringRef targetsName);

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_INPUTROLES_H
