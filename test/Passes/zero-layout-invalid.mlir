// Tests that a plan ZeRO-2/3 cannot run is refused naming the ONNX nodes at
// fault (the importer's NameLoc, kept by autodiff and fusion) and what would
// work. Parameters read in several stages are not such a plan (see
// zero-ties.mlir); a step whose stages run out of order is, and so is a read
// of a parameter before its stage (a parameter belongs to the stage of its
// first read, so only a hand-written stage assignment gets there).
//
// RUN: not fastllm-opt %s --split-input-file --fastllm-zero-layout='dp=2 zero-stage=2' 2>&1 \
// RUN:   | FileCheck %s --check-prefixes=CHECK,ZERO2
// RUN: not fastllm-opt %s --split-input-file --fastllm-zero-layout='dp=2 zero-stage=3' 2>&1 \
// RUN:   | FileCheck %s --check-prefixes=CHECK,ZERO3
// ZeRO-1 reduces once per step: every case compiles.
// RUN: fastllm-opt %s --split-input-file --fastllm-zero-layout='dp=2' -o /dev/null

// Stage 0's backward (the embedding's Gather, adding @a's gradient) runs
// before the head's (stage 1): the backward must run the stages in reverse
// order. An accumulation is named by its parameter.
// ZERO2: 'model.reduce_sum' op in the backward of stage 1 (ONNX node '/lm_head/MatMul') runs after the backward of stage 0 (adding the gradient of @a); ZeRO-2 needs the backward to run the stages in reverse order; --zero-stage 1 takes the stages in any order
// ZERO3: 'model.reduce_sum' op in the backward of stage 1 (ONNX node '/lm_head/MatMul') runs after the backward of stage 0 (adding the gradient of @a); ZeRO-3 needs
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32> loc("a")
  %b = model.get_parameter @b : tensor<16xf32> loc("b")
  %x = model.exp %a {model.stage = 0 : i64} : tensor<8x16xf32> loc("/wte/Gather")
  %y = model.mul %x, %b {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32> loc("/lm_head/MatMul")
  %l = model.reduce_sum %y dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32> loc("/loss/ReduceSum")
  %ga = model.mul %x, %a {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32> loc("/wte/Gather")
  model.accumulate_grad @a, %ga {model.backward, model.stage = 0 : i64} : tensor<8x16xf32> loc("a")
  %gb = model.reduce_sum %x dims [0] {model.backward, model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<16xf32> loc("/lm_head/MatMul")
  model.accumulate_grad @b, %gb {model.backward, model.stage = 1 : i64} : tensor<16xf32> loc("b")
  return %l : tensor<f32>
}

// -----

// The forward must run the stages in order.
// CHECK: 'model.exp' op in the forward of stage 0 (ONNX node '/h.0/Exp') runs after the forward of stage 1 (ONNX node '/h.1/Exp'); ZeRO-{{[23]}} needs the forward to run the stages in order; --zero-stage 1 takes the stages in any order
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %eb = model.exp %b {model.stage = 1 : i64} : tensor<16xf32> loc("/h.1/Exp")
  %x = model.exp %a {model.stage = 0 : i64} : tensor<8x16xf32> loc("/h.0/Exp")
  %y = model.mul %x, %eb {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %l = model.reduce_sum %y dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A forward op after the backward started.
// CHECK: 'model.exp' op of the forward (ONNX node '/h.1/Exp') runs after the backward started (adding the gradient of @b); ZeRO-{{[23]}} needs the forward first; --zero-stage 1 takes the stages in any order
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %x = model.exp %a {model.stage = 0 : i64} : tensor<8x16xf32>
  %y = model.mul %x, %b {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %l = model.reduce_sum %y dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  %gb = model.reduce_sum %x dims [0] {model.backward, model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<16xf32> loc("/h.1/Mul")
  model.accumulate_grad @b, %gb {model.backward} : tensor<16xf32>
  %z = model.exp %y {model.stage = 1 : i64} : tensor<8x16xf32> loc("/h.1/Exp")
  %ga = model.mul %x, %a {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  model.accumulate_grad @a, %ga {model.backward} : tensor<8x16xf32>
  return %l : tensor<f32>
}

// -----

// Stage 0 reads @b of stage 1: ZeRO-3 would find no weights there, ZeRO-2
// would add its gradient before stage 1's slot is cleared.
// CHECK: 'model.mul' op in stage 0 (ONNX node '/h.0/Mul') reads @b of the later stage 1; a parameter belongs to the stage of its first use
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %x = model.mul %a, %b {model.stage = 0 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32> loc("/h.0/Mul")
  %l = model.reduce_sum %x dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  %gb = model.reduce_sum %a dims [0] {model.backward, model.stage = 0 : i64} : tensor<8x16xf32> -> tensor<16xf32> loc("/h.0/Mul")
  model.accumulate_grad @b, %gb {model.backward, model.stage = 0 : i64} : tensor<16xf32>
  model.accumulate_grad @a, %x {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>
  return %l : tensor<f32>
}

// -----

// The same for an accumulation alone.
// CHECK: 'model.accumulate_grad' op in stage 0 adds the gradient of @b of the later stage 1; a parameter belongs to the stage of its first use
model.parameter @a : tensor<8x16xf32> {model.stage = 0 : i64}
model.parameter @b : tensor<16xf32> {model.stage = 1 : i64}
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %a = model.get_parameter @a : tensor<8x16xf32>
  %b = model.get_parameter @b : tensor<16xf32>
  %x = model.mul %a, %b {model.stage = 1 : i64} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %l = model.reduce_sum %x dims [0, 1] {model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<f32>
  %gb = model.reduce_sum %a dims [0] {model.backward, model.stage = 1 : i64} : tensor<8x16xf32> -> tensor<16xf32>
  model.accumulate_grad @b, %gb {model.backward, model.stage = 0 : i64} : tensor<16xf32>
  model.accumulate_grad @a, %x {model.backward, model.stage = 0 : i64} : tensor<8x16xf32>
  return %l : tensor<f32>
}
