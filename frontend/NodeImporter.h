//===- NodeImporter.h - what an op converter sees ---------------*- C++ -*-===//
//
// Converters are keyed by (ONNX op type, first opset of that form), the way
// torch-mlir keys its ONNX patterns, so opset differences (attributes that
// became inputs) sit next to each op. A converter reads its node's inputs and
// attributes through NodeImporter and either computes host tensors (when all
// it needs is known at import time) or emits model-dialect ops.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_FRONTEND_NODEIMPORTER_H
#define FASTLLM_FRONTEND_NODEIMPORTER_H

#include "frontend/HostTensor.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"

#include "onnx/onnx_pb.h"

#include <memory>
#include <string>
#include <vector>

namespace mlir::fastllm {

/// One ONNX value as the importer tracks it: a host tensor (known at import
/// time), a parameter (read lazily with model.get_parameter), or an SSA value.
struct ImportedValue {
  RankedTensorType type;
  Value value;
  std::shared_ptr<HostTensor> host;
  std::string parameter;
  /// The parameter read transposed: a folded `W^T` copy the exporter made of
  /// a weight, read as a view so the tie survives (see GraphImporter).
  bool transposed = false;
  /// A folded copy of rows of the parameter (of its transpose, i.e. its
  /// columns, when `transposed`): the row indices, laid out as `type`'s
  /// leading dims; read as a gather, so that the rows' gradients reach the
  /// parameter. Empty: not a row view.
  std::vector<int64_t> rows;
  /// The parameter's own type, for a row view.
  RankedTensorType parameterType;
};

class GraphImporter;

class NodeImporter {
public:
  NodeImporter(GraphImporter &graph, const onnx::NodeProto &node,
               std::string displayName, Location loc, OpBuilder &builder,
               int64_t opset)
      : graph(graph), node(node), displayName(std::move(displayName)), loc(loc),
        builder(builder), opset(opset) {}

  const onnx::NodeProto &getNode() const { return node; }
  Location getLoc() const { return loc; }
  OpBuilder &getBuilder() { return builder; }
  MLIRContext *getContext() { return builder.getContext(); }
  int64_t getOpset() const { return opset; }

  /// Error prefixed with the node's name and op type.
  InFlightDiagnostic error();

  // Inputs. Optional inputs may be absent (index past the end or empty name).
  unsigned numInputs() const { return node.input_size(); }
  bool hasInput(unsigned i) const {
    return (int)i < node.input_size() && !node.input(i).empty();
  }
  /// The input's type; the input must be present.
  RankedTensorType inputType(unsigned i);
  ArrayRef<int64_t> inputShape(unsigned i) { return inputType(i).getShape(); }
  /// The input's host tensor, or null if it is only known at run time.
  const HostTensor *hostInput(unsigned i);
  /// The input's host tensor; an error naming `what` if it is not constant.
  FailureOr<const HostTensor *> requireHostInput(unsigned i, StringRef what);
  /// True if every present input is known at import time.
  bool allInputsHost();
  /// The input as an SSA value, materialising a constant or parameter read.
  Value operand(unsigned i);
  /// Fails with a diagnostic unless the input has a float element type.
  LogicalResult requireFloat(unsigned i);

  // Attributes.
  const onnx::AttributeProto *attribute(StringRef name) const;
  bool hasAttribute(StringRef name) const { return attribute(name); }
  int64_t intAttr(StringRef name, int64_t defaultValue) const;
  float floatAttr(StringRef name, float defaultValue) const;
  std::string stringAttr(StringRef name, StringRef defaultValue) const;
  std::optional<SmallVector<int64_t>> intsAttr(StringRef name) const;
  /// The attribute when it has `type`; null when absent, or when it has
  /// another type, which getAttributeError() then reports (the importer
  /// turns it into the node's diagnostic).
  const onnx::AttributeProto *
  typedAttribute(StringRef name,
                 onnx::AttributeProto::AttributeType type) const;
  const std::string &getAttributeError() const { return attributeError; }

  // Outputs.
  unsigned numOutputs() const { return node.output_size(); }
  /// True if output `i` exists and anything reads it (a node or the graph).
  bool outputUsed(unsigned i) const;
  void setOutput(unsigned i, Value value);
  void setOutput(unsigned i, HostTensor tensor);
  /// Makes output `out` the same value as input `in` (Identity, Dropout).
  void forwardInput(unsigned out, unsigned in);
  /// Identity of a weight under another name: PyTorch's exporter keeps one
  /// initializer for parameters of equal value (every LayerNorm gain starts
  /// at 1) and names the others as Identity outputs. Output `out` becomes a
  /// parameter of its own, named after it and starting from the weight's
  /// value, so each trains on its own as in the PyTorch model. Returns false
  /// (nothing done) when input `in` is not a weight.
  bool splitParameter(unsigned out, unsigned in);

  /// Normalises a possibly negative axis against `rank`, with a diagnostic.
  FailureOr<int64_t> normalizeAxis(int64_t axis, int64_t rank);
  /// Fails unless a host tensor of `shape` is small enough to fold.
  LogicalResult checkFoldSize(ArrayRef<int64_t> shape);
  /// The tensor of attribute `attr` (a Constant's value) as a host tensor,
  /// inline or in external data; errors start "node 'NAME' (Op): value ".
  FailureOr<HostTensor> decodeTensorAttribute(const onnx::AttributeProto &attr);

  template <typename OpTy, typename... Args>
  Value create(Type resultType, Args &&...args) {
    return builder.create<OpTy>(loc, resultType, std::forward<Args>(args)...)
        .getResult();
  }
  /// An op whose operands and attributes give its result type
  /// (InferTypeOpInterface).
  template <typename OpTy, typename... Args>
  Value createInferred(Args &&...args) {
    return builder.create<OpTy>(loc, std::forward<Args>(args)...).getResult();
  }

private:
  GraphImporter &graph;
  const onnx::NodeProto &node;
  /// The node's name, or `OpType#index` for unnamed nodes.
  std::string displayName;
  Location loc;
  OpBuilder &builder;
  int64_t opset;
  mutable std::string attributeError;
};

using OnnxConverter = LogicalResult (*)(NodeImporter &);

struct OnnxConverterEntry {
  const char *opType;
  /// First default-domain opset this form of the op applies to.
  int64_t sinceVersion;
  /// Inputs that must be present (checked before the converter runs).
  unsigned minInputs;
  OnnxConverter convert;
};

/// All converters, in no particular order.
ArrayRef<OnnxConverterEntry> getOnnxConverters();

/// The converter for `opType` at `opset`: the entry with the largest
/// sinceVersion not above `opset`, or null.
const OnnxConverterEntry *lookupOnnxConverter(StringRef opType, int64_t opset);

/// The most elements the importer folds into one host tensor; larger constant
/// subgraphs are an error rather than an unbounded allocation.
constexpr int64_t kMaxFoldElements = int64_t(1) << 26;
/// The most elements all folded host tensors of one model may add up to
/// (8 bytes each), so many folds below the per-tensor bound stay bounded too.
constexpr int64_t kMaxTotalFoldElements = int64_t(1) << 27;

/// Decodes a TensorProto held inside the model (Constant nodes and their
/// kin) into a host tensor; external data is not accepted here (see
/// NodeImporter::decodeTensorAttribute).
FailureOr<HostTensor>
decodeTensorProto(const onnx::TensorProto &tensor, MLIRContext *context,
                  llvm::function_ref<InFlightDiagnostic()> error);

/// The MLIR element type of an ONNX TensorProto data type, or null.
Type convertOnnxElementType(MLIRContext *context, int32_t dataType);

/// The ONNX name of a TensorProto data type, for diagnostics.
std::string onnxDataTypeName(int32_t dataType);

/// A shape as diagnostics print it: `[2, 3]`.
std::string shapeString(ArrayRef<int64_t> shape);

} // namespace mlir::fastllm

#endif // FASTLLM_FRONTEND_NODEIMPORTER_H
