//===- Data.cpp - token file and samplers ---------------------------------===//

#include "runtime/Data.h"
#include "runtime/InputFile.h"
#include "runtime/TokenFileFormat.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token files are little-endian and are read in place");

namespace {

/// The position of the first id >= limit, or n when there is none. A min
/// reduction keeps the answer the first one whatever the threads' order.
template <typename T>
int64_t firstIdAtLeast(const T *ids, int64_t n, int64_t limit) {
  int64_t first = n;
#pragma omp parallel for reduction(min : first)
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(ids[i]) >= limit && i < first)
      first = i;
  return first;
}

template <typename T>
void widen(const T *ids, int64_t begin, int64_t count, int64_t *out) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = ids[begin + i];
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

} // namespace

namespace {

/// Token files are mapped, and a file truncated while a run reads it turns
/// the next read past its new end into SIGBUS. The handler reports which
/// file, instead of a crash, for the mappings registered here (a fixed
/// table written before the handler can see it; at most a few files).
struct GuardedMapping {
  std::atomic<const char *> begin{nullptr};
  std::atomic<size_t> bytes{0};
  char message[512] = {};
};
GuardedMapping guarded[4];
std::atomic<int> guardedCount{0};

void onBusError(int sig, siginfo_t *info, void *) {
  const char *at = static_cast<const char *>(info->si_addr);
  for (int i = 0; i < guardedCount.load() && i < 4; ++i) {
    const char *begin = guarded[i].begin.load();
    if (begin && at >= begin && at < begin + guarded[i].bytes.load()) {
      ssize_t ignored = ::write(2, guarded[i].message,
                                std::strlen(guarded[i].message));
      (void)ignored;
      _exit(1);
    }
  }
  // Not a token file: the default action, as if no handler were here.
  signal(sig, SIG_DFL);
  raise(sig);
}

/// Reports a SIGBUS in [base, base + bytes) as the truncation of `path`.
void guardMapping(const void *base, size_t bytes, const std::string &path) {
  int slot = guardedCount.load();
  if (slot >= 4)
    return;
  std::snprintf(guarded[slot].message, sizeof(guarded[slot].message),
                "train: error: data file '%s' was truncated while the run "
                "read it (it is mapped: a data file must not change during "
                "a run)\n",
                path.c_str());
  guarded[slot].bytes.store(bytes);
  guarded[slot].begin.store(static_cast<const char *>(base));
  guardedCount.store(slot + 1);
  if (slot == 0) {
    struct sigaction action = {};
    action.sa_sigaction = onBusError;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, nullptr);
  }
}

const char *dtypeName(TokenDtype dtype) {
  return dtype == TokenDtype::U16 ? "u16" : "u32";
}
} // namespace

Expected<TokenFile> TokenFile::open(const std::string &path, TokenDtype dtype,
                                    int64_t seqLen, int64_t vocabSize,
                                    bool dtypeGiven) {
  const char *file = path.c_str();
  // Never blocks (a FIFO), never maps a device: a regular file, or an error.
  Expected<OpenedInput> in = openInput(path, "data file '" + path + "'");
  if (!in)
    return notFound(in.status())
               ? errorf("cannot open data file '%s': it does not exist", file)
               : in.status();
  const int64_t size = in->size;
  void *base = nullptr;
  if (size > 0) {
    base = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, in->fd.get(), 0);
    if (base == MAP_FAILED)
      return errorf("cannot map data file '%s': %s", file,
                    std::strerror(errno));
    guardMapping(base, size_t(size), path);
  }
  TokenFile tokens; // unmaps on every return below
  tokens.base = base;
  tokens.bytes = size;

  // A header (`fastllm-opt data`) says the width and the vocabulary; a raw
  // file is all ids, as wide as --data-dtype says.
  int64_t headerBytes = 0, headerVocab = vocabSize;
  if (size >= int64_t(sizeof(TokenFileHeader)) &&
      hasTokenFileMagic(base)) {
    TokenFileHeader h;
    std::memcpy(&h, base, sizeof(h));
    headerBytes = sizeof(h);
    if (h.version != kTokenFileVersion)
      return errorf("data file '%s' has token file version %u; this runtime "
                    "reads version %u",
                    file, h.version, kTokenFileVersion);
    if (h.bytesPerToken != 2 && h.bytesPerToken != 4)
      return errorf("data file '%s': its header says %u bytes per token (2 or "
                    "4 expected)",
                    file, h.bytesPerToken);
    TokenDtype fileDtype =
        h.bytesPerToken == 2 ? TokenDtype::U16 : TokenDtype::U32;
    if (dtypeGiven && fileDtype != dtype)
      return errorf("data file '%s' holds %s ids (its header says so) but "
                    "--data-dtype is %s; drop the flag",
                    file, dtypeName(fileDtype), dtypeName(dtype));
    dtype = fileDtype;
    if (h.numTokens > uint64_t(size) / h.bytesPerToken ||
        int64_t(h.numTokens * h.bytesPerToken) != size - headerBytes)
      return errorf("data file '%s' has %lld bytes of ids; its header says "
                    "%llu tokens of %u bytes (a truncated or appended file?)",
                    file, (long long)(size - headerBytes),
                    (unsigned long long)h.numTokens, h.bytesPerToken);
    if (h.vocabSize > uint64_t(vocabSize))
      return errorf("data file '%s' was tokenized with a vocabulary of %llu; "
                    "the model's is %lld (another tokenizer?)",
                    file, (unsigned long long)h.vocabSize,
                    (long long)vocabSize);
    if (h.vocabSize == 0)
      return errorf("data file '%s': its header says a vocabulary of 0 (a "
                    "damaged header)",
                    file);
    // Ids must be below the header's own vocabulary, not only the model's.
    headerVocab = int64_t(h.vocabSize);
  }
  int64_t width = dtype == TokenDtype::U16 ? 2 : 4;
  int64_t idBytes = size - headerBytes;
  if (idBytes % width != 0)
    return errorf("data file '%s' has %lld bytes, not a multiple of %lld "
                  "(--data-dtype %s)",
                  file, (long long)idBytes, (long long)width, dtypeName(dtype));
  int64_t n = idBytes / width;
  if (n < seqLen + 2)
    return errorf("data file '%s' has %lld tokens; seq-len %lld needs at "
                  "least %lld",
                  file, (long long)n, (long long)seqLen,
                  (long long)(seqLen + 2));
  tokens.ids = static_cast<const char *>(base) + headerBytes;
  tokens.dtype = dtype;
  tokens.numTokens = n;
  const int64_t limit = std::min(vocabSize, headerVocab);
  int64_t bad = dtype == TokenDtype::U16
                    ? firstIdAtLeast(static_cast<const uint16_t *>(tokens.ids),
                                     n, limit)
                    : firstIdAtLeast(static_cast<const uint32_t *>(tokens.ids),
                                     n, limit);
  if (bad < n) {
    int64_t id;
    tokens.read(bad, 1, &id);
    return errorf("data file '%s': token %lld at position %lld is not below "
                  "the vocabulary size %lld%s%s",
                  file, (long long)id, (long long)bad, (long long)limit,
                  limit < vocabSize ? " (its header's)" : "",
                  headerBytes                ? ""
                  : dtype == TokenDtype::U16 ? " (is --data-dtype u16 right?)"
                                             : " (is --data-dtype u32 right?)");
  }
  return tokens;
}

TokenFile::TokenFile(TokenFile &&other) noexcept { *this = std::move(other); }

TokenFile &TokenFile::operator=(TokenFile &&other) noexcept {
  std::swap(base, other.base);
  std::swap(ids, other.ids);
  std::swap(bytes, other.bytes);
  std::swap(dtype, other.dtype);
  std::swap(numTokens, other.numTokens);
  return *this;
}

TokenFile::~TokenFile() {
  if (!base)
    return;
  for (GuardedMapping &g : guarded)
    if (g.begin.load() == base)
      g.begin.store(nullptr); // no longer ours to report
  munmap(const_cast<void *>(base), bytes);
}

void TokenFile::read(int64_t begin, int64_t count, int64_t *out) const {
  if (dtype == TokenDtype::U16)
    widen(static_cast<const uint16_t *>(ids), begin, count, out);
  else
    widen(static_cast<const uint32_t *>(ids), begin, count, out);
}

Sampler::Sampler(SamplerKind kind, uint64_t seed, int64_t numTokens,
                 int64_t seqLen, int64_t batchSize, int64_t gradAccum,
                 int64_t dp)
    : kind(kind), seed(seed), modulus(numTokens - seqLen - 1), seq(seqLen),
      batch(batchSize), gradAccum(gradAccum), dp(dp) {
  assert(modulus >= 1 && "TokenFile::open guarantees seqLen + 2 tokens");
}

int64_t Sampler::offset(int64_t step, int64_t sample) const {
  using u128 = unsigned __int128;
  if (kind == SamplerKind::Sequential) {
    // 128 bits keep (s * G + i) * T exact for any step count.
    u128 start = (u128(step) * globalBatch() + sample) * u128(seq);
    return static_cast<int64_t>(start % u128(modulus));
  }
  uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(step)) ^
                          uint64_t(sample));
  // The high half of h * M is uniform over [0, M) up to a bias of M / 2^64.
  return static_cast<int64_t>((u128(h) * u128(modulus)) >> 64);
}

void fastllm::rt::fillMicroBatch(const TokenFile &data, const Sampler &sampler,
                                 int64_t step, int64_t rank, int64_t micro,
                                 int64_t *tokens, int64_t *targets) {
  int64_t seqLen = sampler.seqLen();
  for (int64_t row = 0; row < sampler.batchSize(); ++row) {
    int64_t start = sampler.offset(step, sampler.sampleIndex(rank, micro, row));
    data.read(start, seqLen, tokens + row * seqLen);
    data.read(start + 1, seqLen, targets + row * seqLen);
  }
}
