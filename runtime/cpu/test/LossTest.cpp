//===- LossTest.cpp - cross-entropy and NLL ---------------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

constexpr int64_t kIgnore = -100;

/// Per-row cross-entropy (logSoftmax = false) or NLL in double; NaN marks an
/// ignored row.
template <typename Idx>
std::vector<double>
refRowLosses(const std::vector<float> &x, const std::vector<Idx> &targets,
             int64_t classes, bool fromLogits, bool hasIgnore) {
  std::vector<double> loss;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (hasIgnore && targets[r] == kIgnore) {
      loss.push_back(std::nan(""));
      continue;
    }
    const float *xr = x.data() + r * classes;
    double lse = 0;
    if (fromLogits) {
      double m = *std::max_element(xr, xr + classes);
      double s = 0;
      for (int64_t i = 0; i < classes; ++i)
        s += std::exp(xr[i] - m);
      lse = m + std::log(s);
    }
    loss.push_back(lse - xr[targets[r]]);
  }
  return loss;
}

/// Reduces per-row losses as F.cross_entropy does.
std::vector<double> refReduceLoss(const std::vector<double> &rows,
                                  Reduction r) {
  if (r == Reduction::None) {
    std::vector<double> out;
    for (double v : rows)
      out.push_back(std::isnan(v) ? 0.0 : v);
    return out;
  }
  double sum = 0, count = 0;
  for (double v : rows)
    if (!std::isnan(v)) {
      sum += v;
      count += 1;
    }
  return {r == Reduction::Sum ? sum : sum / count};
}

template <typename Idx>
void checkLosses(int64_t classes, const std::vector<Idx> &targets,
                 bool hasIgnore, unsigned seed) {
  int64_t rows = int64_t(targets.size());
  auto logits = randomFloats(rows * classes, seed, -4.f, 4.f);
  for (int64_t i = 0; i < classes; ++i) // stability; the loss is unchanged
    logits[i] += 1000.f;
  std::vector<float> logProbs(logits.size());
  softmax(logProbs.data(), logits.data(), rows, classes, 1, /*log=*/true);
  for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    std::string what = "reduction " + std::to_string(int(r));
    int64_t lossSize = r == Reduction::None ? rows : 1;
    std::vector<float> loss(lossSize);
    crossEntropy(loss.data(), logits.data(), targets.data(), rows, classes,
                 hasIgnore, kIgnore, r);
    auto ceRows = refRowLosses(logits, targets, classes, true, hasIgnore);
    expectAllClose(loss, refReduceLoss(ceRows, r), 1e-5, 1e-6, "CE " + what);
    nllLoss(loss.data(), logProbs.data(), targets.data(), rows, classes,
            hasIgnore, kIgnore, r);
    expectAllClose(
        loss,
        refReduceLoss(
            refRowLosses(logProbs, targets, classes, false, hasIgnore), r),
        1e-6, 1e-6, "NLL " + what);

    // Gradients: d/dx of Σ dloss·loss. The reference is the softmax minus
    // the one-hot target (or the negated one-hot) scaled per row.
    auto dloss = randomFloats(lossSize, seed + 1, 0.5f, 1.5f);
    double count = 0;
    for (double v : ceRows)
      count += !std::isnan(v);
    std::vector<double> wantCE(logits.size(), 0.0), wantNLL(logits.size(), 0.0);
    auto probs = refSoftmax(logits, rows, classes, 1, false);
    for (int64_t row = 0; row < rows; ++row) {
      if (std::isnan(ceRows[row]))
        continue;
      double g = r == Reduction::None  ? dloss[row]
                 : r == Reduction::Sum ? dloss[0]
                                       : dloss[0] / count;
      for (int64_t i = 0; i < classes; ++i)
        wantCE[row * classes + i] =
            g * (probs[row * classes + i] - (i == targets[row]));
      wantNLL[row * classes + targets[row]] = -g;
    }
    std::vector<float> grad(logits.size(), 9.f);
    crossEntropyGrad(grad.data(), logits.data(), targets.data(), dloss.data(),
                     rows, classes, hasIgnore, kIgnore, r);
    expectAllClose(grad, wantCE, 1e-5, 1e-7, "CE grad " + what);
    checkFiniteDifferences(
        logits, grad,
        [&](const std::vector<float> &xs) {
          std::vector<float> l(lossSize);
          crossEntropy(l.data(), xs.data(), targets.data(), rows, classes,
                       hasIgnore, kIgnore, r);
          return weighted(l, dloss);
        },
        1e-2, 2e-3, "CE grad " + what);
    std::fill(grad.begin(), grad.end(), 9.f);
    nllLossGrad(grad.data(), targets.data(), dloss.data(), rows, classes,
                hasIgnore, kIgnore, r);
    expectAllClose(grad, wantNLL, 1e-6, 0, "NLL grad " + what);
  }
}

// Tests cross-entropy and NLL, forward and backward, for every reduction,
// with ignored targets, both index types, and a vocabulary-sized row.
TEST(LossTest, CrossEntropyAndNll) {
  checkLosses<int64_t>(11, {3, 0, kIgnore, 10, 5, kIgnore}, true, 100);
  checkLosses<int32_t>(11, {3, 0, 7, 10, 5, 1}, false, 101);
  std::vector<int64_t> targets(12);
  for (size_t i = 0; i < targets.size(); ++i)
    targets[i] = int64_t(i * 4099 % 5000);
  targets[4] = kIgnore;
  checkLosses<int64_t>(5000, targets, true, 102);
}

// Tests that Mean over only ignored targets is NaN, with zero gradient.
TEST(LossTest, AllIgnored) {
  std::vector<int64_t> targets{kIgnore, kIgnore};
  auto logits = randomFloats(6, 103);
  float loss = 0, dloss = 1;
  crossEntropy(&loss, logits.data(), targets.data(), 2, 3, true, kIgnore,
               Reduction::Mean);
  EXPECT_TRUE(std::isnan(loss));
  std::vector<float> grad(6, 9.f);
  crossEntropyGrad(grad.data(), logits.data(), targets.data(), &dloss, 2, 3,
                   true, kIgnore, Reduction::Mean);
  EXPECT_EQ(grad, std::vector<float>(6, 0.f));
}

} // namespace
