//===- Checkpoint.cpp - sharded, verified training checkpoints ------------===//
//
// Everything of runtime/Checkpoint.h that needs no MPI: checksums,
// fingerprints, manifests, shard files, the folder's housekeeping and
// reading the weights back (fastllm-opt consolidate). The collectives are in
// CheckpointCollective.cpp.
//

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
#include <map>
#include <set>
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

} // namespace

Expected<ShardRecord>
fastllm::rt::writeShard(const std::string &path, int rank, int64_t step,
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
std::string fastllm::rt::loadShard(const std::string &folder, int rank,
                                   const Manifest &m,
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

Expected<ShardRecord> fastllm::rt::writeManifestFile(const std::string &path,
                                                     const std::string &json) {
  ChecksummedFile file(path);
  Status s = file.open();
  if (s.ok())
    s = file.write(json.data(), json.size());
  if (!s.ok())
    return s;
  return file.commit();
}

Expected<Manifest> fastllm::rt::readManifest(const std::string &folder) {
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
// Reading a checkpoint's weights
//===----------------------------------------------------------------------===//

const char *const fastllm::rt::kMasterRegion = "master";

namespace {

/// A fingerprint's decimal field as a non-negative integer below 2^62.
std::optional<int64_t> decimal(const std::string &s) {
  if (s.empty() || s.size() > 18 ||
      s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::strtoll(s.c_str(), nullptr, 10);
}

/// A fingerprint's shape field, "[2, 3]" (or "[]"), as dimensions.
std::optional<std::vector<int64_t>> shapeField(const std::string &s) {
  if (s.size() < 2 || s.front() != '[' || s.back() != ']')
    return std::nullopt;
  std::vector<int64_t> dims;
  std::string inner = s.substr(1, s.size() - 2);
  for (size_t at = 0; !inner.empty();) {
    size_t comma = inner.find(", ", at);
    std::optional<int64_t> d = decimal(inner.substr(at, comma - at));
    if (!d || dims.size() >= 16)
      return std::nullopt;
    dims.push_back(*d);
    if (comma == std::string::npos)
      break;
    at = comma + 2;
  }
  return dims;
}

/// Reads the plan fingerprint's fields by name, naming what is wrong.
class FieldReader {
public:
  explicit FieldReader(const Fingerprint &f) {
    for (const auto &[key, value] : f)
      fields.emplace(key, value);
  }
  Expected<std::string> text(const std::string &key) const {
    auto it = fields.find(key);
    if (it == fields.end())
      return errorf("the manifest's plan has no '%s' (written by an older "
                    "fastllm-opt? consolidate needs the parameters' names, "
                    "shapes and offsets and the stage table)",
                    key.c_str());
    return it->second;
  }
  Expected<int64_t> number(const std::string &key, int64_t max) const {
    Expected<std::string> t = text(key);
    if (!t)
      return t.status();
    std::optional<int64_t> x = decimal(*t);
    if (!x || *x > max)
      return errorf("the manifest's plan field '%s' is \"%s\", not an "
                    "integer in [0, %lld]",
                    key.c_str(), t->c_str(), (long long)max);
    return *x;
  }

private:
  std::map<std::string, std::string> fields;
};

/// The element count of `shape`, or nothing past `max`.
std::optional<int64_t> elementCount(const std::vector<int64_t> &shape,
                                    int64_t max) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n) || n > max)
      return std::nullopt;
  return n;
}

/// Checks that the stages tile the flat array in dp equal shards.
Status checkStages(const CheckpointLayout &l) {
  int64_t end = 0;
  for (size_t k = 0; k < l.stages.size(); ++k) {
    auto [offset, elements] = l.stages[k];
    if (offset != end || elements % l.dp != 0)
      return errorf("the manifest's stage %zu [%lld, +%lld) does not follow "
                    "the previous one or does not split into %lld equal "
                    "shards",
                    k, (long long)offset, (long long)elements, (long long)l.dp);
    end += elements;
  }
  if (end != l.paramElements)
    return errorf("the manifest's stages cover %lld elements, not "
                  "param_elements %lld",
                  (long long)end, (long long)l.paramElements);
  return Status();
}

/// Reads parameter `i` of the fingerprint and checks it against the stages.
Expected<CheckpointParam> readParam(const FieldReader &f,
                                    const CheckpointLayout &l, int64_t i) {
  std::string key = "params[" + std::to_string(i) + "].";
  CheckpointParam p;
  Expected<std::string> name = f.text(key + "name");
  Expected<std::string> shape = f.text(key + "shape");
  Expected<std::string> trainable = f.text(key + "trainable");
  if (!name || !shape || !trainable)
    return !name ? name.status() : !shape ? shape.status() : trainable.status();
  p.name = *name;
  std::optional<std::vector<int64_t>> dims = shapeField(*shape);
  if (!dims || (*trainable != "true" && *trainable != "false"))
    return errorf("parameter %lld ('%s') has shape \"%s\" and trainable "
                  "\"%s\" in the manifest",
                  (long long)i, name->c_str(), shape->c_str(),
                  trainable->c_str());
  p.shape = *dims;
  p.trainable = *trainable == "true";
  std::optional<int64_t> n = elementCount(p.shape, INT64_C(1) << 48);
  if (!n)
    return errorf("parameter '%s' has shape %s, too large", name->c_str(),
                  shape->c_str());
  p.elements = *n;
  if (!p.trainable)
    return p;
  Expected<int64_t> offset = f.number(key + "offset", l.paramElements);
  if (!offset)
    return offset.status();
  p.offset = *offset;
  for (auto [begin, elements] : l.stages)
    if (p.offset >= begin && p.offset + p.elements <= begin + elements)
      return p;
  return errorf("parameter '%s' [%lld, +%lld) lies in no one stage of the "
                "manifest",
                name->c_str(), (long long)p.offset, (long long)p.elements);
}

} // namespace

Expected<CheckpointLayout> fastllm::rt::checkpointLayout(const Manifest &m) {
  FieldReader f(m.plan);
  CheckpointLayout l;
  constexpr int64_t kMaxElements = INT64_C(1) << 48, kMaxCount = 1 << 24;
  Expected<int64_t> dp = f.number("dp", 1 << 20);
  Expected<int64_t> zero = f.number("zero_stage", 3);
  Expected<int64_t> elements = f.number("param_elements", kMaxElements);
  Expected<int64_t> stages = f.number("num_stages", kMaxCount);
  Expected<int64_t> params = f.number("num_params", kMaxCount);
  for (const Expected<int64_t> *x : {&dp, &zero, &elements, &stages, &params})
    if (!*x)
      return x->status();
  if (*dp != m.dp || *dp < 1)
    return errorf("the manifest's plan is for dp %lld but it lists %lld "
                  "shards",
                  (long long)*dp, (long long)m.dp);
  l.dp = *dp;
  l.zeroStage = *zero;
  l.paramElements = *elements;
  for (int64_t k = 0; k < *stages; ++k) {
    std::string key = "stages[" + std::to_string(k) + "].";
    Expected<int64_t> offset = f.number(key + "offset", kMaxElements);
    Expected<int64_t> size = f.number(key + "elements", kMaxElements);
    if (!offset || !size)
      return !offset ? offset.status() : size.status();
    l.stages.push_back({*offset, *size});
  }
  if (Status s = checkStages(l); !s.ok())
    return s;
  std::set<std::string> names;
  for (int64_t i = 0; i < *params; ++i) {
    Expected<CheckpointParam> p = readParam(f, l, i);
    if (!p)
      return p.status();
    if (!names.insert(p->name).second)
      return errorf("the manifest names parameter '%s' twice", p->name.c_str());
    l.params.push_back(std::move(*p));
  }
  return l;
}

namespace {

/// The regions a shard header lists, checked against the shard's rank and
/// step; `what` says what is wrong otherwise.
bool parseShardHeader(const std::string &header, int rank, int64_t step,
                      std::vector<std::pair<std::string, uint64_t>> &regions,
                      std::string &what) {
  Expected<JsonValue> v = parseJson(header);
  if (!v) {
    what = "its header is not JSON: " + v.status().message();
    return false;
  }
  const JsonValue *r = v->get("rank"), *s = v->get("step"),
                  *list = v->get("regions");
  std::optional<uint64_t> hr = r ? r->asUint64() : std::nullopt;
  std::optional<uint64_t> hs = s ? s->asUint64() : std::nullopt;
  if (!hr || !hs || *hr != uint64_t(rank) || *hs != uint64_t(step) || !list ||
      list->kind != JsonValue::Kind::Array) {
    what = "its header does not describe rank " + std::to_string(rank) +
           "'s regions at step " + std::to_string(step);
    return false;
  }
  for (const JsonValue &e : list->array) {
    const JsonValue *name = e.get("name"), *bytes = e.get("bytes");
    std::optional<uint64_t> n = bytes ? bytes->asUint64() : std::nullopt;
    if (!name || name->kind != JsonValue::Kind::String || !n) {
      what = "its header lists a region without a name and a byte count";
      return false;
    }
    regions.push_back({name->text, *n});
  }
  return true;
}

} // namespace

std::string fastllm::rt::readMasterShard(const std::string &folder, int rank,
                                         const Manifest &m,
                                         const CheckpointLayout &layout,
                                         float *out) {
  std::string name = shardFileName(rank);
  const ShardRecord &expected = m.shards.at(rank);
  int fd = ::open((folder + "/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return "cannot open " + name + ": " + std::strerror(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return name + " is not a regular file";
  if (st.st_size != expected.bytes)
    return name + " has " + std::to_string(st.st_size) +
           " bytes but the manifest says " + std::to_string(expected.bytes);
  char magic[sizeof(kShardMagic)];
  uint64_t headerBytes = 0;
  if (!readAll(fd, magic, sizeof(magic)) ||
      std::memcmp(magic, kShardMagic, sizeof(magic)) != 0 ||
      !readAll(fd, &headerBytes, sizeof(headerBytes)) ||
      headerBytes > uint64_t(st.st_size) - 16)
    return name + " is not a checkpoint shard";
  std::string header(headerBytes, '\0');
  if (!readAll(fd, header.data(), headerBytes))
    return name + " is not a checkpoint shard";
  std::vector<std::pair<std::string, uint64_t>> regions;
  std::string what;
  if (!parseShardHeader(header, rank, m.step, regions, what))
    return name + ": " + what;
  // Where the master region starts among the data bytes, and their total.
  const uint64_t want = uint64_t(layout.paramElements / layout.dp) * 4;
  uint64_t total = 0, begin = UINT64_MAX;
  for (const auto &[region, bytes] : regions) {
    if (region == kMasterRegion && bytes == want)
      begin = total;
    if (__builtin_add_overflow(total, bytes, &total))
      return name + "'s header describes more bytes than a file holds";
  }
  if (begin == UINT64_MAX)
    return name + " has no '" + kMasterRegion + "' region of " +
           std::to_string(want) + " bytes";
  if (16 + headerBytes + total != uint64_t(st.st_size))
    return name + " has " + std::to_string(st.st_size) +
           " bytes but its header describes " +
           std::to_string(16 + headerBytes + total);
  uint32_t crc = crc32c(0, magic, sizeof(magic));
  crc = crc32c(crc, &headerBytes, sizeof(headerBytes));
  crc = crc32c(crc, header.data(), header.size());
  // Every byte is checksummed; the master region's land in `out`.
  std::vector<char> chunk(size_t(4) << 20);
  auto stream = [&](uint64_t bytes, char *into) {
    for (uint64_t done = 0; done < bytes;) {
      uint64_t n = std::min<uint64_t>(chunk.size(), bytes - done);
      char *p = into ? into + done : chunk.data();
      if (!readAll(fd, p, int64_t(n)))
        return false;
      crc = crc32c(crc, p, n);
      done += n;
    }
    return true;
  };
  if (!stream(begin, nullptr) || !stream(want, reinterpret_cast<char *>(out)) ||
      !stream(total - begin - want, nullptr))
    return "cannot read " + name + ": it ended early";
  if (crc != expected.crc32c)
    return name + " fails its checksum (crc32c " + hex32(crc) +
           ", the manifest says " + hex32(expected.crc32c) + ")";
  return "";
}

Expected<std::vector<float>>
fastllm::rt::readCheckpointWeights(const std::string &folder, const Manifest &m,
                                   const CheckpointLayout &layout) {
  // The files' sizes first: the manifest's element counts are not trusted
  // with an allocation until the shards are seen to hold them.
  const int64_t shardElements = layout.paramElements / layout.dp;
  for (int r = 0; r < int(layout.dp); ++r) {
    struct stat st;
    std::string path = folder + "/" + shardFileName(r);
    if (stat(path.c_str(), &st) != 0)
      return errorf("cannot open %s: %s", shardFileName(r).c_str(),
                    std::strerror(errno));
    if (st.st_size / 4 < shardElements)
      return errorf("%s has %lld bytes, too few for its %lld weights",
                    shardFileName(r).c_str(), (long long)st.st_size,
                    (long long)shardElements);
  }
  std::vector<float> full(size_t(layout.paramElements), 0.0f);
  std::vector<float> shard(static_cast<size_t>(shardElements));
  for (int r = 0; r < int(layout.dp); ++r) {
    if (std::string why = readMasterShard(folder, r, m, layout, shard.data());
        !why.empty())
      return Status::error(why);
    for (auto [offset, elements] : layout.stages) {
      int64_t part = elements / layout.dp;
      std::copy_n(shard.data() + offset / layout.dp, part,
                  full.data() + offset + r * part);
    }
  }
  return full;
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
