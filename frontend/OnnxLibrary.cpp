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

/// ONNX's text parser recurses once per nested graph or bracket: deep
/// nesting would overflow the stack. Checked before parsing.
constexpr int kMaxTextNesting = 200;

static bool nestedTooDeep(const std::string &text) {
  int depth = 0;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        quoted = false;
      continue;
    }
    if (c == '"')
      quoted = true;
    else if (c == '{' || c == '[' || c == '(')
      depth = std::max(depth, 0) + 1;
    else if (c == '}' || c == ']' || c == ')')
      --depth;
    if (depth > kMaxTextNesting)
      return true;
  }
  return false;
}

std::string mlir::fastllm::parseOnnxText(const std::string &text,
                                         onnx::ModelProto &model) {
  if (nestedTooDeep(text))
    return "brackets or graphs nested more than " +
           std::to_string(kMaxTextNesting) + " deep";
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
    const auto &map =
        onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
    auto it = map.find(onnx::ONNX_DOMAIN);
    return it == map.end() ? 0 : it->second.second;
  }();
  return version;
}

/// Ops whose schema changed in opset 18 (ONNX's changelog): a library that
/// stops at 17 would check them against the wrong form.
static bool changedInOpset18(const std::string &op) {
  static const char *const changed[] = {"ReduceL1",
                                        "ReduceL2",
                                        "ReduceLogSum",
                                        "ReduceLogSumExp",
                                        "ReduceMax",
                                        "ReduceMean",
                                        "ReduceMin",
                                        "ReduceProd",
                                        "ReduceSumSquare",
                                        "Split",
                                        "Pad",
                                        "Resize",
                                        "ScatterElements",
                                        "ScatterND",
                                        "LpPool",
                                        "Col2Im",
                                        "BitwiseAnd",
                                        "BitwiseOr",
                                        "BitwiseXor",
                                        "BitwiseNot",
                                        "CenterCropPad",
                                        "GroupNormalization",
                                        "Mish",
                                        "OptionalHasElement",
                                        "OptionalGetElement"};
  for (const char *name : changed)
    if (op == name)
      return true;
  return false;
}

/// The opset-18 form of the ops the importer converts whose schema changed
/// in 18, for a library that stops at 17: input and output counts and the
/// attributes each may carry (ONNX's operator documentation).
struct Opset18Form {
  const char *op;
  int minInputs, maxInputs, minOutputs, maxOutputs;
  std::initializer_list<
      std::pair<const char *, onnx::AttributeProto::AttributeType>>
      attributes;
};

static const Opset18Form *opset18Form(const std::string &op) {
  using A = onnx::AttributeProto;
  static const Opset18Form forms[] = {
      {"ReduceMean",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceMax",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceMin",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceProd",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceL1",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceL2",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceLogSum",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceLogSumExp",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"ReduceSumSquare",
       1,
       2,
       1,
       1,
       {{"keepdims", A::INT}, {"noop_with_empty_axes", A::INT}}},
      {"Split", 1, 2, 1, 1 << 20, {{"axis", A::INT}, {"num_outputs", A::INT}}},
      {"Pad", 2, 4, 1, 1, {{"mode", A::STRING}}},
      {"ScatterElements",
       3,
       3,
       1,
       1,
       {{"axis", A::INT}, {"reduction", A::STRING}}},
      {"ScatterND", 3, 3, 1, 1, {{"reduction", A::STRING}}},
  };
  for (const Opset18Form &f : forms)
    if (op == f.op)
      return &f;
  return nullptr;
}

static std::string checkOpset18Form(const onnx::NodeProto &node,
                                    const Opset18Form &form) {
  int inputs = node.input_size(), outputs = node.output_size();
  // Trailing empty names are absent optional inputs.
  while (inputs > 0 && node.input(inputs - 1).empty())
    --inputs;
  if (inputs < form.minInputs || inputs > form.maxInputs)
    return "has " + std::to_string(inputs) + " inputs; opset 18 " +
           node.op_type() + " takes " + std::to_string(form.minInputs) +
           (form.minInputs == form.maxInputs
                ? ""
                : " to " + std::to_string(form.maxInputs));
  if (outputs < form.minOutputs || outputs > form.maxOutputs)
    return "has " + std::to_string(outputs) + " outputs, which opset 18 " +
           node.op_type() + " does not allow";
  for (const onnx::AttributeProto &a : node.attribute()) {
    bool known = false;
    for (const auto &[name, type] : form.attributes)
      if (a.name() == name) {
        known = true;
        if (a.type() != type)
          return "attribute '" + a.name() + "' must be of type " +
                 onnx::AttributeProto::AttributeType_Name(type);
      }
    if (!known)
      return "unrecognized attribute '" + a.name() + "' for opset 18 " +
             node.op_type();
  }
  return "";
}

std::string mlir::fastllm::verifyOnnxNodeSchema(const onnx::NodeProto &node,
                                                int64_t opset) {
  try {
    int library = libraryOpset();
    if (opset > library && opset == 18 && library >= 17)
      if (const Opset18Form *form = opset18Form(node.op_type()))
        return checkOpset18Form(node, *form);
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
