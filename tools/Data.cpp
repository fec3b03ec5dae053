//===- Data.cpp - `fastllm-opt data`: text in, token file out ------------===//
//
// Turns text into the token file the training binary reads
// (runtime/TokenFileFormat.h: a header, then the ids). Documents are whole
// files, or the string field of each line of JSON Lines files; each is
// encoded, and with --end-of-document followed by the id 256. The tokenizer
// is byte-level: ids 0-255 are the bytes (vocabulary 256, or 257 with the
// end-of-document id).
// `--val-fraction F` sends the last F of the token stream to a second file.
//
// Inputs are read twice (once to count, once to write, so the header is
// known before the first id and memory stays bounded by one line); outputs
// go through OutputFile (whole or not at all) and an existing file is
// replaced only with --overwrite.
//
//===----------------------------------------------------------------------===//

#include "tools/Compile.h"

#include "runtime/OutputFile.h"
#include "runtime/TokenFileFormat.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/LineIterator.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/WithColor.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

using namespace llvm;

namespace {

raw_ostream &dataError() {
  return WithColor::error(errs(), "fastllm-opt data");
}

/// The byte-level tokenizer: a byte is its own id; kEndOfDocument follows
/// every document when asked for.
constexpr uint16_t kEndOfDocument = 256;

/// Calls `document` with each document of `path`: the whole file, or with a
/// JSONL field, that field of every non-empty line. Reports and fails on a
/// file that cannot be read or a line without a string field.
bool forEachDocument(StringRef path, StringRef jsonlField,
                     const std::function<void(StringRef)> &document) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buffer =
      MemoryBuffer::getFile(path, /*IsText=*/false,
                            /*RequiresNullTerminator=*/false);
  if (!buffer) {
    dataError() << "cannot read '" << path
                << "': " << buffer.getError().message() << "\n";
    return false;
  }
  if (jsonlField.empty()) {
    document((*buffer)->getBuffer());
    return true;
  }
  for (line_iterator line(**buffer, /*SkipBlanks=*/true); !line.is_at_eof();
       ++line) {
    Expected<json::Value> value = json::parse(*line);
    if (!value) {
      dataError() << path << ":" << line.line_number()
                  << ": not JSON: " << toString(value.takeError()) << "\n";
      return false;
    }
    const json::Object *object = value->getAsObject();
    std::optional<StringRef> text =
        object ? object->getString(jsonlField) : std::nullopt;
    if (!text) {
      dataError() << path << ":" << line.line_number() << ": no string field '"
                  << jsonlField << "'\n";
      return false;
    }
    document(*text);
  }
  return true;
}

/// Appends the ids of one document: its bytes, then the end of document
/// when `endOfDocument`.
void encodeBytes(StringRef text, bool endOfDocument,
                 std::vector<uint16_t> &ids) {
  for (unsigned char c : text)
    ids.push_back(c);
  if (endOfDocument)
    ids.push_back(kEndOfDocument);
}

/// A token file being written: the header, then ids as they come.
class TokenWriter {
public:
  TokenWriter(std::string path, uint64_t vocabulary, uint64_t numTokens)
      : file(std::move(path)), vocabulary(vocabulary), expected(numTokens) {}

  bool open() {
    auto header = fastllm::rt::makeTokenFileHeader(sizeof(uint16_t), vocabulary,
                                                   expected);
    return file.open() && file.write(&header, sizeof(header));
  }
  bool write(const uint16_t *ids, size_t n) {
    written += n;
    return file.write(ids, n * sizeof(uint16_t));
  }
  bool commit() {
    if (written != expected) {
      dataError() << "'" << file.path() << "': the inputs changed while being "
                  << "read (" << written << " tokens, " << expected
                  << " counted)\n";
      return false;
    }
    return file.commit();
  }
  const std::string &error() const { return file.error(); }
  uint64_t tokens() const { return expected; }

private:
  fastllm::rt::OutputFile file;
  uint64_t vocabulary, expected, written = 0;
};

} // namespace

int mlir::fastllm::dataMain(int argc, char **argv) {
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
  cl::opt<bool> endOfDocument(
      "end-of-document",
      cl::desc("Follow each document with the id 256 (vocabulary 257; "
               "default: no separator, vocabulary 256)"),
      cl::cat(category));
  cl::opt<bool> overwrite(
      "overwrite", cl::desc("Replace output files that exist (default: stop)"),
      cl::cat(category));
  cl::HideUnrelatedOptions({&category, &getColorCategory()});
  cl::ParseCommandLineOptions(
      argc, argv,
      "fastllm-opt data: text to a token file for `train --data` (a header "
      "with the ids' width and the vocabulary, then the ids). Byte-level "
      "tokenizer: ids 0-255 are the bytes; with --end-of-document, 256 ends "
      "each document\n");

  if (!(valFraction >= 0 && valFraction < 1)) {
    dataError() << "--val-fraction must be in [0, 1), got " << valFraction
                << "\n";
    return 1;
  }
  if ((valFraction > 0) != !valOutput.empty()) {
    dataError() << "--val-fraction and --val-output go together\n";
    return 1;
  }
  std::vector<std::string> outputs = {output};
  if (!valOutput.empty())
    outputs.push_back(valOutput);
  for (const std::string &path : outputs) {
    if (std::string why = ::fastllm::rt::checkReplaceable(path); !why.empty()) {
      dataError() << why << "\n";
      return 1;
    }
    if (sys::fs::exists(path) && !overwrite) {
      dataError() << "'" << path
                  << "' exists; pass --overwrite to replace it\n";
      return 1;
    }
  }
  if (outputs.size() == 2 && outputs[0] == outputs[1]) {
    dataError() << "-o and --val-output are the same file\n";
    return 1;
  }

  // Pass 1: count.
  uint64_t total = 0;
  std::vector<uint16_t> ids;
  for (const std::string &input : inputs)
    if (!forEachDocument(input, jsonlField, [&](StringRef text) {
          total += text.size() + (endOfDocument ? 1 : 0);
        }))
      return 1;
  const uint64_t valTokens = uint64_t(double(total) * valFraction);
  const uint64_t vocabulary = endOfDocument ? 257 : 256;
  TokenWriter train(output, vocabulary, total - valTokens);
  std::optional<TokenWriter> val;
  if (!valOutput.empty())
    val.emplace(valOutput, vocabulary, valTokens);
  if (!train.open() || (val && !val->open())) {
    dataError() << (train.error().empty() ? val->error() : train.error())
                << "\n";
    return 1;
  }

  // Pass 2: encode and write, the first total - valTokens ids to -o.
  uint64_t position = 0;
  bool ok = true;
  for (const std::string &input : inputs) {
    ok = forEachDocument(
             input, jsonlField,
             [&](StringRef text) {
               ids.clear();
               encodeBytes(text, endOfDocument, ids);
               uint64_t toTrain = std::min<uint64_t>(
                   ids.size(),
                   position < train.tokens() ? train.tokens() - position : 0);
               if (toTrain && !train.write(ids.data(), toTrain))
                 ok = false;
               if (toTrain < ids.size() && val &&
                   !val->write(ids.data() + toTrain, ids.size() - toTrain))
                 ok = false;
               position += ids.size();
             }) &&
         ok;
    if (!ok)
      break;
  }
  if (!ok || !train.commit() || (val && !val->commit())) {
    std::string why = !train.error().empty() ? train.error()
                      : val                  ? val->error()
                                             : "";
    if (!why.empty())
      dataError() << why << "\n";
    return 1;
  }
  outs() << "wrote '" << output << "': " << train.tokens()
         << " tokens (u16 ids, vocabulary " << vocabulary << ")\n";
  if (val)
    outs() << "wrote '" << valOutput << "': " << val->tokens()
           << " tokens (the last " << format("%g", double(valFraction))
           << " of the stream)\n";
  return 0;
}
