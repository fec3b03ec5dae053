//===- Wmma.h - WMMA fragments as warp-collective operations ----*- C++ -*-===//
//
// nvcuda::wmma for the emulation: m16n16k16 fragments of __nv_bfloat16 (A and
// B, row- or column-major) and float accumulators. Every operation is warp
// collective, as on a GPU: all 32 lanes must reach it with the same pointer,
// leading dimension and layout, or the emulator reports an error. The
// pointer must be 32-byte aligned and the leading dimension a multiple of 16
// bytes (8 bf16, 4 float elements), CUDA's rules for load_matrix_sync and
// store_matrix_sync.
//
// A fragment's layout across lanes is unspecified in CUDA; here each lane
// holds the whole tile, which is all that code that never indexes a fragment
// can observe. mma_sync multiplies in fp32 (bf16 products are exact in fp32)
// and adds the k products in order: a tensor core's internal rounding is
// what only a GPU can show.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_EMU_WMMA_H
#define FASTLLM_RUNTIME_CUDA_EMU_WMMA_H

#include "runtime/cuda/emu/Device.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <typename Use, int M, int N, int K> struct Shape;
template <int M, int N, int K> struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

/// What every lane of a WMMA operation must pass alike.
struct Key {
  const void *pointer;
  unsigned ldm;
  int layout;
  int op;
};

/// Sets every byte of `key`: the lanes of a warp compare keys byte for
/// byte, and Key has 4 bytes of padding after `op` that an initializer
/// leaves as whatever the lane's stack held (an adversarial schedule then
/// reported matching wmma calls as mismatched, now and then).
/// Filled in place: a copy need not carry the padding.
inline void setKey(Key &key, const void *pointer, unsigned ldm, int layout,
                   int op) {
  std::memset(static_cast<void *>(&key), 0, sizeof(key));
  key.pointer = pointer;
  key.ldm = ldm;
  key.layout = layout;
  key.op = op;
}

/// Checks CUDA's rules for a fragment load or store and meets the warp.
inline void collective(int op, const void *p, unsigned ldm, int layout,
                       size_t elementBytes, const char *what) {
  if (reinterpret_cast<uintptr_t>(p) % 32)
    ::fastllm::emu::deviceFatal(__FILE__, __LINE__,
                                "wmma::%s: pointer %p is not 32-byte aligned",
                                what, p);
  if ((ldm * elementBytes) % 16)
    ::fastllm::emu::deviceFatal(
        __FILE__, __LINE__,
        "wmma::%s: leading dimension %u is not a multiple of 16 bytes", what,
        ldm);
  Key key;
  setKey(key, p, ldm, layout, op);
  ::fastllm::emu::warpOp(::fastllm::emu::WarpOpKind::Wmma, 0xffffffffu, 0, 0,
                         op, 32, &key, int(sizeof(key)), __FILE__, __LINE__);
}

inline void collective(int op) {
  Key key;
  setKey(key, nullptr, 0, 0, op);
  ::fastllm::emu::warpOp(::fastllm::emu::WarpOpKind::Wmma, 0xffffffffu, 0, 0,
                         op, 32, &key, int(sizeof(key)), __FILE__, __LINE__);
}

inline float toFloat(float x) { return x; }
inline float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
} // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
public:
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows;
  static constexpr int cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  /// Row-major over the tile, whatever the memory layout it was loaded from.
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, const T &value) {
  detail::collective(0);
  for (T &e : f.x)
    e = value;
}

/// A or B from memory in the fragment's layout.
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p,
                      unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> ||
                    std::is_same_v<Layout, col_major>,
                "matrix_a and matrix_b fragments have a layout");
  constexpr bool rowMajor = std::is_same_v<Layout, row_major>;
  detail::collective(1, p, ldm, rowMajor, sizeof(T), "load_matrix_sync");
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = rowMajor ? p[r * ldm + c] : p[c * ldm + r];
}

/// An accumulator from memory in `layout`.
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p,
                      unsigned ldm, layout_t layout) {
  detail::collective(2, p, ldm, layout, sizeof(float), "load_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] =
          layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
                       unsigned ldm, layout_t layout) {
  detail::collective(3, p, ldm, layout, sizeof(float), "store_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) =
          f.x[r * N + c];
}

/// d = a·b + c, fp32 products added in k order.
template <int M, int N, int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float> &d,
              const fragment<matrix_a, M, N, K, T, LA> &a,
              const fragment<matrix_b, M, N, K, T, LB> &b,
              const fragment<accumulator, M, N, K, float> &c) {
  detail::collective(4);
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float sum = c.x[i * N + j];
      for (int k = 0; k < K; ++k)
        sum +=
            detail::toFloat(a.x[i * K + k]) * detail::toFloat(b.x[k * N + j]);
      out[i * N + j] = sum;
    }
  for (int e = 0; e < M * N; ++e)
    d.x[e] = out[e];
}

} // namespace nvcuda::wmma

#endif // FASTLLM_RUNTIME_CUDA_EMU_WMMA_H
