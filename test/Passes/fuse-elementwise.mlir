// RUN: fastllm-opt %s --split-input-file --fastllm-fuse-elementwise | FileCheck %s

// Tests which pointwise chains fastllm-fuse-elementwise turns into one
// model.fused_elementwise: a chain whose intermediates have no other use
// (with a cast of a smaller shape, recomputed per element), a value read
// twice inside the group, and what keeps a producer out: a use outside the
// group, a smaller shape from an op that is not a cast or broadcast, an op
// with memory effects in between, another stage or direction, and the input
// limit.

// CHECK-LABEL: func.func @chain
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xbf16>, %[[B:.*]]: tensor<4xf32>, %[[S:.*]]: tensor<2x4xbf16>)
func.func @chain(%x: tensor<2x4xbf16>, %b: tensor<4xf32>, %s: tensor<2x4xbf16>) -> tensor<2x4xbf16> {
  // CHECK-NEXT: %[[R:.*]] = model.fused_elementwise(%[[B]], %[[X]], %[[S]]) {model.stage = 1 : i64} : (tensor<4xf32>, tensor<2x4xbf16>, tensor<2x4xbf16>) -> tensor<2x4xbf16> {
  // CHECK-NEXT: ^bb0(%[[A0:.*]]: tensor<4xf32>, %[[A1:.*]]: tensor<2x4xbf16>, %[[A2:.*]]: tensor<2x4xbf16>):
  // CHECK-NEXT:   %[[C:.*]] = model.cast %[[A0]] : tensor<4xf32> -> tensor<4xbf16>
  // CHECK-NEXT:   %[[ADD:.*]] = model.add %[[A1]], %[[C]]
  // CHECK-NEXT:   %[[T:.*]] = model.tanh %[[ADD]] : tensor<2x4xbf16>
  // CHECK-NEXT:   %[[M:.*]] = model.mul %[[T]], %[[A2]]
  // CHECK-NEXT:   model.yield %[[M]] : tensor<2x4xbf16>
  // CHECK-NEXT: }
  // CHECK-NEXT: return %[[R]]
  %c = model.cast %b {model.stage = 1 : i64} : tensor<4xf32> -> tensor<4xbf16>
  %a = model.add %x, %c {model.stage = 1 : i64} : tensor<2x4xbf16>, tensor<4xbf16> -> tensor<2x4xbf16>
  %t = model.tanh %a {model.stage = 1 : i64} : tensor<2x4xbf16>
  %m = model.mul %t, %s {model.stage = 1 : i64} : tensor<2x4xbf16>, tensor<2x4xbf16> -> tensor<2x4xbf16>
  return %m : tensor<2x4xbf16>
}

// -----

// exp(x) is read by both the add and the mul: it joins once both have, and
// is computed once in the body.
// CHECK-LABEL: func.func @diamond
func.func @diamond(%x: tensor<8xf32>, %one: tensor<f32>) -> tensor<8xf32> {
  // CHECK-NEXT: model.fused_elementwise(%arg0, %arg1)
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: %[[E:.*]] = model.exp %{{.*}}
  // CHECK-NEXT: %[[P:.*]] = model.add %[[E]], %{{.*}}
  // CHECK-NEXT: %[[Q:.*]] = model.mul %[[E]], %[[P]]
  // CHECK-NEXT: model.yield %[[Q]]
  %e = model.exp %x : tensor<8xf32>
  %p = model.add %e, %one : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  %q = model.mul %e, %p : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  return %q : tensor<8xf32>
}

// -----

// The add is also returned, so it stays stored; the tanh alone is no group.
// CHECK-LABEL: func.func @other_use
func.func @other_use(%x: tensor<8xf32>, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  // CHECK-NOT: model.fused_elementwise
  // CHECK: model.add
  // CHECK-NEXT: model.tanh
  %a = model.add %x, %y : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %t = model.tanh %a : tensor<8xf32>
  return %t, %a : tensor<8xf32>, tensor<8xf32>
}

// -----

// exp of a row would be recomputed for every column: it stays; the sub and
// the mul fuse.
// CHECK-LABEL: func.func @smaller_shape
func.func @smaller_shape(%x: tensor<4x8xf32>, %r: tensor<4x1xf32>) -> tensor<4x8xf32> {
  // CHECK-NEXT: %[[E:.*]] = model.exp %arg1 : tensor<4x1xf32>
  // CHECK-NEXT: model.fused_elementwise(%arg0, %[[E]])
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: model.sub
  // CHECK-NEXT: model.mul
  %e = model.exp %r : tensor<4x1xf32>
  %d = model.sub %x, %e : tensor<4x8xf32>, tensor<4x1xf32> -> tensor<4x8xf32>
  %m = model.mul %d, %d : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  return %m : tensor<4x8xf32>
}

// -----

// An op with memory effects between producer and consumer keeps them apart
// (the consumer would read the producer's inputs after it).
model.parameter @w : tensor<8xf32>
// CHECK-LABEL: func.func @effects_between
func.func @effects_between(%x: tensor<8xf32>, %g: tensor<8xf32>) -> tensor<8xf32> {
  // CHECK-NOT: model.fused_elementwise
  // CHECK: model.exp
  // CHECK-NEXT: model.accumulate_grad
  // CHECK-NEXT: model.neg
  %e = model.exp %x : tensor<8xf32>
  model.accumulate_grad @w, %g : tensor<8xf32>
  %n = model.neg %e : tensor<8xf32>
  return %n : tensor<8xf32>
}

// -----

// Another stage, or the backward of the same stage, keeps its own ops.
// CHECK-LABEL: func.func @stages
func.func @stages(%x: tensor<8xf32>) -> tensor<8xf32> {
  // CHECK-NOT: model.fused_elementwise
  %e = model.exp %x {model.stage = 0 : i64} : tensor<8xf32>
  %n = model.neg %e {model.stage = 1 : i64} : tensor<8xf32>
  %t = model.tanh %n {model.backward, model.stage = 1 : i64} : tensor<8xf32>
  return %t : tensor<8xf32>
}

// -----

// A sum of ten inputs: the group stops at eight inputs; the first two adds
// form a group of their own.
// CHECK-LABEL: func.func @input_limit
func.func @input_limit(%a0: tensor<8xf32>, %a1: tensor<8xf32>, %a2: tensor<8xf32>,
                       %a3: tensor<8xf32>, %a4: tensor<8xf32>, %a5: tensor<8xf32>,
                       %a6: tensor<8xf32>, %a7: tensor<8xf32>, %a8: tensor<8xf32>,
                       %a9: tensor<8xf32>) -> tensor<8xf32> {
  // CHECK-NEXT: %[[S2:.*]] = model.fused_elementwise(%arg0, %arg1, %arg2)
  // CHECK-NEXT: ^bb0
  // CHECK-COUNT-2: model.add
  // CHECK-NEXT: model.yield
  // CHECK: model.fused_elementwise(%[[S2]], %arg3, %arg4, %arg5, %arg6, %arg7, %arg8, %arg9)
  // CHECK-NEXT: ^bb0
  // CHECK-COUNT-7: model.add
  // CHECK-NEXT: model.yield
  %s1 = model.add %a0, %a1 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s2 = model.add %s1, %a2 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s3 = model.add %s2, %a3 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s4 = model.add %s3, %a4 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s5 = model.add %s4, %a5 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s6 = model.add %s5, %a6 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s7 = model.add %s6, %a7 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s8 = model.add %s7, %a8 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s9 = model.add %s8, %a9 : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  return %s9 : tensor<8xf32>
}
