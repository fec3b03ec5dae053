//===- GeneratedSmoke.cu - a hand-written "generated" CUDA step -----------===//
//
// What the emitter (codegen/) writes for the CUDA target, by hand: the same
// preamble (ModelABI.h, both `using namespace` lines), functors in an
// anonymous namespace, a __device__ constant, and every kernel call spelled
// as the emitter spells it, with static host arrays for shapes and strides
// and literal arena offsets. Compiling it proves that generated code
// compiles against Kernels.cuh; run on a GPU, it runs a step of the
// one-layer model of test/Codegen/cpu-emit.onnxtext (gather, add, tanh,
// matmul, cross entropy and their gradients) plus one call of every other
// kernel, on a zeroed managed arena, and prints the loss (log 5 = 1.609...).
// A second step makes the same kinds of call in bf16, as a mixed-precision
// step spells them (__nv_bfloat16 buffers and functor operands, float
// parameters, losses and gradient slots); its loss is log 5 as well.
// Without a GPU it says so and exits 0.
//
//===----------------------------------------------------------------------===//

#include "runtime/ModelABI.h"
#include "runtime/cuda/Kernels.cuh"

#include <cmath>
#include <cstdint>
#include <cstdio>

using namespace fastllm::rt;
using namespace fastllm::rt::cuda;

namespace {
__device__ const float g0[1] = {1.000000000e+00f};

struct F0 {
  __host__ __device__ float operator()(float x0, float x1) const {
    return x0 + x1;
  }
};
struct F1 {
  __host__ __device__ float operator()(float x0) const { return fastTanh(x0); }
};
struct F2 {
  __host__ __device__ float operator()(float x0, float x1) const {
    return x0 * x1;
  }
};
struct F3 {
  __host__ __device__ float operator()(float x0, float x1) const {
    return x0 - x1;
  }
};
struct F4 {
  __host__ __device__ bool operator()(float x0, float x1) const {
    return x0 < x1;
  }
};
struct F5 {
  __host__ __device__ float operator()(bool x0, float x1, float x2) const {
    return x0 ? x1 : x2;
  }
};
struct F6 {
  __host__ __device__ float operator()(float x0, float x1) const {
    return std::pow(x0, x1) + 1.0f / std::sqrt(x0) + std::log(x1) +
           std::sin(x0) * std::cos(x1);
  }
};
struct F7 {
  __host__ __device__ float operator()(float x0, float x1) const {
    return geluGrad(x0, x1, true) + gelu(x0, false) + silu(x1) + sigmoid(x0) +
           fastErf(x1) + fastExp(x0);
  }
};
struct F8 {
  __host__ __device__ bool operator()(int64_t x0) const { return x0 != 0; }
};
struct F9 {
  __host__ __device__ float operator()(bool x0) const {
    return static_cast<float>(x0);
  }
};
struct F10 {
  __host__ __device__ __nv_bfloat16 operator()(float x0) const {
    return static_cast<__nv_bfloat16>(x0);
  }
};
struct F11 {
  __host__ __device__ __nv_bfloat16 operator()(__nv_bfloat16 x0,
                                               __nv_bfloat16 x1) const {
    return x0 + x1;
  }
};
struct F12 {
  __host__ __device__ __nv_bfloat16 operator()(__nv_bfloat16 x0) const {
    return gelu(x0, false);
  }
};
struct F13 {
  __host__ __device__ __nv_bfloat16 operator()(__nv_bfloat16 x0,
                                               __nv_bfloat16 x1) const {
    return geluGrad(x0, x1, false);
  }
};
struct F14 {
  __host__ __device__ float operator()(__nv_bfloat16 x0) const {
    return static_cast<float>(x0);
  }
};
} // namespace

extern "C" float fastllm_smoke_step(char *arena) {
  static const float *c0 = [] {
    void *address = nullptr;
    FASTLLM_CUDA_CHECK(cudaGetSymbolAddress(&address, g0));
    return static_cast<const float *>(address);
  }();
  const int64_t *a0 = reinterpret_cast<const int64_t *>(arena + 0);
  const int64_t *a1 = reinterpret_cast<const int64_t *>(arena + 256);
  float *v0 = reinterpret_cast<float *>(arena + 512);  // @emb
  float *v1 = reinterpret_cast<float *>(arena + 768);  // @bias
  float *v2 = reinterpret_cast<float *>(arena + 1024); // @head
  float *v3 = reinterpret_cast<float *>(arena + 1280);
  gather<float, int64_t>(v3, v0, a0, 1, 5, 6, 4);
  float *v4 = reinterpret_cast<float *>(arena + 1536);
  {
    static const int64_t shape[] = {2, 3, 4};
    static const int64_t s0[] = {12, 4, 1};
    static const int64_t s1[] = {0, 0, 1};
    elementwise(v4, 3, shape, F0{}, In<float>{v3, s0}, In<float>{v1, s1});
  }
  float *v5 = reinterpret_cast<float *>(arena + 1792);
  {
    static const int64_t shape[] = {2, 3, 4};
    static const int64_t s0[] = {12, 4, 1};
    elementwise(v5, 3, shape, F1{}, In<float>{v4, s0});
  }
  float *v6 = reinterpret_cast<float *>(arena + 2048);
  {
    static const int64_t bs[] = {2}, as[] = {12}, bs2[] = {0};
    matmul(v6, v5, v2, 1, bs, as, bs2, 3, 5, 4, false, false);
  }
  float *v7 = reinterpret_cast<float *>(arena + 2304);
  crossEntropy<int64_t>(v7, v6, a1, 6, 5, false, 0, Reduction::Mean);
  float *v8 = reinterpret_cast<float *>(arena + 2560);
  {
    static const int64_t shape[] = {0};
    static const int64_t s0[] = {0};
    elementwise(v8, 0, shape, F2{}, In<float>{c0, s0}, In<float>{c0, s0});
  }
  float *v9 = reinterpret_cast<float *>(arena + 2816);
  crossEntropyGrad<int64_t>(v9, v6, a1, v8, 6, 5, false, 0, Reduction::Mean);
  float *v10 = reinterpret_cast<float *>(arena + 3072);
  {
    static const int64_t bs[] = {0}, as[] = {0}, bs2[] = {0};
    matmul(v10, v9, v2, 0, bs, as, bs2, 6, 4, 5, false, true);
  }
  float *v11 = reinterpret_cast<float *>(arena + 3328);
  {
    static const int64_t bs[] = {0}, as[] = {0}, bs2[] = {0};
    matmul(v11, v5, v9, 0, bs, as, bs2, 4, 5, 6, true, false);
  }
  float *v12 = reinterpret_cast<float *>(arena + 3584);
  {
    static const int64_t shape[] = {6, 4};
    static const int64_t s0[] = {4, 1};
    static const int64_t s1[] = {4, 1};
    static const int64_t splat[] = {0, 0};
    // dy = dh * (1 - h * h), in three steps that update v12 in place.
    elementwise(v12, 2, shape, F2{}, In<float>{v5, s0}, In<float>{v5, s1});
    elementwise(v12, 2, shape, F3{}, In<float>{c0, splat}, In<float>{v12, s1});
    elementwise(v12, 2, shape, F2{}, In<float>{v10, s0}, In<float>{v12, s1});
  }
  float *v13 = reinterpret_cast<float *>(arena + 3840);
  {
    static const int64_t shape[] = {2, 3, 4};
    static const bool reduced[] = {true, true, false};
    reduce(v13, v12, 3, shape, reduced, ReduceKind::Sum);
  }
  float *v14 = reinterpret_cast<float *>(arena + 4096);
  gatherGrad<float, int64_t>(v14, v12, a0, 1, 5, 6, 4);

  // One call of every other kernel, as the emitter spells it.
  float *v15 = reinterpret_cast<float *>(arena + 4352);
  layerNorm(v15, v4, v1, nullptr, 6, 4, 9.999999747e-06f);
  float *v16 = reinterpret_cast<float *>(arena + 4608);
  float *v17 = reinterpret_cast<float *>(arena + 4864);
  float *v18 = reinterpret_cast<float *>(arena + 5120);
  layerNormGrad(v16, v17, v18, v4, v1, v15, 6, 4, 9.999999747e-06f);
  float *v19 = reinterpret_cast<float *>(arena + 5376);
  rmsNorm(v19, v4, v1, 6, 4, 9.999999974e-07f);
  float *v20 = reinterpret_cast<float *>(arena + 5632);
  float *v21 = reinterpret_cast<float *>(arena + 5888);
  rmsNormGrad(v20, v21, v4, v1, v19, 6, 4, 9.999999974e-07f);
  float *v22 = reinterpret_cast<float *>(arena + 6144);
  softmax(v22, v6, 6, 5, 1, true);
  float *v23 = reinterpret_cast<float *>(arena + 6400);
  softmaxGrad(v23, v22, v9, 2, 3, 5, false);
  float *v24 = reinterpret_cast<float *>(arena + 6656);
  {
    static const int64_t shape[] = {6, 4}, perm[] = {1, 0};
    transpose(v24, v3, 2, shape, perm);
  }
  float *v25 = reinterpret_cast<float *>(arena + 6912);
  {
    static const int64_t big[] = {6, 4}, start[] = {5, 0}, stride[] = {-2, 1},
                         small[] = {3, 4};
    slice(v25, v3, 2, big, start, stride, small);
  }
  float *v26 = reinterpret_cast<float *>(arena + 7168);
  {
    static const int64_t big[] = {6, 4}, start[] = {5, 0}, stride[] = {-2, 1},
                         small[] = {3, 4};
    sliceGrad(v26, v25, 2, big, start, stride, small);
  }
  float *v27 = reinterpret_cast<float *>(arena + 7424);
  {
    static const int64_t sizes[] = {4, 4};
    const float *ins[] = {v3, v24};
    concat(v27, 2, ins, sizes, 6, 1);
  }
  float *v28 = reinterpret_cast<float *>(arena + 7680);
  float *v29 = reinterpret_cast<float *>(arena + 7936);
  causalAttention(v28, v29, v4, v4, v5, 2, 3, 4, 4, 5.000000000e-01f);
  float *v30 = reinterpret_cast<float *>(arena + 8192);
  float *v31 = reinterpret_cast<float *>(arena + 8448);
  float *v32 = reinterpret_cast<float *>(arena + 8704);
  causalAttentionGrad(v30, v31, v32, v4, v4, v5, v28, v29, v12, 2, 3, 4, 4,
                      5.000000000e-01f);
  float *v33 = reinterpret_cast<float *>(arena + 8960);
  nllLoss<int64_t>(v33, v22, a1, 6, 5, true, -100, Reduction::Sum);
  float *v34 = reinterpret_cast<float *>(arena + 9216);
  nllLossGrad<int64_t>(v34, a1, v8, 6, 5, true, -100, Reduction::Sum);
  bool *v35 = reinterpret_cast<bool *>(arena + 9472);
  {
    static const int64_t shape[] = {6, 4};
    static const int64_t s0[] = {4, 1};
    static const int64_t s1[] = {0, 1};
    elementwise(v35, 2, shape, F4{}, In<float>{v3, s0}, In<float>{v1, s1});
  }
  float *v36 = reinterpret_cast<float *>(arena + 9728);
  {
    static const int64_t shape[] = {6, 4};
    static const int64_t s0[] = {4, 1};
    static const int64_t s1[] = {4, 1};
    static const int64_t s2[] = {4, 1};
    elementwise(v36, 2, shape, F5{}, In<bool>{v35, s0}, In<float>{v3, s1},
                In<float>{v12, s2});
  }
  float *v37 = reinterpret_cast<float *>(arena + 9984);
  {
    static const int64_t shape[] = {6, 4};
    static const int64_t s0[] = {4, 1};
    static const int64_t s1[] = {0, 0};
    elementwise(v37, 2, shape, F6{}, In<float>{v36, s0}, In<float>{c0, s1});
    elementwise(v37, 2, shape, F7{}, In<float>{v37, s0}, In<float>{v12, s0});
  }
  bool *v38 = reinterpret_cast<bool *>(arena + 10240);
  {
    static const int64_t shape[] = {6};
    static const int64_t s0[] = {1};
    elementwise(v38, 1, shape, F8{}, In<int64_t>{a1, s0});
    elementwise(v37, 1, shape, F9{}, In<bool>{v38, s0});
  }

  fill(reinterpret_cast<float *>(arena + 10496), 192, 0.0f);  // stage 0
  addInto(reinterpret_cast<float *>(arena + 10496), v14, 20); // @emb
  addInto(reinterpret_cast<float *>(arena + 10752), v13, 4);  // @bias
  addInto(reinterpret_cast<float *>(arena + 11008), v11, 20); // @head
  copy(v26, v25, 12);
  FASTLLM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return v7[0];
}

extern "C" float fastllm_smoke_bf16_step(char *arena) {
  static const float *c0 = [] {
    void *address = nullptr;
    FASTLLM_CUDA_CHECK(cudaGetSymbolAddress(&address, g0));
    return static_cast<const float *>(address);
  }();
  const int64_t *a0 = reinterpret_cast<const int64_t *>(arena + 0);
  const int64_t *a1 = reinterpret_cast<const int64_t *>(arena + 256);
  float *v0 = reinterpret_cast<float *>(arena + 512);  // @emb
  float *v1 = reinterpret_cast<float *>(arena + 768);  // @bias
  float *v2 = reinterpret_cast<float *>(arena + 1024); // @head
  __nv_bfloat16 *v3 = reinterpret_cast<__nv_bfloat16 *>(arena + 11264);
  __nv_bfloat16 *v4 = reinterpret_cast<__nv_bfloat16 *>(arena + 11520);
  __nv_bfloat16 *v5 = reinterpret_cast<__nv_bfloat16 *>(arena + 11776);
  {
    static const int64_t shape[] = {5, 4};
    static const int64_t s0[] = {4, 1};
    elementwise(v3, 2, shape, F10{}, In<float>{v0, s0});
    elementwise(v5, 2, shape, F10{}, In<float>{v2, s0});
  }
  {
    static const int64_t shape[] = {4};
    static const int64_t s0[] = {1};
    elementwise(v4, 1, shape, F10{}, In<float>{v1, s0});
  }
  __nv_bfloat16 *v6 = reinterpret_cast<__nv_bfloat16 *>(arena + 12032);
  gather<__nv_bfloat16, int64_t>(v6, v3, a0, 1, 5, 6, 4);
  __nv_bfloat16 *v7 = reinterpret_cast<__nv_bfloat16 *>(arena + 12288);
  {
    static const int64_t shape[] = {2, 3, 4};
    static const int64_t s0[] = {12, 4, 1};
    static const int64_t s1[] = {0, 0, 1};
    elementwise(v7, 3, shape, F11{}, In<__nv_bfloat16>{v6, s0},
                In<__nv_bfloat16>{v4, s1});
  }
  __nv_bfloat16 *v8 = reinterpret_cast<__nv_bfloat16 *>(arena + 12544);
  {
    static const int64_t shape[] = {2, 3, 4};
    static const int64_t s0[] = {12, 4, 1};
    elementwise(v8, 3, shape, F12{}, In<__nv_bfloat16>{v7, s0});
  }
  __nv_bfloat16 *v9 = reinterpret_cast<__nv_bfloat16 *>(arena + 12800);
  {
    static const int64_t bs[] = {2}, as[] = {12}, bs2[] = {0};
    matmul(v9, v8, v5, 1, bs, as, bs2, 3, 5, 4, false, false);
  }
  float *v10 = reinterpret_cast<float *>(arena + 13056);
  crossEntropy<int64_t>(v10, v9, a1, 6, 5, false, 0, Reduction::Mean);
  __nv_bfloat16 *v11 = reinterpret_cast<__nv_bfloat16 *>(arena + 13312);
  crossEntropyGrad<int64_t>(v11, v9, a1, c0, 6, 5, false, 0, Reduction::Mean);
  __nv_bfloat16 *v12 = reinterpret_cast<__nv_bfloat16 *>(arena + 13568);
  {
    static const int64_t bs[] = {0}, as[] = {0}, bs2[] = {0};
    matmul(v12, v11, v5, 0, bs, as, bs2, 6, 4, 5, false, true);
  }
  __nv_bfloat16 *v13 = reinterpret_cast<__nv_bfloat16 *>(arena + 13824);
  {
    static const int64_t bs[] = {0}, as[] = {0}, bs2[] = {0};
    matmul(v13, v8, v11, 0, bs, as, bs2, 4, 5, 6, true, false);
  }
  __nv_bfloat16 *v14 = reinterpret_cast<__nv_bfloat16 *>(arena + 14080);
  {
    static const int64_t shape[] = {6, 4};
    static const int64_t s0[] = {4, 1};
    elementwise(v14, 2, shape, F13{}, In<__nv_bfloat16>{v7, s0},
                In<__nv_bfloat16>{v12, s0});
  }
  __nv_bfloat16 *v15 = reinterpret_cast<__nv_bfloat16 *>(arena + 14336);
  {
    static const int64_t shape[] = {2, 3, 4};
    static const bool reduced[] = {true, true, false};
    reduce<__nv_bfloat16>(v15, v14, 3, shape, reduced, ReduceKind::Sum);
  }
  __nv_bfloat16 *v16 = reinterpret_cast<__nv_bfloat16 *>(arena + 14592);
  gatherGrad<__nv_bfloat16, int64_t>(v16, v14, a0, 1, 5, 6, 4);

  // One bf16 call of every other kernel.
  __nv_bfloat16 *v17 = reinterpret_cast<__nv_bfloat16 *>(arena + 14848);
  layerNorm(v17, v7, v4, nullptr, 6, 4, 9.999999747e-06f);
  __nv_bfloat16 *v18 = reinterpret_cast<__nv_bfloat16 *>(arena + 15104);
  __nv_bfloat16 *v19 = reinterpret_cast<__nv_bfloat16 *>(arena + 15360);
  __nv_bfloat16 *v20 = reinterpret_cast<__nv_bfloat16 *>(arena + 15616);
  layerNormGrad(v18, v19, v20, v7, v4, v17, 6, 4, 9.999999747e-06f);
  __nv_bfloat16 *v21 = reinterpret_cast<__nv_bfloat16 *>(arena + 15872);
  rmsNorm(v21, v7, v4, 6, 4, 9.999999974e-07f);
  __nv_bfloat16 *v22 = reinterpret_cast<__nv_bfloat16 *>(arena + 16128);
  __nv_bfloat16 *v23 = reinterpret_cast<__nv_bfloat16 *>(arena + 16384);
  rmsNormGrad(v22, v23, v7, v4, v21, 6, 4, 9.999999974e-07f);
  __nv_bfloat16 *v24 = reinterpret_cast<__nv_bfloat16 *>(arena + 16640);
  softmax(v24, v9, 6, 5, 1, true);
  __nv_bfloat16 *v25 = reinterpret_cast<__nv_bfloat16 *>(arena + 16896);
  softmaxGrad(v25, v24, v11, 2, 3, 5, false);
  __nv_bfloat16 *v26 = reinterpret_cast<__nv_bfloat16 *>(arena + 17152);
  {
    static const int64_t shape[] = {6, 4}, perm[] = {1, 0};
    transpose<__nv_bfloat16>(v26, v6, 2, shape, perm);
  }
  __nv_bfloat16 *v27 = reinterpret_cast<__nv_bfloat16 *>(arena + 17408);
  {
    static const int64_t big[] = {6, 4}, start[] = {5, 0}, stride[] = {-2, 1},
                         small[] = {3, 4};
    slice(v27, v6, 2, big, start, stride, small);
  }
  __nv_bfloat16 *v28 = reinterpret_cast<__nv_bfloat16 *>(arena + 17664);
  {
    static const int64_t big[] = {6, 4}, start[] = {5, 0}, stride[] = {-2, 1},
                         small[] = {3, 4};
    sliceGrad(v28, v27, 2, big, start, stride, small);
  }
  __nv_bfloat16 *v29 = reinterpret_cast<__nv_bfloat16 *>(arena + 17920);
  {
    static const int64_t sizes[] = {4, 4};
    const __nv_bfloat16 *ins[] = {v6, v26};
    concat(v29, 2, ins, sizes, 6, 1);
  }
  __nv_bfloat16 *v30 = reinterpret_cast<__nv_bfloat16 *>(arena + 18176);
  float *v31 = reinterpret_cast<float *>(arena + 18432);
  causalAttention(v30, v31, v7, v7, v8, 2, 3, 4, 4, 5.000000000e-01f);
  __nv_bfloat16 *v32 = reinterpret_cast<__nv_bfloat16 *>(arena + 18688);
  __nv_bfloat16 *v33 = reinterpret_cast<__nv_bfloat16 *>(arena + 18944);
  __nv_bfloat16 *v34 = reinterpret_cast<__nv_bfloat16 *>(arena + 19200);
  causalAttentionGrad(v32, v33, v34, v7, v7, v8, v30, v31, v14, 2, 3, 4, 4,
                      5.000000000e-01f);
  float *v35 = reinterpret_cast<float *>(arena + 19456);
  nllLoss<int64_t>(v35, v24, a1, 6, 5, true, -100, Reduction::Sum);
  __nv_bfloat16 *v36 = reinterpret_cast<__nv_bfloat16 *>(arena + 19712);
  nllLossGrad<int64_t>(v36, a1, c0, 6, 5, true, -100, Reduction::Sum);
  float *v37 = reinterpret_cast<float *>(arena + 19968);
  {
    static const int64_t shape[] = {6, 4};
    static const int64_t s0[] = {4, 1};
    elementwise(v37, 2, shape, F14{}, In<__nv_bfloat16>{v36, s0});
  }

  // bf16 gradients added into the float gradient slots.
  fill(reinterpret_cast<float *>(arena + 10496), 192, 0.0f);  // stage 0
  addInto(reinterpret_cast<float *>(arena + 10496), v16, 20); // @emb
  addInto(reinterpret_cast<float *>(arena + 10752), v15, 4);  // @bias
  addInto(reinterpret_cast<float *>(arena + 11008), v13, 20); // @head
  fill(v28, 24, 0.0f);
  addInto(v28, v27, 12);
  copy(v28, v27, 12);
  FASTLLM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return v10[0];
}

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no CUDA GPU: %s\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "none seen");
    return 0;
  }
  char *arena = nullptr;
  const size_t bytes = 20224;
  FASTLLM_CUDA_CHECK(cudaMallocManaged(&arena, bytes));
  FASTLLM_CUDA_CHECK(cudaMemset(arena, 0, bytes));
  FASTLLM_CUDA_CHECK(cudaDeviceSynchronize());
  float loss = fastllm_smoke_step(arena);
  float bf16Loss = fastllm_smoke_bf16_step(arena);
  std::printf("loss %.6f, bf16 step %.6f (log 5 = %.6f)\n", loss, bf16Loss,
              std::log(5.0));
  FASTLLM_CUDA_CHECK(cudaFree(arena));
  const float want = std::log(5.0f);
  return std::fabs(loss - want) < 1e-5f && std::fabs(bf16Loss - want) < 1e-5f
             ? 0
             : 1;
}
