// RUN: fastllm-opt %s --pass-pipeline='builtin.module(fastllm-cpu-pipeline)' | FileCheck %s --check-prefix=FROZEN
// RUN: fastllm-opt %s --pass-pipeline='builtin.module(fastllm-training-pipeline{train=^mask$})' | FileCheck %s --check-prefixes=TRAINED,PIPELINE
// RUN: fastllm-opt %s --fastllm-mark-frozen='train=^mask$' --fastllm-fuse | FileCheck %s --check-prefix=TRAINED

// Tests that the pipeline settles which parameters train before fusion
// reads frozen ones: an additive causal mask buffer fuses while frozen, and
// stays an add (and trains, as PyTorch would train it) when the train regex
// unfreezes it, instead of being compiled in and then unfrozen by autodiff.

// FROZEN: model.causal_attention
// FROZEN-NOT: model.softmax
// FROZEN-NOT: accumulate_grad @mask

// TRAINED-NOT: model.causal_attention
// TRAINED: model.add %{{.*}}, %{{.*}}
// TRAINED: model.softmax
// PIPELINE: model.accumulate_grad @mask

model.parameter @emb : tensor<8x4xf32> = dense<0.5> : tensor<8x4xf32>
model.parameter @wk : tensor<4xf32> = dense<0.25> : tensor<4xf32>
model.parameter @mask : tensor<3x3xf32> = dense<[[0.0, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0]]> : tensor<3x3xf32> {frozen}

func.func @forward(%tokens2: tensor<1x3xi64>, %targets2: tensor<1x3xi64>) -> tensor<f32> {
  %tokens = model.reshape %tokens2 : tensor<1x3xi64> -> tensor<3xi64>
  %targets = model.reshape %targets2 : tensor<1x3xi64> -> tensor<3xi64>
  %e = model.get_parameter @emb : tensor<8x4xf32>
  %x = model.gather %e[%tokens] dim 0 : tensor<8x4xf32>, tensor<3xi64> -> tensor<3x4xf32>
  %w = model.get_parameter @wk : tensor<4xf32>
  %k = model.mul %x, %w : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x4xf32>
  %kt = model.transpose %k [1, 0] : tensor<3x4xf32> -> tensor<4x3xf32>
  %s = model.matmul %x, %kt : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %m = model.get_parameter @mask : tensor<3x3xf32>
  %a = model.add %s, %m : tensor<3x3xf32>, tensor<3x3xf32> -> tensor<3x3xf32>
  %p = model.softmax %a dim 1 : tensor<3x3xf32>
  %o = model.matmul %p, %x : tensor<3x3xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %l = model.cross_entropy %o, %targets ignore_index -100 reduction mean : tensor<3x4xf32>, tensor<3xi64> -> tensor<f32>
  return %l : tensor<f32>
}
