//===- OnnxLibrary.h - ONNX's own parser and schemas, without throwing -*- C++
//-*-===//
//
// The ONNX library reports errors by throwing C++ exceptions (its text
// parser's number conversions, its schema checks), while LLVM and MLIR code
// is built without exceptions. These wrappers live in a translation unit of
// their own compiled with exceptions and turn every throw into a message,
// so hostile input never aborts the importer.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_FRONTEND_ONNXLIBRARY_H
#define FASTLLM_FRONTEND_ONNXLIBRARY_H

#include "onnx/onnx_pb.h"

#include <cstdint>
#include <string>

namespace mlir::fastllm {

/// Parses ONNX's text format into `model`. Returns "" or the parser's error.
std::string parseOnnxText(const std::string &text, onnx::ModelProto &model);

/// Checks `node` against ONNX's schema of its op at `opset` (default domain):
/// input and output counts, attribute names, types and required attributes.
/// Returns "" when it conforms (or ONNX has no schema for it: the converter
/// table then decides), else what is wrong.
std::string verifyOnnxNodeSchema(const onnx::NodeProto &node, int64_t opset);

} // namespace mlir::fastllm

#endif // FASTLLM_FRONTEND_ONNXLIBRARY_H
