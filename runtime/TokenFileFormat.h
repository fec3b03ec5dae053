//===- TokenFileFormat.h - the header of a token file -----------*- C++ -*-===//
//
// A token file is the training data: token ids, little-endian, one after
// another. `fastllm-opt data` writes it with a 32-byte header first, so that
// the training binary knows the ids' width and the tokenizer's vocabulary
// and refuses a file that does not fit the model, instead of training on
// u32 ids read as u16 pairs. A file without the header (nanoGPT's train.bin:
// raw u16 ids) is still read, its width given by --data-dtype.
//
//   offset  size  field
//   0       8     magic "FLLMTOK" and a NUL
//   8       4     version (1)
//   12      4     bytes per token: 2 (u16) or 4 (u32)
//   16      8     vocabulary size: every id is below it
//   24      8     number of tokens that follow
//
// Plain C++17: the runtime reads it, the compiler's `data` subcommand
// writes it.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_TOKENFILEFORMAT_H
#define FASTLLM_RUNTIME_TOKENFILEFORMAT_H

#include <cstdint>
#include <cstring>

namespace fastllm::rt {

struct TokenFileHeader {
  char magic[8];
  uint32_t version;
  uint32_t bytesPerToken;
  uint64_t vocabSize;
  uint64_t numTokens;
};
static_assert(sizeof(TokenFileHeader) == 32, "the header is 32 bytes");

constexpr char kTokenFileMagic[8] = {'F', 'L', 'L', 'M', 'T', 'O', 'K', '\0'};
constexpr uint32_t kTokenFileVersion = 1;

/// A header for `numTokens` ids of `bytesPerToken` bytes below `vocabSize`.
inline TokenFileHeader makeTokenFileHeader(uint32_t bytesPerToken,
                                           uint64_t vocabSize,
                                           uint64_t numTokens) {
  TokenFileHeader h;
  std::memcpy(h.magic, kTokenFileMagic, sizeof(h.magic));
  h.version = kTokenFileVersion;
  h.bytesPerToken = bytesPerToken;
  h.vocabSize = vocabSize;
  h.numTokens = numTokens;
  return h;
}

/// Whether the file's first bytes `bytes` (at least 8) start a header.
inline bool hasTokenFileMagic(const void *bytes) {
  return std::memcmp(bytes, kTokenFileMagic, sizeof(kTokenFileMagic)) == 0;
}

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_TOKENFILEFORMAT_H
