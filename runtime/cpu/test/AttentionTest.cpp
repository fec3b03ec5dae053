//===- AttentionTest.cpp - fused causal attention ---------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

struct AttentionCase {
  int64_t batch, t, d, dv;
  float scale;
};

std::string describe(const AttentionCase &c) {
  return "batch=" + std::to_string(c.batch) + " t=" + std::to_string(c.t) +
         " d=" + std::to_string(c.d) + " dv=" + std::to_string(c.dv);
}

/// Causal attention and its gradients in double, as the unfused PyTorch
/// chain computes them: explicit [t, t] scores, -inf above the diagonal,
/// softmax, products; the backward from the chain rule through each step.
struct RefAttention {
  std::vector<double> out, lse, dq, dk, dv;

  RefAttention(const AttentionCase &c, const std::vector<float> &q,
               const std::vector<float> &k, const std::vector<float> &v,
               const std::vector<float> &dout) {
    const int64_t t = c.t, d = c.d, dvs = c.dv;
    out.assign(c.batch * t * dvs, 0);
    lse.assign(c.batch * t, 0);
    dq.assign(q.size(), 0);
    dk.assign(k.size(), 0);
    dv.assign(v.size(), 0);
    std::vector<double> p(t * t), dp(t * t), ds(t * t);
    for (int64_t b = 0; b < c.batch; ++b) {
      const float *qb = q.data() + b * t * d, *kb = k.data() + b * t * d;
      const float *vb = v.data() + b * t * dvs, *gb = dout.data() + b * t * dvs;
      for (int64_t i = 0; i < t; ++i) {
        double *s = p.data() + i * t;
        for (int64_t j = 0; j < t; ++j) {
          double dotIJ = 0;
          for (int64_t x = 0; x < d; ++x)
            dotIJ += double(qb[i * d + x]) * kb[j * d + x];
          s[j] = j > i ? -kInf : dotIJ * c.scale;
        }
        double m = *std::max_element(s, s + t), sum = 0;
        for (int64_t j = 0; j < t; ++j)
          sum += std::exp(s[j] - m);
        lse[b * t + i] = m + std::log(sum);
        for (int64_t j = 0; j < t; ++j)
          s[j] = std::exp(s[j] - m) / sum;
      }
      // out = p v; dp = dout vᵀ; dv = pᵀ dout.
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          double dpIJ = 0;
          for (int64_t x = 0; x < dvs; ++x) {
            out[(b * t + i) * dvs + x] += p[i * t + j] * vb[j * dvs + x];
            dv[(b * t + j) * dvs + x] += p[i * t + j] * gb[i * dvs + x];
            dpIJ += double(gb[i * dvs + x]) * vb[j * dvs + x];
          }
          dp[i * t + j] = dpIJ;
        }
      // Softmax backward, then the masked entries get no gradient.
      for (int64_t i = 0; i < t; ++i) {
        double dot = 0;
        for (int64_t j = 0; j < t; ++j)
          dot += dp[i * t + j] * p[i * t + j];
        for (int64_t j = 0; j < t; ++j)
          ds[i * t + j] = j > i ? 0 : p[i * t + j] * (dp[i * t + j] - dot);
      }
      // The scores were (q kᵀ)·scale.
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j)
          for (int64_t x = 0; x < d; ++x) {
            dq[(b * t + i) * d + x] += c.scale * ds[i * t + j] * kb[j * d + x];
            dk[(b * t + j) * d + x] += c.scale * ds[i * t + j] * qb[i * d + x];
          }
    }
  }
};

/// The inputs and the kernels' outputs for one case.
struct AttentionRun {
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;

  AttentionRun(const AttentionCase &c, unsigned seed, float range = 2.f)
      : q(randomFloats(c.batch * c.t * c.d, seed, -range, range)),
        k(randomFloats(c.batch * c.t * c.d, seed + 1, -range, range)),
        v(randomFloats(c.batch * c.t * c.dv, seed + 2)),
        dout(randomFloats(c.batch * c.t * c.dv, seed + 3)),
        out(c.batch * c.t * c.dv, kInfF), lse(c.batch * c.t, kInfF),
        dq(q.size(), kInfF), dk(k.size(), kInfF), dv(v.size(), kInfF) {
    causalAttention(out.data(), lse.data(), q.data(), k.data(), v.data(),
                    c.batch, c.t, c.d, c.dv, c.scale);
    causalAttentionGrad(dq.data(), dk.data(), dv.data(), q.data(), k.data(),
                        v.data(), out.data(), lse.data(), dout.data(), c.batch,
                        c.t, c.d, c.dv, c.scale);
  }
};

/// Within rtol 1e-5 of `want`, or within `tol` times the largest |want|
/// (at least 1): sums that cancel to near zero keep float rounding of the
/// size of their terms.
void expectCloseToScale(const std::vector<float> &got,
                        const std::vector<double> &want, double tol,
                        const std::string &what) {
  double largest = 1;
  for (double w : want)
    largest = std::max(largest, std::abs(w));
  expectAllClose(got, want, 1e-5, tol * largest, what);
}

void checkAttention(const AttentionCase &c, unsigned seed, double tol = 2e-6,
                    float range = 2.f) {
  AttentionRun run(c, seed, range);
  RefAttention ref(c, run.q, run.k, run.v, run.dout);
  std::string what = describe(c);
  expectCloseToScale(run.out, ref.out, tol, what + " out");
  expectCloseToScale(run.lse, ref.lse, tol, what + " lse");
  expectCloseToScale(run.dq, ref.dq, tol, what + " dq");
  expectCloseToScale(run.dk, ref.dk, tol, what + " dk");
  expectCloseToScale(run.dv, ref.dv, tol, what + " dv");
}

// Tests causalAttention and its gradients against the unfused computation in
// double: one row; d != dv; exactly one and two blocks (of 32 rows), one row
// past a block and t not a multiple of the block; 64-row blocks (large
// t·d), again with t not a multiple; batch 1 and 2 (the backward splits each
// problem's blocks into groups) and 9 (it does not); scores in the tens
// (peaked rows, where float rounding of the scores shows most).
TEST(AttentionTest, MatchesUnfusedReference) {
  checkAttention({1, 1, 4, 4, 0.5f}, 120);
  checkAttention({2, 5, 3, 7, 0.6f}, 121);
  checkAttention({3, 32, 16, 16, 0.25f}, 122);
  checkAttention({2, 64, 16, 8, 0.25f}, 123);
  checkAttention({1, 33, 8, 12, 0.3f}, 124);
  checkAttention({2, 130, 32, 24, 0.17f}, 125);
  checkAttention({1, 200, 8, 8, 0.35f}, 126);
  checkAttention({9, 100, 16, 20, 0.25f}, 127);
  checkAttention({2, 257, 64, 64, 0.125f}, 128);
  checkAttention({1, 300, 128, 120, 0.09f}, 129);
  checkAttention({2, 150, 32, 32, 1.f}, 130, 8e-6);
}

// Tests the gradients against central differences of the forward kernel, so
// that the backward formulas themselves are checked, not only their coding.
TEST(AttentionTest, GradIsTheDerivative) {
  for (AttentionCase c :
       {AttentionCase{2, 5, 3, 7, 0.6f}, AttentionCase{1, 70, 8, 6, 0.4f}}) {
    AttentionRun run(c, 131);
    auto objective = [&](const std::vector<float> &q,
                         const std::vector<float> &k,
                         const std::vector<float> &v) {
      std::vector<float> out(run.out.size()), lse(run.lse.size());
      causalAttention(out.data(), lse.data(), q.data(), k.data(), v.data(),
                      c.batch, c.t, c.d, c.dv, c.scale);
      return weighted(out, run.dout);
    };
    std::string what = describe(c);
    checkFiniteDifferences(
        run.q, run.dq,
        [&](const auto &qs) { return objective(qs, run.k, run.v); }, 1e-2, 2e-3,
        what + " dq");
    checkFiniteDifferences(
        run.k, run.dk,
        [&](const auto &ks) { return objective(run.q, ks, run.v); }, 1e-2, 2e-3,
        what + " dk");
    checkFiniteDifferences(
        run.v, run.dv,
        [&](const auto &vs) { return objective(run.q, run.k, vs); }, 1e-2, 2e-3,
        what + " dv");
  }
}

#ifdef _OPENMP
// Tests that attention and its gradients are bitwise the same on 1 and 3
// threads, with the backward splitting problems into groups (batch 3, with
// 32- and 64-row blocks) and not (batch 9).
TEST(AttentionTest, SameBitsOnAnyTeam) {
  for (AttentionCase c : {AttentionCase{3, 300, 32, 40, 0.2f},
                          AttentionCase{3, 300, 128, 128, 0.1f},
                          AttentionCase{9, 130, 16, 16, 0.25f}}) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    AttentionRun one(c, 140);
    omp_set_num_threads(3);
    AttentionRun three(c, 140);
    omp_set_num_threads(saved);
    EXPECT_EQ(one.out, three.out) << describe(c);
    EXPECT_EQ(one.lse, three.lse) << describe(c);
    EXPECT_EQ(one.dq, three.dq) << describe(c);
    EXPECT_EQ(one.dk, three.dk) << describe(c);
    EXPECT_EQ(one.dv, three.dv) << describe(c);
  }
}
#endif

} // namespace
