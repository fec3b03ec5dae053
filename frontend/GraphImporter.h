//===- GraphImporter.h - the importer, shared by its files ------*- C++ -*-===//
//
// Private to frontend/. GraphImporter holds what the import of one model
// knows: the ONNX values seen so far, the module being built and the names
// the file uses. Its steps live in several files:
//
//   GraphImporter.cpp  versions, graph inputs, the walk over the nodes,
//                      outputs and the checks of the finished function
//   Initializers.cpp   initializers to parameters and constants, and which
//                      parameters are trained
//   FoldedWeights.cpp  the identity and names of weights an exporter folded
//                      or copied
//   ExternalData.cpp   initializer bytes stored next to the model
//   MappedModel.cpp    a model parsed from a mapping of its file, weights
//                      left there
//   TensorProtos.cpp   element types and TensorProto decoding
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_FRONTEND_GRAPHIMPORTER_H
#define FASTLLM_FRONTEND_GRAPHIMPORTER_H

#include "frontend/NodeImporter.h"
#include "frontend/OnnxImporter.h"
#include "ir/ModelDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlir::fastllm {

/// A model or external-data file mapped read-only (mapFileReadOnly),
/// unmapped with its last user.
struct MappedFile {
  MappedFile(char *base, size_t size) : base(base), size(size) {}
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  ~MappedFile();
  char *base;
  size_t size;
  int fd = -1; ///< the file, kept open for scanBytes (-1: none)
};

/// An initializer's bytes and what keeps them alive: the read-only mapping
/// of its external-data file (`mapped`), or the string that holds them
/// (raw_data taken over from the protobuf, or a copy of the typed fields;
/// writable, so that nameFoldedWeights can transpose a weight where it lies).
struct TensorBytes {
  ArrayRef<char> data;
  std::shared_ptr<void> owner;
  bool mapped = false;
};

/// nameFoldedWeights marks a folded weight it leaves in the exporter's
/// layout with model::kInitialValueTransposedAttr (ir/ModelDialect.h).
using model::kInitialValueTransposedAttr;

/// Gives back the pages of `data` when it lies in a mapped external-data
/// file (a scan is done with it; a later read faults them in again from
/// the page cache); does nothing for other memory.
void releaseMappedPages(ArrayRef<char> data);

/// Calls `fn` on consecutive pieces of `data` (each a whole number of
/// `unit`-byte elements) until it returns true, and returns whether it did.
/// Bytes of a mapped file are read with pread into a small buffer instead
/// of through the mapping: a page fault per 64 KiB costs several times the
/// read, and no page of the file stays in this process.
bool scanBytes(ArrayRef<char> data, size_t unit,
               llvm::function_ref<bool(ArrayRef<char>)> fn);

/// Maps `size` bytes of the open file `fd` read-only (MAP_PRIVATE); null
/// when it cannot. A SIGBUS in the mapping (the file was truncated while
/// mapped) is reported as such and exits.
std::shared_ptr<MappedFile> mapFileReadOnly(int fd, uint64_t size);

/// Parses the binary ModelProto in `data` (a mapping of the file) without
/// copying the raw_data of its graph's large initializers: their bytes are
/// `initializerData[i]` for initializer i, ranges of `data`
/// (MappedModel.cpp). False when the walk or the parse fails; the caller
/// then parses the file the usual way.
bool parseMappedModel(
    const char *data, size_t size, onnx::ModelProto &model,
    std::vector<std::optional<ArrayRef<char>>> &initializerData);

class GraphImporter {
public:
  GraphImporter(MLIRContext *context, StringRef name, StringRef modelDir,
                OnnxImportOptions options)
      : context(context), name(name.str()), modelDir(modelDir.str()),
        options(std::move(options)), builder(context),
        fileLoc(FileLineColLoc::get(context, name, 0, 0)) {}

  OwningOpRef<ModuleOp> run(onnx::ModelProto &model);

  /// The model was parsed from `file` by parseMappedModel: initializer i's
  /// raw_data is `rawData[i]` when set (a range of the mapping).
  void setMappedRawData(std::shared_ptr<MappedFile> file,
                        std::vector<std::optional<ArrayRef<char>>> rawData) {
    modelFile = std::move(file);
    mappedRawData = std::move(rawData);
  }

  InFlightDiagnostic fileError() { return mlir::emitError(fileLoc); }
  /// A Constant node's tensor (`what` names it in errors) as a host tensor,
  /// its bytes inside the model or in external data (PyTorch writes a large
  /// model's constants there too).
  FailureOr<HostTensor>
  decodeConstantTensor(const onnx::TensorProto &tensor, StringRef what,
                       llvm::function_ref<InFlightDiagnostic()> error);
  ImportedValue *lookup(StringRef valueName) {
    auto it = values.find(valueName);
    return it == values.end() ? nullptr : &it->second;
  }
  Value materialize(ImportedValue &v);
  bool isUsed(StringRef valueName) const { return used.contains(valueName); }
  void define(StringRef valueName, ImportedValue v) {
    values[valueName] = std::move(v);
  }
  /// See NodeImporter::splitParameter.
  bool splitParameter(StringRef from, StringRef to);
  /// Counts `elements` more folded host elements against the model's total
  /// budget; false once the total passes it.
  bool chargeFold(int64_t elements) {
    foldedElements += elements;
    return foldedElements <= kMaxTotalFoldElements;
  }

private:
  // GraphImporter.cpp
  LogicalResult checkVersions(const onnx::ModelProto &model);
  LogicalResult bindTokenDims(const onnx::GraphProto &graph);
  FailureOr<RankedTensorType> inputType(const onnx::ValueInfoProto &info);
  LogicalResult
  declareInputs(const onnx::GraphProto &graph,
                SmallVectorImpl<const onnx::ValueInfoProto *> &args,
                SmallVectorImpl<Type> &argTypes);
  std::vector<bool> markLive(const onnx::GraphProto &graph);
  func::FuncOp createForward(ArrayRef<const onnx::ValueInfoProto *> args,
                             ArrayRef<Type> argTypes);
  LogicalResult importNodes(const onnx::GraphProto &graph,
                            const std::vector<bool> &live);
  FailureOr<SmallVector<const onnx::NodeProto *>>
  topologicalOrder(const onnx::GraphProto &graph);
  LogicalResult importNode(const onnx::NodeProto &node, size_t index);
  LogicalResult returnOutputs(const onnx::GraphProto &graph,
                              func::FuncOp forward);
  LogicalResult checkDeclaredType(const onnx::ValueInfoProto &info,
                                  RankedTensorType actual,
                                  const Twine &context);
  LogicalResult dropUnreadParameters();
  LogicalResult checkTensorSizes(func::FuncOp forward,
                                 ArrayRef<const onnx::ValueInfoProto *> args);

  // Initializers.cpp
  LogicalResult importInitializers(onnx::GraphProto &graph);
  LogicalResult decideTrainable(const onnx::ModelProto &model,
                                func::FuncOp forward);

  // FoldedWeights.cpp
  void tieFoldedCopies();
  void tieFoldedRows(const onnx::GraphProto &graph);
  void indexNames(const onnx::GraphProto &graph);
  std::string matmulModule(StringRef value) const;
  std::string claimWeightName(StringRef modulePath);
  void nameFoldedWeights();

  // ExternalData.cpp
  /// The bytes of `tensor`'s external data (`what` names it in errors:
  /// "initializer 'w'"), mapped when aligned for `alignment`.
  FailureOr<TensorBytes> readExternalData(const onnx::TensorProto &tensor,
                                          size_t expectedBytes,
                                          size_t alignment, StringRef what);
  /// The mapping of the external-data file at `realPath` (open as `fd`,
  /// `fileSize` bytes), made once per file; null when it cannot be mapped.
  std::shared_ptr<MappedFile> mapExternalFile(StringRef realPath, int fd,
                                              uint64_t fileSize);

  MLIRContext *context;
  std::string name, modelDir;
  OnnxImportOptions options;
  OpBuilder builder;
  Location fileLoc;
  int64_t opset = 0;
  ModuleOp module;
  llvm::StringMap<ImportedValue> values;
  llvm::StringSet<> used;
  llvm::StringMap<const onnx::ValueInfoProto *> declared;
  int64_t foldedElements = 0;
  // See indexNames: the readers of exporter-named values, the names the file
  // uses, and the modules it names in full.
  llvm::StringMap<SmallVector<std::pair<const onnx::NodeProto *, int>>> readers;
  llvm::StringSet<> takenNames, namedModules;
  // Module paths with modules or named tensors below them, and the
  // exporter-named weights each module path's MatMul nodes read.
  llvm::StringSet<> containerScopes;
  llvm::StringMap<llvm::StringSet<>> scopeWeights;
  // See mapExternalFile: each external-data file mapped once, by real path.
  llvm::StringMap<std::shared_ptr<MappedFile>> mappedFiles;
  // See setMappedRawData.
  std::shared_ptr<MappedFile> modelFile;
  std::vector<std::optional<ArrayRef<char>>> mappedRawData;
};

//===----------------------------------------------------------------------===//
// Helpers the importer's files share
//===----------------------------------------------------------------------===//

/// Bytes per element in raw_data (bool is one byte).
size_t byteWidth(Type type);

/// Opens `path` for reading when it is a regular file. FIFOs, devices and
/// directories are refused without blocking (O_NONBLOCK until fstat says what
/// the file is). Returns the descriptor and sets `size`, or -1 and `error`.
int openRegularFile(const std::string &path, uint64_t &size,
                    std::string &error);

/// The type of a TensorProto, checking its element type and dims.
FailureOr<RankedTensorType>
tensorProtoType(const onnx::TensorProto &tensor, MLIRContext *context,
                llvm::function_ref<InFlightDiagnostic()> error);

/// A copy of the data a TensorProto holds in raw_data or its typed fields.
FailureOr<std::unique_ptr<std::string>>
tensorProtoBytes(const onnx::TensorProto &tensor, RankedTensorType type,
                 llvm::function_ref<InFlightDiagnostic()> error);

/// The host tensor of `type` whose little-endian elements are `bytes`.
HostTensor decodeHost(RankedTensorType type, StringRef bytes);

} // namespace mlir::fastllm

#endif // FASTLLM_FRONTEND_GRAPHIMPORTER_H
