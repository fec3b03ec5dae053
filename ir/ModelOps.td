//===- ModelOps.td - model dialect ops ----------------------*- tablegen -*-===//

#ifndef FASTLLM_IR_MODELOPS_TD
#define FASTLLM_IR_MODELOPS_TD

include "ir/ModelBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/ViewLikeInterface.td"
include "ir/GradientInterface.td"

/// Ops autodiff can differentiate implement buildGradients (ModelGradients.cpp).
defvar Differentiable = DeclareOpInterfaceMethods<Model_GradientOpInterface>;

/// Ops whose result type follows from their operands and attributes
/// implement inferReturnTypes (InferTypeOpInterface, ModelDialect.cpp): the
/// shape rule is written once, the verifier checks the result against it
/// (with its own diagnostics, before the interface's check), and builders
/// may omit the result type.
defvar Inferred = InferTypeOpAdaptor;
/// As Inferred, but the op may also return an f32 result where the rule
/// gives another float type (mixed precision keeps losses and attention's
/// log-sum-exp in f32).
defvar InferredOrF32 = InferTypeOpAdaptorWithIsCompatible;

def Model_Tensor : StaticShapeTensorOf<[AnyType]>;
def Model_FloatTensor : StaticShapeTensorOf<[AnyFloat]>;
def Model_IntTensor : StaticShapeTensorOf<[AnySignlessInteger]>;
def Model_BoolTensor : StaticShapeTensorOf<[I1]>;

//===----------------------------------------------------------------------===//
// Parameters and constants
//===----------------------------------------------------------------------===//

def Model_ParameterOp : Model_Op<"parameter", [Symbol, HasParent<"ModuleOp">]> {
  let summary = "declares a named float parameter (a weight) of the model";
  let description = [{
    A parameter is a float tensor the training program owns: it has an initial
    value (usually the ONNX initializer's bytes, held once as a resource blob)
    and is read in functions with `model.get_parameter`. The symbol keeps the
    ONNX initializer's name. `frozen` parameters (`--freeze`) get no gradient
    and no optimizer state.

    ```mlir
    model.parameter @"h.0.ln_1.weight" : tensor<64xf32> = dense<1.0> : tensor<64xf32>
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Model_FloatTensor>:$type,
                       OptionalAttr<ElementsAttr>:$initial_value,
                       UnitAttr:$frozen);
  let assemblyFormat = [{
    $sym_name `:` $type (`=` $initial_value^)? attr-dict
  }];
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
  }];
  let hasVerifier = 1;
}

def Model_GetParameterOp : Model_Op<"get_parameter",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "reads a parameter declared by model.parameter";
  let description = [{
    ```mlir
    %w = model.get_parameter @wte : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Model_ConstantOp : Model_Op<"constant",
    [ConstantLike, Pure, AllTypesMatch<["value", "result"]>]> {
  let summary = "a constant tensor";
  let description = [{
    Integer and boolean initializers, ONNX `Constant` nodes and everything the
    importer folds (masks, position tables) become constants.

    ```mlir
    %c = model.constant dense<[0, 1, 2]> : tensor<3xi64>
    ```
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// Binary elementwise op with NumPy broadcasting; operand element types match.
class Model_BinaryOp<string mnemonic, Type operandType, list<Trait> traits = []>
    : Model_Op<mnemonic,
               !listconcat([Pure, Model_Pointwise, Inferred], traits)> {
  let arguments = (ins operandType:$lhs, operandType:$rhs);
  let results = (outs operandType:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
  let description = [{
    Operands broadcast with NumPy rules; the result has the broadcast shape.

    ```mlir
    %r = model.}] # mnemonic # [{ %a, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
    ```
  }];
}

def Model_AddOp : Model_BinaryOp<"add", Model_Tensor, [Differentiable]> { let summary = "elementwise lhs + rhs"; }
def Model_SubOp : Model_BinaryOp<"sub", Model_Tensor, [Differentiable]> { let summary = "elementwise lhs - rhs"; }
def Model_MulOp : Model_BinaryOp<"mul", Model_Tensor, [Differentiable]> { let summary = "elementwise lhs * rhs"; }
def Model_DivOp : Model_BinaryOp<"div", Model_Tensor, [Differentiable]> { let summary = "elementwise lhs / rhs"; }
def Model_PowOp : Model_BinaryOp<"pow", Model_Tensor, [Differentiable]> { let summary = "elementwise lhs ** rhs"; }
def Model_AndOp : Model_BinaryOp<"and", Model_BoolTensor> { let summary = "elementwise logical and"; }
def Model_OrOp : Model_BinaryOp<"or", Model_BoolTensor> { let summary = "elementwise logical or"; }

def Model_CmpOp : Model_Op<"cmp", [Pure, Model_Pointwise, Inferred]> {
  let summary = "elementwise comparison with broadcasting, giving i1";
  let description = [{
    ```mlir
    %m = model.cmp lt, %a, %b : tensor<4x4xi64>, tensor<4x1xi64> -> tensor<4x4xi1>
    ```
  }];
  let arguments = (ins Model_CmpPredicateAttr:$predicate, Model_Tensor:$lhs,
                       Model_Tensor:$rhs);
  let results = (outs Model_BoolTensor:$result);
  let assemblyFormat = [{
    $predicate `,` $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_SelectOp : Model_Op<"select",
    [Pure, Model_Pointwise, Differentiable, Inferred]> {
  let summary = "elementwise cond ? on_true : on_false, with broadcasting";
  let description = [{
    ```mlir
    %r = model.select %mask, %x, %ninf : tensor<4x4xi1>, tensor<2x4x4xf32>, tensor<f32> -> tensor<2x4x4xf32>
    ```
  }];
  let arguments = (ins Model_BoolTensor:$condition, Model_Tensor:$on_true,
                       Model_Tensor:$on_false);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = [{
    $condition `,` $on_true `,` $on_false attr-dict `:` type($condition) `,`
    type($on_true) `,` type($on_false) `->` type($result)
  }];
  let hasVerifier = 1;
}

/// Unary elementwise op: result type equals operand type.
class Model_UnaryOp<string mnemonic, Type operandType, list<Trait> traits = []>
    : Model_Op<mnemonic, !listconcat([Pure, Model_Pointwise,
                                      SameOperandsAndResultType], traits)> {
  let arguments = (ins operandType:$input);
  let results = (outs operandType:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let description = [{
    ```mlir
    %r = model.}] # mnemonic # [{ %x : tensor<2x3xf32>
    ```
  }];
}

def Model_SqrtOp : Model_UnaryOp<"sqrt", Model_FloatTensor, [Differentiable]> { let summary = "elementwise square root"; }
def Model_RsqrtOp : Model_UnaryOp<"rsqrt", Model_FloatTensor, [Differentiable]> { let summary = "elementwise 1 / sqrt(x)"; }
def Model_ReciprocalOp : Model_UnaryOp<"reciprocal", Model_FloatTensor, [Differentiable]> { let summary = "elementwise 1 / x"; }
def Model_NegOp : Model_UnaryOp<"neg", Model_Tensor, [Differentiable]> { let summary = "elementwise -x"; }
def Model_ExpOp : Model_UnaryOp<"exp", Model_FloatTensor, [Differentiable]> { let summary = "elementwise e^x"; }
def Model_LogOp : Model_UnaryOp<"log", Model_FloatTensor, [Differentiable]> { let summary = "elementwise natural logarithm"; }
def Model_TanhOp : Model_UnaryOp<"tanh", Model_FloatTensor, [Differentiable]> { let summary = "elementwise tanh"; }
def Model_ErfOp : Model_UnaryOp<"erf", Model_FloatTensor, [Differentiable]> { let summary = "elementwise error function"; }
def Model_SigmoidOp : Model_UnaryOp<"sigmoid", Model_FloatTensor, [Differentiable]> { let summary = "elementwise 1 / (1 + e^-x)"; }
def Model_ReluOp : Model_UnaryOp<"relu", Model_FloatTensor, [Differentiable]> { let summary = "elementwise max(x, 0)"; }
def Model_SiluOp : Model_UnaryOp<"silu", Model_FloatTensor, [Differentiable]> { let summary = "elementwise x * sigmoid(x)"; }
def Model_SinOp : Model_UnaryOp<"sin", Model_FloatTensor, [Differentiable]> { let summary = "elementwise sine"; }
def Model_CosOp : Model_UnaryOp<"cos", Model_FloatTensor, [Differentiable]> { let summary = "elementwise cosine"; }
def Model_NotOp : Model_UnaryOp<"not", Model_BoolTensor> { let summary = "elementwise logical not"; }

def Model_GeluOp : Model_Op<"gelu", [Pure, Model_Pointwise, Differentiable,
                                     SameOperandsAndResultType]> {
  let summary = "elementwise GELU, exact (erf) or tanh-approximated";
  let description = [{
    `none` is x * 0.5 * (1 + erf(x / sqrt(2))); `tanh` is
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).

    ```mlir
    %r = model.gelu %x approximate tanh : tensor<2x3xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input,
      DefaultValuedAttr<Model_GeluApproximationAttr,
                        "GeluApproximation::none">:$approximate);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$input `approximate` $approximate attr-dict `:` type($result)";
}

def Model_DropoutOp : Model_Op<"dropout", [Pure, Differentiable,
                                         SameOperandsAndResultType]> {
  let summary = "training-mode dropout with a counter-based mask";
  let description = [{
    Each element is kept with probability `1 - ratio` and scaled by
    `1 / (1 - ratio)`, or zeroed. The mask is not an operand: it is a pure
    function of the run's seed, the step, the element's global sample (the
    input's leading dimension is the batch, or the batch flattened with the
    dims after it), the `site` and the element's index within its sample
    (runtime/Philox.h). So a sample draws the same mask whatever the data
    parallelism or micro-batching, and the gradient, the same op with the
    same site applied to the result's gradient, regenerates the forward's
    mask instead of storing it.

    The importer gives every ONNX Dropout its own site: the FNV-1a hash of
    the node's output name. Pure is right within one step (the same input
    and site give the same result); the op is not Model_Pointwise because
    its value depends on the element's position, which fused functors do
    not see.

    ```mlir
    %r = model.dropout %x ratio 1.000000e-01 site 7 : tensor<2x8x64xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, F32Attr:$ratio,
                       I64Attr:$site);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$input `ratio` $ratio `site` $site attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra and data movement
//===----------------------------------------------------------------------===//

def Model_MatmulOp : Model_Op<"matmul", [Pure, Differentiable, Inferred]> {
  let summary = "batched matrix product with broadcast batch dimensions";
  let description = [{
    Operands have rank >= 2: `[..., M, K] x [..., K, N] -> [..., M, N]`, the
    leading (batch) dimensions broadcast with NumPy rules. `transpose_lhs`
    (`transpose_rhs`) reads that operand with its last two dims swapped:
    fastllm-fold-transposes sets them after autodiff, so that no transposed
    copy is made; such a matmul has no gradient rule.

    ```mlir
    %r = model.matmul %a, %b : tensor<2x8x16xf32>, tensor<16x4xf32> -> tensor<2x8x4xf32>
    %s = model.matmul %a, %c {transpose_rhs} : tensor<2x8x16xf32>, tensor<4x16xf32> -> tensor<2x8x4xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$lhs, Model_FloatTensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_TransposeOp : Model_Op<"transpose",
    [Pure, Differentiable, Inferred]> {
  let summary = "permutes dimensions: result dim i is input dim permutation[i]";
  let description = [{
    ```mlir
    %r = model.transpose %x [0, 2, 1] : tensor<2x3x4xf32> -> tensor<2x4x3xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = "$input $permutation attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Model_ReshapeOp : Model_Op<"reshape", [Pure, Differentiable,
    DeclareOpInterfaceMethods<ViewLikeOpInterface>]> {
  let summary = "reinterprets the row-major elements with another shape";
  let description = [{
    A view: its result is its input's buffer (ViewLikeOpInterface), so the
    memory planner, the collectives' analyses and the emitter give it no
    memory of its own (model::bufferRoot finds the buffer).

    ```mlir
    %r = model.reshape %x : tensor<2x3x4xf32> -> tensor<6x4xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Model_SliceOp : Model_Op<"slice", [Pure, Differentiable, Inferred]> {
  let summary = "strided slice [start, limit) with positive strides, per dim";
  let description = [{
    ```mlir
    %r = model.slice %x start [0, 2] limit [4, 8] stride [1, 2]
        : tensor<4x8xf32> -> tensor<4x3xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input, DenseI64ArrayAttr:$start,
                       DenseI64ArrayAttr:$limit, DenseI64ArrayAttr:$stride);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = [{
    $input `start` $start `limit` $limit `stride` $stride attr-dict `:`
    type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_ConcatOp : Model_Op<"concat", [Pure, Differentiable, Inferred]> {
  let summary = "concatenates tensors along one dimension";
  let description = [{
    ```mlir
    %r = model.concat %a, %b dim 1 : (tensor<2x3xf32>, tensor<2x5xf32>) -> tensor<2x8xf32>
    ```
  }];
  let arguments = (ins Variadic<Model_Tensor>:$inputs, I64Attr:$dim);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = "$inputs `dim` $dim attr-dict `:` functional-type($inputs, $result)";
  let hasVerifier = 1;
}

def Model_SplitOp : Model_Op<"split", [Pure, Differentiable, Inferred]> {
  let summary = "splits a tensor along one dimension into consecutive pieces";
  let description = [{
    ```mlir
    %q, %k, %v = model.split %x dim 2 sizes [64, 64, 64]
        : tensor<2x8x192xf32> -> tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input, I64Attr:$dim, DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<Model_Tensor>:$results);
  let assemblyFormat = [{
    $input `dim` $dim `sizes` $sizes attr-dict `:` type($input) `->` type($results)
  }];
  let hasVerifier = 1;
}

def Model_GatherOp : Model_Op<"gather", [Pure, Differentiable, Inferred]> {
  let summary = "takes slices of `input` along `dim` at `indices` (embedding lookup)";
  let description = [{
    Result shape: `input[:dim] + indices + input[dim+1:]`. Negative indices
    count from the end, as in ONNX.

    ```mlir
    %e = model.gather %wte[%tokens] dim 0 : tensor<256x64xf32>, tensor<2x8xi64> -> tensor<2x8x64xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input, Model_IntTensor:$indices, I64Attr:$dim);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = [{
    $input `[` $indices `]` `dim` $dim attr-dict `:` type($input) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_BroadcastOp : Model_Op<"broadcast", [Pure, Model_Pointwise, Differentiable]> {
  let summary = "broadcasts a tensor to a larger shape with NumPy rules";
  let description = [{
    ```mlir
    %r = model.broadcast %x : tensor<1x4xf32> -> tensor<3x4xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Model_CastOp : Model_Op<"cast", [Pure, Model_Pointwise, Differentiable]> {
  let summary = "converts the element type, keeping the shape";
  let description = [{
    Float to integer truncates toward zero; anything to i1 is `x != 0`.

    ```mlir
    %r = model.cast %x : tensor<4xi64> -> tensor<4xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$input);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Reductions and normalisation
//===----------------------------------------------------------------------===//

class Model_ReduceOp<string mnemonic>
    : Model_Op<mnemonic, [Pure, Differentiable, Inferred]> {
  let arguments = (ins Model_Tensor:$input, DenseI64ArrayAttr:$dims,
                       UnitAttr:$keep_dims);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = [{
    $input `dims` $dims (`keep_dims` $keep_dims^)? attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let description = [{
    Reduces over `dims` (sorted, distinct, non-negative); with `keep_dims`
    they stay as size-1 dimensions.

    ```mlir
    %r = model.}] # mnemonic # [{ %x dims [1] keep_dims : tensor<2x3xf32> -> tensor<2x1xf32>
    ```
  }];
}

def Model_ReduceSumOp : Model_ReduceOp<"reduce_sum"> { let summary = "sum over dims"; }
def Model_ReduceMeanOp : Model_ReduceOp<"reduce_mean"> { let summary = "mean over dims"; }
def Model_ReduceMaxOp : Model_ReduceOp<"reduce_max"> { let summary = "maximum over dims"; }

class Model_SoftmaxLikeOp<string mnemonic>
    : Model_Op<mnemonic, [Pure, SameOperandsAndResultType, Differentiable]> {
  let arguments = (ins Model_FloatTensor:$input, I64Attr:$dim);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$input `dim` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
  let description = [{
    ```mlir
    %r = model.}] # mnemonic # [{ %x dim 1 : tensor<2x3xf32>
    ```
  }];
}

def Model_SoftmaxOp : Model_SoftmaxLikeOp<"softmax"> { let summary = "softmax along one dimension"; }
def Model_LogSoftmaxOp : Model_SoftmaxLikeOp<"log_softmax"> { let summary = "log of softmax along one dimension"; }

def Model_LayerNormOp : Model_Op<"layer_norm",
    [Pure, Differentiable, Inferred]> {
  let summary = "layer normalisation over the trailing dims from `dim` on";
  let description = [{
    `(x - mean) / sqrt(var + epsilon) * scale + bias`, statistics over dims
    `[dim, rank)`; `scale` and the optional `bias` have the shape of those dims.

    ```mlir
    %r = model.layer_norm %x, %g, %b dim 2 eps 1.000000e-05
        : (tensor<2x8x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, Model_FloatTensor:$scale,
                       Optional<Model_FloatTensor>:$bias, I64Attr:$dim,
                       F32Attr:$epsilon);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $scale (`,` $bias^)? `dim` $dim `eps` $epsilon attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_RmsNormOp : Model_Op<"rms_norm", [Pure, Differentiable, Inferred]> {
  let summary = "RMS normalisation over the trailing dims from `dim` on";
  let description = [{
    `x / sqrt(mean(x^2) + epsilon) * scale`, the mean over dims `[dim, rank)`.

    ```mlir
    %r = model.rms_norm %x, %g dim 2 eps 1.000000e-06
        : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, Model_FloatTensor:$scale,
                       I64Attr:$dim, F32Attr:$epsilon);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $scale `dim` $dim `eps` $epsilon attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_CausalAttentionOp : Model_Op<"causal_attention",
    [Pure, Differentiable, InferredOrF32]> {
  let summary = "fused causal self-attention: softmax(scale * q k^T, causal) v";
  let description = [{
    q, k: `[..., t, d]`, v: `[..., t, dv]`; query i attends to keys j <= i.
    The second result is the log-sum-exp of each masked, scaled score row,
    `[..., t]`, kept for the backward so the `t x t` scores are never stored.
    `fastllm-fuse` forms it from the matmul, scale, mask, softmax, matmul
    chain exporters write.

    ```mlir
    %o, %lse = model.causal_attention %q, %k, %v scale 1.250000e-01
        : tensor<2x4x16x64xf32>, tensor<2x4x16x64xf32>, tensor<2x4x16x64xf32>
        -> tensor<2x4x16x64xf32>, tensor<2x4x16xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$query, Model_FloatTensor:$key,
                       Model_FloatTensor:$value, F32Attr:$scale);
  let results = (outs Model_FloatTensor:$result, Model_FloatTensor:$lse);
  let assemblyFormat = [{
    $query `,` $key `,` $value `scale` $scale attr-dict `:` type($query) `,`
    type($key) `,` type($value) `->` type($result) `,` type($lse)
  }];
  let hasVerifier = 1;
}

def Model_CausalAttentionGradOp : Model_Op<"causal_attention_grad", [Pure,
    AllTypesMatch<["query", "query_grad"]>, AllTypesMatch<["key", "key_grad"]>,
    AllTypesMatch<["value", "value_grad"]>, AllTypesMatch<["output", "grad"]>]> {
  let summary = "gradients of model.causal_attention w.r.t. q, k and v";
  let description = [{
    Recomputes the attention probabilities from q, k and the saved lse.

    ```mlir
    %dq, %dk, %dv = model.causal_attention_grad %q, %k, %v, %o, %lse, %do
        scale 1.250000e-01 : tensor<2x4x16x64xf32>, tensor<2x4x16x64xf32>,
        tensor<2x4x16x64xf32>, tensor<2x4x16x64xf32>, tensor<2x4x16xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$query, Model_FloatTensor:$key,
                       Model_FloatTensor:$value, Model_FloatTensor:$output,
                       Model_FloatTensor:$lse, Model_FloatTensor:$grad,
                       F32Attr:$scale);
  let results = (outs Model_FloatTensor:$query_grad, Model_FloatTensor:$key_grad,
                      Model_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $output `,` $lse `,` $grad `scale` $scale
    attr-dict `:` type($query) `,` type($key) `,` type($value) `,`
    type($output) `,` type($lse)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

class Model_LossOp<string mnemonic>
    : Model_Op<mnemonic, [Pure, Differentiable, InferredOrF32]> {
  let arguments = (ins Model_FloatTensor:$input, Model_IntTensor:$targets,
                       OptionalAttr<I64Attr>:$ignore_index,
                       Model_LossReductionAttr:$reduction);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $targets (`ignore_index` $ignore_index^)? `reduction` $reduction
    attr-dict `:` type($input) `,` type($targets) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_CrossEntropyOp : Model_LossOp<"cross_entropy"> {
  let summary = "softmax cross-entropy of logits [..., C] against class ids [...]";
  let description = [{
    The class dimension is the last one. Targets equal to `ignore_index` add
    nothing and are not counted by `mean`. The result is a scalar for `sum`
    and `mean`, and has the targets' shape for `none`.

    ```mlir
    %l = model.cross_entropy %logits, %t ignore_index -100 reduction mean
        : tensor<16x256xf32>, tensor<16xi64> -> tensor<f32>
    ```
  }];
}

def Model_NllLossOp : Model_LossOp<"nll_loss"> {
  let summary = "negative log-likelihood of log-probabilities [..., C] at class ids [...]";
  let description = [{
    As `model.cross_entropy`, but the input already holds log-probabilities.

    ```mlir
    %l = model.nll_loss %logp, %t reduction mean
        : tensor<16x256xf32>, tensor<16xi64> -> tensor<f32>
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Backward ops: what autodiff emits where a composite rule would be wasteful
//===----------------------------------------------------------------------===//

def Model_AccumulateGradOp : Model_Op<"accumulate_grad",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemWrite]>]> {
  let summary = "adds a gradient into a parameter's gradient accumulator";
  let description = [{
    The training step's output: `grad(@name) += grad`. A parameter read in
    several places (a tied embedding and head) gets one accumulate per read,
    so its gradient is the sum of all uses. `grad` has the parameter's type,
    or is bf16 for an f32 parameter: widened (exactly) as it is added
    (fastllm-fuse-grad-accumulation folds autodiff's widening casts so).

    ```mlir
    model.accumulate_grad @wte, %g : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name, Model_FloatTensor:$grad);
  let assemblyFormat = "$name `,` $grad attr-dict `:` type($grad)";
}

class Model_SoftmaxGradLikeOp<string mnemonic, string formula>
    : Model_Op<mnemonic, [Pure, AllTypesMatch<["output", "grad", "result"]>]> {
  let summary = "gradient of " # !subst("_grad", "", mnemonic) # " from its output";
  let description = [{
    `}] # formula # [{`, along `dim`.

    ```mlir
    %dx = model.}] # mnemonic # [{ %y, %g dim 1 : tensor<2x8xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$output, Model_FloatTensor:$grad,
                       I64Attr:$dim);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$output `,` $grad `dim` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Model_SoftmaxGradOp
    : Model_SoftmaxGradLikeOp<"softmax_grad", "dx = y * (g - sum(g * y))">;
def Model_LogSoftmaxGradOp
    : Model_SoftmaxGradLikeOp<"log_softmax_grad", "dx = g - exp(y) * sum(g)">;

def Model_LayerNormGradOp : Model_Op<"layer_norm_grad", [Pure,
    AllTypesMatch<["input", "grad", "input_grad"]>,
    AllTypesMatch<["scale", "scale_grad", "bias_grad"]>]> {
  let summary = "gradients of model.layer_norm w.r.t. input, scale and bias";
  let description = [{
    Recomputes the statistics from the input.

    ```mlir
    %dx, %dg, %db = model.layer_norm_grad %x, %g, %dy dim 2 eps 1.000000e-05
        : tensor<2x8x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, Model_FloatTensor:$scale,
                       Model_FloatTensor:$grad, I64Attr:$dim, F32Attr:$epsilon);
  let results = (outs Model_FloatTensor:$input_grad,
                      Model_FloatTensor:$scale_grad,
                      Model_FloatTensor:$bias_grad);
  let assemblyFormat = [{
    $input `,` $scale `,` $grad `dim` $dim `eps` $epsilon attr-dict `:`
    type($input) `,` type($scale)
  }];
  let hasVerifier = 1;
}

def Model_RmsNormGradOp : Model_Op<"rms_norm_grad", [Pure,
    AllTypesMatch<["input", "grad", "input_grad"]>,
    AllTypesMatch<["scale", "scale_grad"]>]> {
  let summary = "gradients of model.rms_norm w.r.t. input and scale";
  let description = [{
    ```mlir
    %dx, %dg = model.rms_norm_grad %x, %g, %dy dim 2 eps 1.000000e-06
        : tensor<2x8x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, Model_FloatTensor:$scale,
                       Model_FloatTensor:$grad, I64Attr:$dim, F32Attr:$epsilon);
  let results = (outs Model_FloatTensor:$input_grad,
                      Model_FloatTensor:$scale_grad);
  let assemblyFormat = [{
    $input `,` $scale `,` $grad `dim` $dim `eps` $epsilon attr-dict `:`
    type($input) `,` type($scale)
  }];
  let hasVerifier = 1;
}

def Model_GeluGradOp : Model_Op<"gelu_grad",
    [Pure, Model_Pointwise, AllTypesMatch<["input", "grad", "result"]>]> {
  let summary = "gradient of model.gelu: grad * gelu'(input)";
  let description = [{
    ```mlir
    %dx = model.gelu_grad %x, %g approximate none : tensor<2x8xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, Model_FloatTensor:$grad,
      DefaultValuedAttr<Model_GeluApproximationAttr,
                        "GeluApproximation::none">:$approximate);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad `approximate` $approximate attr-dict `:` type($result)
  }];
}

def Model_CrossEntropyGradOp : Model_Op<"cross_entropy_grad",
    [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "gradient of model.cross_entropy w.r.t. its logits";
  let description = [{
    `(softmax(logits) - onehot(targets)) * g`, zero at ignored targets, and
    divided by the number of counted targets for `mean`. `grad` is the loss
    gradient: a scalar for `sum`/`mean`, targets-shaped for `none`.

    ```mlir
    %dl = model.cross_entropy_grad %logits, %t, %g ignore_index -100 reduction mean
        : tensor<16x256xf32>, tensor<16xi64>, tensor<f32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$input, Model_IntTensor:$targets,
                       Model_FloatTensor:$grad, OptionalAttr<I64Attr>:$ignore_index,
                       Model_LossReductionAttr:$reduction);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $targets `,` $grad (`ignore_index` $ignore_index^)? `reduction`
    $reduction attr-dict `:` type($input) `,` type($targets) `,` type($grad)
  }];
  let hasVerifier = 1;
}

def Model_NllLossGradOp : Model_Op<"nll_loss_grad", [Pure]> {
  let summary = "gradient of model.nll_loss w.r.t. its log-probabilities";
  let description = [{
    `-g` at each counted target's class (divided by the count for `mean`),
    zero elsewhere.

    ```mlir
    %dl = model.nll_loss_grad %t, %g reduction mean
        : tensor<16xi64>, tensor<f32> -> tensor<16x256xf32>
    ```
  }];
  let arguments = (ins Model_IntTensor:$targets, Model_FloatTensor:$grad,
                       OptionalAttr<I64Attr>:$ignore_index,
                       Model_LossReductionAttr:$reduction);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $targets `,` $grad (`ignore_index` $ignore_index^)? `reduction` $reduction
    attr-dict `:` type($targets) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_GatherGradOp : Model_Op<"gather_grad", [Pure]> {
  let summary = "gradient of model.gather w.r.t. its input: a scatter-add";
  let description = [{
    Zeros of the result type, with each slice of `grad` added at its index
    along `dim` (repeated indices add up: the embedding backward).

    ```mlir
    %dw = model.gather_grad %g at %tokens dim 0
        : tensor<2x8x64xf32>, tensor<2x8xi64> -> tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Model_FloatTensor:$grad, Model_IntTensor:$indices,
                       I64Attr:$dim);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $grad `at` $indices `dim` $dim attr-dict `:` type($grad) `,` type($indices)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def Model_SliceGradOp : Model_Op<"slice_grad", [Pure]> {
  let summary = "gradient of model.slice: zeros with `grad` placed at the slice";
  let description = [{
    ```mlir
    %dx = model.slice_grad %g start [0, 2] limit [4, 8] stride [1, 2]
        : tensor<4x3xf32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Model_Tensor:$grad, DenseI64ArrayAttr:$start,
                       DenseI64ArrayAttr:$limit, DenseI64ArrayAttr:$stride);
  let results = (outs Model_Tensor:$result);
  let assemblyFormat = [{
    $grad `start` $start `limit` $limit `stride` $stride attr-dict `:`
    type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Distributed plan (docs/DESIGN.md section 3): collectives of a ZeRO-2/3 step
//===----------------------------------------------------------------------===//
//
// A stage's parameters are one flat array split into dp equal shards; every
// rank owns one shard of the fp32 master weights and of the reduced
// gradient. Weight and gradient *slots* are the buffers (of the memory plan)
// that hold a stage's full weights or gradients while it runs. These ops
// name a stage and a slot by index; fastllm-zero-layout decides both and
// fastllm-verify-collectives proves that a step uses them consistently.

class Model_CollectiveOp<string mnemonic>
    : Model_Op<mnemonic, [MemoryEffects<[MemRead, MemWrite]>]> {
  let arguments = (ins I64Attr:$stage, I64Attr:$slot);
  let results = (outs Model_RequestType:$request);
  let hasVerifier = 1;
}

def Model_AllGatherOp : Model_CollectiveOp<"all_gather"> {
  let summary = "starts gathering a stage's weights into a weight slot";
  let description = [{
    Every rank sends its shard of stage `stage`'s master weights; when the
    request is waited, weight slot `slot` holds the stage's full weights.

    ```mlir
    %r = model.all_gather stage 2 into slot 0
    model.wait %r
    ```
  }];
  let assemblyFormat = "`stage` $stage `into` `slot` $slot attr-dict";
}

def Model_ReduceScatterOp : Model_CollectiveOp<"reduce_scatter"> {
  let summary = "starts reducing a gradient slot into the stage's shards";
  let description = [{
    Gradient slot `slot` holds this rank's gradient of stage `stage` for one
    micro-batch. When the request is waited, every rank's shard of the
    stage's reduced gradient has been increased by the mean over the
    data-parallel ranks and the step's micro-batches of its part of the slot,
    and the slot may be reused.

    ```mlir
    %r = model.reduce_scatter stage 2 from slot 1
    model.wait %r
    ```
  }];
  let assemblyFormat = "`stage` $stage `from` `slot` $slot attr-dict";
}

def Model_WaitOp : Model_Op<"wait", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "waits for a collective to finish";
  let arguments = (ins Model_RequestType:$request);
  let assemblyFormat = "$request attr-dict";
}

def Model_ClearGradsOp : Model_Op<"clear_grads", [MemoryEffects<[MemWrite]>]> {
  let summary = "zeroes a gradient slot for a stage's backward";
  let description = [{
    Before stage `stage` accumulates its gradients into gradient slot `slot`:

    ```mlir
    model.clear_grads stage 2 slot 1
    ```
  }];
  let arguments = (ins I64Attr:$stage, I64Attr:$slot);
  let assemblyFormat = "`stage` $stage `slot` $slot attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Kernel fusion (fastllm-fuse-elementwise, fastllm-fuse-grad-accumulation)
//===----------------------------------------------------------------------===//

def Model_FusedElementwiseOp : Model_Op<"fused_elementwise",
    [Pure, IsolatedFromAbove, SingleBlock]> {
  let summary = "pointwise ops computed in one pass, intermediates unstored";
  let description = [{
    The body takes one tensor argument per input and yields the result; its
    ops are pointwise (Model_Pointwise). Every input broadcasts to the
    result's shape, so the body is evaluated once per result element with
    each value at that index: a chain of pointwise ops becomes one kernel
    whose intermediates stay in registers (in the compute type, fp32 for
    bf16: a bf16 intermediate is not rounded unless a model.cast says so).

    ```mlir
    %r = model.fused_elementwise (%a, %b) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32> {
    ^bb0(%x: tensor<2x4xf32>, %y: tensor<4xf32>):
      %s = model.add %x, %y : tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
      %t = model.tanh %s : tensor<2x4xf32>
      model.yield %t : tensor<2x4xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Model_Tensor>:$inputs);
  let results = (outs Model_Tensor:$result);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict `:` functional-type($inputs, $result) $body
  }];
  let hasVerifier = 1;
}

def Model_MatmulAccumulateGradOp : Model_Op<"matmul_accumulate_grad",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemWrite]>]> {
  let summary = "adds a matmul's product into a parameter's gradient";
  let description = [{
    `grad(@name) += op(lhs)·op(rhs)`, the product as model.matmul computes it
    (with the same transpose flags, accumulating in fp32) and added in the
    gradient's type (fp32) without first being rounded to the operands'
    type: one GEMM where model.accumulate_grad of a matmul (widened by a
    model.cast for bf16 operands) would store the product, widen it and add
    it. fastllm-fuse-grad-accumulation makes it, after the distributed plan;
    it accumulates where the model.accumulate_grad did (same plan.slot).

    ```mlir
    model.matmul_accumulate_grad @w, %x, %g {transpose_lhs} : tensor<32x64xbf16>, tensor<32x256xbf16>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name, Model_FloatTensor:$lhs,
                       Model_FloatTensor:$rhs, UnitAttr:$transpose_lhs,
                       UnitAttr:$transpose_rhs);
  let assemblyFormat = "$name `,` $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs)";
  let hasVerifier = 1;
}

def Model_YieldOp : Model_Op<"yield",
    [Pure, Terminator, HasParent<"FusedElementwiseOp">]> {
  let summary = "the result of a model.fused_elementwise body";
  let arguments = (ins Model_Tensor:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

#endif // FASTLLM_IR_MODELOPS_TD
