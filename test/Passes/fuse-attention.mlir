// RUN: fastllm-opt %s --split-input-file --fastllm-fuse | FileCheck %s

// Tests that causal attention as the GPT-2 export writes it (q @ k^T, * scale,
// select(future mask, -inf, .), softmax, @ v) becomes model.causal_attention
// reading k itself rather than k^T.

// CHECK-LABEL: func.func @attention
// CHECK-SAME: (%[[Q:.*]]: tensor<2x3x4xf32>, %[[K:.*]]: tensor<2x3x4xf32>, %[[V:.*]]: tensor<2x3x5xf32>)
// CHECK-NEXT: %[[O:.*]], %{{.*}} = model.causal_attention %[[Q]], %[[K]], %[[V]] scale 5.000000e-01
// CHECK-NEXT: return %[[O]]
func.func @attention(%q: tensor<2x3x4xf32>, %k: tensor<2x3x4xf32>, %v: tensor<2x3x5xf32>) -> tensor<2x3x5xf32> {
  %mask = model.constant dense<[[false, true, true], [false, false, true], [false, false, false]]> : tensor<3x3xi1>
  %ninf = model.constant dense<0xFF800000> : tensor<f32>
  %scale = model.constant dense<0.5> : tensor<f32>
  %kt = model.transpose %k [0, 2, 1] : tensor<2x3x4xf32> -> tensor<2x4x3xf32>
  %s = model.matmul %q, %kt : tensor<2x3x4xf32>, tensor<2x4x3xf32> -> tensor<2x3x3xf32>
  %ss = model.mul %s, %scale : tensor<2x3x3xf32>, tensor<f32> -> tensor<2x3x3xf32>
  %m = model.select %mask, %ninf, %ss : tensor<3x3xi1>, tensor<f32>, tensor<2x3x3xf32> -> tensor<2x3x3xf32>
  %p = model.softmax %m dim 2 : tensor<2x3x3xf32>
  %o = model.matmul %p, %v : tensor<2x3x3xf32>, tensor<2x3x5xf32> -> tensor<2x3x5xf32>
  return %o : tensor<2x3x5xf32>
}

// -----

// Tests the other spellings: k^T made by one transpose straight from the
// [b, t, h, d] layout (k is then that layout transposed to [b, h, t, d]),
// the mask as select(past, scores, fill) with float lowest, and the scale as
// a division.

// CHECK-LABEL: func.func @attention_variants
// CHECK-SAME: (%[[Q:.*]]: tensor<1x2x3x4xf32>, %[[KS:.*]]: tensor<1x3x2x4xf32>, %[[V:.*]]: tensor<1x2x3x4xf32>)
// CHECK-NEXT: %[[K:.*]] = model.transpose %[[KS]] [0, 2, 1, 3] : tensor<1x3x2x4xf32> -> tensor<1x2x3x4xf32>
// CHECK-NEXT: %[[O:.*]], %{{.*}} = model.causal_attention %[[Q]], %[[K]], %[[V]] scale 5.000000e-01
// CHECK-NEXT: return %[[O]]
func.func @attention_variants(%q: tensor<1x2x3x4xf32>, %kbthd: tensor<1x3x2x4xf32>, %v: tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32> {
  %past = model.constant dense<[[[[true, false, false], [true, true, false], [true, true, true]]]]> : tensor<1x1x3x3xi1>
  %lowest = model.constant dense<-3.40282347E+38> : tensor<f32>
  %two = model.constant dense<2.0> : tensor<f32>
  %kt = model.transpose %kbthd [0, 2, 3, 1] : tensor<1x3x2x4xf32> -> tensor<1x2x4x3xf32>
  %s = model.matmul %q, %kt : tensor<1x2x3x4xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x3x3xf32>
  %ss = model.div %s, %two : tensor<1x2x3x3xf32>, tensor<f32> -> tensor<1x2x3x3xf32>
  %m = model.select %past, %ss, %lowest : tensor<1x1x3x3xi1>, tensor<1x2x3x3xf32>, tensor<f32> -> tensor<1x2x3x3xf32>
  %p = model.softmax %m dim 3 : tensor<1x2x3x3xf32>
  %o = model.matmul %p, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32> -> tensor<1x2x3x4xf32>
  return %o : tensor<1x2x3x4xf32>
}

// -----

// Tests near-misses that must stay unfused: a mask that is not causal (one
// entry flipped), a fill value that is not -inf-like, and scores that are
// also used elsewhere.

// CHECK-LABEL: func.func @attention_near_misses
// CHECK-NOT: causal_attention
// CHECK: return
func.func @attention_near_misses(%q: tensor<3x4xf32>, %kt: tensor<4x3xf32>, %v: tensor<3x4xf32>) -> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x3xf32>) {
  %bad = model.constant dense<[[false, true, true], [false, false, false], [false, false, false]]> : tensor<3x3xi1>
  %mask = model.constant dense<[[false, true, true], [false, false, true], [false, false, false]]> : tensor<3x3xi1>
  %ninf = model.constant dense<0xFF800000> : tensor<f32>
  %small = model.constant dense<-1.0e4> : tensor<f32>
  %s0 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %m0 = model.select %bad, %ninf, %s0 : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p0 = model.softmax %m0 dim 1 : tensor<3x3xf32>
  %o0 = model.matmul %p0, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %s1 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %m1 = model.select %mask, %small, %s1 : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p1 = model.softmax %m1 dim 1 : tensor<3x3xf32>
  %o1 = model.matmul %p1, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %s2 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %m2 = model.select %mask, %ninf, %s2 : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p2 = model.softmax %m2 dim 1 : tensor<3x3xf32>
  %o2 = model.matmul %p2, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  return %o0, %o1, %o2, %s2 : tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x3xf32>
}
