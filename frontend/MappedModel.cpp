//===- MappedModel.cpp - a binary model read through a mapping --*- C++ -*-===//
//
// Protobuf parses a `bytes` field into a string of its own: a model whose
// weights are inside the .onnx (PyTorch's default below 2 GB) would be read
// into memory whole, page by page, and copied again for strings over the
// parser's chunk size (GPT-2 124M: 653 MB; the import was 5.5 s, almost all
// of it copying).
//
// Instead the file is mapped read-only and its wire format walked just
// deep enough to find the graph's initializers (ModelProto.graph = 7,
// GraphProto.initializer = 5, TensorProto.raw_data = 9). The parser gets a
// copy of the file without the raw_data of large initializers (the
// "skeleton": the graph, names, dims and small tensors, a few MB), and each
// such initializer's bytes are a range of the mapping. Everything else is
// copied through unchanged, so the parsed model is the one protobuf would
// have given, minus those fields; the walker handles exactly the wire
// format protobuf accepts for these messages and otherwise declines
// (groups, a bad varint or length), and the caller parses the file as
// before, with the same diagnostics.
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"

using namespace mlir;
using namespace mlir::fastllm;

namespace {

/// Raw data shorter than this stays in the skeleton (biases, norms, shape
/// constants): mapping them would save nothing.
constexpr uint64_t kMinMappedBytes = 16 * 1024;

enum class Message { Model, Graph, Tensor };

/// Copies a ModelProto field by field; its graph and the graph's
/// initializers are walked (three levels: protobuf allows 100), everything
/// else is copied whole.
class Walker {
public:
  /// Appends message `kind` in [begin, end) to `out`, without the large
  /// raw_data of initializers; false when the bytes are not wire format
  /// this walker reads.
  bool walk(const char *p, const char *end, Message kind, std::string &out,
            int64_t tensorIndex = -1);

  std::vector<std::optional<ArrayRef<char>>> rawData;

private:
  static bool varint(const char *&p, const char *end, uint64_t &value) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end)
        return false;
      uint8_t byte = uint8_t(*p++);
      value |= uint64_t(byte & 0x7F) << shift;
      if (!(byte & 0x80))
        return true;
    }
    return false;
  }
  static void putVarint(std::string &out, uint64_t value) {
    while (value >= 0x80) {
      out += char(uint8_t(value) | 0x80);
      value >>= 7;
    }
    out += char(value);
  }
};

bool Walker::walk(const char *p, const char *end, Message kind,
                  std::string &out, int64_t tensorIndex) {
  while (p < end) {
    const char *fieldStart = p;
    uint64_t tag;
    if (!varint(p, end, tag))
      return false;
    uint64_t field = tag >> 3, wireType = tag & 7;
    if (field == 0)
      return false;
    uint64_t length = 0;
    switch (wireType) {
    case 0: // varint
      if (!varint(p, end, length))
        return false;
      out.append(fieldStart, p);
      continue;
    case 1: // 64-bit
    case 5: // 32-bit
      length = wireType == 1 ? 8 : 4;
      if (uint64_t(end - p) < length)
        return false;
      p += length;
      out.append(fieldStart, p);
      continue;
    case 2: // length-delimited
      break;
    default: // groups, or not protobuf
      return false;
    }
    const char *tagEnd = p;
    if (!varint(p, end, length) || length > uint64_t(end - p))
      return false;
    const char *payload = p, *payloadEnd = p + length;
    p = payloadEnd;

    Message inner;
    if (kind == Message::Model && field == 7)
      inner = Message::Graph;
    else if (kind == Message::Graph && field == 5)
      inner = Message::Tensor;
    else {
      if (kind == Message::Tensor && field == 9) {
        // raw_data: the last occurrence wins, as in protobuf.
        if (length >= kMinMappedBytes) {
          rawData[tensorIndex] = ArrayRef<char>(payload, length);
          continue;
        }
        rawData[tensorIndex].reset();
      }
      out.append(fieldStart, payloadEnd);
      continue;
    }
    // A graph or initializer: walked, then written with its new length.
    std::string body;
    int64_t index = -1;
    if (inner == Message::Tensor) {
      index = int64_t(rawData.size());
      rawData.emplace_back();
    }
    if (!walk(payload, payloadEnd, inner, body, index))
      return false;
    out.append(fieldStart, tagEnd);
    putVarint(out, body.size());
    out += body;
  }
  return p == end;
}

} // namespace

bool mlir::fastllm::parseMappedModel(
    const char *data, size_t size, onnx::ModelProto &model,
    std::vector<std::optional<ArrayRef<char>>> &initializerData) {
  Walker walker;
  std::string skeleton;
  if (!walker.walk(data, data + size, Message::Model, skeleton) ||
      skeleton.size() > size_t(INT_MAX) ||
      !model.ParseFromArray(skeleton.data(), int(skeleton.size())))
    return false;
  // Initializers counted by the walker are the parsed ones, in order (a
  // repeated graph field is merged, its initializers appended).
  if (int64_t(walker.rawData.size()) != model.graph().initializer_size())
    return false;
  initializerData = std::move(walker.rawData);
  return true;
}
