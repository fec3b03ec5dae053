//===- Checkpoint.cpp - sharded, verified training checkpoints ------------===//
//
// Everything of runtime/Checkpoint.h that needs no MPI: checksums,
// fingerprints, manifests, shard files, the folder's housekeeping and
// reading the weights back (fastllm-opt consolidate). The collectives are in
// CheckpointCollective.cpp.
//

#include "runtime/Checkpoint.h"
#include "runtime/Version.h"

#include "runtime/InputFile.h"
#include "runtime/Json.h"
#include "runtime/OutputFile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cmath>
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
  // Values may hold any byte (parameter names do, NUL included): shown
  // escaped, so that a message is one line of text and is not cut short.
  auto shown = [](const std::string *text) {
    return text ? printable(*text) : std::string("absent");
  };
  auto describe = [&](const std::string &key, const std::string *was,
                      const std::string *now) {
    return shown(&key) + " is " + shown(was) + " in the checkpoint but " +
           shown(now) + " now";
  };
  std::vector<std::string> diffs;
  // A saved value is what jsonQuote wrote: bytes that are not UTF-8 (a
  // --decay pattern may hold any) as the text \xNN.
  for (const auto &[key, now] : current) {
    const std::string *was = find(saved, key);
    if (!was || *was != utf8Text(now))
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

/// CRC32C of the file at `path` (8 hex digits), or "unreadable": its whole
/// contents, or with `sample` its size and first and last `sample` bytes
/// (a data file of many GB: a copy that differs from the others almost
/// always differs there).
std::string fastllm::rt::fileCrc32c(const std::string &path, int64_t sample) {
  Expected<OpenedInput> in = openInput(path, path, InputOptions());
  if (!in)
    return "unreadable";
  const int64_t size = in->size;
  uint32_t crc = crc32c(0, &size, sizeof(size));
  std::vector<char> chunk(size_t(4) << 20);
  auto add = [&](int64_t from, int64_t bytes) {
    for (int64_t done = 0; done < bytes;) {
      int64_t n = std::min<int64_t>(int64_t(chunk.size()), bytes - done);
      if (!readAt(in->fd.get(), chunk.data(), uint64_t(n), uint64_t(from + done)))
        return false;
      crc = crc32c(crc, chunk.data(), size_t(n));
      done += n;
    }
    return true;
  };
  bool ok = sample < 0 || 2 * sample >= size
                ? add(0, size)
                : add(0, sample) && add(size - sample, sample);
  if (!ok)
    return "unreadable";
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", crc);
  return hex;
}

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
  s += "\n  ]";
  if (m.tokens >= 0)
    s += ",\n  \"tokens\": " + std::to_string(m.tokens);
  if (!m.loss.empty())
    s += ",\n  \"loss\": " + jsonQuote(m.loss);
  if (!m.initialWeights.empty())
    s += ",\n  \"initial_weights\": {\"path\": " +
         jsonQuote(m.initialWeights) +
         // A path that is not UTF-8 is kept exactly too.
         (utf8Text(m.initialWeights) == m.initialWeights
              ? std::string()
              : ", \"path_hex\": \"" + hexBytes(m.initialWeights) + "\"") +
         ", \"bytes\": " + std::to_string(m.initialWeightsBytes) +
         ", \"mtime_ns\": " + std::to_string(m.initialWeightsMtimeNs) +
         (m.initialWeightsCrc.empty()
              ? std::string()
              : ", \"crc32c\": " + jsonQuote(m.initialWeightsCrc)) +
         "}";
  return s + "\n}\n";
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
  // AdamW steps once per step, less the skipped ones: never more.
  if (m.optimizerStep > m.step)
    return errorf("'optimizer_step' %lld is past 'step' %lld (the optimizer "
                  "steps at most once a step)",
                  (long long)m.optimizerStep, (long long)m.step);
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
  if (v.get("tokens")) {
    Expected<int64_t> tokens = member(v, "tokens");
    if (!tokens)
      return tokens.status();
    // (train bounds a run to 2^62 tokens, so that counts never overflow.)
    if (*tokens > (INT64_C(1) << 62))
      return errorf("'tokens' %lld is more than a run counts (2^62)",
                    (long long)*tokens);
    m.tokens = *tokens;
  }
  if (const JsonValue *loss = v.get("loss")) {
    if (loss->kind != JsonValue::Kind::String || loss->text.empty() ||
        loss->text.size() > 32 ||
        loss->text.find_first_not_of("0123456789.eE+-NaInfty") !=
            std::string::npos)
      return errorf("'loss' must be a number as a string (\"2.5\")");
    m.loss = loss->text;
  }
  if (const JsonValue *w = v.get("initial_weights")) {
    const JsonValue *path = w->get("path");
    Expected<int64_t> bytes = member(*w, "bytes");
    Expected<int64_t> mtime = member(*w, "mtime_ns");
    if (!path || path->kind != JsonValue::Kind::String || path->text.empty() ||
        !bytes || !mtime)
      return errorf("'initial_weights' must be {\"path\": \"...\", "
                    "\"bytes\": N, \"mtime_ns\": N}");
    if (const JsonValue *crc = w->get("crc32c")) {
      if (crc->kind != JsonValue::Kind::String || crc->text.size() != 8 ||
          std::strspn(crc->text.c_str(), "0123456789abcdef") != 8)
        return errorf("'initial_weights.crc32c' must be 8 hex digits");
      m.initialWeightsCrc = crc->text;
    }
    m.initialWeights = path->text;
    if (const JsonValue *hex = w->get("path_hex")) {
      std::optional<std::string> exact =
          hex->kind == JsonValue::Kind::String ? fromHexBytes(hex->text)
                                               : std::nullopt;
      if (!exact || exact->empty() || exact->find('\0') != std::string::npos)
        return errorf("'initial_weights.path_hex' must be the path's bytes "
                      "as hex digits");
      m.initialWeights = *exact;
    }
    m.initialWeightsBytes = *bytes;
    m.initialWeightsMtimeNs = *mtime;
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

namespace {

/// One rank's shard file, opened as resume and consolidate read it: a
/// regular file (never a FIFO, a device or a symlink), of the size the
/// manifest records, starting with the magic and a header that fits in it.
struct ShardFile {
  InputFd fd;
  int64_t size = 0;
  char magic[sizeof(kShardMagic)] = {};
  uint64_t headerBytes = 0;
  std::string header;

  /// The CRC32C of the bytes read so far (magic, length, header), which
  /// the data's continues.
  uint32_t headerCrc() const {
    uint32_t crc = crc32c(0, magic, sizeof(magic));
    crc = crc32c(crc, &headerBytes, sizeof(headerBytes));
    return crc32c(crc, header.data(), header.size());
  }
};

/// Opens rank `rank`'s shard of the checkpoint `m` in `folder` into `out`;
/// "" or what is wrong with it.
std::string openShard(const std::string &folder, int rank, const Manifest &m,
                      ShardFile &out) {
  const std::string name = shardFileName(rank);
  if (rank < 0 || rank >= int(m.shards.size()))
    return "the manifest lists no " + name;
  const int64_t expectedBytes = m.shards[rank].bytes;
  InputOptions options;
  options.noFollow = true;
  options.maxBytes = expectedBytes;
  Expected<OpenedInput> in = openInput(folder + "/" + name, name, options);
  if (!in) {
    if (notFound(in.status()))
      return "cannot open " + name + ": it does not exist";
    const std::string &why = in.status().message();
    // A larger file than the manifest says: the same words as a smaller one.
    if (why.find("more than the") != std::string::npos) {
      struct stat st;
      if (stat((folder + "/" + name).c_str(), &st) == 0)
        return name + " has " + std::to_string(st.st_size) +
               " bytes but the manifest says " +
               std::to_string(expectedBytes);
    }
    return why;
  }
  out.fd = std::move(in->fd);
  out.size = in->size;
  if (out.size != expectedBytes)
    return name + " has " + std::to_string(out.size) +
           " bytes but the manifest says " + std::to_string(expectedBytes);
  const int fd = out.fd.get();
  if (!readAll(fd, out.magic, sizeof(out.magic)) ||
      std::memcmp(out.magic, kShardMagic, sizeof(out.magic)) != 0 ||
      !readAll(fd, &out.headerBytes, sizeof(out.headerBytes)) ||
      out.headerBytes > uint64_t(out.size) - 16)
    return name + " is not a checkpoint shard";
  out.header.assign(out.headerBytes, '\0');
  if (!readAll(fd, out.header.data(), int64_t(out.headerBytes)))
    return name + " is not a checkpoint shard";
  return "";
}

} // namespace

/// Reads this rank's shard of the checkpoint in `folder` into `regions`;
/// an empty string, or what is wrong with the shard.
std::string fastllm::rt::loadShard(const std::string &folder, int rank,
                                   const Manifest &m,
                                   const std::vector<Region> &regions) {
  const std::string name = shardFileName(rank);
  ShardFile shard;
  if (std::string why = openShard(folder, rank, m, shard); !why.empty())
    return why;
  const ShardRecord &expected = m.shards[rank];
  const int fd = shard.fd.get();
  const std::string &header = shard.header;
  const uint64_t headerBytes = shard.headerBytes;
  if (header != shardHeader(rank, m.step, regions))
    return name + "'s header does not describe rank " + std::to_string(rank) +
           "'s regions at step " + std::to_string(m.step);
  int64_t total = sizeof(kShardMagic) + sizeof(headerBytes) + headerBytes;
  for (const Region &r : regions)
    total += r.bytes;
  if (total != shard.size)
    return name + " has " + std::to_string(shard.size) +
           " bytes but its header describes " + std::to_string(total);

  uint32_t crc = shard.headerCrc();
  for (const Region &r : regions) {
    if (!readAll(fd, r.data, r.bytes))
      return "cannot read " + name + ": " + std::strerror(errno);
    crc = crc32c(crc, r.data, r.bytes);
  }
  if (crc != expected.crc32c)
    return name + " fails its checksum (crc32c " + hex32(crc) +
           ", the manifest says " + hex32(expected.crc32c) + ")";
  if (int64_t bad = countInvalid(regions))
    return name + " holds " + std::to_string(bad) +
           " values no checkpoint is saved with (not finite, or a negative "
           "AdamW v): it was altered after it was written";
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

/// The most a manifest may hold: its plan fingerprint names every parameter,
/// so a model with a million of them still fits many times over.
constexpr int64_t kMaxManifestBytes = int64_t(256) << 20;

Expected<Manifest> fastllm::rt::readManifest(const std::string &folder) {
  InputOptions options;
  options.noFollow = true;
  options.maxBytes = kMaxManifestBytes;
  Expected<std::string> text =
      readInputFile(folder + "/manifest.json", "manifest.json", options);
  if (!text) {
    if (notFound(text.status()))
      return errorf("it has no manifest.json (the checkpoint is incomplete)");
    return text.status();
  }
  Expected<Manifest> m = parseManifest(*text);
  if (!m)
    return Status::error("manifest.json: " + m.status().message());
  return m;
}

bool fastllm::rt::hasManifest(const std::string &folder) {
  struct stat st;
  return lstat((folder + "/manifest.json").c_str(), &st) == 0;
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
    int64_t step = std::strtoll(name + 5, nullptr, 10);
    // Only the name train gives a step ("step-00000012"): another spelling
    // of the same number would count it twice.
    if (stepFolderName(step) == name)
      steps.push_back(step);
  }
  closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

//===----------------------------------------------------------------------===//
// Reading a checkpoint's weights
//===----------------------------------------------------------------------===//

const char *const fastllm::rt::kMasterRegion = "master";

std::vector<Region> fastllm::rt::optimizerStateRegions(void *master,
                                                       void *adamM,
                                                       void *adamV,
                                                       int64_t shardBytes) {
  return {{kMasterRegion, master, shardBytes},
          {"adam_m", adamM, shardBytes},
          {"adam_v", adamV, shardBytes}};
}

int64_t fastllm::rt::countInvalid(const std::vector<Region> &state) {
  int64_t bad = 0;
  for (const Region &r : state) {
    const float *x = static_cast<const float *>(r.data);
    const int64_t n = r.bytes / int64_t(sizeof(float));
    const bool nonNegative = r.name == "adam_v";
#pragma omp parallel for reduction(+ : bad)
    for (int64_t i = 0; i < n; ++i)
      bad += !std::isfinite(x[i]) || (nonNegative && x[i] < 0);
  }
  return bad;
}

namespace {
/// The memory the system can give without swapping (/proc/meminfo's
/// MemAvailable), or nothing where it does not say.
std::optional<int64_t> availableMemoryBytes() {
  FILE *f = std::fopen("/proc/meminfo", "r");
  if (!f)
    return std::nullopt;
  char line[256];
  std::optional<int64_t> bytes;
  while (std::fgets(line, sizeof(line), f)) {
    long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) {
      bytes = int64_t(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}
} // namespace

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


std::string fastllm::rt::readMasterShard(const std::string &folder, int rank,
                                         const Manifest &m,
                                         const CheckpointLayout &layout,
                                         float *out) {
  const std::string name = shardFileName(rank);
  ShardFile shard;
  if (std::string why = openShard(folder, rank, m, shard); !why.empty())
    return why;
  const ShardRecord &expected = m.shards[rank];
  const int fd = shard.fd.get();
  const std::string &header = shard.header;
  const uint64_t headerBytes = shard.headerBytes;
  // The header must be the one train writes for this layout, as --resume
  // requires: the master region first, then AdamW's m and v.
  const uint64_t want = uint64_t(layout.paramElements / layout.dp) * 4;
  const std::vector<Region> layoutRegions =
      optimizerStateRegions(nullptr, nullptr, nullptr, int64_t(want));
  if (header != shardHeader(rank, m.step, layoutRegions))
    return name + "'s header does not describe rank " + std::to_string(rank) +
           "'s regions at step " + std::to_string(m.step) + " (" +
           kMasterRegion + ", adam_m, adam_v of " + std::to_string(want) +
           " bytes each)";
  const uint64_t begin = 0, total = 3 * want;
  if (16 + headerBytes + total != uint64_t(shard.size))
    return name + " has " + std::to_string(shard.size) +
           " bytes but its header describes " +
           std::to_string(16 + headerBytes + total);
  uint32_t crc = shard.headerCrc();
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
  if (int64_t bad = countInvalid({{kMasterRegion, out, int64_t(want)}}))
    return name + " holds " + std::to_string(bad) +
           " master weights that are not finite, which no checkpoint is "
           "saved with: it was altered after it was written";
  return "";
}

Expected<std::vector<float>>
fastllm::rt::readCheckpointWeights(const std::string &folder, const Manifest &m,
                                   const CheckpointLayout &layout) {
  // The files' sizes first: the manifest's element counts are not trusted
  // with an allocation until the shards are seen to hold them.
  const int64_t shardElements = layout.paramElements / layout.dp;
  for (int r = 0; r < int(layout.dp); ++r) {
    // (Opened as the shard will be: a FIFO or a device is named as one.)
    InputOptions options;
    options.noFollow = true;
    Expected<OpenedInput> in = openInput(folder + "/" + shardFileName(r),
                                         shardFileName(r), options);
    if (!in)
      return in.status();
    if (in->size / 4 < shardElements)
      return errorf("%s has %lld bytes, too few for its %lld weights",
                    shardFileName(r).c_str(), (long long)in->size,
                    (long long)shardElements);
  }
  // The weights are held whole: the memory must be there, or the manifest
  // (whose sizes the shards' sizes vouch for, sparse files included) would
  // take the process down.
  const int64_t needed = (layout.paramElements + shardElements) * 4;
  if (std::optional<int64_t> available = availableMemoryBytes();
      available && needed > *available)
    return errorf("the checkpoint's weights take %.2f GiB (%lld parameters), "
                  "more than the %.2f GiB of memory available",
                  needed / 1073741824.0, (long long)layout.paramElements,
                  *available / 1073741824.0);
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

/// Whether `name` is an OutputFile temporary of one of `targets`:
/// `<target>.tmp-XXXXXX`. Only such names are removed as temporaries: a
/// user's file that merely ends like one is not ours to delete.
bool isTemporaryOf(const std::string &name,
                   const std::vector<std::string> &targets) {
  for (const std::string &target : targets) {
    std::string prefix = target + kTemporarySuffix;
    if (name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0)
      return true;
  }
  return false;
}

/// Whether `name` is a shard's file name, "rank-NNNNN.bin".
bool isShardName(const std::string &name) {
  return name.size() == shardFileName(0).size() &&
         name.compare(0, 5, "rank-") == 0 &&
         name.find_first_not_of("0123456789", 5) == name.size() - 4 &&
         name.compare(name.size() - 4, 4, ".bin") == 0;
}

/// The entries of the folder open as `fd` (not . and ..), sorted.
std::vector<std::string> entriesAt(int fd) {
  std::vector<std::string> names;
  int copy = dup(fd);
  if (copy < 0)
    return names;
  DIR *d = fdopendir(copy);
  if (!d) {
    ::close(copy);
    return names;
  }
  rewinddir(d);
  while (dirent *e = readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, ".."))
      names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

/// The folder `name` inside the folder `at`, opened without following a
/// symlink; -1 (errno set) when it is one, or not a folder.
int openFolderAt(int at, const std::string &name) {
  return ::openat(at, name.c_str(),
                  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/// Whether the regular file `name` in folder `at` starts like a shard that
/// fastllm-opt wrote for step `step`: the magic, then a header naming the
/// step. What an interrupted save leaves is removed only when it proves
/// itself ours this way.
bool provesShardOfStep(int at, const std::string &name, int64_t step) {
  InputOptions options;
  options.noFollow = true;
  options.atFolder = at;
  Expected<OpenedInput> in = openInput(name, name, options);
  if (!in || in->size < 16)
    return false;
  char magic[sizeof(kShardMagic)];
  uint64_t headerBytes = 0;
  if (!readAt(in->fd.get(), magic, sizeof(magic), 0) ||
      std::memcmp(magic, kShardMagic, sizeof(magic)) != 0 ||
      !readAt(in->fd.get(), &headerBytes, 8, 8) ||
      headerBytes > uint64_t(in->size) - 16 || headerBytes > (1u << 20))
    return false;
  std::string header(headerBytes, '\0');
  if (!readAt(in->fd.get(), header.data(), headerBytes, 16))
    return false;
  Expected<JsonValue> v = parseJson(header);
  if (!v)
    return false;
  const JsonValue *s = v->get("step");
  std::optional<uint64_t> n = s ? s->asUint64() : std::nullopt;
  return n && int64_t(*n) == step;
}

} // namespace

std::string fastllm::rt::checkStepFolders(const std::string &dir) {
  Expected<std::vector<int64_t>> steps = listCheckpointSteps(dir);
  if (!steps)
    return steps.status().message();
  for (int64_t step : *steps) {
    std::string folder = dir + "/" + stepFolderName(step);
    struct stat st;
    if (lstat(folder.c_str(), &st) != 0)
      continue; // gone since the listing
    if (!S_ISDIR(st.st_mode))
      return "'" + folder + "' is " +
             (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a folder") +
             "; checkpoints are read and written only in step folders "
             "fastllm-opt made: put the folder itself there, or move the "
             "entry away";
  }
  return "";
}

Expected<int64_t> fastllm::rt::removeOrphanTemporaries(const std::string &dir) {
  int64_t removed = 0;
  int top = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (top < 0)
    return errorf("cannot read checkpoint folder '%s': %s", dir.c_str(),
                  std::strerror(errno));
  InputFd topFd(top);
  // (folder descriptor, the targets whose temporaries it may hold)
  std::vector<std::pair<int, std::vector<std::string>>> folders;
  folders.push_back({top, {std::string(kLockFileName) + ".owner"}});
  std::vector<InputFd> stepFds;
  Expected<std::vector<int64_t>> steps = listCheckpointSteps(dir);
  if (!steps)
    return steps.status();
  for (int64_t step : *steps) {
    int fd = openFolderAt(top, stepFolderName(step));
    if (fd < 0)
      continue; // a symlink or not a folder: not ours to clean
    stepFds.emplace_back(fd);
    std::vector<std::string> targets = {"manifest.json"};
    for (const std::string &name : entriesAt(fd))
      if (name.size() > shardFileName(0).size() &&
          isShardName(name.substr(0, shardFileName(0).size())))
        targets.push_back(name.substr(0, shardFileName(0).size()));
    folders.push_back({fd, targets});
  }
  for (auto &[fd, targets] : folders) {
    for (const std::string &name : entriesAt(fd)) {
      if (!isTemporaryOf(name, targets))
        continue;
      struct stat st;
      if (fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(st.st_mode))
        continue; // only files OutputFile could have made
      if (unlinkat(fd, name.c_str(), 0) != 0)
        return errorf("cannot remove the orphan temporary '%s' in '%s': %s",
                      name.c_str(), dir.c_str(), std::strerror(errno));
      ++removed;
    }
    fsync(fd);
  }
  return removed;
}

Expected<bool> fastllm::rt::removeCheckpoint(const std::string &dir,
                                             int64_t step) {
  int top = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (top < 0)
    return errorf("cannot read checkpoint folder '%s': %s", dir.c_str(),
                  std::strerror(errno));
  InputFd topFd(top);
  const std::string stepName = stepFolderName(step);
  int fd = openFolderAt(top, stepName);
  if (fd < 0)
    return false; // a symlink or not a folder: never ours to remove
  InputFd folderFd(fd);
  std::string folder = dir + "/" + stepName;

  // What this run's kind wrote there: the manifest's own list when it has
  // one; without one (a save cut short), the shards that prove themselves.
  std::vector<std::string> ours;
  struct stat st;
  if (fstatat(fd, "manifest.json", &st, AT_SYMLINK_NOFOLLOW) == 0) {
    Expected<Manifest> m = readManifest(folder);
    if (!m || m->step != step)
      return false; // damaged: keep the evidence
    ours.push_back("manifest.json"); // first: a half-removed one is incomplete
    for (int64_t r = 0; r < m->dp; ++r)
      ours.push_back(shardFileName(int(r)));
  } else {
    for (const std::string &name : entriesAt(fd))
      if (isShardName(name) && provesShardOfStep(fd, name, step))
        ours.push_back(name);
  }
  std::vector<std::string> targets = ours;
  targets.push_back("manifest.json");
  for (const std::string &name : entriesAt(fd))
    if (isTemporaryOf(name, targets) &&
        fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(st.st_mode))
      ours.push_back(name);
  for (const std::string &name : ours) {
    if (unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT)
      return errorf("cannot remove '%s/%s': %s", folder.c_str(), name.c_str(),
                    std::strerror(errno));
    if (name == "manifest.json")
      fsync(fd);
  }
  // Whatever else is there (a user's file) stays, and so does the folder.
  if (unlinkat(top, stepName.c_str(), AT_REMOVEDIR) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST)
      return false;
    return errorf("cannot remove checkpoint folder '%s': %s", folder.c_str(),
                  std::strerror(errno));
  }
  fsync(top);
  return true;
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
    Expected<bool> gone = removeCheckpoint(dir, step);
    if (!gone)
      return gone.status();
    if (*gone)
      removed.push_back(step);
  }
  return removed;
}

//===----------------------------------------------------------------------===//
// The folder's lock
//===----------------------------------------------------------------------===//

const char *const fastllm::rt::kLockFileName = "train.lock";

std::string fastllm::rt::checkpointFolderEntry(const std::string &path,
                                               const std::string &dir) {
  struct stat top;
  bool haveDir = !dir.empty() && stat(dir.c_str(), &top) == 0;
  // A checkpoint folder: `dir`, or any folder that holds a lock file.
  auto isCheckpointFolder = [&](const std::string &folder) {
    struct stat st;
    if (stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return false;
    if (haveDir && st.st_dev == top.st_dev && st.st_ino == top.st_ino)
      return true;
    return lstat((folder + "/" + kLockFileName).c_str(), &st) == 0;
  };
  auto base = [](const std::string &p) {
    size_t slash = p.find_last_of('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
  };
  auto isStep = [](const std::string &name) {
    return name.size() > 5 && name.compare(0, 5, "step-") == 0;
  };
  std::string folder = folderOf(path), name = base(path);
  if ((name.compare(0, std::strlen(kLockFileName), kLockFileName) == 0 ||
       isStep(name)) &&
      isCheckpointFolder(folder))
    return "is the checkpoint folder's own '" + name + "'";
  if (isStep(base(folder)) && isCheckpointFolder(folderOf(folder)))
    return "is inside the checkpoint step folder '" + folder + "'";
  return "";
}

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
    // Who holds it, as it wrote there: a short regular file, or nothing
    // (never a wait on a FIFO or a read of something endless).
    std::string holder;
    InputOptions options;
    options.noFollow = true;
    options.maxBytes = 4096;
    if (Expected<std::string> text = readInputFile(owner, owner, options)) {
      holder = text->substr(0, 255);
      holder.erase(std::remove_if(holder.begin(), holder.end(),
                                  [](char c) { return c < ' ' || c > '~'; }),
                   holder.end());
      while (!holder.empty() && holder.back() == ' ')
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
