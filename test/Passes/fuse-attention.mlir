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

// -----

// Tests nanoGPT's registered buffer: `bias = tril(ones(5, 5)).view(1, 1, 5, 5)`
// (a frozen parameter) read as `bias[:, :, :3, :3] == 0` through the two
// slices a dynamic-axes export makes, then masked_fill(-inf).

model.parameter @bias : tensor<1x1x5x5xf32> = dense<[[[[1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]]]]> : tensor<1x1x5x5xf32> {frozen}

// CHECK-LABEL: func.func @nanogpt_buffer
// CHECK-SAME: (%[[Q:.*]]: tensor<1x2x3x4xf32>, %[[K:.*]]: tensor<1x2x3x4xf32>, %[[V:.*]]: tensor<1x2x3x4xf32>)
// CHECK-NEXT: %[[O:.*]], %{{.*}} = model.causal_attention %[[Q]], %[[K]], %[[V]] scale 5.000000e-01
// CHECK-NEXT: return %[[O]]
func.func @nanogpt_buffer(%q: tensor<1x2x3x4xf32>, %k: tensor<1x2x3x4xf32>, %v: tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32> {
  %scale = model.constant dense<0.5> : tensor<f32>
  %kt = model.transpose %k [0, 1, 3, 2] : tensor<1x2x3x4xf32> -> tensor<1x2x4x3xf32>
  %s = model.matmul %q, %kt : tensor<1x2x3x4xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x3x3xf32>
  %ss = model.mul %s, %scale : tensor<1x2x3x3xf32>, tensor<f32> -> tensor<1x2x3x3xf32>
  %b = model.get_parameter @bias : tensor<1x1x5x5xf32>
  %rows = model.slice %b start [0, 0, 0, 0] limit [1, 1, 3, 5] stride [1, 1, 1, 1] : tensor<1x1x5x5xf32> -> tensor<1x1x3x5xf32>
  %used = model.slice %rows start [0, 0, 0, 0] limit [1, 1, 3, 3] stride [1, 1, 1, 1] : tensor<1x1x3x5xf32> -> tensor<1x1x3x3xf32>
  %zero = model.constant dense<0.0> : tensor<f32>
  %future = model.cmp eq, %used, %zero : tensor<1x1x3x3xf32>, tensor<f32> -> tensor<1x1x3x3xi1>
  %ninf = model.constant dense<0xFF800000> : tensor<f32>
  %m = model.select %future, %ninf, %ss : tensor<1x1x3x3xi1>, tensor<f32>, tensor<1x2x3x3xf32> -> tensor<1x2x3x3xf32>
  %p = model.softmax %m dim 3 : tensor<1x2x3x3xf32>
  %o = model.matmul %p, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32> -> tensor<1x2x3x4xf32>
  return %o : tensor<1x2x3x4xf32>
}

// -----

// Tests a bool buffer `ones(4, 4, dtype=bool).tril()` (a constant: only
// float initializers are parameters), sliced to [:3, :3], both as
// masked_fill(~mask, -inf) and as torch.where(mask, scores, -inf), the
// second viewed as [1, 1, 3, 3] and filled from a one-element tensor.

// CHECK-LABEL: func.func @bool_buffer
// CHECK-COUNT-2: model.causal_attention
// CHECK-NOT: model.softmax
// CHECK: return
func.func @bool_buffer(%q: tensor<2x3x4xf32>, %kt: tensor<2x4x3xf32>, %v: tensor<2x3x4xf32>) -> (tensor<2x3x4xf32>, tensor<2x3x4xf32>) {
  %mask = model.constant dense<[[true, false, false, false], [true, true, false, false], [true, true, true, false], [true, true, true, true]]> : tensor<4x4xi1>
  %used = model.slice %mask start [0, 0] limit [3, 3] stride [1, 1] : tensor<4x4xi1> -> tensor<3x3xi1>
  %ninf = model.constant dense<0xFF800000> : tensor<f32>
  %s0 = model.matmul %q, %kt : tensor<2x3x4xf32>, tensor<2x4x3xf32> -> tensor<2x3x3xf32>
  %future = model.not %used : tensor<3x3xi1>
  %m0 = model.select %future, %ninf, %s0 : tensor<3x3xi1>, tensor<f32>, tensor<2x3x3xf32> -> tensor<2x3x3xf32>
  %p0 = model.softmax %m0 dim 2 : tensor<2x3x3xf32>
  %o0 = model.matmul %p0, %v : tensor<2x3x3xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %s1 = model.matmul %q, %kt : tensor<2x3x4xf32>, tensor<2x4x3xf32> -> tensor<2x3x3xf32>
  %past = model.reshape %used : tensor<3x3xi1> -> tensor<1x3x3xi1>
  %fill = model.constant dense<0xFF800000> : tensor<1x1x1xf32>
  %m1 = model.select %past, %s1, %fill : tensor<1x3x3xi1>, tensor<2x3x3xf32>, tensor<1x1x1xf32> -> tensor<2x3x3xf32>
  %p1 = model.softmax %m1 dim 2 : tensor<2x3x3xf32>
  %o1 = model.matmul %p1, %v : tensor<2x3x3xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  return %o0, %o1 : tensor<2x3x4xf32>, tensor<2x3x4xf32>
}

// -----

// Tests additive masks (Llama): `full((4, 4), -inf).triu(1)` registered as
// a frozen buffer and added as mask[:3, :3]; the same viewed as
// [1, 1, 4, 4] with the mask as the add's first operand and float lowest
// for -inf; and one built in forward (folded to a constant) with the
// scores divided by sqrt(d).

model.parameter @mask : tensor<4x4xf32> = dense<[[0.0, 0xFF800000, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000, 0xFF800000], [0.0, 0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0, 0.0]]> : tensor<4x4xf32> {frozen}
model.parameter @mask4 : tensor<1x1x4x4xf32> = dense<[[[[0.0, -3.40282347E+38, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, 0.0, -3.40282347E+38], [0.0, 0.0, 0.0, 0.0]]]]> : tensor<1x1x4x4xf32> {frozen}

// CHECK-LABEL: func.func @additive
// CHECK-NEXT: model.causal_attention {{.*}} scale 1.000000e+00
// CHECK-NEXT: model.causal_attention {{.*}} scale 1.000000e+00
// CHECK-NEXT: model.causal_attention {{.*}} scale 5.000000e-01
// CHECK-NEXT: return
func.func @additive(%q: tensor<1x2x3x4xf32>, %k: tensor<1x2x3x4xf32>, %v: tensor<1x2x3x4xf32>) -> (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) {
  %m = model.get_parameter @mask : tensor<4x4xf32>
  %used = model.slice %m start [0, 0] limit [3, 3] stride [1, 1] : tensor<4x4xf32> -> tensor<3x3xf32>
  %kt0 = model.transpose %k [0, 1, 3, 2] : tensor<1x2x3x4xf32> -> tensor<1x2x4x3xf32>
  %s0 = model.matmul %q, %kt0 : tensor<1x2x3x4xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x3x3xf32>
  %a0 = model.add %s0, %used : tensor<1x2x3x3xf32>, tensor<3x3xf32> -> tensor<1x2x3x3xf32>
  %p0 = model.softmax %a0 dim 3 : tensor<1x2x3x3xf32>
  %o0 = model.matmul %p0, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32> -> tensor<1x2x3x4xf32>
  %m4 = model.get_parameter @mask4 : tensor<1x1x4x4xf32>
  %used4 = model.slice %m4 start [0, 0, 0, 0] limit [1, 1, 3, 3] stride [1, 1, 1, 1] : tensor<1x1x4x4xf32> -> tensor<1x1x3x3xf32>
  %kt1 = model.transpose %k [0, 1, 3, 2] : tensor<1x2x3x4xf32> -> tensor<1x2x4x3xf32>
  %s1 = model.matmul %q, %kt1 : tensor<1x2x3x4xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x3x3xf32>
  %a1 = model.add %used4, %s1 : tensor<1x1x3x3xf32>, tensor<1x2x3x3xf32> -> tensor<1x2x3x3xf32>
  %p1 = model.softmax %a1 dim 3 : tensor<1x2x3x3xf32>
  %o1 = model.matmul %p1, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32> -> tensor<1x2x3x4xf32>
  %fwd = model.constant dense<[[0.0, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
  %two = model.constant dense<2.0> : tensor<f32>
  %kt2 = model.transpose %k [0, 1, 3, 2] : tensor<1x2x3x4xf32> -> tensor<1x2x4x3xf32>
  %s2 = model.matmul %q, %kt2 : tensor<1x2x3x4xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x3x3xf32>
  %ss2 = model.div %s2, %two : tensor<1x2x3x3xf32>, tensor<f32> -> tensor<1x2x3x3xf32>
  %a2 = model.add %ss2, %fwd : tensor<1x2x3x3xf32>, tensor<3x3xf32> -> tensor<1x2x3x3xf32>
  %p2 = model.softmax %a2 dim 3 : tensor<1x2x3x3xf32>
  %o2 = model.matmul %p2, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32> -> tensor<1x2x3x4xf32>
  return %o0, %o1, %o2 : tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>
}

// -----

// Tests an additive mask computed in forward from a bool constant, as the
// old nn.Transformer.generate_square_subsequent_mask wrote it unfolded:
// mask.float().masked_fill(mask == 0, -inf).masked_fill(mask == 1, 0.0).

// CHECK-LABEL: func.func @computed_additive
// CHECK-NEXT: model.transpose
// CHECK-NEXT: model.causal_attention
// CHECK-NEXT: return
func.func @computed_additive(%q: tensor<3x4xf32>, %kt: tensor<4x3xf32>, %v: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %past = model.constant dense<[[true, false, false], [true, true, false], [true, true, true]]> : tensor<3x3xi1>
  %f = model.cast %past : tensor<3x3xi1> -> tensor<3x3xf32>
  %zero = model.constant dense<0.0> : tensor<f32>
  %one = model.constant dense<1.0> : tensor<f32>
  %ninf = model.constant dense<0xFF800000> : tensor<f32>
  %is0 = model.cmp eq, %f, %zero : tensor<3x3xf32>, tensor<f32> -> tensor<3x3xi1>
  %f1 = model.select %is0, %ninf, %f : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %is1 = model.cmp eq, %f1, %one : tensor<3x3xf32>, tensor<f32> -> tensor<3x3xi1>
  %mask = model.select %is1, %zero, %f1 : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %s = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a = model.add %s, %mask : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p = model.softmax %a dim 1 : tensor<3x3xf32>
  %o = model.matmul %p, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  return %o : tensor<3x4xf32>
}

// -----

// Tests a frozen buffer held as a resource blob, as the importer stores
// initializers (an additive [3, 3] mask: 0 and -inf).

model.parameter @blob : tensor<3x3xf32> = dense_resource<blob> : tensor<3x3xf32> {frozen}

// CHECK-LABEL: func.func @blob_buffer
// CHECK: model.causal_attention
// CHECK-NOT: model.softmax
func.func @blob_buffer(%q: tensor<3x4xf32>, %kt: tensor<4x3xf32>, %v: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %m = model.get_parameter @blob : tensor<3x3xf32>
  %s = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a = model.add %s, %m : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p = model.softmax %a dim 1 : tensor<3x3xf32>
  %o = model.matmul %p, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  return %o : tensor<3x4xf32>
}

{-#
  dialect_resources: {
    builtin: {
      blob: "0x0400000000000000000080FF000080FF0000000000000000000080FF000000000000000000000000"
    }
  }
#-}

// -----

// Tests a frozen buffer whose bytes are still in the exporter's layout
// (model.initial_value_transposed, as the importer leaves a folded weight
// it found in a read-only mapping): the bytes spell the causal mask above,
// but the value is their transpose, which masks the past: no fusion.

model.parameter @stored : tensor<3x3xf32> = dense_resource<stored> : tensor<3x3xf32> {frozen, model.initial_value_transposed}

// CHECK-LABEL: func.func @transposed_buffer
// CHECK-NOT: model.causal_attention
// CHECK: model.softmax
func.func @transposed_buffer(%q: tensor<3x4xf32>, %kt: tensor<4x3xf32>, %v: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %m = model.get_parameter @stored : tensor<3x3xf32>
  %s = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a = model.add %s, %m : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p = model.softmax %a dim 1 : tensor<3x3xf32>
  %o = model.matmul %p, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  return %o : tensor<3x4xf32>
}

{-#
  dialect_resources: {
    builtin: {
      stored: "0x0400000000000000000080FF000080FF0000000000000000000080FF000000000000000000000000"
    }
  }
#-}

// -----

// Tests masks that must not fuse, each one step from a causal one: a
// trainable parameter holding the causal pattern (training changes it), a
// frozen one with no value, a diagonal offset (triu(0): the diagonal masked
// too), a finite -1e9 fill, one flipped element in a buffer, and a slice of
// a causal buffer that starts one row down (keeps j <= i + 1).

model.parameter @trainable : tensor<3x3xf32> = dense<[[0.0, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
model.parameter @novalue : tensor<3x3xf32> {frozen}
model.parameter @diagonal : tensor<3x3xf32> = dense<[[0xFF800000, 0xFF800000, 0xFF800000], [0.0, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000]]> : tensor<3x3xf32> {frozen}
model.parameter @finite : tensor<3x3xf32> = dense<[[0.0, -1.0e9, -1.0e9], [0.0, 0.0, -1.0e9], [0.0, 0.0, 0.0]]> : tensor<3x3xf32> {frozen}
model.parameter @flipped : tensor<1x1x4x4xf32> = dense<[[[[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]]]> : tensor<1x1x4x4xf32> {frozen}
model.parameter @tril : tensor<4x4xf32> = dense<[[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]> : tensor<4x4xf32> {frozen}

// CHECK-LABEL: func.func @mask_near_misses
// CHECK-NOT: causal_attention
// CHECK: return
func.func @mask_near_misses(%q: tensor<3x4xf32>, %kt: tensor<4x3xf32>, %v: tensor<3x4xf32>) -> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>) {
  %zero = model.constant dense<0.0> : tensor<f32>
  %ninf = model.constant dense<0xFF800000> : tensor<f32>
  %t = model.get_parameter @trainable : tensor<3x3xf32>
  %s0 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a0 = model.add %s0, %t : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p0 = model.softmax %a0 dim 1 : tensor<3x3xf32>
  %o0 = model.matmul %p0, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %n = model.get_parameter @novalue : tensor<3x3xf32>
  %s1 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a1 = model.add %s1, %n : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p1 = model.softmax %a1 dim 1 : tensor<3x3xf32>
  %o1 = model.matmul %p1, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %d = model.get_parameter @diagonal : tensor<3x3xf32>
  %s2 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a2 = model.add %s2, %d : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p2 = model.softmax %a2 dim 1 : tensor<3x3xf32>
  %o2 = model.matmul %p2, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %f = model.get_parameter @finite : tensor<3x3xf32>
  %s3 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %a3 = model.add %s3, %f : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p3 = model.softmax %a3 dim 1 : tensor<3x3xf32>
  %o3 = model.matmul %p3, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %fl = model.get_parameter @flipped : tensor<1x1x4x4xf32>
  %flu = model.slice %fl start [0, 0, 0, 0] limit [1, 1, 3, 3] stride [1, 1, 1, 1] : tensor<1x1x4x4xf32> -> tensor<1x1x3x3xf32>
  %flr = model.reshape %flu : tensor<1x1x3x3xf32> -> tensor<3x3xf32>
  %c4 = model.cmp eq, %flr, %zero : tensor<3x3xf32>, tensor<f32> -> tensor<3x3xi1>
  %s4 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %m4 = model.select %c4, %ninf, %s4 : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p4 = model.softmax %m4 dim 1 : tensor<3x3xf32>
  %o4 = model.matmul %p4, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %tr = model.get_parameter @tril : tensor<4x4xf32>
  %down = model.slice %tr start [1, 0] limit [4, 3] stride [1, 1] : tensor<4x4xf32> -> tensor<3x3xf32>
  %c5 = model.cmp eq, %down, %zero : tensor<3x3xf32>, tensor<f32> -> tensor<3x3xi1>
  %s5 = model.matmul %q, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %m5 = model.select %c5, %ninf, %s5 : tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p5 = model.softmax %m5 dim 1 : tensor<3x3xf32>
  %o5 = model.matmul %p5, %v : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  return %o0, %o1, %o2, %o3, %o4, %o5 : tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
}
