//===- DataTest.cpp - token file and samplers -----------------------------===//
//
// The sequential sampler is the reference order the PyTorch comparisons
// replay, so its offsets are checked against docs/DESIGN.md's formula written
// out again here; the random one must be reproducible and stay in range.
//
//===----------------------------------------------------------------------===//

#include "TestUtil.h"

#include "runtime/Data.h"
#include "runtime/TokenFileFormat.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

using namespace fastllm::rt;
using namespace fastllm::rt::test;

namespace {

std::vector<uint16_t> iota16(int n) {
  std::vector<uint16_t> ids(n);
  for (int i = 0; i < n; ++i)
    ids[i] = i % 1000;
  return ids;
}

TEST(Data, SequentialOffsetsFollowTheFormula) {
  const int64_t n = 997, T = 7, B = 3, A = 2, dp = 1;
  Sampler sampler(SamplerKind::Sequential, /*seed=*/5, n, T, B, A, dp);
  const int64_t G = dp * A * B;
  ASSERT_EQ(sampler.globalBatch(), G);
  for (int64_t s = 0; s < 200; ++s)
    for (int64_t i = 0; i < G; ++i)
      ASSERT_EQ(sampler.offset(s, i), ((s * G + i) * T) % (n - T - 1))
          << "step " << s << " sample " << i;
}

TEST(Data, SequentialOffsetsDoNotOverflow) {
  // (s * G + i) * T exceeds 2^63 here; the offset must still be exact.
  const int64_t n = 1000003, T = 1024, G = 64;
  Sampler sampler(SamplerKind::Sequential, 0, n, T, G, 1, 1);
  const int64_t s = int64_t(1) << 50, M = n - T - 1;
  // ((s * G) * T) mod M computed by modular multiplication.
  auto mulMod = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    for (a %= M; b; b >>= 1, a = (a * 2) % M)
      if (b & 1)
        r = (r + a) % M;
    return r;
  };
  EXPECT_EQ(sampler.offset(s, 3), mulMod((mulMod(s, G) + 3) % M, T));
}

TEST(Data, MicroBatchesHoldTheRankSamplesAndShiftedTargets) {
  TempDir dir;
  std::vector<uint16_t> ids = iota16(500);
  writeTokens(dir.file("t.u16"), ids);
  const int64_t T = 5, B = 2, A = 3, dp = 2, n = ids.size();
  Expected<TokenFile> data =
      TokenFile::open(dir.file("t.u16"), TokenDtype::U16, T, 1000);
  ASSERT_TRUE(data.ok()) << data.status().message();
  Sampler sampler(SamplerKind::Sequential, 0, n, T, B, A, dp);
  const int64_t G = dp * A * B;
  std::vector<int64_t> tokens(B * T), targets(B * T);
  for (int64_t step : {0, 1, 17})
    for (int64_t rank = 0; rank < dp; ++rank)
      for (int64_t micro = 0; micro < A; ++micro) {
        fillMicroBatch(*data, sampler, step, rank, micro, tokens.data(),
                       targets.data());
        for (int64_t row = 0; row < B; ++row) {
          // Rank r owns samples [r*G/dp, (r+1)*G/dp) in micro-batches of B.
          int64_t sample = rank * G / dp + micro * B + row;
          int64_t start = ((step * G + sample) * T) % (n - T - 1);
          for (int64_t k = 0; k < T; ++k) {
            ASSERT_EQ(tokens[row * T + k], ids[start + k]);
            ASSERT_EQ(targets[row * T + k], ids[start + k + 1]);
          }
        }
      }
}

TEST(Data, RandomOffsetsAreReproducibleAndInRange) {
  const int64_t n = 40, T = 8, M = n - T - 1;
  Sampler a(SamplerKind::Random, 1234, n, T, 4, 2, 1);
  Sampler b(SamplerKind::Random, 1234, n, T, 4, 2, 1);
  Sampler other(SamplerKind::Random, 1235, n, T, 4, 2, 1);
  std::set<int64_t> seen;
  int differ = 0;
  for (int64_t s = 0; s < 300; ++s)
    for (int64_t i = 0; i < 8; ++i) {
      int64_t off = a.offset(s, i);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, M);
      ASSERT_EQ(off, b.offset(s, i));
      seen.insert(off);
      differ += off != other.offset(s, i);
    }
  EXPECT_EQ(seen.size(), size_t(M)); // 2400 draws cover all 31 offsets
  EXPECT_GT(differ, 2000);           // another seed is another order
}

TEST(Data, ReadsU32Files) {
  TempDir dir;
  std::vector<uint32_t> ids = {70000, 1, 2, 3, 4, 5};
  writeTokens(dir.file("t.u32"), ids);
  Expected<TokenFile> data =
      TokenFile::open(dir.file("t.u32"), TokenDtype::U32, 3, 70001);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->size(), 6);
  int64_t out[2];
  data->read(0, 2, out);
  EXPECT_EQ(out[0], 70000);
  EXPECT_EQ(out[1], 1);
}

std::string openError(const std::string &path, TokenDtype dtype, int64_t seqLen,
                      int64_t vocab) {
  Expected<TokenFile> data = TokenFile::open(path, dtype, seqLen, vocab);
  EXPECT_FALSE(data.ok());
  return data.ok() ? "" : data.status().message();
}

TEST(Data, RejectsBadFiles) {
  TempDir dir;
  std::string missing = dir.file("missing.u16");
  EXPECT_EQ(openError(missing, TokenDtype::U16, 4, 100),
            "cannot open data file '" + missing + "': it does not exist");
  EXPECT_EQ(openError(dir.path(), TokenDtype::U16, 4, 100),
            "data file '" + dir.path() + "' is a folder, not a regular file");

  std::string odd = dir.file("odd.u16");
  writeBytes(odd, std::string(11, '\0'));
  EXPECT_EQ(openError(odd, TokenDtype::U16, 2, 100),
            "data file '" + odd +
                "' has 11 bytes, not a multiple of 2 (--data-dtype u16)");
  std::string six = dir.file("six.u32");
  writeBytes(six, std::string(6, '\0'));
  EXPECT_EQ(openError(six, TokenDtype::U32, 1, 100),
            "data file '" + six +
                "' has 6 bytes, not a multiple of 4 (--data-dtype u32)");

  std::string empty = dir.file("empty.u16");
  writeBytes(empty, "");
  EXPECT_EQ(openError(empty, TokenDtype::U16, 4, 100),
            "data file '" + empty +
                "' has 0 tokens; seq-len 4 needs at least 6");
  std::string short5 = dir.file("short.u16");
  writeTokens(short5, iota16(5));
  EXPECT_EQ(openError(short5, TokenDtype::U16, 4, 100),
            "data file '" + short5 +
                "' has 5 tokens; seq-len 4 needs at least 6");
  EXPECT_TRUE(TokenFile::open(short5, TokenDtype::U16, 3, 100).ok());
}

TEST(Data, RejectsTheFirstTokenOutsideTheVocabulary) {
  TempDir dir;
  std::vector<uint16_t> ids(100000, 3);
  ids[77777] = 50;
  ids[88888] = 60;
  writeTokens(dir.file("t.u16"), ids);
  EXPECT_EQ(openError(dir.file("t.u16"), TokenDtype::U16, 8, 50),
            "data file '" + dir.file("t.u16") +
                "': token 50 at position 77777 is not below the vocabulary "
                "size 50 (is --data-dtype u16 right?)");
  EXPECT_TRUE(TokenFile::open(dir.file("t.u16"), TokenDtype::U16, 8, 61).ok());
}

/// A file as `fastllm-opt data` writes it: the header, then the ids.
template <typename T>
std::string headered(const std::vector<T> &ids, uint64_t vocab,
                     uint64_t count) {
  TokenFileHeader h = makeTokenFileHeader(sizeof(T), vocab, count);
  std::string bytes(reinterpret_cast<const char *>(&h), sizeof(h));
  bytes.append(reinterpret_cast<const char *>(ids.data()),
               ids.size() * sizeof(T));
  return bytes;
}

TEST(Data, AHeaderSaysTheWidthAndTheVocabulary) {
  TempDir dir;
  std::vector<uint32_t> ids = {70000, 1, 2, 3, 4, 5};
  std::string path = dir.file("t.tok");
  writeBytes(path, headered(ids, 70001, ids.size()));
  // The header's u32 wins over the default u16 when the flag is not given.
  Expected<TokenFile> data = TokenFile::open(path, TokenDtype::U16, 3, 70001);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->size(), 6);
  int64_t out[3];
  data->read(0, 3, out);
  EXPECT_EQ(out[0], 70000);
  EXPECT_EQ(out[2], 2);
  // Given and agreeing is fine.
  EXPECT_TRUE(TokenFile::open(path, TokenDtype::U32, 3, 70001, true).ok());
  // Given and disagreeing is refused, and so is a larger vocabulary than the
  // model's, even when every id happens to fit.
  Expected<TokenFile> u16 = TokenFile::open(path, TokenDtype::U16, 3, 70001,
                                            /*dtypeGiven=*/true);
  ASSERT_FALSE(u16.ok());
  EXPECT_EQ(u16.status().message(),
            "data file '" + path +
                "' holds u32 ids (its header says so) but --data-dtype is "
                "u16; drop the flag");
  EXPECT_EQ(openError(path, TokenDtype::U16, 3, 70000),
            "data file '" + path +
                "' was tokenized with a vocabulary of 70001; the model's is "
                "70000 (another tokenizer?)");
}

TEST(Data, RejectsHeadersThatDoNotFitTheFile) {
  TempDir dir;
  std::vector<uint16_t> ids = iota16(20);
  std::string truncated = dir.file("truncated.tok");
  writeBytes(truncated, headered(ids, 1000, 21));
  EXPECT_EQ(openError(truncated, TokenDtype::U16, 3, 1000),
            "data file '" + truncated +
                "' has 40 bytes of ids; its header says 21 tokens of 2 bytes "
                "(a truncated or appended file?)");
  std::string huge = dir.file("huge.tok");
  writeBytes(huge, headered(ids, 1000, uint64_t(1) << 63));
  EXPECT_NE(openError(huge, TokenDtype::U16, 3, 1000).find("its header says"),
            std::string::npos);
  std::string later = dir.file("v2.tok");
  std::string bytes = headered(ids, 1000, 20);
  bytes[8] = 2; // version 2
  writeBytes(later, bytes);
  EXPECT_EQ(openError(later, TokenDtype::U16, 3, 1000),
            "data file '" + later +
                "' has token file version 2; this runtime reads version 1");
  std::string wide = dir.file("wide.tok");
  bytes = headered(ids, 1000, 20);
  bytes[12] = 8; // 8 bytes per token
  writeBytes(wide, bytes);
  EXPECT_EQ(openError(wide, TokenDtype::U16, 3, 1000),
            "data file '" + wide +
                "': its header says 8 bytes per token (2 or 4 expected)");
}

} // namespace
