//===- GradientInterface.td - how an op declares its gradient -*- tablegen -*-===//

#ifndef FASTLLM_IR_GRADIENTINTERFACE_TD
#define FASTLLM_IR_GRADIENTINTERFACE_TD

include "mlir/IR/OpBase.td"

def Model_GradientOpInterface : OpInterface<"GradientOpInterface"> {
  let description = [{
    An op that reverse-mode autodiff can differentiate. Given the gradient of
    the loss with respect to each result (a null Value when a result does not
    reach the loss, which means zero), the op builds, at the builder's
    insertion point, the gradient with respect to each operand, or a null
    Value for operands that are not differentiable (indices, masks, shapes).
    Operand gradients have exactly the operand's type: gradients of
    broadcast operands are summed back to the operand's shape.
  }];
  let cppNamespace = "::mlir::fastllm::model";
  let methods = [
    InterfaceMethod<
      "Builds the operand gradients from the result gradients.",
      "::mlir::LogicalResult", "buildGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // FASTLLM_IR_GRADIENTINTERFACE_TD
