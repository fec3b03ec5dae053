//===- CublasLtTest.cpp - tests of the emulated cuBLASLt ------------------===//
//
// Runs the emulated cublasLtMatmul the way runtime/cuda/kernels/Matmul.cu
// does (descriptors, preference with the operands' alignments, heuristic,
// matmul on a stream) and checks D twice: bit for bit against a sequential
// fp32 fused multiply-add model (the emulation's documented numerics), and
// within a rounding bound against a double-precision reference. Padding
// between columns and batches of D must be left untouched. Then every error
// the interpreter reports: statuses for what the real library rejects, death
// for what it leaves undefined.
//
// Operands live in host memory, which is the emulation's device memory.
//
//===----------------------------------------------------------------------===//

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
/// What D holds where the GEMM must not write.
constexpr float kSentinel = -12345.f;

/// A column-major operand of `batch` matrices in host memory, 256-byte
/// aligned plus `offsetBytes`.
class Operand {
public:
  Operand(cudaDataType type, int64_t rows, int64_t cols, int64_t ld,
          int32_t batch, int64_t stride, size_t offsetBytes = 0)
      : type(type), rows(rows), cols(cols), ld(ld), stride(stride),
        batch(batch), offset(offsetBytes) {
    const int64_t elems = (rows == 0 || cols == 0)
                              ? 0
                              : (batch - 1) * stride + (cols - 1) * ld + rows;
    size = size_t(elems);
    storage.resize(size * elemSize() + offset + 512);
    fill(0.f);
  }

  size_t elemSize() const { return type == CUDA_R_32F ? 4 : 2; }
  void *ptr() {
    uintptr_t base = reinterpret_cast<uintptr_t>(storage.data());
    return reinterpret_cast<void *>(((base + 255) & ~uintptr_t(255)) + offset);
  }
  const void *ptr() const { return const_cast<Operand *>(this)->ptr(); }

  /// Element `index` of the allocation.
  float at(size_t index) const {
    const unsigned char *p =
        static_cast<const unsigned char *>(ptr()) + index * elemSize();
    if (type == CUDA_R_32F) {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    __nv_bfloat16 x;
    std::memcpy(&x, p, 2);
    return __bfloat162float(x);
  }
  void setAt(size_t index, float x) {
    unsigned char *p = static_cast<unsigned char *>(ptr()) + index * elemSize();
    if (type == CUDA_R_32F) {
      std::memcpy(p, &x, 4);
      return;
    }
    __nv_bfloat16 b = __float2bfloat16(x);
    std::memcpy(p, &b, 2);
  }
  size_t index(int64_t b, int64_t i, int64_t j) const {
    return size_t(b * stride + j * ld + i);
  }
  float get(int64_t b, int64_t i, int64_t j) const {
    return at(index(b, i, j));
  }
  void set(int64_t b, int64_t i, int64_t j, float x) {
    setAt(index(b, i, j), x);
  }

  /// Every element of the allocation (padding too) = `x`.
  void fill(float x) {
    for (size_t i = 0; i < size; ++i)
      setAt(i, x);
  }
  /// Every element of every matrix uniform in [-1, 1) (rounded to the type).
  void randomize(std::mt19937 &rng) {
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i)
          set(b, i, j, dist(rng));
  }

  /// A layout of this operand, set up as Matmul.cu does.
  cublasLtMatrixLayout_t layout() const {
    cublasLtMatrixLayout_t l = nullptr;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows),
                                         uint64_t(cols), ld),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                  l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                  l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                  sizeof(stride)),
              CUBLAS_STATUS_SUCCESS);
    return l;
  }

  cudaDataType type;
  int64_t rows, cols, ld, stride;
  int32_t batch;

private:
  size_t offset;
  size_t size = 0;
  std::vector<unsigned char> storage;
};

/// The largest power of two up to 256 dividing `p`'s address.
uint32_t alignmentOf(const void *p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align)
    align /= 2;
  return align;
}

/// The process's handle.
cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t created = nullptr;
    EXPECT_EQ(cublasLtCreate(&created), CUBLAS_STATUS_SUCCESS);
    return created;
  }();
  return h;
}

/// One GEMM's arguments: D = alpha * op(A) * op(B) + beta * C.
struct Call {
  cublasOperation_t transA = CUBLAS_OP_N, transB = CUBLAS_OP_N;
  float alpha = 1.f, beta = 0.f;
  Operand *a, *b, *c, *d;
};

/// A matmul descriptor with fp32 compute and the transposes of `call`.
cublasLtMatmulDesc_t makeDesc(const Call &call) {
  cublasLtMatmulDesc_t desc = nullptr;
  EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                           &call.transA, sizeof(call.transA)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                           &call.transB, sizeof(call.transB)),
            CUBLAS_STATUS_SUCCESS);
  return desc;
}

/// A preference as Matmul.cu makes it: 32 MiB of workspace, alignments of
/// the operands' pointers.
cublasLtMatmulPreference_t makePreference(const Call &call) {
  cublasLtMatmulPreference_t pref = nullptr;
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t workspace = uint64_t(32) << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                sizeof(workspace)),
            CUBLAS_STATUS_SUCCESS);
  const Operand *ops[] = {call.a, call.b, call.c, call.d};
  const cublasLtMatmulPreferenceAttributes_t attrs[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    const uint32_t align = alignmentOf(ops[i]->ptr());
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &align,
                                                   sizeof(align)),
              CUBLAS_STATUS_SUCCESS);
  }
  return pref;
}

/// Runs `call` through heuristic and matmul on the legacy stream and waits:
/// the first status that is not a success, or success.
cublasStatus_t run(const Call &call) {
  cublasLtMatmulDesc_t desc = makeDesc(call);
  cublasLtMatrixLayout_t la = call.a->layout(), lb = call.b->layout(),
                         lc = call.c->layout(), ld = call.d->layout();
  cublasLtMatmulPreference_t pref = makePreference(call);
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle(), desc, la, lb, lc, ld, pref, 1, &result, &found);
  if (status == CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(found, 1);
    EXPECT_EQ(result.workspaceSize, 0u);
    EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
    std::vector<unsigned char> workspace(1024);
    status = cublasLtMatmul(handle(), desc, &call.alpha, call.a->ptr(), la,
                            call.b->ptr(), lb, &call.beta, call.c->ptr(), lc,
                            call.d->ptr(), ld, &result.algo, workspace.data(),
                            workspace.size(), /*stream=*/0);
    EXPECT_EQ(cudaStreamSynchronize(0), cudaSuccess);
  }
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  for (cublasLtMatrixLayout_t l : {la, lb, lc, ld})
    EXPECT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  return status;
}

/// Element (i, j) of op(x) in batch b.
float opGet(const Operand &x, cublasOperation_t op, int64_t b, int64_t i,
            int64_t j) {
  return op == CUBLAS_OP_N ? x.get(b, i, j) : x.get(b, j, i);
}

/// Runs `call` and checks D against both models, and D's padding. The
/// operands must be filled already.
void runAndCheck(const Call &call) {
  const Operand &a = *call.a, &b = *call.b, &d = *call.d;
  const int64_t m = d.rows, n = d.cols, batch = d.batch;
  const int64_t k = call.transA == CUBLAS_OP_N ? a.cols : a.rows;
  // C as it is before the call (C may be D).
  std::vector<float> c(size_t(batch * m * n));
  if (call.beta != 0.f)
    for (int64_t bt = 0; bt < batch; ++bt)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i)
          c[size_t((bt * n + j) * m + i)] = call.c->get(bt, i, j);
  // Everything of D outside its matrices: padding the GEMM must not touch.
  std::vector<float> before;
  const size_t dSize = size_t((batch - 1) * d.stride + (n - 1) * d.ld + m);
  for (size_t e = 0; e < dSize; ++e)
    before.push_back(d.at(e));

  ASSERT_EQ(run(call), CUBLAS_STATUS_SUCCESS);

  std::vector<bool> inside(dSize, false);
  const double eps = std::ldexp(1.0, -24);
  for (int64_t bt = 0; bt < batch; ++bt)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.f;
        double exact = 0, magnitude = 0;
        for (int64_t p = 0; p < k; ++p) {
          const float x = opGet(a, call.transA, bt, i, p);
          const float y = opGet(b, call.transB, bt, p, j);
          acc = std::fma(x, y, acc);
          exact += double(x) * double(y);
          magnitude += std::fabs(double(x) * double(y));
        }
        const float cv = c[size_t((bt * n + j) * m + i)];
        float model = call.alpha * acc;
        double want = double(call.alpha) * exact;
        double bound = std::fabs(call.alpha) * magnitude * (k + 1) * eps;
        if (call.beta != 0.f) {
          model = std::fma(call.beta, cv, model);
          want += double(call.beta) * cv;
          bound += std::fabs(double(call.beta) * cv) * 2 * eps;
        }
        if (d.type == CUDA_R_16BF) {
          model = __bfloat162float(__float2bfloat16(model));
          bound += std::fabs(want) * std::ldexp(1.0, -8);
        }
        const float got = d.get(bt, i, j);
        inside[d.index(bt, i, j)] = true;
        // Bit for bit the sequential fp32 fma model.
        uint32_t gotBits, modelBits;
        std::memcpy(&gotBits, &got, 4);
        std::memcpy(&modelBits, &model, 4);
        ASSERT_EQ(gotBits, modelBits)
            << "batch " << bt << " (" << i << ", " << j << "): " << got
            << " vs model " << model;
        // And close to the exact product.
        ASSERT_LE(std::fabs(double(got) - want), bound + 1e-30)
            << "batch " << bt << " (" << i << ", " << j << ")";
      }
  for (size_t e = 0; e < dSize; ++e) {
    if (inside[e])
      continue;
    const float now = d.at(e);
    ASSERT_EQ(std::memcmp(&now, &before[e], 4), 0) << "padding element " << e;
  }
}

/// Random fill, with D's padding at kSentinel.
void prepare(const Call &call, unsigned seed) {
  std::mt19937 rng(seed);
  call.a->randomize(rng);
  call.b->randomize(rng);
  if (call.c != call.d)
    call.c->randomize(rng);
  call.d->fill(kSentinel);
  if (call.c == call.d)
    call.d->randomize(rng);
}

//===----------------------------------------------------------------------===//
// Results
//===----------------------------------------------------------------------===//

// fp32, every transpose pair, ld > rows everywhere, sizes off the tiles.
TEST(CublasLt, Fp32Transposes) {
  const int64_t m = 37, n = 29, k = 45;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      SCOPED_TRACE(testing::Message() << "transA " << ta << " transB " << tb);
      const int64_t ar = ta == CUBLAS_OP_N ? m : k,
                    ac = ta == CUBLAS_OP_N ? k : m;
      const int64_t br = tb == CUBLAS_OP_N ? k : n,
                    bc = tb == CUBLAS_OP_N ? n : k;
      Operand a(CUDA_R_32F, ar, ac, ar + 3, 1, 0);
      Operand b(CUDA_R_32F, br, bc, br + 5, 1, 0);
      Operand d(CUDA_R_32F, m, n, m + 2, 1, 0);
      Call call{ta, tb, 1.5f, 0.f, &a, &b, &d, &d};
      prepare(call, 1);
      runAndCheck(call);
    }
}

// CUBLAS_OP_C on real types is the transpose.
TEST(CublasLt, ConjugateTransposeIsTransposeOnReals) {
  Operand a(CUDA_R_32F, 8, 5, 8, 1, 0), b(CUDA_R_32F, 8, 6, 9, 1, 0);
  Operand d(CUDA_R_32F, 5, 6, 5, 1, 0);
  Call call{CUBLAS_OP_C, CUBLAS_OP_N, 1.f, 0.f, &a, &b, &d, &d};
  prepare(call, 2);
  runAndCheck(call);
}

// Strided batches with gaps between matrices, A broadcast by stride 0.
TEST(CublasLt, StridedBatchesAndBroadcast) {
  const int64_t m = 20, n = 17, k = 33;
  const int32_t batch = 3;
  Operand a(CUDA_R_32F, m, k, m + 1, batch, 0); // one A for all
  Operand b(CUDA_R_32F, n, k, n, batch, n * k + 7);
  Operand d(CUDA_R_32F, m, n, m + 4, batch, (m + 4) * n + 11);
  Call call{CUBLAS_OP_N, CUBLAS_OP_T, 1.f, 0.f, &a, &b, &d, &d};
  prepare(call, 3);
  runAndCheck(call);
}

// Batches of D interleaved within its columns are disjoint: allowed.
TEST(CublasLt, InterleavedBatchesOfD) {
  const int64_t m = 6, n = 5, k = 7;
  const int32_t batch = 3;
  Operand a(CUDA_R_32F, m, k, m, batch, m * k);
  Operand b(CUDA_R_32F, k, n, k, batch, k * n);
  Operand d(CUDA_R_32F, m, n, m * batch + 1, batch, m);
  Call call{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 0.f, &a, &b, &d, &d};
  prepare(call, 4);
  runAndCheck(call);
}

// beta 0: C is not read, NaN in it (out of place or in place) never shows.
TEST(CublasLt, BetaZeroIgnoresNaNInC) {
  const int64_t m = 19, n = 9, k = 12;
  Operand a(CUDA_R_32F, m, k, m, 1, 0), b(CUDA_R_32F, k, n, k, 1, 0);
  Operand c(CUDA_R_32F, m, n, m, 1, 0), d(CUDA_R_32F, m, n, m, 1, 0);
  Call outOfPlace{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 0.f, &a, &b, &c, &d};
  prepare(outOfPlace, 5);
  c.fill(kNaN);
  runAndCheck(outOfPlace);
  Call inPlace{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 0.f, &a, &b, &d, &d};
  d.fill(kNaN);
  runAndCheck(inPlace);
}

// beta 1 with C == D: addMatmul's accumulation into a gradient buffer.
TEST(CublasLt, BetaOneAccumulatesInPlace) {
  const int64_t m = 33, n = 21, k = 40;
  const int32_t batch = 2;
  Operand a(CUDA_R_32F, k, m, k, batch, k * m);
  Operand b(CUDA_R_32F, k, n, k + 1, batch, (k + 1) * n);
  Operand d(CUDA_R_32F, m, n, m, batch, m * n);
  Call call{CUBLAS_OP_T, CUBLAS_OP_N, 1.f, 1.f, &a, &b, &d, &d};
  prepare(call, 6);
  runAndCheck(call);
}

// Out of place with beta != 0: C is read through its own ld and stride.
TEST(CublasLt, OutOfPlaceReadsC) {
  const int64_t m = 18, n = 13, k = 9;
  const int32_t batch = 2;
  Operand a(CUDA_R_32F, m, k, m, batch, m * k),
      b(CUDA_R_32F, k, n, k, batch, 0);
  Operand c(CUDA_R_32F, m, n, m + 7, batch, (m + 7) * n);
  Operand d(CUDA_R_32F, m, n, m + 1, batch, (m + 1) * n + 3);
  Call call{CUBLAS_OP_N, CUBLAS_OP_N, -0.75f, 0.3f, &a, &b, &c, &d};
  prepare(call, 7);
  runAndCheck(call);
}

// k = 0: D = beta * C.
TEST(CublasLt, EmptyInnerDimension) {
  Operand a(CUDA_R_32F, 5, 0, 5, 1, 0), b(CUDA_R_32F, 0, 4, 1, 1, 0);
  Operand d(CUDA_R_32F, 5, 4, 5, 1, 0);
  Call call{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 2.f, &a, &b, &d, &d};
  prepare(call, 8);
  runAndCheck(call);
}

// bf16 A and B, bf16 D (rounded once), every transpose pair.
TEST(CublasLt, Bf16InBf16Out) {
  const int64_t m = 24, n = 35, k = 70;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      SCOPED_TRACE(testing::Message() << "transA " << ta << " transB " << tb);
      const int64_t ar = ta == CUBLAS_OP_N ? m : k,
                    ac = ta == CUBLAS_OP_N ? k : m;
      const int64_t br = tb == CUBLAS_OP_N ? k : n,
                    bc = tb == CUBLAS_OP_N ? n : k;
      Operand a(CUDA_R_16BF, ar, ac, ar + 1, 2, ar * ac + 2 * ac);
      Operand b(CUDA_R_16BF, br, bc, br, 2, 0);
      Operand d(CUDA_R_16BF, m, n, m + 2, 2, (m + 2) * n);
      Call call{ta, tb, 1.f, 0.f, &a, &b, &d, &d};
      prepare(call, 9);
      runAndCheck(call);
    }
}

// bf16 A and B accumulated into fp32 C == D: addMatmul on bf16.
TEST(CublasLt, Bf16InFp32Out) {
  const int64_t m = 31, n = 8, k = 100;
  Operand a(CUDA_R_16BF, m, k, m, 1, 0), b(CUDA_R_16BF, n, k, n + 3, 1, 0);
  Operand d(CUDA_R_32F, m, n, m, 1, 0);
  Call call{CUBLAS_OP_N, CUBLAS_OP_T, 1.f, 1.f, &a, &b, &d, &d};
  prepare(call, 10);
  runAndCheck(call);
  Call plain{CUBLAS_OP_N, CUBLAS_OP_T, 1.f, 0.f, &a, &b, &d, &d};
  runAndCheck(plain);
}

// A 256 x 256 x 256 fp32 GEMM: correct, and fast enough for emulated
// training (the time is printed; the bound is loose for loaded machines).
TEST(CublasLt, Fp32Large) {
  const int64_t s = 256;
  Operand a(CUDA_R_32F, s, s, s, 1, 0), b(CUDA_R_32F, s, s, s, 1, 0);
  Operand d(CUDA_R_32F, s, s, s, 1, 0);
  Call call{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 0.f, &a, &b, &d, &d};
  prepare(call, 11);
  runAndCheck(call);
  run(call); // warm
  const auto start = std::chrono::steady_clock::now();
  const int reps = 5;
  for (int r = 0; r < reps; ++r)
    ASSERT_EQ(run(call), CUBLAS_STATUS_SUCCESS);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count() /
                    reps;
  std::printf("256^3 fp32 GEMM: %.2f ms\n", ms);
  EXPECT_LT(ms, 500.0);
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST(CublasLtErrors, StatusStrings) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED),
               "CUBLAS_STATUS_NOT_SUPPORTED");
  for (cublasStatus_t s : {CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_INVALID_VALUE,
                           CUBLAS_STATUS_NOT_SUPPORTED, cublasStatus_t(31)})
    EXPECT_NE(cublasLtGetStatusString(s), nullptr);
  EXPECT_STRNE(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE),
               cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED));
}

TEST(CublasLtErrors, LayoutAttributes) {
  cublasLtMatrixLayout_t l = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 4),
            CUBLAS_STATUS_SUCCESS);
  const int32_t batch32 = 2;
  const int64_t batch64 = 2, stride = 16;
  // The header's types: BATCH_COUNT int32_t, STRIDED_BATCH_OFFSET int64_t.
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch64, 8),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch32, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, 8),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  const int32_t zero = 0;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &zero, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  // Attributes the header does not declare, and those it does that the
  // emulation does not implement.
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, cublasLtMatrixLayoutAttribute_t(15), &batch32, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  const int32_t rowMajor = CUBLASLT_ORDER_ROW;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER,
                                             &rowMajor, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const uint32_t pointerArray = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &pointerArray, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const int64_t planeOffset = 64, negative = -1;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(
                l, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, &planeOffset, 8),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD,
                                             &negative, 8),
            CUBLAS_STATUS_INVALID_VALUE);
  const uint32_t half = CUDA_R_16F;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE,
                                             &half, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  // Unsupported types at creation.
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_16F, 4, 4, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_64F, 4, 4, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST(CublasLtErrors, MatmulDescAttributes) {
  cublasLtMatmulDesc_t desc = nullptr;
  EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_64F, CUDA_R_64F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(
      cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
      CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_16BF),
            CUBLAS_STATUS_NOT_SUPPORTED);
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  const int64_t wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                           &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                           &t, sizeof(t)),
            CUBLAS_STATUS_SUCCESS);
  const int32_t bogusOp = 7, conj = CUBLAS_OP_CONJG;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                           &bogusOp, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                           &conj, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSC, &t, 4),
      CUBLAS_STATUS_NOT_SUPPORTED);
  const uint32_t relu = CUBLASLT_EPILOGUE_RELU,
                 plain = CUBLASLT_EPILOGUE_DEFAULT;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                           &relu, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                           &plain, 4),
            CUBLAS_STATUS_SUCCESS);
  const int32_t device = CUBLASLT_POINTER_MODE_DEVICE;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(
                desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &device, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const int32_t computeHalf = CUBLAS_COMPUTE_16F;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(
                desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &computeHalf, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const void *bias = &t;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(
                desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const int8_t fastAccum = 1;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(
                desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fastAccum, 1),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(
                desc, cublasLtMatmulDescAttributes_t(63), &t, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
}

TEST(CublasLtErrors, PreferenceAttributes) {
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint32_t small = 1024, three = 3, zero = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &small, 4),
            CUBLAS_STATUS_INVALID_VALUE); // uint64_t
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &three, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &zero, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  const uint64_t align64 = 16;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align64, 8),
            CUBLAS_STATUS_INVALID_VALUE); // uint32_t
  const uint32_t limited = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &limited, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const float waves = 1.f;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, &waves, 4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, cublasLtMatmulPreferenceAttributes_t(4), &small, 4),
            CUBLAS_STATUS_INVALID_VALUE); // not declared
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

/// Operands of a small valid fp32 GEMM, changed by each error test.
struct Small {
  Operand a{CUDA_R_32F, 8, 4, 8, 1, 0};
  Operand b{CUDA_R_32F, 4, 6, 4, 1, 0};
  Operand d{CUDA_R_32F, 8, 6, 8, 1, 0};
  Call call() {
    return Call{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 0.f, &a, &b, &d, &d};
  }
};

TEST(CublasLtErrors, ValidSmallCaseRuns) {
  Small s;
  EXPECT_EQ(run(s.call()), CUBLAS_STATUS_SUCCESS);
}

TEST(CublasLtErrors, MismatchedBatchCounts) {
  Small s;
  s.b.batch = 2;
  s.b.stride = 0;
  EXPECT_EQ(run(s.call()), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtErrors, LeadingDimensionBelowRows) {
  Small s;
  s.a.ld = 7; // 8 rows
  EXPECT_EQ(run(s.call()), CUBLAS_STATUS_INVALID_VALUE);
  Small t;
  t.d.ld = 4;
  EXPECT_EQ(run(t.call()), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtErrors, InconsistentShapes) {
  Small s;
  Call call = s.call();
  call.transB = CUBLAS_OP_T; // op(B) 6 x 4, k 4
  EXPECT_EQ(run(call), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtErrors, UnsupportedTypeCombinations) {
  { // fp32 A with bf16 B
    Small s;
    Operand b(CUDA_R_16BF, 4, 6, 4, 1, 0);
    Call call = s.call();
    call.b = &b;
    EXPECT_EQ(run(call), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  { // fp32 inputs, bf16 output
    Small s;
    Operand d(CUDA_R_16BF, 8, 6, 8, 1, 0);
    Call call = s.call();
    call.c = call.d = &d;
    EXPECT_EQ(run(call), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  { // bf16 inputs, C bf16 but D fp32
    Operand a(CUDA_R_16BF, 8, 4, 8, 1, 0), b(CUDA_R_16BF, 4, 6, 4, 1, 0);
    Operand c(CUDA_R_16BF, 8, 6, 8, 1, 0), d(CUDA_R_32F, 8, 6, 8, 1, 0);
    Call call{CUBLAS_OP_N, CUBLAS_OP_N, 1.f, 1.f, &a, &b, &c, &d};
    EXPECT_EQ(run(call), CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

/// Descriptors of `s` for calling the heuristic and matmul by hand.
struct Descriptors {
  explicit Descriptors(Small &s)
      : desc(makeDesc(s.call())), a(s.a.layout()), b(s.b.layout()),
        d(s.d.layout()) {}
  ~Descriptors() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
  }
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
};

TEST(CublasLtErrors, HeuristicArguments) {
  Small s;
  Descriptors ds(s);
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int found = -1;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle(), ds.desc, ds.a, ds.b, ds.d,
                                           ds.d, pref, 0, &result, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, ds.desc, ds.a, ds.b, ds.d,
                                           ds.d, pref, 1, &result, &found),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle(), ds.desc, ds.a, nullptr,
                                           ds.d, ds.d, pref, 1, &result,
                                           &found),
            CUBLAS_STATUS_INVALID_VALUE);
  // A promised alignment below fp32's 4 bytes: no algorithm.
  const uint32_t two = 2;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &two, 4),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle(), ds.desc, ds.a, ds.b, ds.d,
                                           ds.d, pref, 1, &result, &found),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

TEST(CublasLtErrors, PointerLessAlignedThanPromised) {
  Small s;
  Descriptors ds(s);
  cublasLtMatmulPreference_t pref; // default promise: 256 bytes
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle(), ds.desc, ds.a, ds.b, ds.d,
                                           ds.d, pref, 1, &result, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  const float alpha = 1.f, beta = 0.f;
  // Operand's storage is 256-byte aligned: fine.
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, s.a.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(),
                           ds.d, &result.algo, nullptr, 0, 0),
            CUBLAS_STATUS_SUCCESS);
  // A 16 bytes further on keeps 16-byte alignment only.
  Operand shifted(CUDA_R_32F, 8, 4, 8, 1, 0, 16);
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, shifted.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(),
                           ds.d, &result.algo, nullptr, 0, 0),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // Without an algorithm, element alignment is enough.
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, shifted.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(),
                           ds.d, nullptr, nullptr, 0, 0),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaStreamSynchronize(0), cudaSuccess);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

TEST(CublasLtErrors, MatmulArguments) {
  Small s;
  Descriptors ds(s);
  const float alpha = 1.f, beta = 0.f;
  EXPECT_EQ(cublasLtMatmul(nullptr, ds.desc, &alpha, s.a.ptr(), ds.a, s.b.ptr(),
                           ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(), ds.d,
                           nullptr, nullptr, 0, 0),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, nullptr, s.a.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(),
                           ds.d, nullptr, nullptr, 0, 0),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, s.a.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), nullptr,
                           s.d.ptr(), ds.d, nullptr, nullptr, 0, 0),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, s.a.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(),
                           ds.d, nullptr, nullptr, 64, 0),
            CUBLAS_STATUS_INVALID_VALUE); // workspace size without workspace
  // In place (C == D) with another layout for C than for D.
  Operand wide(CUDA_R_32F, 8, 6, 9, 1, 0);
  cublasLtMatrixLayout_t lc = wide.layout();
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, s.a.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), lc, s.d.ptr(),
                           ds.d, nullptr, nullptr, 0, 0),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayoutDestroy(lc);
  // An algorithm chosen for bf16 operands.
  Operand a16(CUDA_R_16BF, 8, 4, 8, 1, 0), b16(CUDA_R_16BF, 4, 6, 4, 1, 0);
  cublasLtMatrixLayout_t la16 = a16.layout(), lb16 = b16.layout();
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle(), ds.desc, la16, lb16, ds.d,
                                           ds.d, pref, 1, &result, &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmul(handle(), ds.desc, &alpha, s.a.ptr(), ds.a,
                           s.b.ptr(), ds.b, &beta, s.d.ptr(), ds.d, s.d.ptr(),
                           ds.d, &result.algo, nullptr, 0, 0),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la16);
  cublasLtMatrixLayoutDestroy(lb16);
}

// What a GPU would leave undefined ends the process.
TEST(CublasLtDeathTest, UndefinedUses) {
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  {
    // D overlapping A.
    Operand buffer(CUDA_R_32F, 64, 1, 64, 1, 0);
    float *base = static_cast<float *>(buffer.ptr());
    Small s;
    Descriptors ds(s);
    const float alpha = 1.f, beta = 0.f;
    EXPECT_DEATH(cublasLtMatmul(handle(), ds.desc, &alpha, base, ds.a,
                                s.b.ptr(), ds.b, &beta, base + 16, ds.d,
                                base + 16, ds.d, nullptr, nullptr, 0, 0),
                 "D overlaps A");
  }
  {
    // Batches of D on top of each other (stride 0).
    Small s;
    for (Operand *x : {&s.a, &s.b, &s.d})
      x->batch = 2;
    s.d.stride = 0;
    EXPECT_DEATH(run(s.call()), "batches of D overlap");
  }
  {
    // Beta != 0 with a null C.
    Small s;
    Descriptors ds(s);
    const float alpha = 1.f, beta = 1.f;
    EXPECT_DEATH(cublasLtMatmul(handle(), ds.desc, &alpha, s.a.ptr(), ds.a,
                                s.b.ptr(), ds.b, &beta, nullptr, ds.d,
                                s.d.ptr(), ds.d, nullptr, nullptr, 0, 0),
                 "C is null");
  }
  {
    // A descriptor its Create function did not make.
    cublasLtMatmulPreferenceOpaque_t zeroed{};
    const uint64_t bytes = 0;
    EXPECT_DEATH(cublasLtMatmulPreferenceSetAttribute(
                     &zeroed, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                     sizeof(bytes)),
                 "not a matmul preference descriptor");
  }
}

} // namespace
