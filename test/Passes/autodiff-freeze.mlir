// RUN: fastllm-opt %s --fastllm-autodiff='freeze=^emb\.' | FileCheck %s
// RUN: not fastllm-opt %s --fastllm-autodiff='freeze=(' 2>&1 | FileCheck %s --check-prefix=BADREGEX

// Tests that --freeze marks matching parameters frozen and gives them no
// gradient, while the others still get theirs; and that a bad regex is an
// error naming it.

// CHECK: model.parameter @emb.weight : tensor<4x2xf32> {frozen}
// CHECK: model.parameter @head.weight : tensor<2x2xf32>{{$}}
model.parameter @emb.weight : tensor<4x2xf32>
model.parameter @head.weight : tensor<2x2xf32>
// CHECK-LABEL: func.func @train_step
// CHECK-NOT: accumulate_grad @emb.weight
// CHECK: model.accumulate_grad @head.weight
// CHECK-NOT: accumulate_grad @emb.weight
func.func @forward(%t: tensor<3xi64>) -> tensor<f32> {
  %e = model.get_parameter @emb.weight : tensor<4x2xf32>
  %h = model.get_parameter @head.weight : tensor<2x2xf32>
  %x = model.gather %e[%t] dim 0 : tensor<4x2xf32>, tensor<3xi64> -> tensor<3x2xf32>
  %y = model.matmul %x, %h : tensor<3x2xf32>, tensor<2x2xf32> -> tensor<3x2xf32>
  %l = model.reduce_sum %y dims [0, 1] : tensor<3x2xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// BADREGEX: error: invalid --freeze regex '(': parentheses not balanced
