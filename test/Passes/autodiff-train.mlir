// RUN: fastllm-opt %s --fastllm-autodiff | FileCheck %s --check-prefix=DEFAULT
// RUN: fastllm-opt %s --fastllm-autodiff='train=^buf$' | FileCheck %s --check-prefix=TRAIN
// RUN: fastllm-opt %s --fastllm-autodiff='train=^buf$ freeze=^buf$' | FileCheck %s --check-prefix=BOTH
// RUN: not fastllm-opt %s --fastllm-autodiff='train=[' 2>&1 | FileCheck %s --check-prefix=BADREGEX

// Tests --train: a parameter the importer froze (a buffer, with its reason)
// is trained when the regex matches, its reason dropped; --freeze wins where
// both match; a bad regex is an error naming the flag.

// DEFAULT: model.parameter @buf : tensor<2x2xf32> {frozen, model.constant_reason = "a buffer"}
// DEFAULT-LABEL: func.func @train_step
// DEFAULT-NOT: accumulate_grad @buf
// TRAIN: model.parameter @buf : tensor<2x2xf32>{{$}}
// TRAIN-LABEL: func.func @train_step
// TRAIN: model.accumulate_grad @buf
// BOTH: model.parameter @buf : tensor<2x2xf32> {frozen}
// BOTH-NOT: accumulate_grad @buf
model.parameter @buf : tensor<2x2xf32> {frozen, model.constant_reason = "a buffer"}
model.parameter @w : tensor<2x2xf32>
func.func @forward(%x: tensor<3x2xf32>) -> tensor<f32> {
  %b = model.get_parameter @buf : tensor<2x2xf32>
  %w = model.get_parameter @w : tensor<2x2xf32>
  %y = model.matmul %x, %w : tensor<3x2xf32>, tensor<2x2xf32> -> tensor<3x2xf32>
  %z = model.matmul %y, %b : tensor<3x2xf32>, tensor<2x2xf32> -> tensor<3x2xf32>
  %l = model.reduce_sum %z dims [0, 1] : tensor<3x2xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// BADREGEX: error: invalid --train regex '[': {{.+}}
