// RUN: fastllm-opt %s --split-input-file --verify-diagnostics

// Tests that every verifier of the model dialect rejects what it must, with
// a message naming the offending values.

// expected-error @+1 {{initial value type 'tensor<4xf32>' does not match parameter type 'tensor<8xf32>'}}
model.parameter @p : tensor<8xf32> = dense<1.0> : tensor<4xf32>

// -----

// expected-error @+1 {{attribute 'type' failed to satisfy constraint}}
model.parameter @p : tensor<8xi64>

// -----

func.func @f() {
  // expected-error @+1 {{expects parent op 'builtin.module'}}
  "model.parameter"() <{sym_name = "p", type = tensor<8xf32>}> : () -> ()
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'missing' does not name a model.parameter}}
  %0 = model.get_parameter @missing : tensor<8xf32>
  return
}

// -----

model.parameter @p : tensor<8xf32>
func.func @f() {
  // expected-error @+1 {{result type 'tensor<4xf32>' does not match parameter type 'tensor<8xf32>'}}
  %0 = model.get_parameter @p : tensor<4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{operand shapes are not broadcast-compatible: [2, 3] and [4]}}
  %0 = model.add %a, %b : tensor<2x3xf32>, tensor<4xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{result shape [3] is not the broadcast shape [2, 3]}}
  %0 = model.mul %a, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<3xf32>
  return
}

// -----

func.func @f(%a: tensor<3xf32>, %b: tensor<3xf16>) {
  // expected-error @+1 {{element types differ: 'f32' and 'f16'}}
  %0 = model.sub %a, %b : tensor<3xf32>, tensor<3xf16> -> tensor<3xf32>
  return
}

// -----

func.func @f(%a: tensor<3xi64>, %b: tensor<3xi64>) {
  // expected-error @+1 {{must be statically shaped tensor of floating-point values}}
  %0 = model.exp %a : tensor<3xi64>
  return
}

// -----

func.func @f(%a: tensor<3xf32>) {
  // expected-error @+1 {{must be statically shaped tensor of 1-bit signless integer values}}
  %0 = model.and %a, %a : tensor<3xf32>, tensor<3xf32> -> tensor<3xf32>
  return
}

// -----

func.func @f(%a: tensor<3xi64>, %b: tensor<3xi32>) {
  // expected-error @+1 {{element types differ: 'i64' and 'i32'}}
  %0 = model.cmp eq, %a, %b : tensor<3xi64>, tensor<3xi32> -> tensor<3xi1>
  return
}

// -----

func.func @f(%a: tensor<3xi64>, %b: tensor<4xi64>) {
  // expected-error @+1 {{operand shapes are not broadcast-compatible}}
  %0 = model.cmp eq, %a, %b : tensor<3xi64>, tensor<4xi64> -> tensor<3xi1>
  return
}

// -----

func.func @f(%c: tensor<3xi1>, %a: tensor<3xf32>, %b: tensor<3xf16>) {
  // expected-error @+1 {{element types differ}}
  %0 = model.select %c, %a, %b : tensor<3xi1>, tensor<3xf32>, tensor<3xf16> -> tensor<3xf32>
  return
}

// -----

func.func @f(%c: tensor<5xi1>, %a: tensor<3xf32>) {
  // expected-error @+1 {{operand shapes are not broadcast-compatible: [5] and [3]}}
  %0 = model.select %c, %a, %a : tensor<5xi1>, tensor<3xf32>, tensor<3xf32> -> tensor<3xf32>
  return
}

// -----

func.func @f(%a: tensor<8xf32>, %b: tensor<8x4xf32>) {
  // expected-error @+1 {{operands must have rank >= 2, got 1 and 2}}
  %0 = model.matmul %a, %b : tensor<8xf32>, tensor<8x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x8xf32>, %b: tensor<7x4xf32>) {
  // expected-error @+1 {{contraction dims differ: lhs [2, 8] has K = 8, rhs [7, 4] has K = 7}}
  %0 = model.matmul %a, %b : tensor<2x8xf32>, tensor<7x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<3x2x8xf32>, %b: tensor<5x8x4xf32>) {
  // expected-error @+1 {{batch dims are not broadcast-compatible}}
  %0 = model.matmul %a, %b : tensor<3x2x8xf32>, tensor<5x8x4xf32> -> tensor<3x2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x8xf32>, %b: tensor<8x4xf32>) {
  // expected-error @+1 {{result shape [4, 2] should be [2, 4]}}
  %0 = model.matmul %a, %b : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{permutation has 3 entries for an input of rank 2}}
  %0 = model.transpose %a [0, 1, 2] : tensor<2x3xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{permutation [1, 1] is not a permutation}}
  %0 = model.transpose %a [1, 1] : tensor<2x3xf32> -> tensor<3x3xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{result shape [2, 3] should be [3, 2]}}
  %0 = model.transpose %a [1, 0] : tensor<2x3xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{element count changes from 6 to 8}}
  %0 = model.reshape %a : tensor<2x3xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{start, limit and stride need one entry per dim (rank 2)}}
  %0 = model.slice %a start [0] limit [4] stride [1] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{stride 0 in dim 1 must be positive}}
  %0 = model.slice %a start [0, 0] limit [4, 8] stride [1, 0] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{slice [0, 9) is out of bounds for dim 1 of size 8}}
  %0 = model.slice %a start [0, 0] limit [4, 9] stride [1, 1] : tensor<4x8xf32> -> tensor<4x9xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{result shape [4, 4] should be [4, 3]}}
  %0 = model.slice %a start [0, 1] limit [4, 8] stride [1, 3] : tensor<4x8xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %0 = model.concat %a, %a dim 2 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x3xf32>) {
  // expected-error @+1 {{inputs [2, 3] and [3, 3] differ outside dim 1}}
  %0 = model.concat %a, %b dim 1 : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{inputs have different ranks}}
  %0 = model.concat %a, %b dim 0 : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<5x3xf32>
  return
}

// -----

func.func @f(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{result shape [2, 5] should be [2, 6]}}
  %0 = model.concat %a, %a dim 1 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x5xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{needs at least one input}}
  %0 = "model.concat"() <{dim = 0 : i64}> : () -> tensor<2xf32>
  return
}

// -----

func.func @f(%a: tensor<2x6xf32>) {
  // expected-error @+1 {{sizes add up to 5 but dim 1 has size 6}}
  %0:2 = model.split %a dim 1 sizes [2, 3] : tensor<2x6xf32> -> tensor<2x2xf32>, tensor<2x3xf32>
  return
}

// -----

func.func @f(%a: tensor<2x6xf32>) {
  // expected-error @+1 {{has 3 sizes for 2 results}}
  %0:2 = model.split %a dim 1 sizes [2, 2, 2] : tensor<2x6xf32> -> tensor<2x2xf32>, tensor<2x2xf32>
  return
}

// -----

func.func @f(%a: tensor<2x6xf32>) {
  // expected-error @+1 {{size -1 is negative}}
  %0:2 = model.split %a dim 1 sizes [-1, 7] : tensor<2x6xf32> -> tensor<2x2xf32>, tensor<2x7xf32>
  return
}

// -----

func.func @f(%a: tensor<2x6xf32>) {
  // expected-error @+1 {{result type 'tensor<2x4xf32>' should have shape [2, 3]}}
  %0:2 = model.split %a dim 1 sizes [3, 3] : tensor<2x6xf32> -> tensor<2x3xf32>, tensor<2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x6xf32>) {
  // expected-error @+1 {{dim -1 is out of range for rank 2}}
  %0:2 = model.split %a dim -1 sizes [3, 3] : tensor<2x6xf32> -> tensor<2x3xf32>, tensor<2x3xf32>
  return
}

// -----

func.func @f(%w: tensor<16x8xf32>, %i: tensor<2x4xi64>) {
  // expected-error @+1 {{result shape [2, 4, 16] should be [2, 4, 8]}}
  %0 = model.gather %w[%i] dim 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x16xf32>
  return
}

// -----

func.func @f(%w: tensor<16x8xf32>, %i: tensor<2x4xi64>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %0 = model.gather %w[%i] dim 2 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x16xf32>
  return
}

// -----

func.func @f(%w: tensor<16x8xf32>, %i: tensor<2x4xf32>) {
  // expected-error @+1 {{must be statically shaped tensor of signless integer values}}
  %0 = model.gather %w[%i] dim 0 : tensor<16x8xf32>, tensor<2x4xf32> -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{cannot broadcast [2, 4] to [3, 4]}}
  %0 = model.broadcast %a : tensor<2x4xf32> -> tensor<3x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{cannot broadcast rank 2 to rank 1}}
  %0 = model.broadcast %a : tensor<2x4xf32> -> tensor<8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xi64>) {
  // expected-error @+1 {{shape changes from [2, 4] to [8]}}
  %0 = model.cast %a : tensor<2x4xi64> -> tensor<8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{dims must be sorted and distinct}}
  %0 = model.reduce_sum %a dims [1, 0] : tensor<2x4xf32> -> tensor<f32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %0 = model.reduce_mean %a dims [2] : tensor<2x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{result shape [2] should be [2, 1]}}
  %0 = model.reduce_max %a dims [1] keep_dims : tensor<2x4xf32> -> tensor<2xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %0 = model.softmax %a dim 2 : tensor<2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{dim -1 is out of range for rank 2}}
  %0 = model.log_softmax %a dim -1 : tensor<2x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4xi64>) {
  // expected-error @+1 {{must be statically shaped tensor of floating-point values}}
  %0 = model.softmax %a dim 1 : tensor<2x4xi64>
  return
}

// -----

func.func @f(%a: tensor<2x4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{scale/bias shape [4, 8] should be the normalised shape [8]}}
  %0 = model.layer_norm %a, %g dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4x8xf32>, %g: tensor<8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{scale/bias shape [4] should be the normalised shape [8]}}
  %0 = model.layer_norm %a, %g, %b dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<4xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{result shape differs from the input shape}}
  %0 = model.rms_norm %a, %g dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<8x8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{dim 3 is out of range for rank 3}}
  %0 = model.rms_norm %a, %g dim 3 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<2x4x8xf32>, %g: tensor<8xf16>) {
  // expected-error @+1 {{element types differ: 'f32' and 'f16'}}
  %0 = model.rms_norm %a, %g dim 2 eps 1.0e-5 : (tensor<2x4x8xf32>, tensor<8xf16>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%l: tensor<8x16xf32>, %t: tensor<4xi64>) {
  // expected-error @+1 {{input shape [8, 16] should be the targets' shape [4] plus a class dim}}
  %0 = model.cross_entropy %l, %t reduction mean : tensor<8x16xf32>, tensor<4xi64> -> tensor<f32>
  return
}

// -----

func.func @f(%l: tensor<8x16xf32>, %t: tensor<8xi64>) {
  // expected-error @+1 {{result shape [8] should be [] (a scalar)}}
  %0 = model.cross_entropy %l, %t reduction sum : tensor<8x16xf32>, tensor<8xi64> -> tensor<8xf32>
  return
}

// -----

func.func @f(%l: tensor<8x16xf32>, %t: tensor<8xi64>) {
  // expected-error @+1 {{result shape [] should be [8]}}
  %0 = model.nll_loss %l, %t reduction none : tensor<8x16xf32>, tensor<8xi64> -> tensor<f32>
  return
}

// -----

func.func @f(%l: tensor<8x16xf32>, %t: tensor<8xi64>) {
  // expected-error @+1 {{element types differ: 'f32' and 'f16'}}
  %0 = model.nll_loss %l, %t reduction mean : tensor<8x16xf32>, tensor<8xi64> -> tensor<f16>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{must be statically shaped tensor of any type values}}
  %0 = "model.constant"() <{value = dense<1.0> : tensor<2xf32>}> : () -> tensor<?xf32>
  return
}

// -----

model.parameter @p : tensor<8xf32>
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{gradient type 'tensor<4xf32>' does not match parameter type 'tensor<8xf32>'}}
  model.accumulate_grad @p, %g : tensor<4xf32>
  return
}

// -----

model.parameter @p : tensor<8xf32> {frozen}
func.func @f(%g: tensor<8xf32>) {
  // expected-error @+1 {{parameter 'p' is frozen}}
  model.accumulate_grad @p, %g : tensor<8xf32>
  return
}

// -----

func.func @f(%g: tensor<2x2xf32>) {
  // expected-error @+1 {{grad shape [2, 2] should be the slice's shape [2, 3]}}
  %0 = model.slice_grad %g start [0, 0] limit [2, 6] stride [1, 2] : tensor<2x2xf32> -> tensor<2x6xf32>
  return
}

// -----

func.func @f(%g: tensor<2x4x8xf32>, %i: tensor<2x4xi64>) {
  // expected-error @+1 {{grad shape [2, 4, 8] should be [2, 4, 4]}}
  %0 = model.gather_grad %g at %i dim 0 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x4xf32>
  return
}

// -----

func.func @f(%l: tensor<4x16xf32>, %t: tensor<4xi64>, %g: tensor<4xf32>) {
  // expected-error @+1 {{loss gradient shape [4] should be [] (a scalar)}}
  %0 = model.cross_entropy_grad %l, %t, %g reduction mean : tensor<4x16xf32>, tensor<4xi64>, tensor<4xf32>
  return
}

// -----

func.func @f(%q: tensor<2x3x4xf32>, %k: tensor<2x5x4xf32>, %v: tensor<2x3x4xf32>) {
  // expected-error @+1 {{key shape [2, 5, 4] differs from query shape [2, 3, 4]}}
  %o, %l = model.causal_attention %q, %k, %v scale 1.0 : tensor<2x3x4xf32>, tensor<2x5x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>, tensor<2x3xf32>
  return
}

// -----

func.func @f(%q: tensor<2x3x4xf32>, %v: tensor<2x3x4xf32>) {
  // expected-error @+1 {{lse shape [2] should be [2, 3]}}
  %o, %l = model.causal_attention %q, %q, %v scale 1.0 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>, tensor<2xf32>
  return
}

// -----

func.func @f(%x: tensor<2x4xf32>, %b: tensor<3xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{input of type 'tensor<3xf32>' does not broadcast to the result's shape [2, 4]}}
  %r = model.fused_elementwise (%x, %b) : (tensor<2x4xf32>, tensor<3xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>, %c: tensor<3xf32>):
    model.yield %a : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = model.fused_elementwise (%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is not pointwise: model.fused_elementwise holds only pointwise ops}}
    %s = model.softmax %a dim 1 : tensor<2x4xf32>
    model.yield %s : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{yields 'tensor<2x4xbf16>', not the result type 'tensor<2x4xf32>'}}
  %r = model.fused_elementwise (%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    %c = model.cast %a : tensor<2x4xf32> -> tensor<2x4xbf16>
    model.yield %c : tensor<2x4xbf16>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{body arguments must have the inputs' types}}
  %r = model.fused_elementwise (%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %b = model.broadcast %a : tensor<4xf32> -> tensor<2x4xf32>
    model.yield %b : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = model.fused_elementwise (%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{result does not broadcast to the fused result's shape [2, 4]}}
    %b = model.broadcast %a : tensor<2x4xf32> -> tensor<3x2x4xf32>
    %s = model.reduce_sum %b dims [0] : tensor<3x2x4xf32> -> tensor<2x4xf32>
    model.yield %s : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

model.parameter @w : tensor<4x8xf32>
func.func @f(%x: tensor<6x4xf32>, %h: tensor<4x8xf32>) {
  // expected-error @+1 {{product shape [6, 8] differs from parameter 'w' of shape [4, 8]}}
  model.matmul_accumulate_grad @w, %x, %h : tensor<6x4xf32>, tensor<4x8xf32>
  return
}

// -----

model.parameter @w : tensor<4x8xf32>
func.func @f(%x: tensor<6x4xf32>, %g: tensor<6x8xf32>) {
  // expected-error @+1 {{contraction dims differ}}
  model.matmul_accumulate_grad @w, %x, %g : tensor<6x4xf32>, tensor<6x8xf32>
  return
}

// -----

model.parameter @w : tensor<4x8xf32>
func.func @f(%g: tensor<8x4xbf16>) {
  // expected-error @+1 {{gradient type 'tensor<8x4xbf16>' does not match parameter type 'tensor<4x8xf32>'}}
  model.accumulate_grad @w, %g : tensor<8x4xbf16>
  return
}
