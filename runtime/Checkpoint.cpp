//===- Checkpoint.cpp - sharded, verified training checkpoints ------------===//

#include "runtime/Checkpoint.h"
#include "runtime/Version.h"

#include "runtime/Json.h"
#include "runtime/OutputFile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

//===----------------------------------------------------------------------===//
// CRC32C
//===----------------------------------------------------------------------===//

namespace {

/// Slice-by-8 tables of the reflected Castagnoli polynomial.
struct Crc32cTables {
  uint32_t t[8][256];
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (int i = 0; i < 256; ++i)
        t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
};

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t
crc32cSse42(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = uint32_t(c);
  for (; n; --n)
    c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}
#endif

} // namespace

uint32_t fastllm::rt::crc32cPortable(uint32_t crc, const void *data, size_t n) {
  static const Crc32cTables tables;
  const auto &t = tables.t;
  const auto *p = static_cast<const unsigned char *>(data);
  crc = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
          t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
          t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; n; --n)
    crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t fastllm::rt::crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42)
    return crc32cSse42(crc, static_cast<const unsigned char *>(data), n);
#endif
  return crc32cPortable(crc, data, n);
}

//===----------------------------------------------------------------------===//
// Fingerprints
//===----------------------------------------------------------------------===//

Fingerprint fastllm::rt::planFingerprint(const PlanInfo &plan) {
  auto str = [](int64_t x) { return std::to_string(x); };
  Fingerprint f = {{"target", plan.target},
                   {"batch_size", str(plan.batchSize)},
                   {"seq_len", str(plan.seqLen)},
                   {"vocab_size", str(plan.vocabSize)},
                   {"tokens_input", plan.tokensInput},
                   {"targets_input", plan.targetsInput},
                   {"dp", str(plan.dataParallel)},
                   {"zero_stage", str(plan.zeroStage)},
                   {"param_elements", str(plan.paramElements)},
                   {"num_stages", str(plan.numStages)},
                   {"num_params", str(plan.numParams)}};
  for (int32_t k = 0; k < plan.numStages; ++k) {
    std::string key = "stages[" + str(k) + "].";
    f.push_back({key + "offset", str(plan.stages[k].offset)});
    f.push_back({key + "elements", str(plan.stages[k].elements)});
  }
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    std::string key = "params[" + str(i) + "].", shape = "[";
    for (int32_t d = 0; d < p.rank; ++d)
      shape += (d ? ", " : "") + str(p.shape[d]);
    f.push_back({key + "name", paramName(p)});
    f.push_back({key + "shape", shape + "]"});
    f.push_back({key + "offset", str(p.offset)});
    f.push_back({key + "trainable", p.trainable ? "true" : "false"});
  }
  return f;
}

std::vector<std::string>
fastllm::rt::allDifferences(const Fingerprint &saved,
                            const Fingerprint &current) {
  auto find = [](const Fingerprint &f, const std::string &key) {
    for (const auto &[k, v] : f)
      if (k == key)
        return &v;
    return static_cast<const std::string *>(nullptr);
  };
  auto describe = [](const std::string &key, const std::string *was,
                     const std::string *now) {
    return key + " is " + (was ? *was : "absent") + " in the checkpoint but " +
           (now ? *now : "absent") + " now";
  };
  std::vector<std::string> diffs;
  for (const auto &[key, now] : current) {
    const std::string *was = find(saved, key);
    if (!was || *was != now)
      diffs.push_back(describe(key, was, &now));
  }
  for (const auto &[key, was] : saved)
    if (!find(current, key))
      diffs.push_back(describe(key, &was, nullptr));
  return diffs;
}

std::optional<std::string>
fastllm::rt::firstDifference(const Fingerprint &saved,
                             const Fingerprint &current) {
  std::vector<std::string> diffs = allDifferences(saved, current);
  if (diffs.empty())
    return std::nullopt;
  return diffs.front();
}

//===----------------------------------------------------------------------===//
// Manifest
//===----------------------------------------------------------------------===//

namespace {

constexpr const char *kFormat = "fastllm-checkpoint";
constexpr int kVersion = 1;
constexpr char kShardMagic[8] = {'F', 'L', 'C', 'K', 'P', 'T', '0', '1'};

std::string fingerprintJson(const Fingerprint &f) {
  std::string s = "{";
  for (size_t i = 0; i < f.size(); ++i)
    s += std::string(i ? ",\n    " : "\n    ") + jsonQuote(f[i].first) + ": " +
         jsonQuote(f[i].second);
  return s + "\n  }";
}

std::string hex32(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", x);
  return buf;
}

Expected<Fingerprint> parseFingerprint(const JsonValue *v, const char *what) {
  if (!v || v->kind != JsonValue::Kind::Object)
    return errorf("'%s' is missing or not an object", what);
  Fingerprint f;
  for (const auto &[key, value] : v->object) {
    if (value.kind != JsonValue::Kind::String)
      return errorf("'%s.%s' is not a string", what, key.c_str());
    f.push_back({key, value.text});
  }
  return f;
}

/// The manifest's non-negative integer member `key`.
Expected<int64_t> member(const JsonValue &v, const char *key) {
  const JsonValue *m = v.get(key);
  std::optional<uint64_t> x = m ? m->asUint64() : std::nullopt;
  if (!x || *x > uint64_t(INT64_MAX))
    return errorf("'%s' is missing or not a non-negative integer", key);
  return int64_t(*x);
}

} // namespace

std::string fastllm::rt::stepFolderName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", (long long)step);
  return buf;
}

std::string fastllm::rt::shardFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d.bin", rank);
  return buf;
}

std::string fastllm::rt::manifestJson(const Manifest &m) {
  std::string s =
      std::string("{\n  \"format\": \"") + kFormat +
      "\",\n  \"version\": " + std::to_string(kVersion) +
      ",\n  \"producer\": \"fastllm-opt " + versionString() + "\"" +
      ",\n  \"step\": " + std::to_string(m.step) +
      ",\n  \"optimizer_step\": " + std::to_string(m.optimizerStep) +
      ",\n  \"dp\": " + std::to_string(m.dp) +
      ",\n  \"plan\": " + fingerprintJson(m.plan) +
      ",\n  \"run\": " + fingerprintJson(m.run) + ",\n  \"shards\": [";
  for (size_t r = 0; r < m.shards.size(); ++r)
    s += std::string(r ? "," : "") + "\n    {\"file\": \"" +
         shardFileName(int(r)) +
         "\", \"bytes\": " + std::to_string(m.shards[r].bytes) +
         ", \"crc32c\": \"" + hex32(m.shards[r].crc32c) + "\"}";
  return s + "\n  ]\n}\n";
}

Expected<Manifest> fastllm::rt::parseManifest(std::string_view json) {
  Expected<JsonValue> doc = parseJson(json);
  if (!doc)
    return doc.status();
  const JsonValue &v = *doc;
  const JsonValue *format = v.get("format");
  if (v.kind != JsonValue::Kind::Object || !format || format->text != kFormat)
    return errorf("not a %s manifest", kFormat);
  Expected<int64_t> version = member(v, "version");
  if (!version)
    return version.status();
  if (*version != kVersion)
    return errorf("manifest version %lld is not %d, the one this runtime "
                  "reads",
                  (long long)*version, kVersion);
  Manifest m;
  for (auto [key, out] : {std::pair{"step", &m.step},
                          {"optimizer_step", &m.optimizerStep},
                          {"dp", &m.dp}}) {
    Expected<int64_t> x = member(v, key);
    if (!x)
      return x.status();
    *out = *x;
  }
  Expected<Fingerprint> plan = parseFingerprint(v.get("plan"), "plan");
  if (!plan)
    return plan.status();
  Expected<Fingerprint> run = parseFingerprint(v.get("run"), "run");
  if (!run)
    return run.status();
  m.plan = std::move(*plan);
  m.run = std::move(*run);
  const JsonValue *shards = v.get("shards");
  if (!shards || shards->kind != JsonValue::Kind::Array ||
      int64_t(shards->array.size()) != m.dp)
    return errorf("'shards' must list %lld shards, one per rank",
                  (long long)m.dp);
  for (size_t r = 0; r < shards->array.size(); ++r) {
    const JsonValue &s = shards->array[r];
    const JsonValue *file = s.get("file"), *crc = s.get("crc32c");
    Expected<int64_t> bytes = member(s, "bytes");
    bool hex = crc && crc->kind == JsonValue::Kind::String &&
               crc->text.size() == 8 &&
               std::strspn(crc->text.c_str(), "0123456789abcdef") == 8;
    if (!file || file->text != shardFileName(int(r)) || !bytes || !hex)
      return errorf("shard %zu: expected {\"file\": \"%s\", \"bytes\": N, "
                    "\"crc32c\": \"8 hex digits\"}",
                    r, shardFileName(int(r)).c_str());
    m.shards.push_back(
        {*bytes, uint32_t(std::strtoul(crc->text.c_str(), nullptr, 16))});
  }
  return m;
}

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

namespace {

/// An OutputFile that checksums the bytes as it writes them, so a shard's
/// CRC32C costs no second read.
class ChecksummedFile {
public:
  explicit ChecksummedFile(std::string path) : file(std::move(path)) {}

  Status open() { return file.open() ? Status() : failure(); }
  Status write(const void *data, int64_t bytes) {
    record.crc32c = crc32c(record.crc32c, data, size_t(bytes));
    record.bytes += bytes;
    return file.write(data, size_t(bytes)) ? Status() : failure();
  }
  /// Synced and renamed into place.
  Expected<ShardRecord> commit() {
    if (!file.commit())
      return failure();
    return record;
  }

private:
  Status failure() const { return Status::error(file.error()); }

  OutputFile file;
  ShardRecord record;
};

/// Reads exactly `bytes` bytes, or says why not.
bool readAll(int fd, void *data, int64_t bytes) {
  for (char *p = static_cast<char *>(data); bytes > 0;) {
    ssize_t n = ::read(fd, p, std::min<int64_t>(bytes, 1 << 30));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    bytes -= n;
  }
  return true;
}

std::string shardHeader(int rank, int64_t step,
                        const std::vector<Region> &regions) {
  std::string s = "{\"rank\": " + std::to_string(rank) +
                  ", \"step\": " + std::to_string(step) + ", \"regions\": [";
  for (size_t i = 0; i < regions.size(); ++i)
    s += std::string(i ? ", " : "") +
         "{\"name\": " + jsonQuote(regions[i].name) +
         ", \"bytes\": " + std::to_string(regions[i].bytes) + "}";
  return s + "]}";
}

Expected<ShardRecord> writeShard(const std::string &path, int rank,
                                 int64_t step,
                                 const std::vector<Region> &regions) {
  std::string header = shardHeader(rank, step, regions);
  uint64_t headerBytes = header.size();
  ChecksummedFile file(path);
  Status s = file.open();
  if (s.ok())
    s = file.write(kShardMagic, sizeof(kShardMagic));
  if (s.ok())
    s = file.write(&headerBytes, sizeof(headerBytes));
  if (s.ok())
    s = file.write(header.data(), header.size());
  for (const Region &r : regions)
    if (s.ok())
      s = file.write(r.data, r.bytes);
  if (!s.ok())
    return s;
  return file.commit();
}

/// Reads this rank's shard of the checkpoint in `folder` into `regions`;
/// an empty string, or what is wrong with the shard.
std::string loadShard(const std::string &folder, int rank, const Manifest &m,
                      const std::vector<Region> &regions) {
  std::string name = shardFileName(rank);
  if (rank >= int(m.shards.size()))
    return "the manifest lists no " + name;
  const ShardRecord &expected = m.shards[rank];
  int fd = ::open((folder + "/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return "cannot open " + name + ": " + std::strerror(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0)
    return "cannot stat " + name + ": " + std::strerror(errno);
  if (st.st_size != expected.bytes)
    return name + " has " + std::to_string(st.st_size) +
           " bytes but the manifest says " + std::to_string(expected.bytes);

  char magic[sizeof(kShardMagic)];
  uint64_t headerBytes = 0;
  if (!readAll(fd, magic, sizeof(magic)) ||
      std::memcmp(magic, kShardMagic, sizeof(magic)) != 0 ||
      !readAll(fd, &headerBytes, sizeof(headerBytes)) ||
      headerBytes > uint64_t(st.st_size))
    return name + " is not a checkpoint shard";
  std::string header(headerBytes, '\0');
  if (!readAll(fd, header.data(), headerBytes))
    return name + " is not a checkpoint shard";
  if (header != shardHeader(rank, m.step, regions))
    return name + "'s header does not describe rank " + std::to_string(rank) +
           "'s regions at step " + std::to_string(m.step);
  int64_t total = sizeof(magic) + sizeof(headerBytes) + headerBytes;
  for (const Region &r : regions)
    total += r.bytes;
  if (total != st.st_size)
    return name + " has " + std::to_string(st.st_size) +
           " bytes but its header describes " + std::to_string(total);

  uint32_t crc = crc32c(0, magic, sizeof(magic));
  crc = crc32c(crc, &headerBytes, sizeof(headerBytes));
  crc = crc32c(crc, header.data(), header.size());
  for (const Region &r : regions) {
    if (!readAll(fd, r.data, r.bytes))
      return "cannot read " + name + ": " + std::strerror(errno);
    crc = crc32c(crc, r.data, r.bytes);
  }
  if (crc != expected.crc32c)
    return name + " fails its checksum (crc32c " + hex32(crc) +
           ", the manifest says " + hex32(expected.crc32c) + ")";
  return "";
}

Expected<Manifest> readManifest(const std::string &folder) {
  std::string path = folder + "/manifest.json";
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT)
      return errorf("it has no manifest.json (the checkpoint is incomplete)");
    return errorf("cannot open manifest.json: %s", std::strerror(errno));
  }
  std::string text;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;)
    text.append(buf, n);
  bool failed = std::ferror(f);
  std::fclose(f);
  if (failed)
    return errorf("cannot read manifest.json");
  Expected<Manifest> m = parseManifest(text);
  if (!m)
    return Status::error("manifest.json: " + m.status().message());
  return m;
}

} // namespace

Expected<std::vector<int64_t>>
fastllm::rt::listCheckpointSteps(const std::string &dir) {
  DIR *d = opendir(dir.c_str());
  if (!d)
    return errorf("cannot read checkpoint folder '%s': %s", dir.c_str(),
                  std::strerror(errno));
  std::vector<int64_t> steps;
  while (dirent *e = readdir(d)) {
    const char *name = e->d_name;
    if (std::strncmp(name, "step-", 5) != 0 || !name[5] ||
        std::strspn(name + 5, "0123456789") != std::strlen(name + 5) ||
        std::strlen(name + 5) > 18)
      continue;
    steps.push_back(std::strtoll(name + 5, nullptr, 10));
  }
  closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

//===----------------------------------------------------------------------===//
// Save and restore
//===----------------------------------------------------------------------===//

Status fastllm::rt::saveCheckpoint(Communicator &comm, const std::string &dir,
                                   Manifest m,
                                   const std::vector<Region> &regions) {
  std::string folder = dir + "/" + stepFolderName(m.step);
  std::string manifestPath = folder + "/manifest.json";
  if (comm.rank() == 0) {
    if (mkdir(folder.c_str(), 0777) != 0 && errno != EEXIST)
      return errorf("cannot create checkpoint folder '%s': %s", folder.c_str(),
                    std::strerror(errno));
    // A manifest left by an earlier run must not vouch for the shards about
    // to be replaced.
    if (unlink(manifestPath.c_str()) != 0 && errno != ENOENT)
      return errorf("cannot remove the old '%s': %s", manifestPath.c_str(),
                    std::strerror(errno));
    syncFolder(folder);
    syncFolder(dir);
  }
  comm.barrier(); // the folder exists and holds no stale manifest

  Expected<ShardRecord> mine = writeShard(
      folder + "/" + shardFileName(comm.rank()), comm.rank(), m.step, regions);
  if (!mine)
    return mine.status(); // the peers wait below until the job is aborted
  m.dp = comm.size();
  m.shards.assign(comm.size(), ShardRecord());
  comm.allGatherBytes(&*mine, m.shards.data(), sizeof(ShardRecord));
  if (comm.rank() != 0)
    return Status();

  std::string json = manifestJson(m);
  ChecksummedFile file(manifestPath);
  Status s = file.open();
  if (s.ok())
    s = file.write(json.data(), json.size());
  if (!s.ok())
    return s;
  if (Expected<ShardRecord> done = file.commit(); !done)
    return done.status();
  return Status();
}

Expected<Restored>
fastllm::rt::loadLatestCheckpoint(Communicator &comm, const std::string &dir,
                                  const Fingerprint &plan,
                                  const std::vector<Region> &regions) {
  // Rank 0's listing decides which checkpoints everyone tries, in order, so
  // that the ranks' collectives below pair up.
  std::vector<int64_t> steps;
  int64_t count = 0;
  Status listing;
  if (comm.rank() == 0) {
    Expected<std::vector<int64_t>> listed = listCheckpointSteps(dir);
    if (listed)
      steps = std::move(*listed);
    else
      listing = listed.status();
    count = listed ? int64_t(steps.size()) : -1;
  }
  comm.broadcast(&count, sizeof(count), 0);
  if (count < 0)
    return listing.ok()
               ? errorf("cannot read checkpoint folder '%s'", dir.c_str())
               : listing;
  steps.resize(count);
  comm.broadcast(steps.data(), count * int64_t(sizeof(int64_t)), 0);

  constexpr int kReasonBytes = 256;
  Restored result;
  for (int64_t step : steps) {
    std::string folder = dir + "/" + stepFolderName(step);
    Expected<Manifest> m = readManifest(folder);
    std::string why;
    if (!m) {
      why = m.status().message();
    } else if (m->step != step) {
      why = "its manifest is for step " + std::to_string(m->step);
    } else if (std::optional<std::string> diff =
                   firstDifference(m->plan, plan)) {
      return errorf("checkpoint '%s' was written for a different plan: %s; "
                    "resume with the binary that wrote it, or start a new "
                    "--checkpoint-dir",
                    folder.c_str(), diff->c_str());
    } else {
      why = loadShard(folder, comm.rank(), *m, regions);
    }

    // Every rank must have loaded its shard of the same checkpoint.
    char reason[kReasonBytes] = {};
    std::strncpy(reason, why.c_str(), kReasonBytes - 1);
    std::vector<char> reasons(size_t(kReasonBytes) * comm.size());
    comm.allGatherBytes(reason, reasons.data(), kReasonBytes);
    std::vector<std::string> problems;
    for (int r = 0; r < comm.size(); ++r)
      problems.push_back(&reasons[size_t(r) * kReasonBytes]);
    if (std::all_of(problems.begin(), problems.end(),
                    [](const std::string &p) { return p.empty(); })) {
      result.path = folder;
      result.manifest = std::move(*m);
      return result;
    }
    // One reason when the ranks agree (a missing manifest), else each rank's.
    std::string line = "checkpoint '" + folder + "' skipped: ";
    if (std::equal(problems.begin() + 1, problems.end(), problems.begin())) {
      line += problems[0];
    } else {
      bool first = true;
      for (int r = 0; r < comm.size(); ++r)
        if (!problems[r].empty()) {
          line += (first ? "rank " : "; rank ") + std::to_string(r) + ": " +
                  problems[r];
          first = false;
        }
    }
    result.skipped.push_back(line);
    // Rank 0's view decides (every rank read the same manifest file).
    int64_t hadManifest = m.ok();
    comm.broadcast(&hadManifest, sizeof(hadManifest), 0);
    result.damaged += hadManifest;
  }
  return result; // none complete: an empty path
}

Expected<std::vector<int64_t>>
fastllm::rt::listCompleteCheckpointSteps(const std::string &dir) {
  Expected<std::vector<int64_t>> steps = listCheckpointSteps(dir);
  if (!steps)
    return steps;
  std::vector<int64_t> complete;
  for (int64_t step : *steps) {
    Expected<Manifest> m = readManifest(dir + "/" + stepFolderName(step));
    if (m && m->step == step)
      complete.push_back(step);
  }
  return complete;
}

namespace {

/// Whether `name` is an OutputFile temporary: `<target>.tmp-XXXXXX`.
bool isTemporary(const char *name) {
  const char *at = std::strstr(name, kTemporarySuffix);
  return at && at != name &&
         std::strlen(at) == std::strlen(kTemporarySuffix) + 6;
}

/// The entries of `folder` (not . and ..), or an error.
Expected<std::vector<std::string>> entries(const std::string &folder) {
  DIR *d = opendir(folder.c_str());
  if (!d)
    return errorf("cannot read folder '%s': %s", folder.c_str(),
                  std::strerror(errno));
  std::vector<std::string> names;
  while (dirent *e = readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, ".."))
      names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace

Expected<int64_t> fastllm::rt::removeOrphanTemporaries(const std::string &dir) {
  int64_t removed = 0;
  std::vector<std::string> folders = {dir};
  Expected<std::vector<int64_t>> steps = listCheckpointSteps(dir);
  if (!steps)
    return steps.status();
  for (int64_t step : *steps)
    folders.push_back(dir + "/" + stepFolderName(step));
  for (const std::string &folder : folders) {
    Expected<std::vector<std::string>> names = entries(folder);
    if (!names)
      return names.status();
    for (const std::string &name : *names) {
      if (!isTemporary(name.c_str()))
        continue;
      std::string path = folder + "/" + name;
      struct stat st;
      if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        continue; // only files OutputFile could have made
      if (unlink(path.c_str()) != 0)
        return errorf("cannot remove the orphan temporary '%s': %s",
                      path.c_str(), std::strerror(errno));
      ++removed;
    }
    syncFolder(folder);
  }
  return removed;
}

Status fastllm::rt::removeCheckpoint(const std::string &dir, int64_t step) {
  std::string folder = dir + "/" + stepFolderName(step);
  // The manifest first: a folder half removed is incomplete, not damaged.
  std::string manifest = folder + "/manifest.json";
  if (unlink(manifest.c_str()) != 0 && errno != ENOENT)
    return errorf("cannot remove '%s': %s", manifest.c_str(),
                  std::strerror(errno));
  syncFolder(folder);
  Expected<std::vector<std::string>> names = entries(folder);
  if (!names)
    return names.status();
  for (const std::string &name : *names) {
    // Only what a checkpoint holds: shards and temporaries.
    bool shard = name.size() == shardFileName(0).size() &&
                 name.compare(0, 5, "rank-") == 0 &&
                 name.compare(name.size() - 4, 4, ".bin") == 0;
    if (!shard && !isTemporary(name.c_str()))
      continue;
    std::string path = folder + "/" + name;
    if (unlink(path.c_str()) != 0 && errno != ENOENT)
      return errorf("cannot remove '%s': %s", path.c_str(),
                    std::strerror(errno));
  }
  if (rmdir(folder.c_str()) != 0)
    return errorf("cannot remove checkpoint folder '%s': %s", folder.c_str(),
                  std::strerror(errno));
  syncFolder(dir);
  return Status();
}

Expected<std::vector<int64_t>>
fastllm::rt::pruneCheckpoints(const std::string &dir, int64_t keep) {
  std::vector<int64_t> removed;
  if (keep <= 0)
    return removed;
  Expected<std::vector<int64_t>> complete = listCompleteCheckpointSteps(dir);
  if (!complete)
    return complete;
  if (int64_t(complete->size()) <= keep)
    return removed;
  const int64_t oldestKept = (*complete)[keep - 1];
  Expected<std::vector<int64_t>> all = listCheckpointSteps(dir);
  if (!all)
    return all;
  for (int64_t step : *all) {
    if (step >= oldestKept)
      continue;
    if (Status s = removeCheckpoint(dir, step); !s.ok())
      return s;
    removed.push_back(step);
  }
  return removed;
}

//===----------------------------------------------------------------------===//
// The folder's lock
//===----------------------------------------------------------------------===//

const char *const fastllm::rt::kLockFileName = "train.lock";

CheckpointLock::~CheckpointLock() {
  if (fd >= 0)
    ::close(fd); // releases the flock
}

CheckpointLock::CheckpointLock(CheckpointLock &&other) noexcept : fd(other.fd) {
  other.fd = -1;
}

CheckpointLock &CheckpointLock::operator=(CheckpointLock &&other) noexcept {
  std::swap(fd, other.fd);
  return *this;
}

Expected<CheckpointLock> CheckpointLock::acquire(const std::string &dir) {
  std::string path = dir + "/" + kLockFileName;
  std::string owner = path + ".owner";
  if (std::string why = checkReplaceable(path); !why.empty())
    return Status::error("--checkpoint-dir '" + dir + "': " + why);
  // Never replaced (another job's lock would then be on a different file):
  // created once, empty, and only locked.
  int fd = ::open(path.c_str(),
                  O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
  if (fd < 0)
    return errorf("--checkpoint-dir '%s': cannot open its lock file '%s': %s",
                  dir.c_str(), path.c_str(), std::strerror(errno));
  CheckpointLock lock;
  lock.fd = fd;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return errorf("--checkpoint-dir '%s': its lock file '%s' is not a "
                  "regular file",
                  dir.c_str(), path.c_str());
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err != EWOULDBLOCK)
      return errorf("--checkpoint-dir '%s': cannot lock '%s': %s", dir.c_str(),
                    path.c_str(), std::strerror(err));
    std::string holder;
    if (FILE *f = std::fopen(owner.c_str(), "rb")) {
      char buf[256] = {};
      size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
      std::fclose(f);
      holder = std::string(buf, n);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
        holder.pop_back();
    }
    return errorf("--checkpoint-dir '%s' is in use by another training job%s "
                  "(it holds '%s'); wait for it to end or use another folder",
                  dir.c_str(),
                  holder.empty() ? "" : (" (" + holder + ")").c_str(),
                  path.c_str());
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string who = "pid " + std::to_string(getpid()) + " on " + host + "\n";
  if (std::string why = writeFileAtomically(owner, who); !why.empty())
    return Status::error("--checkpoint-dir '" + dir + "': " + why);
  return lock;
}
