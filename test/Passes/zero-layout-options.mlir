// Tests that fastllm-zero-layout refuses settings that cannot work, naming
// the option (docs/DESIGN.md section 3).
// RUN: not fastllm-opt %s --fastllm-zero-layout='dp=0' 2>&1 | FileCheck %s --check-prefix=DP
// RUN: not fastllm-opt %s --fastllm-zero-layout='zero-stage=4' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not fastllm-opt %s --fastllm-zero-layout='zero-stage=2 num-grad-buffers=0' 2>&1 | FileCheck %s --check-prefix=GRAD0
// RUN: not fastllm-opt %s --fastllm-zero-layout='zero-stage=3 num-weight-buffers=-3' 2>&1 | FileCheck %s --check-prefix=WEIGHT0
// RUN: not fastllm-opt %s --fastllm-zero-layout='zero-stage=1 num-grad-buffers=2' 2>&1 | FileCheck %s --check-prefix=GRAD1
// RUN: not fastllm-opt %s --fastllm-zero-layout='zero-stage=2 num-weight-buffers=2' 2>&1 | FileCheck %s --check-prefix=WEIGHT2
// RUN: not fastllm-opt %s --fastllm-zero-layout='alignment=6' 2>&1 | FileCheck %s --check-prefix=ALIGN

// DP: error: dp must be at least 1, got 0
// ZERO: error: zero-stage must be 1, 2 or 3, got 4
// GRAD0: error: num-grad-buffers must be at least 1, got 0
// WEIGHT0: error: num-weight-buffers must be at least 1, got -3
// GRAD1: error: num-grad-buffers applies to ZeRO-2 and 3; zero-stage is 1
// WEIGHT2: error: num-weight-buffers applies to ZeRO-3; zero-stage is 2
// ALIGN: error: alignment must be a power of two of at least 4 bytes, got 6

model.parameter @w : tensor<4xf32>
func.func @train_step(%tok: tensor<2x4xi64>, %tgt: tensor<2x4xi64>) -> tensor<f32> {
  %c = model.constant dense<1.0> : tensor<f32>
  return %c : tensor<f32>
}
