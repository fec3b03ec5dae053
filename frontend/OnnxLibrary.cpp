//===- OnnxLibrary.cpp - ONNX's own parser and schemas, without throwing --===//
//
// Compiled with -fexceptions (see frontend/CMakeLists.txt): every call into
// the ONNX library that may throw is caught here.
//
//===----------------------------------------------------------------------===//

#include "frontend/OnnxLibrary.h"

#include "onnx/defs/parser.h"
#include "onnx/defs/schema.h"

#include <algorithm>
#include <exception>

using namespace mlir::fastllm;

std::string mlir::fastllm::parseOnnxText(const std::string &text,
                                         onnx::ModelProto &model) {
  try {
    onnx::Status status = onnx::OnnxParser::Parse(model, text.c_str());
    if (!status.IsOK())
      return status.ErrorMessage().empty() ? std::string("syntax error")
                                           : status.ErrorMessage();
    return "";
  } catch (const std::exception &e) {
    // std::stof and friends on out-of-range literals, among others.
    return std::string("invalid literal or structure (") + e.what() + ")";
  } catch (...) {
    return "invalid input";
  }
}

/// The newest default-domain opset the installed ONNX library describes.
static int libraryOpset() {
  static const int version = [] {
    const auto &map = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
    auto it = map.find(onnx::ONNX_DOMAIN);
    return it == map.end() ? 0 : it->second.second;
  }();
  return version;
}

/// Ops whose schema changed in opset 18 (ONNX's changelog): a library that
/// stops at 17 would check them against the wrong form.
static bool changedInOpset18(const std::string &op) {
  static const char *const changed[] = {
      "ReduceL1",       "ReduceL2",     "ReduceLogSum", "ReduceLogSumExp",
      "ReduceMax",      "ReduceMean",   "ReduceMin",    "ReduceProd",
      "ReduceSumSquare", "Split",       "Pad",          "Resize",
      "ScatterElements", "ScatterND",   "LpPool",       "Col2Im",
      "BitwiseAnd",     "BitwiseOr",    "BitwiseXor",   "BitwiseNot",
      "CenterCropPad",  "GroupNormalization", "Mish",
      "OptionalHasElement", "OptionalGetElement"};
  for (const char *name : changed)
    if (op == name)
      return true;
  return false;
}

std::string mlir::fastllm::verifyOnnxNodeSchema(const onnx::NodeProto &node,
                                                int64_t opset) {
  try {
    int library = libraryOpset();
    if (opset > library &&
        (opset > 18 || library < 17 || changedInOpset18(node.op_type())))
      return ""; // the library does not know this form; converters check it
    const onnx::OpSchema *schema = onnx::OpSchemaRegistry::Schema(
        node.op_type(), int(std::min<int64_t>(opset, library)),
        onnx::ONNX_DOMAIN);
    if (!schema)
      return "";
    schema->Verify(node);
    return "";
  } catch (const std::exception &e) {
    std::string message = e.what();
    // ONNX appends a "==> Context: Bad node spec ..." dump of the whole node;
    // the diagnostic already names the node.
    size_t context = message.find("\n\n==> Context:");
    if (context != std::string::npos)
      message.resize(context);
    return message;
  } catch (...) {
    return "the node does not conform to its ONNX schema";
  }
}
