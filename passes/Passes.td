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

def PlanMemoryPass : Pass<"fastllm-plan-memory", "ModuleOp"> {
  let summary = "lays out one static arena per process and assigns every buffer";
  let description = [{
    Plans the memory of `func.func @train_step` for one rank:

    - parameters are laid end to end in one flat fp32 array, ordered by
      stage (`model.stage`), each tensor aligned to `alignment` bytes and
      each stage padded to a multiple of `dp * 32` elements;
      `model.parameter`s get `plan.offset` (elements); the gradient buffer
      mirrors that layout, and the fp32 master weights, AdamW moments and
      reduced gradients are this rank's 1/dp shard of every stage;
    - the token and target inputs (the first two integer arguments) get
      regions of their own;
    - every other tensor an op produces gets a byte offset in the activation
      region, assigned from liveness so that values whose lifetimes do not
      overlap share memory (greedy by size, first fit); `model.reshape`
      aliases its input, `model.constant` and `model.get_parameter` need no
      activation memory.

    Ops get `plan.offsets` (one byte offset per result, -1 when the result
    has no buffer of its own); the module gets `plan.memory`, a dictionary
    with every region's offset and size and the arena's total.
  }];
  let options = [
    Option<"alignment", "alignment", "int64_t", /*default=*/"64",
           "Alignment of every buffer, in bytes (a power of two)">,
    Option<"dp", "dp", "int64_t", /*default=*/"1",
           "Data-parallel ranks: each stage is padded to dp * 32 elements and "
           "the master weights, moments and reduced gradients are sharded">,
    Option<"zeroStage", "zero-stage", "int64_t", /*default=*/"1",
           "ZeRO stage (1, 2 or 3)">,
  ];
}

def FusePass : Pass<"fastllm-fuse", "func::FuncOp"> {
  let summary = "recognises the composite patterns exporters spell out";
  let description = [{
    Replaces, when every intermediate has no other use:

    - GELU, erf form `x * 0.5 * (1 + erf(x / sqrt(2)))` and tanh form
      `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, with
      `model.gelu` (factors in any order; `x / c` or `x * (1/c)`; `x^3` as a
      product or a pow);
    - RMSNorm `x * 1/sqrt(mean(x^2, last dims) + eps) * w` (the reciprocal
      as a division, `reciprocal` or `rsqrt`) with `model.rms_norm`;
    - SiLU `x * sigmoid(x)` with `model.silu` (so SwiGLU becomes
      `silu(a) * b`);
    - `1 / sqrt(x)` (a division or `reciprocal`) with `model.rsqrt`;
    - causal attention `softmax(mask(scale * q k^T)) v`, the mask a constant
      keeping keys j <= i (filled with -inf or a huge negative value), with
      `model.causal_attention`.

    Constants must match to within 1e-6 relative; anything else (another
    constant, another operand, a reduction over other dims) is left alone.
  }];
  let dependentDialects = ["::mlir::fastllm::model::ModelDialect"];
}

def PartitionStagesPass : Pass<"fastllm-partition-stages", "ModuleOp"> {
  let summary = "finds the model's layers from its structure and groups them into stages";
  let description = [{
    Works on `@forward`. A *layer boundary* is a point in the program where
    exactly one activation (a value computed from the inputs) is live: the
    residual stream. Parameters, constants and what is computed from them
    alone (weight transposes, masks, position tables) do not count. The
    segments between boundaries repeat with the transformer's blocks (a
    pre-norm block has two: attention and MLP), so the longest periodic run
    of segments (same op sequence) gives the blocks; what precedes it is the
    embedding layer and what follows it the head. This needs no names, so it
    works on folded exports whose weights are anonymous (`onnx::MatMul_502`).

    Stages (Fast-LLM's rule): the embedding is stage 0; the blocks and the
    head are grouped `layers-per-stage` at a time, layer j (0-based after the
    embedding) going to stage 1 + floor(j / layers-per-stage). Every op gets
    `model.layer` and `model.stage`; ops computed from parameters and
    constants alone, and every `model.parameter`, take the stage of their
    first use (a tied embedding/head weight belongs to the embedding's
    stage). The module gets `model.num_layers` and `model.num_stages`.
  }];
  let options = [
    Option<"layersPerStage", "layers-per-stage", "double", /*default=*/"1.0",
           "Layers per stage (a positive number; fractions allowed)">,
  ];
}

#endif // FASTLLM_PASSES_TD
