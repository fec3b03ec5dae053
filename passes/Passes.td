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
    `model.parameter`s not marked `frozen` (the importer freezes buffers and
    initializers the loss does not depend on differentiably), plus those the
    `train` regex matches, minus those the `freeze` regex matches (`freeze`
    wins; both may match anywhere in the name: anchor them with ^ and $). Every op between a trainable parameter and the loss must
    implement GradientOpInterface. `@forward` is kept for evaluation.
  }];
  let options = [
    Option<"freeze", "freeze", "std::string", /*default=*/"\"\"",
           "Regex of parameter names to freeze (no gradient, no optimizer state)">,
    Option<"train", "train", "std::string", /*default=*/"\"\"",
           "Regex of parameter names to train even though the importer "
           "froze them">,
  ];
  let dependentDialects = ["::mlir::fastllm::model::ModelDialect"];
}

def MarkFrozenPass : Pass<"fastllm-mark-frozen", "ModuleOp"> {
  let summary = "applies the freeze and train regexes to the `frozen` marks";
  let description = [{
    First in the pipeline, so that every later pass sees which parameters
    train: fastllm-fuse compiles frozen parameters' values in (a causal mask
    buffer), which a `train` regex applied only at autodiff would unfreeze
    after the fact. The options mean what fastllm-autodiff's do (it applies
    them again, to the same effect).
  }];
  let options = [
    Option<"freeze", "freeze", "std::string", /*default=*/"\"\"",
           "Regex of parameter names to freeze (no gradient, no optimizer state)">,
    Option<"train", "train", "std::string", /*default=*/"\"\"",
           "Regex of parameter names to train even though the importer "
           "froze them">,
  ];
}

def FoldTransposesPass : Pass<"fastllm-fold-transposes", "ModuleOp"> {
  let summary = "folds last-two-dims transposes into the matmuls that read them";
  let description = [{
    After autodiff: `model.matmul(model.transpose(x))` where the transpose
    swaps the last two dims becomes a matmul reading x with its
    `transpose_lhs` or `transpose_rhs` flag; transposes left without uses are
    erased.
  }];
}

def FuseElementwisePass : Pass<"fastllm-fuse-elementwise", "ModuleOp"> {
  let summary = "turns chains of pointwise ops into model.fused_elementwise";
  let description = [{
    Before memory planning: a pointwise op and the pointwise producers whose
    every use is in its group (same stage and direction, no op with memory
    effects in between, the group's shape or a cast or broadcast, at most 8
    inputs) become one model.fused_elementwise at the last op's place; its
    intermediates get no buffer and the emitter writes one kernel for it.
  }];
}

def FuseGradAccumulationPass : Pass<"fastllm-fuse-grad-accumulation", "ModuleOp"> {
  let summary = "weight gradients added into their buffers by the GEMM";
  let description = [{
    After fastllm-verify-collectives: `model.accumulate_grad` of a matmul's
    product (through a bf16-to-f32 cast and a matrix transpose, each
    optional, every value with one use, no op with memory effects between
    the matmul and the accumulate) becomes one
    `model.matmul_accumulate_grad` at the accumulate's place, keeping its
    stage and gradient slot.
  }];
}

def MixedPrecisionPass : Pass<"fastllm-mixed-precision", "ModuleOp"> {
  let summary = "computes @forward in bf16 with fp32 weights, gradients and loss";
  let description = [{
    Before autodiff: every float parameter read is cast to bf16; an op with
    a bf16 operand computes in bf16 (its other float operands are cast);
    losses read bf16 logits and return fp32; @forward returns fp32. Autodiff
    then casts each parameter's bf16 gradient back to fp32 before it is
    accumulated, so gradient buffers, master weights and the optimizer stay
    fp32 (full-precision gradients).
  }];
  let options = [
    Option<"compute", "compute", "std::string", /*default=*/"\"bf16\"",
           "The compute type: bf16">,
  ];
  let dependentDialects = ["::mlir::fastllm::model::ModelDialect"];
}

def ZeroLayoutPass : Pass<"fastllm-zero-layout", "ModuleOp"> {
  let summary = "ZeRO step 1: lays out the stages' parameters and assigns buffer slots";
  let description = [{
    Decides the distributed plan of `func.func @train_step` (docs/DESIGN.md
    section 3) and records it in the module's `plan.layout`:

    - parameters are laid end to end in one flat fp32 array, ordered by
      stage (`model.stage`), each tensor aligned to `alignment` bytes and
      each stage padded to a multiple of `dp * 32` elements (`plan.offset`
      on each `model.parameter`, in elements);
    - ZeRO-2 and 3 give the stages that have parameters `num-grad-buffers`
      gradient slots round-robin (default 2), ZeRO-3 also `num-weight-buffers`
      weight slots (default 2), each sized for the largest stage it serves; a
      stage read by a later stage (a tied embedding read by the head) keeps
      a weight slot of its own, which the later stage reads (ZeRO-3);
    - every op of the step gets a `model.stage`; ZeRO-2/3 require the forward
      to run the stages in order and the backward in reverse; ZeRO-3 gives
      each stage its own `model.get_parameter` with the weight slot it reads
      (`plan.slot`), ZeRO-2/3 each `model.accumulate_grad` its gradient slot.
  }];
  let options = [
    Option<"dp", "dp", "int64_t", /*default=*/"1",
           "Data-parallel ranks: each stage is padded to dp * 32 elements and "
           "the master weights, moments and reduced gradients are sharded">,
    Option<"zeroStage", "zero-stage", "int64_t", /*default=*/"1",
           "ZeRO stage (1, 2 or 3)">,
    Option<"numGradBuffers", "num-grad-buffers", "int64_t", /*default=*/"2",
           "Gradient slots shared by the stages (ZeRO-2/3 only)">,
    Option<"numWeightBuffers", "num-weight-buffers", "int64_t", /*default=*/"2",
           "Weight slots shared by the stages (ZeRO-3 only)">,
    Option<"alignment", "alignment", "int64_t", /*default=*/"64",
           "Alignment of every parameter tensor, in bytes">,
    Option<"fullPrecisionGradients", "full-precision-gradients", "bool",
           /*default=*/"true",
           "Gradient buffers in fp32 (else in the compute dtype; the CPU "
           "target computes in fp32, so both are fp32 there)">,
  ];
}

def ZeroCollectivesPass : Pass<"fastllm-zero-collectives", "ModuleOp"> {
  let summary = "ZeRO step 2: places the step's all-gathers and reduce-scatters";
  let description = [{
    Inserts into `func.func @train_step` the collectives of one micro-batch,
    from the slots of fastllm-zero-layout: ZeRO-3 gathers each stage's
    weights before its forward (prefetching the next stage's during its
    compute) and again before its backward when its slot was reused; ZeRO-2
    and 3 clear a stage's gradient slot before its backward and start its
    reduce-scatter after it, waiting for it only when the slot is needed
    again or at the end of the step. ZeRO-1 steps are left alone.
  }];
}

def VerifyCollectivesPass : Pass<"fastllm-verify-collectives", "ModuleOp"> {
  let summary = "proves the step's collectives consistent and records its traffic";
  let description = [{
    Runs the step over an abstract state of its weight and gradient slots and
    fails with a diagnostic on the op at fault unless: the step is
    straight-line code (every rank issues the same collectives, of its
    stage's size); every parameter read finds its stage in its weight slot;
    every gradient is added into a slot cleared for its stage; every stage
    with parameters is reduce-scattered exactly once per micro-batch
    (ZeRO-2/3); nothing is in flight at the end. A pure verifier: it
    changes nothing (fastllm-count-traffic records what the collectives
    move).
  }];
}

def CountTrafficPass : Pass<"fastllm-count-traffic", "ModuleOp"> {
  let summary = "records the bytes one rank's collectives move";
  let description = [{
    Sums, into the module's `plan.traffic`, the bytes one rank's collectives
    move, counting a collective as its full buffer (a stage's fp32 elements
    times 4): the all-gathers and reduce-scatters of `@train_step`, per
    micro-batch, and the runtime's once per optimizer step (ZeRO-1
    reduce-scatters and ZeRO-1/2 all-gathers of the whole flat array). With
    dp 1 nothing moves and every figure is 0.
  }];
}

def PlanMemoryPass : Pass<"fastllm-plan-memory", "ModuleOp"> {
  let summary = "lays out one static arena per process and assigns every buffer";
  let description = [{
    Places the regions of one rank's arena for the layout of
    fastllm-zero-layout (docs/DESIGN.md section 3):

    - ZeRO-1 and 2: the full weights (ZeRO-3: the weight slots); ZeRO-1: the
      full gradients (ZeRO-2/3: the gradient slots, reduced in place); this rank's 1/dp shards of
      the fp32 master weights, AdamW moments and reduced gradients;
    - the token and target inputs (the step's two integer arguments; the
      token ids index an embedding table, the targets label a loss, or the
      `input-tokens` / `input-targets` options name them by their exported
      names where the graph cannot tell);
    - every other tensor an op produces gets a byte offset in the activation
      region, assigned from liveness so that values whose lifetimes do not
      overlap share memory (greedy by size, first fit); `model.reshape`
      aliases its input, `model.constant` needs no memory.

    Ops get `plan.offsets` (one byte offset per tensor result: for
    `model.get_parameter` where the weights it reads are,
    `model.accumulate_grad` gets the offset of the gradient it adds into);
    the module's `plan.arena` gets every region's offset and size and the
    arena's total. Every region and buffer is aligned to the `alignment`
    fastllm-zero-layout chose (one option, recorded in the plan).
  }];
  let options = [
    Option<"inputTokens", "input-tokens", "std::string", /*default=*/"\"\"",
           "Name of the input holding the token ids (default: from the graph)">,
    Option<"inputTargets", "input-targets", "std::string", /*default=*/"\"\"",
           "Name of the input holding the targets (default: from the graph)">,
  ];
}

def PrepareEmissionPass : Pass<"fastllm-prepare-emission", "ModuleOp"> {
  let summary = "makes the emitter's last decisions visible in the IR";
  let description = [{
    The emitter prints; it decides nothing. This pass, the last of the
    training pipeline, decides what is left and records it on the planned
    module, where tests can see it:

    - the data: the tokens and targets inputs of `@train_step` (the roles
      fastllm-plan-memory gave them) must be `[batch, seq]` int64;
      `plan.data` holds `batch_size`, `seq_len` and `vocab_size`, the
      vocabulary being the smallest bound on token ids the step relies on
      (the class dimension of a loss on the targets, the rows of a table the
      tokens index);
    - the optimizer: `plan.weight_decay` on every `model.parameter`, true
      for tensors of rank 2 or more (matrices and embeddings) and false for
      vectors and scalars (biases, norm gains), the rule of nanoGPT and
      Megatron-LM; a parameter that already has one keeps it.

    ```mlir
    model.parameter @wte : tensor<64x16xf32> {plan.offset = 0 : i64, plan.weight_decay = true}
    ```
  }];
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
    head are grouped `layers-per-stage` (F) at a time: a stage closes once the
    running layer count reaches the last cut plus F, so layer j (0-based after
    the embedding) goes to stage 1 + floor(j / max(F, 1)). F below 1 gives one
    layer per stage (never an empty one); F must be positive and finite.
    Every op gets
    `model.layer` and `model.stage`; ops computed from parameters and
    constants alone, and every `model.parameter`, take the stage of their
    first use (a tied embedding/head weight belongs to the embedding's
    stage). The module gets `model.num_layers` and `model.num_stages`.
  }];
  let options = [
    Option<"layersPerStage", "layers-per-stage", "double", /*default=*/"1.0",
           "Layers per stage (a positive finite number; fractions allowed, "
           "below 1 means one layer per stage)">,
  ];
}

#endif // FASTLLM_PASSES_TD
