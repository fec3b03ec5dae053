//===- Passes.td - fastllm-opt passes -----------------------*- tablegen -*-===//

#ifndef FASTLLM_PASSES_TD
#define FASTLLM_PASSES_TD

include "mlir/Pass/PassBase.td"

def AutodiffPass : Pass<"fastllm-autodiff", "ModuleOp"> {
  let summary = "builds the training step: forward, then reverse-mode backward";
  let description = [{
    Clones `func.func @forward` (one scalar float result: the loss) into
    `func.func @train_step`, which computes the loss, then the gradient of
    every trainable parameter, and adds each into the parameter's gradient
    accumulator with `model.accumulate_grad`. Trainable parameters are the
    `model.parameter`s whose name the `freeze` regex does not match (it may
    match anywhere in the name; anchor it with ^ and $); matched ones are
    marked `frozen`. Every op between a trainable parameter and the loss must
    implement GradientOpInterface. `@forward` is kept for evaluation.
  }];
  let options = [
    Option<"freeze", "freeze", "std::string", /*default=*/"\"\"",
           "Regex of parameter names to freeze (no gradient, no optimizer state)">,
  ];
  let dependentDialects = ["::mlir::fastllm::model::ModelDialect"];
}

#endif // FASTLLM_PASSES_TD
