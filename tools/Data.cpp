//===- Data.cpp - `fastllm-opt data`: text in, token file out ------------===//
//
// The fastllm-data executable, which `fastllm-opt data` runs: a process of
// its own because libsentencepiece carries its own copy of protobuf 3.14,
// which cannot share a process with the system's protobuf that fastllm-opt's
// ONNX importer links (the library's version check aborts at load).
//
// Turns text into the token file the training binary reads
// (runtime/TokenFileFormat.h: a header, then the ids). Documents are whole
// files, or the string field of each line of JSON Lines files; each is
// encoded, and with --end-of-document followed by an end-of-document id.
//
// Two tokenizers:
//  - bytes: ids 0-255 are the bytes (vocabulary 256, or 257 with the
//    end-of-document id 256);
//  - sentencepiece (Debian's libsentencepiece): a given .model, or one
//    trained here on the input text first. A document is encoded line by
//    line, as spm_encode does (a line's ids are `spm_encode
//    --output_format=id`'s for it; the newlines themselves get no id); a
//    line longer than kEncodeChunkBytes is encoded in pieces cut after a
//    space (or at a character boundary), which bounds the encoder's memory.
//    The vocabulary is the model's piece count and the end of document its
//    EOS id.
// Ids are u16 when the vocabulary fits (at most 65536), else u32.
// `--val-fraction F` sends the last F of the token stream to a second file.
//
// Inputs are read and encoded twice (once to count, once to write, so the
// header is known before the first id and memory stays bounded by one
// chunk); outputs go through OutputFile (whole or not at all) and an
// existing file is replaced only with --overwrite.
//
//===----------------------------------------------------------------------===//

#include "runtime/InputFile.h"
#include "runtime/Json.h"
#include "runtime/OutputFile.h"
#include "runtime/TokenFileFormat.h"
#include "tools/ToolProcess.h"
#include "tools/WholeNumberFlag.h"

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/LineIterator.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/WithColor.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdint>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <climits>
#include <cstring>
#include <csignal>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

// Exported by libsentencepiece (spm_train's --minloglevel sets it) but not
// declared in its installed headers: 1 keeps the trainer's warnings and
// drops its progress lines.
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
} // namespace sentencepiece::logging

using namespace llvm;

namespace {

raw_ostream &dataError() {
  return WithColor::error(errs(), "fastllm-opt data");
}

/// The byte-level tokenizer's end of document.
constexpr uint32_t kByteEndOfDocument = 256;
/// The longest piece of a line given to SentencePiece's encoder at once.
constexpr size_t kEncodeChunkBytes = 64 * 1024;
/// The longest training sentence: the library's default max_sentence_length
/// (it drops longer ones); longer lines are cut into pieces this long.
constexpr size_t kTrainSentenceBytes = 4192;
/// Ids are u16 up to this vocabulary, u32 above.
constexpr uint64_t kU16Vocabulary = 65536;
/// The largest vocabulary --sp-train-vocab-size trains (2^20 pieces).
constexpr int64_t kMaxTrainVocabulary = int64_t(1) << 20;

/// The longest JSON Lines line read: a document of 256 MiB in one line
/// (the parse holds about three times the line).
constexpr size_t kMaxJsonLineBytes = size_t(256) << 20;
/// The deepest nesting of objects and arrays in a JSON Lines line: the
/// parser recurses once per level.
constexpr int kMaxJsonDepth = 64;
/// The most values (arrays, objects, members, elements) in a JSON Lines
/// line: the parsed tree costs about 70 bytes a value, so a line of tiny
/// values ("[],[],...") would otherwise cost twenty times its length.
constexpr int64_t kMaxJsonValues = int64_t(1) << 20;

/// How deep `line`'s objects and arrays nest and how many values it holds
/// (the document, and each element or member of each container), found
/// without parsing and without recursion: a container holds one more
/// element than its commas unless it is empty.
struct JsonShape {
  int depth = 0;
  int64_t values = 1;
};
JsonShape jsonShape(StringRef line) {
  JsonShape shape;
  int depth = 0;
  bool inString = false, justOpened = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (justOpened && c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      justOpened = false;
      if (c != ']' && c != '}')
        ++shape.values;
    }
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      shape.depth = std::max(shape.depth, ++depth);
      justOpened = true;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',') {
      ++shape.values;
    }
  }
  return shape;
}

/// The input file being read, when it is mapped: the pages already read
/// are given back as the reading moves on, so that memory holds about the
/// part being read rather than the whole file (a mapped file's pages count
/// in the process's resident memory until the kernel reclaims them: a
/// 2 GiB input showed 2 GiB resident). The file is only read, so a page
/// given back is read again from the file should it be touched again.
struct MappedInput {
  const char *begin = nullptr, *end = nullptr, *released = nullptr;
};
MappedInput mappedInput;

/// Gives back the mapped input's pages before `p`, 16 MiB at a time.
void releaseReadUpTo(const char *p) {
  MappedInput &m = mappedInput;
  if (!m.begin || p < m.begin || p > m.end)
    return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const char *upto = reinterpret_cast<const char *>(
      reinterpret_cast<uintptr_t>(p) / page * page);
  if (upto <= m.released || size_t(upto - m.released) < (size_t(16) << 20))
    return;
  madvise(const_cast<char *>(m.released), size_t(upto - m.released),
          MADV_DONTNEED);
  m.released = upto;
}

/// Makes `buffer` the mapped input while it lives (nothing when it was
/// read into memory: those pages are the only copy).
class MappedInputScope {
public:
  explicit MappedInputScope(const MemoryBuffer &buffer) {
    if (buffer.getBufferKind() != MemoryBuffer::MemoryBuffer_MMap)
      return;
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const char *start = buffer.getBufferStart();
    mappedInput = {start, buffer.getBufferEnd(),
                   reinterpret_cast<const char *>(
                       reinterpret_cast<uintptr_t>(start) / page * page)};
  }
  ~MappedInputScope() { mappedInput = MappedInput(); }
  MappedInputScope(const MappedInputScope &) = delete;
  MappedInputScope &operator=(const MappedInputScope &) = delete;
};

/// Maps the user's file `path` for reading, never blocking on a FIFO nor
/// reading a device (runtime/InputFile.h); reports and returns null when it
/// is not a regular file or cannot be read.
/// What is being read (`input 'x.txt'`), for the SIGBUS handler: a mapped
/// file truncated while it is read raises SIGBUS at the next page.
char readingNow[PATH_MAX + 64];

/// Ends the process with a message naming the file being read, its
/// temporaries removed (async-signal-safe).
void onTruncatedInput(int) {
  mlir::fastllm::removeTemporariesNow();
  auto say = [](const char *text) {
    (void)!::write(2, text, std::strlen(text));
  };
  say("fastllm-opt data: error: ");
  say(readingNow[0] ? readingNow : "an input");
  say(" was truncated while it was read (a file must not change while "
      "fastllm-opt data reads it); nothing was written\n");
  ::_exit(1);
}

std::unique_ptr<MemoryBuffer> readUserFile(StringRef path, StringRef what,
                                           int64_t maxBytes = -1) {
  std::string described = (what + " '" + path + "'").str();
  described.resize(std::min(described.size(), sizeof(readingNow) - 1));
  std::memcpy(readingNow, described.c_str(), described.size() + 1);
  fastllm::rt::InputOptions options;
  options.maxBytes = maxBytes;
  fastllm::rt::Expected<fastllm::rt::OpenedInput> in = fastllm::rt::openInput(
      path.str(), what.str() + " '" + path.str() + "'", options);
  if (!in) {
    dataError() << in.status().message() << "\n";
    return nullptr;
  }
  ErrorOr<std::unique_ptr<MemoryBuffer>> buffer = MemoryBuffer::getOpenFile(
      sys::fs::convertFDToNativeFile(in->fd.get()), path, uint64_t(in->size),
      /*RequiresNullTerminator=*/false);
  if (!buffer) {
    dataError() << "cannot read " << what << " '" << path
                << "': " << buffer.getError().message() << "\n";
    return nullptr;
  }
  return std::move(*buffer);
}

/// Calls `document` with each document of `path`: the whole file, or with a
/// JSONL field, that field of every non-empty line. Reports and fails on a
/// file that cannot be read, a line without a string field, or a false
/// return from `document` (which reported why).
bool forEachDocument(StringRef path, StringRef jsonlField,
                     function_ref<bool(StringRef)> document) {
  std::unique_ptr<MemoryBuffer> buffer = readUserFile(path, "input");
  if (!buffer)
    return false;
  MappedInputScope mapped(*buffer);
  if (jsonlField.empty())
    return document(buffer->getBuffer());
  for (line_iterator line(*buffer, /*SkipBlanks=*/true); !line.is_at_eof();
       ++line) {
    if (line->size() > kMaxJsonLineBytes) {
      dataError() << path << ":" << line.line_number() << ": a line of "
                  << line->size() << " bytes; JSON Lines documents are read "
                  << "up to " << (kMaxJsonLineBytes >> 20) << " MiB a line\n";
      return false;
    }
    JsonShape shape = jsonShape(*line);
    if (shape.depth > kMaxJsonDepth) {
      dataError() << path << ":" << line.line_number() << ": JSON nested "
                  << shape.depth << " levels deep (at most " << kMaxJsonDepth
                  << " are read)\n";
      return false;
    }
    if (shape.values > kMaxJsonValues) {
      dataError() << path << ":" << line.line_number() << ": JSON with "
                  << shape.values << " values (at most " << kMaxJsonValues
                  << " are read in a line)\n";
      return false;
    }
    // A byte-order mark before the first line (a file saved as "UTF-8 with
    // BOM"): JSON allows a reader to pass over it.
    StringRef text = *line;
    if (text.data() == buffer->getBufferStart())
      text.consume_front("\xEF\xBB\xBF");
    // The runtime's parser: a key given twice and a lone UTF-16 surrogate
    // (\ud800), which no UTF-8 text can hold, are errors, not a silent pick
    // or a replacement character.
    fastllm::rt::Expected<fastllm::rt::JsonValue> value =
        fastllm::rt::parseJson(std::string_view(text.data(), text.size()));
    if (!value) {
      dataError() << path << ":" << line.line_number()
                  << ": not JSON: " << value.status().message() << "\n";
      return false;
    }
    const fastllm::rt::JsonValue *field =
        value->kind == fastllm::rt::JsonValue::Kind::Object
            ? value->get(jsonlField)
            : nullptr;
    if (!field || field->kind != fastllm::rt::JsonValue::Kind::String) {
      dataError() << path << ":" << line.line_number() << ": no string field '"
                  << jsonlField << "'\n";
      return false;
    }
    if (!document(field->text))
      return false;
    releaseReadUpTo(line->end());
  }
  return true;
}

/// Where to cut `text` (longer than `limit`) so the first part is at most
/// `limit` bytes: after its last space, else at a UTF-8 character boundary.
size_t cutPoint(StringRef text, size_t limit) {
  size_t space = text.substr(0, limit).rfind(' ');
  if (space != StringRef::npos)
    return space + 1;
  size_t cut = limit;
  while (cut > 0 && (uint8_t(text[cut]) & 0xC0) == 0x80)
    --cut;
  return cut > 0 ? cut : limit;
}

/// Calls `piece` with each line of `text` (without its newline), lines
/// longer than `limit` cut into pieces (cutPoint()); stops at a false return.
bool forEachLinePiece(StringRef text, size_t limit,
                      function_ref<bool(StringRef)> piece) {
  while (!text.empty()) {
    auto [line, rest] = text.split('\n');
    text = rest;
    while (line.size() > limit) {
      size_t cut = cutPoint(line, limit);
      if (!piece(line.substr(0, cut)))
        return false;
      line = line.substr(cut);
      releaseReadUpTo(line.data());
    }
    if (!piece(line))
      return false;
    releaseReadUpTo(line.end());
  }
  return true;
}

/// A tokenizer: byte-level, or a loaded SentencePiece model.
class Encoder {
public:
  /// The byte-level tokenizer.
  explicit Encoder(bool endOfDocument)
      : vocab(endOfDocument ? 257 : 256),
        eod(endOfDocument ? std::optional<uint32_t>(kByteEndOfDocument)
                          : std::nullopt) {}

  /// A SentencePiece model from its serialized bytes (`name` says where they
  /// came from); reports and returns nothing when they are not a model, or
  /// when `endOfDocument` is asked of a model without an EOS piece.
  static std::optional<Encoder> sentencePiece(StringRef bytes, StringRef name,
                                              bool endOfDocument) {
    auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
    sentencepiece::util::Status status = sp->LoadFromSerializedProto(
        std::string_view(bytes.data(), bytes.size()));
    if (!status.ok()) {
      dataError() << "'" << name
                  << "' is not a SentencePiece model: " << status.ToString()
                  << "\n";
      return std::nullopt;
    }
    Encoder e(false);
    e.vocab = sp->GetPieceSize();
    e.eod = std::nullopt;
    if (endOfDocument) {
      if (sp->eos_id() < 0) {
        dataError() << "--end-of-document: the SentencePiece model '" << name
                    << "' has no EOS piece (it was trained with eos_id=-1); "
                       "use a model with one, or drop the flag\n";
        return std::nullopt;
      }
      e.eod = uint32_t(sp->eos_id());
    }
    e.sp = std::move(sp);
    return e;
  }

  /// Every id is below this.
  uint64_t vocabulary() const { return vocab; }
  /// The id width in bytes: 2 when the vocabulary fits in u16.
  uint32_t bytesPerToken() const { return vocab <= kU16Vocabulary ? 2 : 4; }
  bool isBytes() const { return !sp; }
  std::optional<uint32_t> endOfDocument() const { return eod; }

  /// Calls `sink` with the ids of `document`, a chunk at a time, the end of
  /// document last when asked for. Reports and fails when the encoder or
  /// `sink` (which reported why) fails.
  bool encode(StringRef document, function_ref<bool(ArrayRef<uint32_t>)> sink) {
    std::vector<uint32_t> ids;
    bool ok = sp ? encodeLines(document, sink, ids)
                 : encodeBytes(document, sink, ids);
    if (!ok || !eod)
      return ok;
    return sink(ArrayRef<uint32_t>(*eod));
  }

private:
  bool encodeBytes(StringRef text, function_ref<bool(ArrayRef<uint32_t>)> sink,
                   std::vector<uint32_t> &ids) {
    for (size_t at = 0; at < text.size(); at += kEncodeChunkBytes) {
      StringRef chunk = text.substr(at, kEncodeChunkBytes);
      ids.assign(chunk.bytes_begin(), chunk.bytes_end());
      if (!sink(ids))
        return false;
      releaseReadUpTo(chunk.end());
    }
    return true;
  }

  bool encodeLines(StringRef text, function_ref<bool(ArrayRef<uint32_t>)> sink,
                   std::vector<uint32_t> &ids) {
    std::vector<int> pieceIds;
    return forEachLinePiece(text, kEncodeChunkBytes, [&](StringRef line) {
      if (line.empty())
        return true;
      sentencepiece::util::Status status =
          sp->Encode(std::string_view(line.data(), line.size()), &pieceIds);
      if (!status.ok()) {
        dataError() << "SentencePiece cannot encode a line: "
                    << status.ToString() << "\n";
        return false;
      }
      ids.assign(pieceIds.begin(), pieceIds.end());
      return sink(ids);
    });
  }

  uint64_t vocab;
  std::optional<uint32_t> eod;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp;
};

/// The training sentences: the input's lines (cut to kTrainSentenceBytes),
/// a uniform sample of at most `limit` of them when there are more (a fixed
/// seed: the same inputs give the same model).
class SentenceSample : public sentencepiece::SentenceIterator {
public:
  explicit SentenceSample(uint64_t limit) : limit(limit) {}

  void add(StringRef line) {
    if (line.empty())
      return;
    ++seen;
    if (sentences.size() < limit) {
      sentences.push_back(line.str());
      return;
    }
    uint64_t j = random() % seen;
    if (j < limit)
      sentences[j] = line.str();
  }
  uint64_t linesSeen() const { return seen; }
  size_t size() const { return sentences.size(); }

  bool done() const override { return next >= sentences.size(); }
  void Next() override { ++next; }
  const std::string &value() const override { return sentences[next]; }
  sentencepiece::util::Status status() const override { return {}; }

private:
  uint64_t limit, seen = 0;
  size_t next = 0;
  std::vector<std::string> sentences;
  std::mt19937_64 random{0x5eed};
};

/// What `--tokenizer sentencepiece` was given.
struct SentencePieceFlags {
  std::string model;       // --sp-model
  int64_t trainVocab = 0;  // --sp-train-vocab-size (0: not training)
  std::string modelOut;    // where the trained model goes
  std::string modelType;   // --sp-model-type
  uint64_t trainSentences; // --sp-train-sentences
};

/// Trains a SentencePiece model on the lines of `inputs` and returns its
/// bytes (written to `flags.modelOut` with the token files, all or none);
/// reports and returns nothing on failure.
std::optional<std::string> trainModel(ArrayRef<std::string> inputs,
                                      StringRef jsonlField,
                                      const SentencePieceFlags &flags) {
  SentenceSample sample(flags.trainSentences);
  for (const std::string &input : inputs)
    if (!forEachDocument(input, jsonlField, [&](StringRef text) {
          return forEachLinePiece(text, kTrainSentenceBytes, [&](StringRef s) {
            sample.add(s);
            return true;
          });
        }))
      return std::nullopt;
  if (sample.size() == 0) {
    dataError() << "no text to train a SentencePiece model on (every input "
                   "line is empty)\n";
    return std::nullopt;
  }
  outs() << "training a SentencePiece " << flags.modelType << " model ("
         << flags.trainVocab << " pieces) on " << sample.size() << " of "
         << sample.linesSeen() << " lines\n";
  outs().flush();
  sentencepiece::logging::SetMinLogLevel(1);
  std::string model;
  sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(
          {{"vocab_size", std::to_string(flags.trainVocab)},
           {"model_type", flags.modelType},
           {"max_sentence_length", std::to_string(kTrainSentenceBytes)}},
          &sample, &model);
  if (!status.ok()) {
    dataError() << "cannot train a SentencePiece model with "
                << flags.trainVocab
                << " pieces on this text: " << status.ToString() << "\n";
    return std::nullopt;
  }
  return model;
}

/// The tokenizer the flags ask for: bytes, a model read from --sp-model, or
/// one trained on the inputs. Reports and returns nothing on failure.
std::optional<Encoder> makeEncoder(bool sentencePiece,
                                   const SentencePieceFlags &flags,
                                   ArrayRef<std::string> inputs,
                                   StringRef jsonlField, bool endOfDocument,
                                   std::string *trained = nullptr) {
  if (!sentencePiece)
    return Encoder(endOfDocument);
  if (flags.trainVocab > 0) {
    std::optional<std::string> model = trainModel(inputs, jsonlField, flags);
    if (!model)
      return std::nullopt;
    if (trained)
      *trained = *model;
    return Encoder::sentencePiece(*model, flags.modelOut, endOfDocument);
  }
  // SentencePiece models are megabytes; 1 GiB is far beyond any.
  std::unique_ptr<MemoryBuffer> model =
      readUserFile(flags.model, "the SentencePiece model", int64_t(1) << 30);
  if (!model)
    return std::nullopt;
  return Encoder::sentencePiece(model->getBuffer(), flags.model,
                                endOfDocument);
}

/// A token file being written: the header, then ids as they come.
class TokenWriter {
public:
  TokenWriter(std::string path, uint64_t vocabulary, uint32_t bytesPerToken,
              uint64_t numTokens)
      : file(std::move(path)), vocabulary(vocabulary), width(bytesPerToken),
        expected(numTokens) {}

  bool open() {
    auto header = fastllm::rt::makeTokenFileHeader(width, vocabulary, expected);
    return file.open() && file.write(&header, sizeof(header));
  }
  /// Appends `ids` (each below the vocabulary) in the file's width.
  bool write(ArrayRef<uint32_t> ids) {
    written += ids.size();
    if (width == 4)
      return file.write(ids.data(), ids.size() * sizeof(uint32_t));
    narrow.assign(ids.begin(), ids.end());
    return file.write(narrow.data(), narrow.size() * sizeof(uint16_t));
  }
  /// Complete and synced, not yet in place (see commitTogether).
  bool finish() {
    if (written != expected) {
      dataError() << "'" << file.path() << "': the inputs changed while being "
                  << "read (" << written << " tokens, " << expected
                  << " counted)\n";
      return false;
    }
    return file.finishWithoutRename();
  }
  const std::string &temporary() const { return file.temporaryPath(); }
  const std::string &path() const { return file.path(); }
  const std::string &error() const { return file.error(); }
  uint64_t tokens() const { return expected; }

private:
  fastllm::rt::OutputFile file;
  uint64_t vocabulary;
  uint32_t width;
  uint64_t expected, written = 0;
  std::vector<uint16_t> narrow;
};

/// Reports and fails unless each of `outputs` may be written: replaceable,
/// absent or --overwrite, and all different.
bool checkOutputs(ArrayRef<std::string> outputs, bool overwrite) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string &path = outputs[i];
    if (std::string why = ::fastllm::rt::checkReplaceable(path); !why.empty()) {
      dataError() << why << "\n";
      return false;
    }
    if (sys::fs::exists(path) && !overwrite) {
      dataError() << "'" << path
                  << "' exists; pass --overwrite to replace it\n";
      return false;
    }
    for (size_t j = 0; j < i; ++j)
      if (sys::fs::equivalent(outputs[j], path) || outputs[j] == path) {
        dataError() << "'" << path << "' is named twice as an output\n";
        return false;
      }
  }
  return true;
}

/// Encodes `inputs` twice: counting, then writing the first part of the
/// stream to `output` and the last `valFraction` to `valOutput` (when not
/// empty). Reports and returns 1 on failure, else prints what it wrote.
/// Pass 1: how many ids `encoder` makes of `inputs` (bytes need no
/// encoding to be counted); nothing on failure (reported).
std::optional<uint64_t> countTokens(Encoder &encoder,
                                    ArrayRef<std::string> inputs,
                                    StringRef jsonlField) {
  uint64_t total = 0;
  for (const std::string &input : inputs)
    if (!forEachDocument(input, jsonlField, [&](StringRef text) {
          if (encoder.isBytes()) {
            total += text.size() + (encoder.endOfDocument() ? 1 : 0);
            return true;
          }
          return encoder.encode(text, [&](ArrayRef<uint32_t> ids) {
            total += ids.size();
            return true;
          });
        }))
      return std::nullopt;
  return total;
}

/// Writes the token files of `inputs` (and `trainedModel`, when given, to
/// `modelPath`): all put in place together at the end, or none.
int writeTokenFiles(Encoder &encoder, ArrayRef<std::string> inputs,
                    StringRef jsonlField, const std::string &output,
                    const std::string &valOutput, double valFraction,
                    std::optional<uint64_t> counted, bool overwrite,
                    const std::string *trainedModel = nullptr,
                    const std::string &modelPath = "") {
  if (!counted)
    counted = countTokens(encoder, inputs, jsonlField);
  if (!counted)
    return 1;
  const uint64_t total = *counted;
  const uint64_t valTokens = uint64_t(double(total) * valFraction);
  // An empty token file trains nothing: say so here, not at `train`.
  if (total == 0) {
    dataError() << "the input holds no text to tokenize; nothing written\n";
    return 1;
  }
  if (valFraction > 0 && valTokens == 0) {
    dataError() << "--val-fraction " << format("%g", valFraction) << " of "
                << total << " tokens is less than one token; nothing written "
                << "(raise it, or drop --val-output)\n";
    return 1;
  }
  const uint64_t vocabulary = encoder.vocabulary();
  TokenWriter train(output, vocabulary, encoder.bytesPerToken(),
                    total - valTokens);
  std::optional<TokenWriter> val;
  if (!valOutput.empty())
    val.emplace(valOutput, vocabulary, encoder.bytesPerToken(), valTokens);
  if (!train.open() || (val && !val->open())) {
    dataError() << (train.error().empty() ? val->error() : train.error())
                << "\n";
    return 1;
  }

  // Pass 2: encode and write, the first total - valTokens ids to -o.
  uint64_t position = 0;
  auto sink = [&](ArrayRef<uint32_t> ids) {
    uint64_t toTrain = std::min<uint64_t>(
        ids.size(), position < train.tokens() ? train.tokens() - position : 0);
    position += ids.size();
    if (toTrain && !train.write(ids.take_front(toTrain)))
      return false;
    return toTrain == ids.size() || !val || val->write(ids.drop_front(toTrain));
  };
  bool ok = true;
  for (const std::string &input : inputs)
    if (!(ok = forEachDocument(input, jsonlField, [&](StringRef text) {
            return encoder.encode(text, sink);
          })))
      break;
  std::optional<fastllm::rt::OutputFile> model;
  if (trainedModel) {
    model.emplace(modelPath);
    if (!model->open() || !model->write(*trainedModel))
      ok = false;
  }
  auto removeAll = [&] {
    ::unlink(train.temporary().c_str());
    if (val)
      ::unlink(val->temporary().c_str());
    if (model)
      ::unlink(model->temporaryPath().c_str());
  };
  if (!ok || !train.finish() || (val && !val->finish()) ||
      (model && !model->finishWithoutRename())) {
    std::string why = !train.error().empty()           ? train.error()
                      : val && !val->error().empty()   ? val->error()
                      : model && !model->error().empty() ? model->error()
                                                         : "";
    if (!why.empty())
      dataError() << why << "\n";
    removeAll();
    return 1;
  }
  // All complete before any is put in place: a run interrupted while the
  // files are synced leaves none (not a training file without its
  // validation file, nor a trained model without its tokens).
  std::vector<std::pair<std::string, std::string>> renames = {
      {train.temporary(), train.path()}};
  if (val)
    renames.push_back({val->temporary(), val->path()});
  if (model)
    renames.push_back({model->temporaryPath(), modelPath});
  std::string why;
  for (const auto &[from, to] : renames)
    if (why.empty())
      why = fastllm::rt::renameInto(from, to, overwrite);
  if (!why.empty()) {
    dataError() << why << "\n";
    removeAll();
    return 1;
  }
  if (model)
    outs() << "wrote '" << modelPath << "': the SentencePiece model\n";
  outs() << "wrote '" << output << "': " << train.tokens() << " tokens ("
         << (encoder.bytesPerToken() == 2 ? "u16" : "u32")
         << " ids, vocabulary " << vocabulary << ")\n";
  if (val)
    outs() << "wrote '" << valOutput << "': " << val->tokens()
           << " tokens (the last " << format("%g", valFraction)
           << " of the stream)\n";
  return 0;
}

enum class TokenizerKind { Bytes, SentencePiece };

/// Why the SentencePiece flags do not go together ("" when they do); sets
/// the trained model's path when the flags leave it to `output`'s.
std::string checkSentencePieceFlags(bool sentencePiece, SentencePieceFlags &sp,
                                    StringRef output, bool training) {
  if (!sentencePiece)
    return sp.model.empty() && !training && sp.modelOut.empty()
               ? ""
               : "--sp-model, --sp-train-vocab-size and --sp-model-out need "
                 "--tokenizer sentencepiece";
  if (sp.model.empty() == !training)
    return "--tokenizer sentencepiece takes one of --sp-model FILE (encode "
           "with that model) and --sp-train-vocab-size N (train one)";
  if (!training)
    return sp.modelOut.empty() ? ""
                               : "--sp-model-out names where a trained model "
                                 "goes; it needs --sp-train-vocab-size";
  // The trainer's own arithmetic overflows (and then loops) near 2^31;
  // the largest vocabularies in use are a few hundred thousand pieces.
  if (sp.trainVocab < 1 || sp.trainVocab > kMaxTrainVocabulary)
    return "--sp-train-vocab-size must be in [1, " +
           std::to_string(kMaxTrainVocabulary) + "], got " +
           std::to_string(sp.trainVocab);
  if (sp.modelType != "unigram" && sp.modelType != "bpe")
    return "--sp-model-type must be unigram or bpe, got '" + sp.modelType + "'";
  if (sp.trainSentences < 1)
    return "--sp-train-sentences must be at least 1";
  if (sp.modelOut.empty()) {
    SmallString<256> path(output);
    sys::path::replace_extension(path, ".model");
    sp.modelOut = std::string(path);
    if (sp.modelOut == output)
      return "the trained model goes beside -o with the extension '.model' "
             "by default, which is -o itself ('" +
             output.str() + "'): name it with --sp-model-out FILE";
  }
  return "";
}

} // namespace

/// Loads the SentencePiece model and counts the ids of `inputs` in a child
/// process. The count; nothing when the child failed and said why (an
/// unreadable model, say); or an outer nothing when it crashed, which is
/// reported here.
static std::optional<std::optional<uint64_t>>
countBehindWall(bool sentencePiece, const SentencePieceFlags &sp,
                ArrayRef<std::string> inputs, StringRef jsonlField,
                bool endOfDocument) {
  int fds[2];
  if (::pipe(fds) != 0) {
    dataError() << "cannot create a pipe: " << std::strerror(errno) << "\n";
    return std::nullopt;
  }
  errs().flush();
  outs().flush();
  const pid_t parent = ::getpid();
  pid_t child = ::fork();
  if (child < 0) {
    dataError() << "cannot start a process: " << std::strerror(errno) << "\n";
    return std::nullopt;
  }
  if (child == 0) {
    ::close(fds[0]);
    // Ends with its parent (killed, the parent waits for nothing).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent)
      ::_exit(1);
    // A crash is the parent's to report: no stack dump from here.
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP})
      ::signal(sig, SIG_DFL);
    std::optional<Encoder> encoder =
        makeEncoder(sentencePiece, sp, inputs, jsonlField, endOfDocument);
    std::optional<uint64_t> total =
        encoder ? countTokens(*encoder, inputs, jsonlField) : std::nullopt;
    errs().flush();
    if (!total || ::write(fds[1], &*total, sizeof(*total)) != sizeof(*total))
      ::_exit(1);
    ::_exit(0);
  }
  ::close(fds[1]);
  uint64_t total = 0;
  ssize_t got = ::read(fds[0], &total, sizeof(total));
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    dataError() << "the SentencePiece library crashed ("
                << strsignal(WTERMSIG(status)) << ") reading the model '"
                << sp.model << "' or encoding with it: the model is damaged "
                << "or was not written by SentencePiece; nothing was written\n";
    return std::nullopt;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      got != ssize_t(sizeof(total)))
    return std::optional<uint64_t>(); // the child said why
  return std::optional<uint64_t>(total);
}

/// `fastllm-opt data`'s flags, checks and work; the exit code.
static int dataMain(int argc, char **argv) {
  cl::OptionCategory category("fastllm-opt data options");
  cl::list<std::string> inputs(cl::Positional, cl::OneOrMore,
                               cl::desc("<text files | JSONL files>"),
                               cl::cat(category));
  cl::opt<std::string> output("o", cl::Required,
                              cl::desc("The token file to write"),
                              cl::value_desc("file"), cl::cat(category));
  cl::opt<std::string> jsonlField(
      "jsonl-field",
      cl::desc("The inputs are JSON Lines: each line's string field NAME is "
               "a document (default: each input file is one document)"),
      cl::value_desc("NAME"), cl::cat(category));
  cl::opt<double> valFraction(
      "val-fraction",
      cl::desc("Write the last fraction F of the tokens to --val-output "
               "instead (0 <= F < 1; default 0)"),
      cl::value_desc("F"), cl::init(0.0), cl::cat(category));
  cl::opt<std::string> valOutput("val-output",
                                 cl::desc("The validation token file"),
                                 cl::value_desc("file"), cl::cat(category));
  cl::opt<TokenizerKind> tokenizer(
      "tokenizer", cl::desc("The tokenizer (default: bytes)"),
      cl::values(
          clEnumValN(TokenizerKind::Bytes, "bytes", "ids 0-255 are the bytes"),
          clEnumValN(TokenizerKind::SentencePiece, "sentencepiece",
                     "a SentencePiece model: --sp-model, or one "
                     "trained here with --sp-train-vocab-size")),
      cl::init(TokenizerKind::Bytes), cl::cat(category));
  cl::opt<std::string> spModel(
      "sp-model", cl::desc("The SentencePiece model (.model) to encode with"),
      cl::value_desc("file"), cl::cat(category));
  mlir::fastllm::Flag<int64_t> spTrainVocab(
      "sp-train-vocab-size",
      cl::desc("Train a SentencePiece model of N pieces (1 to 1048576) on "
               "the inputs' lines first, and encode with it"),
      cl::value_desc("N"), cl::init(0), cl::cat(category));
  cl::opt<std::string> spModelOut(
      "sp-model-out",
      cl::desc("Where the trained model goes (default: -o's path with the "
               "extension .model)"),
      cl::value_desc("file"), cl::cat(category));
  cl::opt<std::string> spModelType(
      "sp-model-type",
      cl::desc("The trained model's algorithm: unigram or bpe (default: "
               "unigram)"),
      cl::value_desc("type"), cl::init("unigram"), cl::cat(category));
  mlir::fastllm::Flag<uint64_t> spTrainSentences(
      "sp-train-sentences",
      cl::desc("Train on at most N lines, a uniform sample when the inputs "
               "have more; lines are cut to 4192 bytes, so this bounds the "
               "text held in memory (default: 1000000)"),
      cl::value_desc("N"), cl::init(1000000), cl::cat(category));
  cl::opt<bool> endOfDocument(
      "end-of-document",
      cl::desc("Follow each document with an end-of-document id: 256 with "
               "bytes (vocabulary 257), the model's EOS id with "
               "sentencepiece (refused if it has none); default: no "
               "separator"),
      cl::cat(category));
  cl::opt<bool> overwrite(
      "overwrite",
      cl::desc("Replace output files (and a trained model) that exist "
               "(default: stop)"),
      cl::cat(category));
  cl::HideUnrelatedOptions({&category, &getColorCategory()});
  cl::ParseCommandLineOptions(
      argc, argv,
      "fastllm-opt data: text to a token file for `train --data` (a header "
      "with the ids' width and the vocabulary, then the ids: u16 up to a "
      "vocabulary of 65536, else u32). Byte-level tokenizer: ids 0-255 are "
      "the bytes; with --end-of-document, 256 ends each document. "
      "SentencePiece: each line of a document is encoded as spm_encode "
      "encodes it\n");

  if (!(valFraction >= 0 && valFraction < 1)) {
    dataError() << "--val-fraction must be in [0, 1), got " << valFraction
                << "\n";
    return 1;
  }
  if ((valFraction > 0) != !valOutput.empty()) {
    dataError() << (valOutput.empty()
                        ? "--val-fraction needs --val-output FILE"
                        : "--val-output needs a --val-fraction above 0")
                << "\n";
    return 1;
  }
  if (jsonlField.getNumOccurrences() && jsonlField.empty()) {
    dataError() << "--jsonl-field: an empty field name\n";
    return 1;
  }
  bool sentencePiece = tokenizer == TokenizerKind::SentencePiece;
  SentencePieceFlags sp{spModel, spTrainVocab, spModelOut, spModelType,
                        spTrainSentences};
  if (std::string why = checkSentencePieceFlags(
          sentencePiece, sp, output, spTrainVocab.getNumOccurrences());
      !why.empty()) {
    dataError() << why << "\n";
    return 1;
  }
  std::vector<std::string> outputs = {output};
  if (!valOutput.empty())
    outputs.push_back(valOutput);
  if (sp.trainVocab > 0)
    outputs.push_back(sp.modelOut);
  if (!checkOutputs(outputs, overwrite))
    return 1;
  // No output may be an input (--overwrite or not) or another output.
  std::vector<fastllm::rt::NamedPath> files;
  for (const std::string &input : inputs)
    files.push_back({"input", input});
  if (!spModel.empty())
    files.push_back({"--sp-model", spModel});
  files.push_back({"-o", output, true});
  if (!valOutput.empty())
    files.push_back({"--val-output", valOutput, true});
  if (sp.trainVocab > 0)
    files.push_back({"--sp-model-out", sp.modelOut, true});
  if (std::string clash = fastllm::rt::distinctPaths(files); !clash.empty()) {
    dataError() << clash << "\n";
    return 1;
  }
  // An output's folder is created as compile -o creates its own.
  for (const std::string &out : outputs) {
    StringRef folder = sys::path::parent_path(out);
    if (folder.empty())
      continue;
    if (std::error_code ec = sys::fs::create_directories(folder)) {
      dataError() << "cannot create the folder '" << folder << "' of '" << out
                  << "': " << ec.message() << "\n";
      return 1;
    }
  }

  // A SentencePiece model from the user is read by a library that trusts
  // it (a damaged trie crashes it): the model's load and the counting pass
  // run in a child process first, whose crash is reported here before any
  // output exists. The same code on the same bytes then runs here.
  std::optional<uint64_t> counted;
  if (sentencePiece && sp.trainVocab == 0) {
    std::optional<std::optional<uint64_t>> walled =
        countBehindWall(sentencePiece, sp, inputs, jsonlField, endOfDocument);
    if (!walled || !*walled)
      return 1;
    counted = **walled;
  }
  std::string trained;
  std::optional<Encoder> encoder = makeEncoder(sentencePiece, sp, inputs,
                                               jsonlField, endOfDocument,
                                               &trained);
  if (!encoder)
    return 1;
  return writeTokenFiles(*encoder, inputs, jsonlField, output, valOutput,
                         valFraction, counted, overwrite,
                         sp.trainVocab > 0 ? &trained : nullptr, sp.modelOut);
}

/// fastllm-data: `fastllm-opt data` runs it with its own arguments (argv[0]
/// "fastllm-opt data"), see tools/DataLauncher.cpp.
int main(int argc, char **argv) {
  // (A closed stdout would be taken by the next file opened, the output.)
  mlir::fastllm::setUpToolProcess();
  InitLLVM y(argc, argv);
  mlir::fastllm::setUpToolSignals();
  struct sigaction bus = {};
  bus.sa_handler = onTruncatedInput;
  ::sigaction(SIGBUS, &bus, nullptr);
  return dataMain(argc, argv);
}
