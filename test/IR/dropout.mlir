// RUN: fastllm-opt %s | fastllm-opt | FileCheck %s
// RUN: fastllm-opt %s --mlir-print-op-generic | fastllm-opt | FileCheck %s
// RUN: fastllm-opt %s --fastllm-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: sed -e 's/ratio 1.000000e-01/ratio 1.000000e+00/' %s > %t.one.mlir
// RUN: not fastllm-opt %t.one.mlir 2>&1 | FileCheck %s --check-prefix=ONE
// RUN: sed -e 's/ratio 1.000000e-01/ratio -5.000000e-01/' %s > %t.neg.mlir
// RUN: not fastllm-opt %t.neg.mlir 2>&1 | FileCheck %s --check-prefix=NEG
// RUN: sed -e 's/ratio 1.000000e-01/ratio 0x7FC00000/' %s > %t.nan.mlir
// RUN: not fastllm-opt %t.nan.mlir 2>&1 | FileCheck %s --check-prefix=NAN
// RUN: sed -e 's/site 7 /site 4294967296 /' %s > %t.site.mlir
// RUN: not fastllm-opt %t.site.mlir 2>&1 | FileCheck %s --check-prefix=SITE
// RUN: sed -e 's/site 7 /site -1 /' %s > %t.negsite.mlir
// RUN: not fastllm-opt %t.negsite.mlir 2>&1 | FileCheck %s --check-prefix=NEGSITE

// Tests model.dropout: it round-trips in its custom and generic forms; its
// verifier takes a ratio in [0, 1) and a 32-bit site only; and its gradient
// is the same dropout (ratio and site) of the result's gradient, so the
// backward regenerates the forward's mask and the forward keeps nothing for
// it but its output.

// ONE: error: 'model.dropout' op ratio must be in [0, 1), got 1
// NEG: error: 'model.dropout' op ratio must be in [0, 1), got -0.5
// NAN: error: 'model.dropout' op ratio must be in [0, 1), got NaN
// SITE: error: 'model.dropout' op site must be in [0, 2^32), got 4294967296
// NEGSITE: error: 'model.dropout' op site must be in [0, 2^32), got -1

model.parameter @w : tensor<2x3x4xf32>

// CHECK-LABEL: func.func @forward
// CHECK: model.dropout %{{.*}} ratio 1.000000e-01 site 7 : tensor<2x3x4xf32>
// CHECK: model.dropout %{{.*}} ratio 0.000000e+00 site 4294967295 : tensor<2x3x4xf32>

// GRAD-LABEL: func.func @train_step
// GRAD: %[[W:.*]] = model.get_parameter @w : tensor<2x3x4xf32>
// GRAD: %[[Y:.*]] = model.dropout %[[W]] ratio 1.000000e-01 site 7 : tensor<2x3x4xf32>
// GRAD: %[[Z:.*]] = model.dropout %[[Y]] ratio 0.000000e+00 site 4294967295 : tensor<2x3x4xf32>
// GRAD: %[[SQ:.*]] = model.mul %[[Z]], %[[Z]]
// The backward: y * y's gradient through both dropouts, in reverse order,
// each with its forward's ratio and site.
// GRAD: %[[DZ:.*]] = model.add %{{.*}}, %{{.*}} : tensor<2x3x4xf32>, tensor<2x3x4xf32>
// GRAD: %[[DY:.*]] = model.dropout %[[DZ]] ratio 0.000000e+00 site 4294967295 {model.backward} : tensor<2x3x4xf32>
// GRAD: %[[DW:.*]] = model.dropout %[[DY]] ratio 1.000000e-01 site 7 {model.backward} : tensor<2x3x4xf32>
// GRAD: model.accumulate_grad @w, %[[DW]]
func.func @forward() -> tensor<f32> {
  %w = model.get_parameter @w : tensor<2x3x4xf32>
  %y = model.dropout %w ratio 1.000000e-01 site 7 : tensor<2x3x4xf32>
  %z = model.dropout %y ratio 0.000000e+00 site 4294967295 : tensor<2x3x4xf32>
  %sq = model.mul %z, %z : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %l = model.reduce_sum %sq dims [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
