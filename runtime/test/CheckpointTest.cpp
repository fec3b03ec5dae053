//===- CheckpointTest.cpp - checksums, manifests, choosing a checkpoint ---===//
//
// A resumed run must never load a torn or foreign checkpoint: these tests
// damage checkpoints the ways a kill or a bad disk does and check that resume
// skips exactly those, saying why, and refuses another plan's by name.
//
//===----------------------------------------------------------------------===//

#include "FakeModel.h"
#include "TestComm.h"
#include "TestUtil.h"

#include "runtime/Checkpoint.h"
#include "runtime/Json.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

using namespace fastllm::rt;
using namespace fastllm::rt::test;
namespace fs = std::filesystem;

namespace {

uint32_t crcOf(const std::string &s) { return crc32c(0, s.data(), s.size()); }

TEST(Crc32c, MatchesKnownVectors) {
  // The check value of the CRC catalogue and RFC 3720's (iSCSI) examples.
  std::string ascending(32, 0), descending(32, 0);
  std::iota(ascending.begin(), ascending.end(), 0);
  std::iota(descending.rbegin(), descending.rend(), 0);
  const std::pair<std::string, uint32_t> vectors[] = {
      {"", 0},
      {"123456789", 0xe3069283u},
      {std::string(32, '\0'), 0x8a9136aau},
      {std::string(32, '\xff'), 0x62a8ab43u},
      {ascending, 0x46dd794eu},
      {descending, 0x113fdb5cu}};
  for (const auto &[input, expected] : vectors) {
    EXPECT_EQ(crc32c(0, input.data(), input.size()), expected) << input.size();
    EXPECT_EQ(crc32cPortable(0, input.data(), input.size()), expected)
        << input.size();
  }
}

TEST(Crc32c, ChainsAndAgreesWithThePortableFormAtAnyAlignment) {
  std::mt19937 rng(1);
  std::string data(4099, '\0');
  for (char &c : data)
    c = char(rng());
  uint32_t whole = crcOf(data);
  for (size_t begin : {0, 1, 3, 7, 8, 13})
    for (size_t length : {0, 1, 5, 8, 9, 64, 1000, 4000}) {
      const char *p = data.data() + begin;
      EXPECT_EQ(crc32c(0, p, length), crc32cPortable(0, p, length))
          << begin << "+" << length;
    }
  for (size_t split : {0, 1, 7, 2048, 4099}) {
    uint32_t a = crc32c(0, data.data(), split);
    EXPECT_EQ(crc32c(a, data.data() + split, data.size() - split), whole);
    a = crc32cPortable(0, data.data(), split);
    EXPECT_EQ(crc32cPortable(a, data.data() + split, data.size() - split),
              whole);
  }
}

Manifest sampleManifest() {
  Manifest m;
  m.step = 12;
  m.optimizerStep = 11;
  m.dp = 2;
  m.plan = {{"target", "cpu"}, {"params[0].name", "h.0/\"w\""}};
  m.run = {{"seed", "7"}};
  m.shards = {{1234, 0xe3069283u}, {99, 0x0000000fu}};
  m.loss = "3.14159274";
  m.tokens = 4096;
  return m;
}

TEST(Manifest, RoundTrips) {
  Manifest m = sampleManifest();
  std::string json = manifestJson(m);
  EXPECT_NE(json.find("\"file\": \"rank-00001.bin\", \"bytes\": 99, "
                      "\"crc32c\": \"0000000f\""),
            std::string::npos)
      << json;
  Expected<Manifest> back = parseManifest(json);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->step, 12);
  EXPECT_EQ(back->optimizerStep, 11);
  EXPECT_EQ(back->dp, 2);
  EXPECT_EQ(back->plan, m.plan);
  EXPECT_EQ(back->run, m.run);
  ASSERT_EQ(back->shards.size(), 2u);
  EXPECT_EQ(back->shards[0].bytes, 1234);
  EXPECT_EQ(back->shards[0].crc32c, 0xe3069283u);
  EXPECT_EQ(back->shards[1].crc32c, 0xfu);
  EXPECT_EQ(back->loss, "3.14159274");
}

TEST(Manifest, AnyBytesInPathsAndOptionsReadBack) {
  // A path or a flag may hold bytes that are not UTF-8 (a folder named in
  // Latin-1): the manifest stays JSON its reader takes, the initial
  // weights' path comes back exactly, and a fingerprint compares equal to
  // the one it was written from.
  Manifest m = sampleManifest();
  m.initialWeights = "/data/run\xe9/weights.safetensors";
  m.initialWeightsBytes = 10;
  m.initialWeightsMtimeNs = 20;
  m.run = {{"decay", "\xff\xfe(w|b)"}, {"seed", "7"}};
  Expected<Manifest> back = parseManifest(manifestJson(m));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->initialWeights, m.initialWeights);
  EXPECT_EQ(firstDifference(back->run, m.run), std::nullopt);
  Fingerprint other = m.run;
  other[0].second = "\xff(w|b)";
  EXPECT_NE(firstDifference(back->run, other), std::nullopt);
  EXPECT_EQ(utf8Text("caf\xc3\xa9 \xe9\xed\xa0\x80 \xf4\x90\x80\x80"),
            "caf\xc3\xa9 \\xe9\\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80");
  EXPECT_EQ(fromHexBytes(hexBytes(m.initialWeights)), m.initialWeights);
  EXPECT_EQ(fromHexBytes("abc"), std::nullopt);
  EXPECT_EQ(fromHexBytes("zz"), std::nullopt);
}

TEST(Manifest, RejectsMalformedOnes) {
  std::string good = manifestJson(sampleManifest());
  auto broken = [&](const std::string &from, const std::string &to) {
    std::string json = good;
    size_t at = json.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    json.replace(at, from.size(), to);
    Expected<Manifest> m = parseManifest(json);
    EXPECT_FALSE(m.ok()) << json;
    return m.ok() ? "" : m.status().message();
  };
  EXPECT_EQ(broken("fastllm-checkpoint", "other"),
            "not a fastllm-checkpoint manifest");
  EXPECT_EQ(broken("\"version\": 1", "\"version\": 2"),
            "manifest version 2 is not 1, the one this runtime reads");
  EXPECT_EQ(broken("\"dp\": 2", "\"dp\": 3"),
            "'shards' must list 3 shards, one per rank");
  EXPECT_EQ(broken("\"step\": 12", "\"step\": -1"),
            "'step' is missing or not a non-negative integer");
  EXPECT_NE(broken("0000000f", "xyz").find("shard 1: expected"),
            std::string::npos);
  EXPECT_NE(broken("rank-00001.bin", "rank-00000.bin").find("shard 1"),
            std::string::npos);
  EXPECT_EQ(broken("\"seed\": \"7\"", "\"seed\": 7"),
            "'run.seed' is not a string");
  EXPECT_EQ(broken("\"tokens\": 4096", "\"tokens\": 9223372036854775807"),
            "'tokens' 9223372036854775807 is more than a run counts (2^62)");
  EXPECT_EQ(broken("\"3.14159274\"", "3.14159274"),
            "'loss' must be a number as a string (\"2.5\")");
  EXPECT_EQ(broken("\"3.14159274\"", "\"3.1; rm\""),
            "'loss' must be a number as a string (\"2.5\")");
  EXPECT_FALSE(parseManifest(good.substr(0, good.size() / 2)).ok());
}

TEST(Fingerprint, NamesTheFirstDifference) {
  Fingerprint a = {{"target", "cpu"}, {"batch_size", "2"}, {"seq_len", "3"}};
  EXPECT_FALSE(firstDifference(a, a));
  Fingerprint b = a;
  b[1].second = "4";
  b[2].second = "5";
  EXPECT_EQ(*firstDifference(a, b), "batch_size is 2 in the checkpoint but 4 "
                                    "now");
  EXPECT_EQ(allDifferences(a, b).size(), 2u);
  Fingerprint c = a;
  c.push_back({"params[3].name", "head"});
  EXPECT_EQ(*firstDifference(a, c),
            "params[3].name is absent in the checkpoint but head now");
  EXPECT_EQ(*firstDifference(c, a),
            "params[3].name is head in the checkpoint but absent now");
  // Any byte may be in a value (parameter names hold NUL and newlines):
  // the message shows it escaped, whole and on one line.
  Fingerprint d = a;
  d[0].second = std::string("cp\0u\n", 5);
  EXPECT_EQ(*firstDifference(d, a),
            "target is cp\\x00u\\x0a in the checkpoint but cpu now");
}

TEST(Fingerprint, CoversThePlansIdentifyingFields) {
  fake::setShape(2, 3);
  PlanInfo plan = *fastllm_plan();
  Fingerprint f = planFingerprint(plan);
  auto value = [&](const std::string &key) {
    for (const auto &[k, v] : f)
      if (k == key)
        return v;
    return std::string("(missing)");
  };
  EXPECT_EQ(value("target"), "cpu");
  EXPECT_EQ(value("batch_size"), "2");
  EXPECT_EQ(value("seq_len"), "3");
  EXPECT_EQ(value("vocab_size"), "16");
  EXPECT_EQ(value("dp"), "1");
  EXPECT_EQ(value("zero_stage"), "1");
  EXPECT_EQ(value("param_elements"), "160");
  EXPECT_EQ(value("num_stages"), "2");
  EXPECT_EQ(value("stages[0].offset"), "0");
  EXPECT_EQ(value("stages[0].elements"), "96");
  EXPECT_EQ(value("stages[1].offset"), "96");
  EXPECT_EQ(value("stages[1].elements"), "64");
  EXPECT_EQ(value("params[0].name"), "embed");
  EXPECT_EQ(value("params[0].shape"), "[16, 4]");
  EXPECT_EQ(value("params[0].offset"), "4");
  EXPECT_EQ(value("params[1].offset"), "0");
  EXPECT_EQ(value("params[2].trainable"), "false");
  ParamInfo params[3] = {plan.params[0], plan.params[1], plan.params[2]};
  params[1].shape[0] = 8;
  PlanInfo changed = plan;
  changed.params = params;
  EXPECT_EQ(*firstDifference(f, planFingerprint(changed)),
            "params[1].shape is [4] in the checkpoint but [8] now");
  // The same stages split among more ranks hold other shards.
  changed = plan;
  changed.dataParallel = 2;
  EXPECT_EQ(*firstDifference(f, planFingerprint(changed)),
            "dp is 1 in the checkpoint but 2 now");
  StageInfo stages[2] = {{0, 64, -1, -1}, {64, 96, -1, -1}};
  changed = plan;
  changed.stages = stages;
  EXPECT_EQ(*firstDifference(f, planFingerprint(changed)),
            "stages[0].elements is 96 in the checkpoint but 64 now");
}

/// Two regions of a rank's state, filled from a seed so that every
/// checkpoint's contents are distinct.
class CheckpointTest : public ::testing::Test {
protected:
  std::vector<float> weights = std::vector<float>(1000);
  std::vector<int32_t> counters = std::vector<int32_t>(7);
  const Fingerprint plan = {{"target", "cpu"}, {"batch_size", "2"}};

  std::vector<Region> regions() {
    return {{"weights", weights.data(), int64_t(weights.size() * 4)},
            {"counters", counters.data(), int64_t(counters.size() * 4)}};
  }
  void fill(int seed) {
    for (size_t i = 0; i < weights.size(); ++i)
      weights[i] = float(seed) + float(i) / 1024;
    for (size_t i = 0; i < counters.size(); ++i)
      counters[i] = seed * 100 + int(i);
  }
  bool holds(int seed) {
    std::vector<float> w = weights;
    std::vector<int32_t> c = counters;
    fill(seed);
    return w == weights && c == counters;
  }
  Status save(int64_t step, int seed) {
    fill(seed);
    Manifest m;
    m.step = step;
    m.optimizerStep = step;
    m.plan = plan;
    return saveCheckpoint(testComm(), dir.path(), m, regions());
  }
  std::string folder(int64_t step) {
    return dir.path() + "/" + stepFolderName(step);
  }
  std::string shard(int64_t step) {
    return folder(step) + "/" + shardFileName(0);
  }
  Expected<Restored> load() {
    fill(-1);
    return loadLatestCheckpoint(testComm(), dir.path(), plan, regions());
  }

  TempDir dir;
};

TEST_F(CheckpointTest, WritesShardsAndAManifestThatLoadBack) {
  ASSERT_TRUE(save(5, 1).ok());
  ASSERT_TRUE(save(10, 2).ok());
  std::vector<std::string> files;
  for (const auto &e : fs::directory_iterator(folder(10)))
    files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"manifest.json", "rank-00000.bin"}));

  Expected<Manifest> m =
      parseManifest(readBytes(folder(10) + "/manifest.json"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::string bytes = readBytes(shard(10));
  EXPECT_EQ(m->step, 10);
  EXPECT_EQ(m->dp, 1);
  ASSERT_EQ(m->shards.size(), 1u);
  EXPECT_EQ(m->shards[0].bytes, int64_t(bytes.size()));
  EXPECT_EQ(m->shards[0].crc32c, crcOf(bytes));
  EXPECT_EQ(bytes.substr(0, 8), "FLCKPT01");

  Expected<Restored> r = load();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, folder(10));
  EXPECT_EQ(r->manifest.step, 10);
  EXPECT_TRUE(r->skipped.empty());
  EXPECT_TRUE(holds(2));
}

TEST_F(CheckpointTest, SkipsIncompleteAndDamagedCheckpoints) {
  for (int step : {5, 10, 15, 20, 25})
    ASSERT_TRUE(save(step, step).ok());
  // 25: killed before the manifest, with a shard still in its temporary file.
  fs::remove(folder(25) + "/manifest.json");
  fs::rename(shard(25), shard(25) + ".tmp-abcdef");
  // 20: its shard truncated.
  std::string bytes = readBytes(shard(20));
  writeBytes(shard(20), bytes.substr(0, bytes.size() - 10));
  // 15: one bit flipped in the weights.
  bytes = readBytes(shard(15));
  bytes[bytes.size() / 2] ^= 4;
  writeBytes(shard(15), bytes);
  // 10: the shard file is gone.
  fs::remove(shard(10));
  // Not checkpoints.
  fs::create_directory(dir.file("step-abc"));
  writeBytes(dir.file("step-99.tmp"), "x");

  Expected<Restored> r = load();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, folder(5));
  EXPECT_TRUE(holds(5));
  ASSERT_EQ(r->skipped.size(), 4u);
  auto skipped = [&](int step, const std::string &why) {
    return "checkpoint '" + folder(step) + "' skipped: " + why;
  };
  EXPECT_EQ(r->skipped[0],
            skipped(25, "it has no manifest.json (the checkpoint is "
                        "incomplete)"));
  EXPECT_EQ(r->skipped[1], skipped(20, "rank-00000.bin has " +
                                           std::to_string(bytes.size() - 10) +
                                           " bytes but the manifest says " +
                                           std::to_string(bytes.size())));
  EXPECT_EQ(r->skipped[2].find(skipped(15, "rank-00000.bin fails its checksum "
                                           "(crc32c ")),
            0u)
      << r->skipped[2];
  EXPECT_EQ(r->skipped[3],
            skipped(10, "cannot open rank-00000.bin: it does not exist"));
}

TEST_F(CheckpointTest, FindsNothingWhenNoCheckpointIsComplete) {
  Expected<Restored> r = load();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, "");
  EXPECT_TRUE(r->skipped.empty());
  ASSERT_TRUE(save(3, 3).ok());
  fs::remove(folder(3) + "/manifest.json");
  r = load();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, "");
  EXPECT_EQ(r->damaged, 0); // incomplete, not damaged
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0], "checkpoint '" + folder(3) +
                               "' skipped: it has no manifest.json (the "
                               "checkpoint is incomplete)");
  Expected<std::vector<int64_t>> complete =
      listCompleteCheckpointSteps(dir.path());
  ASSERT_TRUE(complete.ok());
  EXPECT_TRUE(complete->empty());
}

TEST_F(CheckpointTest, RefusesAnotherPlansCheckpoint) {
  ASSERT_TRUE(save(5, 5).ok());
  Fingerprint other = plan;
  other[1].second = "4";
  Expected<Restored> r =
      loadLatestCheckpoint(testComm(), dir.path(), other, regions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "checkpoint '" + folder(5) +
                "' was written for a different plan: batch_size is 2 in the "
                "checkpoint but 4 now; resume with the binary that wrote it, "
                "or start a new --checkpoint-dir");
}

TEST_F(CheckpointTest, RejectsAShardOfOtherRegions) {
  ASSERT_TRUE(save(5, 5).ok());
  std::vector<Region> fewer = regions();
  fewer.pop_back();
  Expected<Restored> r =
      loadLatestCheckpoint(testComm(), dir.path(), plan, fewer);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, "");
  EXPECT_EQ(r->damaged, 1); // a manifest, but the shard does not load
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_NE(r->skipped[0].find(
                "rank-00000.bin's header does not describe rank 0's regions "
                "at step 5"),
            std::string::npos)
      << r->skipped[0];
}

TEST_F(CheckpointTest, RewritingAStepReplacesIt) {
  // A run resumed from step 5 reaches step 10 again, where a damaged
  // checkpoint of the first run lies.
  ASSERT_TRUE(save(10, 1).ok());
  writeBytes(shard(10), "garbage");
  ASSERT_TRUE(save(10, 2).ok());
  Expected<Restored> r = load();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->skipped.empty());
  EXPECT_TRUE(holds(2));
}

TEST_F(CheckpointTest, ReportsAFolderItCannotWrite) {
  Manifest m;
  m.step = 1;
  Status s = saveCheckpoint(testComm(), dir.file("missing"), m, regions());
  EXPECT_EQ(s.message(), "cannot create checkpoint folder '" +
                             dir.file("missing") + "/" + stepFolderName(1) +
                             "': No such file or directory");
}

} // namespace
