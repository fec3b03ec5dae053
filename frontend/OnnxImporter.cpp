//===- OnnxImporter.cpp - ONNX ModelProto to the model dialect ------------===//
//
// The importer walks the graph once in topological order. Every ONNX value is
// tracked as an ImportedValue: host tensors (integer initializers, Constant
// nodes and everything computed only from them and from static shapes) are
// evaluated here, float initializers become model.parameter symbols whose
// bytes are moved (not copied) out of the protobuf, and the rest is emitted as
// model-dialect ops into `func.func @forward`.
//
//===----------------------------------------------------------------------===//

#include "frontend/OnnxImporter.h"
#include "frontend/NodeImporter.h"
#include "frontend/OnnxLibrary.h"
#include "ir/ModelDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"


#include <google/protobuf/io/zero_copy_stream_impl.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <queue>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mlir;
using namespace mlir::fastllm;

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

Type mlir::fastllm::convertOnnxElementType(MLIRContext *context,
                                           int32_t dataType) {
  Builder b(context);
  switch (dataType) {
  case onnx::TensorProto::FLOAT:
    return b.getF32Type();
  case onnx::TensorProto::DOUBLE:
    return b.getF64Type();
  case onnx::TensorProto::FLOAT16:
    return b.getF16Type();
  case onnx::TensorProto::BFLOAT16:
    return b.getBF16Type();
  case onnx::TensorProto::INT64:
    return b.getI64Type();
  case onnx::TensorProto::INT32:
    return b.getI32Type();
  case onnx::TensorProto::INT8:
    return b.getI8Type();
  case onnx::TensorProto::BOOL:
    return b.getI1Type();
  default:
    return nullptr;
  }
}

std::string mlir::fastllm::onnxDataTypeName(int32_t dataType) {
  if (onnx::TensorProto::DataType_IsValid(dataType))
    return onnx::TensorProto::DataType_Name(
        static_cast<onnx::TensorProto::DataType>(dataType));
  return "data type " + std::to_string(dataType);
}

/// Bytes per element in raw_data (bool is one byte).
static size_t byteWidth(Type type) {
  return type.isInteger(1) ? 1 : type.getIntOrFloatBitWidth() / 8;
}

static std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

//===----------------------------------------------------------------------===//
// GraphImporter
//===----------------------------------------------------------------------===//

static bool isCallOf(StringRef copy, StringRef source,
                     const llvm::StringSet<> &namedModules);

namespace mlir::fastllm {
class GraphImporter {
public:
  GraphImporter(MLIRContext *context, StringRef name, StringRef modelDir,
                OnnxImportOptions options)
      : context(context), name(name.str()), modelDir(modelDir.str()),
        options(std::move(options)), builder(context),
        fileLoc(FileLineColLoc::get(context, name, 0, 0)) {}

  OwningOpRef<ModuleOp> run(onnx::ModelProto &model);

  InFlightDiagnostic fileError() { return mlir::emitError(fileLoc); }
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
  bool splitParameter(StringRef from, StringRef to) {
    ImportedValue *source = lookup(from);
    if (options.keepSharedInitializers || !source ||
        source->parameter.empty() || values.count(to) ||
        module.lookupSymbol(to) || !llvm::json::isUTF8(to) ||
        to == "__metadata__")
      return false;
    auto original = module.lookupSymbol<model::ParameterOp>(source->parameter);
    if (!original)
      return false;
    // An exporter-named copy read by another call of the module that reads
    // the source (a shared block called by every layer) is that module's
    // one weight: its folded copies were merged as equal values.
    std::string copyModule;
    if (to.starts_with("onnx::")) {
      copyModule = matmulModule(to);
      std::string sourceModule = matmulModule(from);
      if (!copyModule.empty() && !sourceModule.empty() &&
          isCallOf(copyModule, sourceModule, namedModules)) {
        SmallVector<Attribute> calls;
        if (auto old = original->getAttrOfType<ArrayAttr>("model.call_copies"))
          calls.append(old.begin(), old.end());
        calls.push_back(builder.getStringAttr(to));
        original->setAttr("model.call_copies", builder.getArrayAttr(calls));
        return false;
      }
    }
    // A folded weight of another module: named after that module, stored
    // like its source (PyTorch's layout when the source was renamed).
    std::string name = to.str();
    if (!copyModule.empty() && original->hasAttr("model.folded_from"))
      if (std::string claimed = claimWeightName(copyModule); !claimed.empty())
        name = claimed;
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointAfter(original);
    auto copy = builder.create<model::ParameterOp>(
        NameLoc::get(builder.getStringAttr(name), fileLoc), name,
        original.getTensorType(), original.getInitialValueAttr());
    // The import summary lists each such decision.
    copy->setAttr("model.copied_from",
                  builder.getStringAttr(original.getSymName()));
    if (name != to)
      copy->setAttr("model.folded_from", builder.getStringAttr(to));
    ImportedValue v;
    v.type = source->type;
    v.parameter = name;
    v.transposed = source->transposed;
    values[to] = std::move(v);
    return true;
  }
  /// Counts `elements` more folded host elements against the model's total
  /// budget; false once the total passes it.
  bool chargeFold(int64_t elements) {
    foldedElements += elements;
    return foldedElements <= kMaxTotalFoldElements;
  }

private:
  LogicalResult checkVersions(const onnx::ModelProto &model);
  LogicalResult importInitializers(onnx::GraphProto &graph);
  void tieFoldedCopies();
  void indexNames(const onnx::GraphProto &graph);
  std::string matmulModule(StringRef value) const;
  std::string claimWeightName(StringRef modulePath);
  void nameFoldedWeights();
  LogicalResult decideTrainable(const onnx::ModelProto &model,
                                func::FuncOp forward);
  LogicalResult bindTokenDims(const onnx::GraphProto &graph);
  FailureOr<RankedTensorType> inputType(const onnx::ValueInfoProto &info);
  FailureOr<SmallVector<const onnx::NodeProto *>>
  topologicalOrder(const onnx::GraphProto &graph);
  LogicalResult importNode(const onnx::NodeProto &node, size_t index);
  LogicalResult checkDeclaredType(const onnx::ValueInfoProto &info,
                                  RankedTensorType actual,
                                  const Twine &context);
  FailureOr<std::unique_ptr<std::string>>
  readExternalData(const onnx::TensorProto &tensor, size_t expectedBytes);

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
  llvm::StringMap<int64_t> paramUses;
  int64_t foldedElements = 0;
  // See indexNames: the readers of exporter-named values, the names the file
  // uses, and the modules it names in full.
  llvm::StringMap<SmallVector<std::pair<const onnx::NodeProto *, int>>> readers;
  llvm::StringSet<> takenNames, namedModules;
};
} // namespace mlir::fastllm

Value GraphImporter::materialize(ImportedValue &v) {
  if (v.value)
    return v.value;
  if (v.host) {
    v.value = builder.create<model::ConstantOp>(fileLoc, v.host->toAttr());
  } else if (v.transposed) {
    auto loc = NameLoc::get(builder.getStringAttr(v.parameter), fileLoc);
    RankedTensorType stored = RankedTensorType::get(
        {v.type.getDimSize(1), v.type.getDimSize(0)}, v.type.getElementType());
    Value read = builder.create<model::GetParameterOp>(
        loc, stored, FlatSymbolRefAttr::get(context, v.parameter));
    v.value = builder.create<model::TransposeOp>(loc, v.type, read,
                                                 ArrayRef<int64_t>{1, 0});
  } else {
    v.value = builder.create<model::GetParameterOp>(
        NameLoc::get(builder.getStringAttr(v.parameter), fileLoc), v.type,
        FlatSymbolRefAttr::get(context, v.parameter));
  }
  return v.value;
}

LogicalResult GraphImporter::checkVersions(const onnx::ModelProto &model) {
  if (!model.has_ir_version())
    return fileError() << "not an ONNX model: ir_version is missing";
  int64_t ir = model.ir_version();
  if (ir < kMinIrVersion || ir > kMaxIrVersion)
    return fileError() << "unsupported ONNX IR version " << ir
                       << " (supported: " << kMinIrVersion << " to "
                       << kMaxIrVersion << ")";
  bool found = false;
  for (const onnx::OperatorSetIdProto &set : model.opset_import()) {
    if (!set.domain().empty() && set.domain() != "ai.onnx")
      continue;
    if (found)
      return fileError() << "the model imports the default-domain opset twice ("
                         << opset << " and " << set.version() << ")";
    found = true;
    opset = set.version();
  }
  if (!found)
    return fileError() << "the model imports no default-domain opset";
  if (opset < kMinOpset || opset > kMaxOpset)
    return fileError() << "unsupported opset version " << opset
                       << " (supported: " << kMinOpset << " to " << kMaxOpset
                       << ")";
  if (!model.has_graph())
    return fileError() << "the model has no graph";
  return success();
}

/// Opens `path` for reading when it is a regular file. FIFOs, devices and
/// directories are refused without blocking (O_NONBLOCK until fstat says what
/// the file is). Returns the descriptor and sets `size`, or -1 and `error`.
static int openRegularFile(const std::string &path, uint64_t &size,
                           std::string &error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    error = std::string("cannot open the file: ") + std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error = S_ISDIR(st.st_mode) ? "is a directory, not a file"
                                : "is not a regular file (a FIFO, device or "
                                  "socket); refusing to read it";
    ::close(fd);
    return -1;
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0)
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  size = uint64_t(st.st_size);
  return fd;
}

FailureOr<std::unique_ptr<std::string>>
GraphImporter::readExternalData(const onnx::TensorProto &tensor,
                                size_t expectedBytes) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const onnx::StringStringEntryProto &kv : tensor.external_data()) {
    char *end = nullptr;
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset" || kv.key() == "length") {
      uint64_t v = std::strtoull(kv.value().c_str(), &end, 10);
      if (kv.value().empty() || *end)
        return fileError() << "initializer '" << tensor.name()
                           << "': external data " << kv.key() << " '"
                           << kv.value() << "' is not a number";
      if (kv.key() == "offset")
        offset = v;
      else
        length = v;
    }
  }
  auto fail = [&]() {
    return fileError() << "initializer '" << tensor.name()
                       << "': external data location '" << location << "' ";
  };
  if (location.empty())
    return fileError() << "initializer '" << tensor.name()
                       << "': external data has no location";
  if (modelDir.empty())
    return fail() << "cannot be resolved for a model read from memory";
  if (llvm::sys::path::is_absolute(location))
    return fail() << "is an absolute path; it must be inside the model's folder";
  for (StringRef part : llvm::make_range(llvm::sys::path::begin(location),
                                         llvm::sys::path::end(location)))
    if (part == "..")
      return fail() << "leaves the model's folder";
  SmallString<256> path(modelDir);
  llvm::sys::path::append(path, location);
  SmallString<256> realDir, realPath;
  if (llvm::sys::fs::real_path(modelDir, realDir) ||
      llvm::sys::fs::real_path(path, realPath))
    return fail() << "does not exist";
  // A symlink inside the folder may still point outside of it.
  if (!StringRef(realPath).starts_with((realDir + "/").str()))
    return fail() << "resolves to '" << realPath
                  << "', outside the model's folder";
  if (length && *length != expectedBytes)
    return fail() << "has length " << *length << " but the tensor needs "
                  << expectedBytes << " bytes";
  uint64_t fileSize = 0;
  std::string openError;
  int fd = openRegularFile(realPath.str().str(), fileSize, openError);
  if (fd < 0)
    return fail() << openError;
  // Sizes are checked before anything is allocated.
  if (offset > fileSize || expectedBytes > fileSize - offset) {
    ::close(fd);
    return fail() << "is too short: the tensor needs " << expectedBytes
                  << " bytes at offset " << offset << ", the file has "
                  << fileSize;
  }
  auto bytes = std::make_unique<std::string>(expectedBytes, '\0');
  size_t done = 0;
  while (done < expectedBytes) {
    ssize_t n = ::pread(fd, bytes->data() + done, expectedBytes - done,
                        offset + done);
    if (n <= 0)
      break;
    done += n;
  }
  ::close(fd);
  if (done != expectedBytes)
    return fail() << "is too short: needed " << expectedBytes
                  << " bytes at offset " << offset << ", read " << done;
  return bytes;
}

/// Decodes element `k` of little-endian raw bytes of `type`.
static double decodeRaw(Type type, const char *data, int64_t k) {
  auto load = [&](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, data + k * sizeof(v), sizeof(v));
    return v;
  };
  if (type.isF32())
    return load(float());
  if (type.isF64())
    return load(double());
  if (type.isF16() || type.isBF16()) {
    uint16_t bits = load(uint16_t());
    APFloat f(cast<FloatType>(type).getFloatSemantics(), APInt(16, bits));
    return f.convertToDouble();
  }
  if (type.isInteger(64))
    return (double)load(int64_t());
  if (type.isInteger(32))
    return load(int32_t());
  if (type.isInteger(8))
    return load(int8_t());
  return load(uint8_t()) != 0; // bool
}

static int64_t decodeRawInt(Type type, const char *data, int64_t k) {
  if (type.isInteger(64)) {
    int64_t v;
    std::memcpy(&v, data + k * 8, 8);
    return v;
  }
  return (int64_t)decodeRaw(type, data, k);
}

/// The type of a TensorProto, checking its element type and dims.
static FailureOr<RankedTensorType>
tensorProtoType(const onnx::TensorProto &tensor, MLIRContext *context,
                llvm::function_ref<InFlightDiagnostic()> error) {
  Type elementType = convertOnnxElementType(context, tensor.data_type());
  if (!elementType)
    return error() << "unsupported element type "
                   << onnxDataTypeName(tensor.data_type()),
           failure();
  SmallVector<int64_t> shape;
  int64_t count = 1;
  for (int64_t d : tensor.dims()) {
    if (d < 0 || (d > 0 && count > (int64_t(1) << 40) / d))
      return error() << "invalid dims", failure();
    shape.push_back(d);
    count *= d;
  }
  return RankedTensorType::get(shape, elementType);
}

/// A copy of the data a TensorProto holds in raw_data or its typed fields.
static FailureOr<std::unique_ptr<std::string>>
tensorProtoBytes(const onnx::TensorProto &tensor, RankedTensorType type,
                 llvm::function_ref<InFlightDiagnostic()> error) {
  Type elementType = type.getElementType();
  int64_t count = type.getNumElements();
  size_t width = byteWidth(elementType);
  size_t expected = count * width;
  if (tensor.has_raw_data()) {
    if (tensor.raw_data().size() != expected)
      return error() << "has " << tensor.raw_data().size()
                     << " bytes of data but its dims "
                     << shapeString(type.getShape()) << " need " << expected,
             failure();
    return std::make_unique<std::string>(tensor.raw_data());
  }
  int64_t have;
  if (elementType.isF32())
    have = tensor.float_data_size();
  else if (elementType.isF64())
    have = tensor.double_data_size();
  else if (elementType.isInteger(64))
    have = tensor.int64_data_size();
  else // int32_data holds int32, int8, bool and the bits of f16/bf16.
    have = tensor.int32_data_size();
  if (have != count)
    return error() << "has " << have << " values but its dims "
                   << shapeString(type.getShape()) << " need " << count,
           failure();
  auto bytes = std::make_unique<std::string>(expected, '\0');
  char *out = bytes->data();
  if (elementType.isF32())
    std::memcpy(out, tensor.float_data().data(), expected);
  else if (elementType.isF64())
    std::memcpy(out, tensor.double_data().data(), expected);
  else if (elementType.isInteger(64))
    std::memcpy(out, tensor.int64_data().data(), expected);
  else
    for (int64_t k = 0; k < count; ++k) {
      int32_t v = tensor.int32_data(k);
      std::memcpy(out + k * width, &v, width);
    }
  return bytes;
}

static HostTensor decodeHost(RankedTensorType type, const std::string &bytes) {
  HostTensor host;
  host.elementType = type.getElementType();
  host.shape.assign(type.getShape().begin(), type.getShape().end());
  int64_t count = type.getNumElements();
  if (host.isFloat()) {
    host.floats.resize(count);
    for (int64_t k = 0; k < count; ++k)
      host.floats[k] = decodeRaw(host.elementType, bytes.data(), k);
  } else {
    host.ints.resize(count);
    for (int64_t k = 0; k < count; ++k)
      host.ints[k] = decodeRawInt(host.elementType, bytes.data(), k);
  }
  return host;
}

FailureOr<HostTensor> mlir::fastllm::decodeTensorProto(
    const onnx::TensorProto &tensor, MLIRContext *context,
    llvm::function_ref<InFlightDiagnostic()> error) {
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL)
    return error() << "external data is only supported for initializers",
           failure();
  auto type = tensorProtoType(tensor, context, error);
  if (failed(type))
    return failure();
  auto bytes = tensorProtoBytes(tensor, *type, error);
  if (failed(bytes))
    return failure();
  return decodeHost(*type, **bytes);
}

LogicalResult GraphImporter::importInitializers(onnx::GraphProto &graph) {
  if (graph.sparse_initializer_size())
    return fileError() << "sparse initializers are not supported ('"
                       << graph.sparse_initializer(0).values().name() << "')";
  for (onnx::TensorProto &tensor : *graph.mutable_initializer()) {
    const std::string &tname = tensor.name();
    if (tname.empty())
      return fileError() << "an initializer has no name";
    // Names travel into JSON (plan.json, safetensors headers) and must come
    // back byte for byte.
    if (tname == "__metadata__")
      return fileError() << "initializer name '__metadata__' is reserved (the "
                            "weights file's metadata entry)";
    if (!llvm::json::isUTF8(tname))
      return fileError() << "initializer name '" << llvm::json::fixUTF8(tname)
                         << "' is not valid UTF-8";
    if (values.count(tname))
      return fileError() << "initializer '" << tname << "' is defined twice";
    auto error = [&]() {
      return fileError() << "initializer '" << tname << "' ";
    };
    auto type = tensorProtoType(tensor, context, error);
    if (failed(type))
      return failure();
    Type elementType = type->getElementType();
    size_t width = byteWidth(elementType);
    size_t expected = type->getNumElements() * width;

    // The bytes: external data, raw_data moved out of the proto, or a copy of
    // the typed fields (small tensors only, in practice).
    std::unique_ptr<std::string> bytes;
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
      auto ext = readExternalData(tensor, expected);
      if (failed(ext))
        return failure();
      bytes = std::move(*ext);
    } else if (tensor.has_raw_data() && tensor.raw_data().size() == expected) {
      bytes.reset(tensor.release_raw_data());
    } else {
      auto copied = tensorProtoBytes(tensor, *type, error);
      if (failed(copied))
        return failure();
      bytes = std::move(*copied);
    }

    ImportedValue value;
    value.type = *type;
    if (isa<FloatType>(elementType)) {
      // A weight: its bytes become the parameter's resource blob, held once.
      ArrayRef<char> data(bytes->data(), bytes->size());
      std::string *owned = bytes.release();
      AsmResourceBlob blob(
          data, width, [owned](void *, size_t, size_t) { delete owned; },
          /*dataIsMutable=*/true); // nameFoldedWeights transposes in place
      // Resource keys must be bare identifiers; the symbol keeps the real
      // name and the blob manager makes the key unique.
      std::string key = tname;
      for (char &c : key)
        if (!llvm::isAlnum(c) && c != '_' && c != '.' && c != '-' && c != '$')
          c = '_';
      if (key.empty() || llvm::isDigit(key[0]))
        key = "w_" + key;
      auto attr = DenseResourceElementsAttr::get(*type, key, std::move(blob));
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToEnd(module.getBody());
      builder.create<model::ParameterOp>(
          NameLoc::get(builder.getStringAttr(tname), fileLoc), tname, *type,
          attr);
      value.parameter = tname;
    } else {
      value.host = std::make_shared<HostTensor>(decodeHost(*type, *bytes));
    }
    values[tname] = std::move(value);
  }
  return success();
}

/// The f32 elements of a parameter's initial value, when held as a blob.
static ArrayRef<float> parameterFloats(model::ParameterOp p) {
  auto res = dyn_cast_or_null<DenseResourceElementsAttr>(p.getInitialValueAttr());
  if (!res || !p.getTensorType().getElementType().isF32())
    return {};
  AsmResourceBlob *blob = res.getRawHandle().getBlob();
  if (!blob)
    return {};
  ArrayRef<char> data = blob->getData();
  return ArrayRef<float>(reinterpret_cast<const float *>(data.data()),
                         data.size() / sizeof(float));
}

/// Constant folding (the exporter's default) replaces `x @ W.t()` by a
/// folded initializer holding W transposed, under a generated name
/// (`onnx::MatMul_N`): a tied embedding and head would silently train as
/// two matrices. A 2-D float initializer under such a name whose values are
/// exactly another initializer's, transposed or not, is read as a view of
/// that parameter instead. Tensors whose elements are all equal are never
/// tied this way (equal values say nothing about identity).
void GraphImporter::tieFoldedCopies() {
  SmallVector<model::ParameterOp> params(module.getOps<model::ParameterOp>());
  for (model::ParameterOp copy : params) {
    StringRef name = copy.getSymName();
    RankedTensorType type = copy.getTensorType();
    if (!name.starts_with("onnx::") || type.getRank() != 2)
      continue;
    ArrayRef<float> data = parameterFloats(copy);
    if (data.empty() || llvm::all_equal(data))
      continue;
    int64_t rows = type.getDimSize(0), cols = type.getDimSize(1);
    for (model::ParameterOp source : params) {
      if (source == copy || source.getSymName().starts_with("onnx::") ||
          source.getTensorType().getElementType() != type.getElementType())
        continue;
      ArrayRef<int64_t> shape = source.getTensorType().getShape();
      ArrayRef<float> src = parameterFloats(source);
      if (src.size() != data.size() || shape.size() != 2)
        continue;
      bool same = shape == type.getShape() &&
                  std::memcmp(src.data(), data.data(),
                              data.size() * sizeof(float)) == 0;
      bool transposed = !same && shape[0] == cols && shape[1] == rows;
      for (int64_t i = 0; transposed && i < rows; ++i)
        for (int64_t j = 0; transposed && j < cols; ++j)
          transposed = std::memcmp(&data[i * cols + j], &src[j * rows + i],
                                   sizeof(float)) == 0;
      if (!same && !transposed)
        continue;
      ImportedValue view;
      view.type = type;
      view.parameter = source.getSymName().str();
      view.transposed = transposed;
      values[name] = std::move(view);
      SmallVector<Attribute> views;
      if (auto old = source->getAttrOfType<ArrayAttr>("model.folded_views"))
        views.append(old.begin(), old.end());
      views.push_back(builder.getStringAttr(
          (name + (transposed ? " = transpose" : " = copy")).str()));
      source->setAttr("model.folded_views", builder.getArrayAttr(views));
      copy.erase();
      break;
    }
  }
}

/// The PyTorch module path in an exporter's node name: `/h.0/c_attn/MatMul`
/// is node MatMul of module `h.0.c_attn`. Empty when the node is not inside
/// a module (`/MatMul`) or the name has no such form.
static std::string modulePath(StringRef nodeName) {
  if (!nodeName.consume_front("/"))
    return {};
  size_t last = nodeName.rfind('/');
  if (last == StringRef::npos || last == 0)
    return {};
  std::string path = nodeName.take_front(last).str();
  for (char &c : path)
    if (c == '/')
      c = '.';
  return path;
}

/// True when the components of `scope` appear in order in `path`, the last
/// ones equal: the exporter's scopes skip modules that were not called
/// (a ModuleDict, a submodule whose `forward` was called directly), so
/// `h.0.attn.c_attn` is scope of module `transformer.h.0.attn.c_attn`.
static bool scopeMatches(StringRef scope, StringRef path) {
  SmallVector<StringRef> s, p;
  scope.split(s, '.');
  path.split(p, '.');
  if (s.empty() || p.empty() || s.back() != p.back())
    return false;
  size_t j = 0;
  for (StringRef part : p)
    if (j < s.size() && part == s[j])
      ++j;
  return j == s.size();
}

/// Constant folding also replaces each `nn.Linear` weight of a 3-D matmul by
/// its transpose under a generated name (`onnx::MatMul_N`): the PyTorch name
/// and layout are gone from the file. Such a weight read only as the right
/// operand of MatMul nodes of one module (`/h.0/c_attn/MatMul`) is named
/// after that module (`h.0.c_attn.weight`) and stored in PyTorch's layout
/// ([out, in], the transpose of what the graph reads), so weights files and
/// checkpoints carry the names and shapes PyTorch's `load_state_dict`
/// expects. The node's scope may skip modules; when exactly one module named
/// elsewhere in the file (by a bias or a norm's initializer) fits it, that
/// module's full path is used (`transformer.h.0.attn.c_attn.weight`). The
/// bytes are transposed in place. A weight whose module cannot be told, or
/// whose would-be name is taken, keeps the exporter's name.
void GraphImporter::indexNames(const onnx::GraphProto &graph) {
  for (const onnx::NodeProto &node : graph.node())
    for (auto [i, in] : llvm::enumerate(node.input()))
      if (StringRef(in).starts_with("onnx::"))
        readers[in].push_back({&node, int(i)});
  for (const onnx::TensorProto &t : graph.initializer())
    takenNames.insert(t.name());
  for (const onnx::NodeProto &node : graph.node())
    for (const std::string &out : node.output())
      takenNames.insert(out);
  // Modules the file names in full: parents of PyTorch-named initializers
  // and of the exporter's Identity copies.
  auto addModule = [&](StringRef name) {
    size_t dot = name.rfind('.');
    if (!name.starts_with("onnx::") && !name.starts_with("/") &&
        dot != StringRef::npos && dot > 0)
      namedModules.insert(name.take_front(dot));
  };
  for (const onnx::TensorProto &t : graph.initializer())
    addModule(t.name());
  for (const onnx::NodeProto &node : graph.node())
    if (node.op_type() == "Identity" && node.output_size() == 1)
      addModule(node.output(0));
}

/// The module (scope path) whose MatMul nodes read exporter-named `value` as
/// their weight, when all its readers but Identity copies are such nodes of
/// one module; empty otherwise.
std::string GraphImporter::matmulModule(StringRef value) const {
  auto it = readers.find(value);
  if (it == readers.end())
    return {};
  std::string path;
  for (auto [node, index] : it->second) {
    if (node->op_type() == "Identity")
      continue;
    std::string p = node->op_type() == "MatMul" && index == 1
                        ? modulePath(node->name())
                        : std::string();
    if (p.empty() || (!path.empty() && p != path))
      return {};
    path = p;
  }
  return path;
}

/// `<module>.weight` for the module at scope `path` (its full path when
/// exactly one module named in the file fits the scope), reserved; empty
/// when that name is taken.
std::string GraphImporter::claimWeightName(StringRef path) {
  std::string full;
  int fits = 0;
  for (const auto &m : namedModules)
    if (scopeMatches(path, m.getKey()) && ++fits == 1)
      full = m.getKey().str();
  std::string name = (fits == 1 ? full : path.str()) + ".weight";
  // Node names are the file's: they must make a name weights files can hold.
  if (takenNames.contains(name) || module.lookupSymbol(name) ||
      !llvm::json::isUTF8(name))
    return {};
  takenNames.insert(name);
  return name;
}

/// True when scope `copy` is another call of the module at scope `source`:
/// the exporter scopes the k-th call of a module `c_attn` as `c_attn_k`
/// (ALBERT's shared block: `/block/c_attn_1/MatMul`). A scope the file names
/// as a module of its own (a bias under it) is not a call.
static bool isCallOf(StringRef copy, StringRef source,
                     const llvm::StringSet<> &namedModules) {
  if (copy != source && namedModules.contains(copy))
    return false;
  SmallVector<StringRef> c, s;
  copy.split(c, '.');
  source.split(s, '.');
  if (c.size() != s.size())
    return false;
  for (auto [a, b] : llvm::zip(c, s)) {
    if (a == b)
      continue;
    StringRef suffix = a;
    if (!suffix.consume_front(b) || !suffix.consume_front("_") ||
        suffix.empty() || !llvm::all_of(suffix, llvm::isDigit))
      return false;
  }
  return true;
}

void GraphImporter::nameFoldedWeights() {
  SmallVector<model::ParameterOp> params(module.getOps<model::ParameterOp>());
  for (model::ParameterOp param : params) {
    StringRef old = param.getSymName();
    RankedTensorType type = param.getTensorType();
    auto res =
        dyn_cast_or_null<DenseResourceElementsAttr>(param.getInitialValueAttr());
    if (!old.starts_with("onnx::") || type.getRank() != 2 || !res ||
        !res.getRawHandle().getBlob())
      continue;
    std::string path = matmulModule(old);
    std::string name = path.empty() ? std::string() : claimWeightName(path);
    if (name.empty())
      continue;
    // Transpose the bytes where they are (one scratch copy of this tensor).
    int64_t rows = type.getDimSize(0), cols = type.getDimSize(1);
    MutableArrayRef<char> bytes = res.getRawHandle().getBlob()->getMutableData();
    size_t width = byteWidth(type.getElementType());
    std::vector<char> scratch(bytes.begin(), bytes.end());
    // In 32x32 tiles: a row-by-row transpose of a 768x2304 matrix misses the
    // cache on every element.
    constexpr int64_t kTile = 32;
    for (int64_t i0 = 0; i0 < rows; i0 += kTile)
      for (int64_t j0 = 0; j0 < cols; j0 += kTile)
        for (int64_t i = i0; i < std::min(rows, i0 + kTile); ++i)
          for (int64_t j = j0; j < std::min(cols, j0 + kTile); ++j)
            std::memcpy(&bytes[(j * rows + i) * width],
                        &scratch[(i * cols + j) * width], width);
    auto stored = RankedTensorType::get({cols, rows}, type.getElementType());
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointAfter(param);
    auto renamed = builder.create<model::ParameterOp>(
        NameLoc::get(builder.getStringAttr(name), fileLoc), name, stored,
        DenseResourceElementsAttr::get(stored, res.getRawHandle()));
    renamed->setAttr("model.folded_from", builder.getStringAttr(old));
    ImportedValue view;
    view.type = type;
    view.parameter = name;
    view.transposed = true;
    values[old] = std::move(view);
    param.erase();
  }
}

/// True when the parameter's initial value holds an infinity or a NaN (an
/// additive `-inf` attention mask, say): such a tensor is not a weight.
static bool holdsNonFinite(model::ParameterOp p) {
  auto res = dyn_cast_or_null<DenseResourceElementsAttr>(p.getInitialValueAttr());
  AsmResourceBlob *blob = res ? res.getRawHandle().getBlob() : nullptr;
  if (!blob)
    return false;
  ArrayRef<char> data = blob->getData();
  Type t = p.getTensorType().getElementType();
  auto all16 = [&](uint16_t exponent) {
    for (size_t i = 0; i + 1 < data.size(); i += 2) {
      uint16_t bits;
      std::memcpy(&bits, &data[i], 2);
      if ((bits & exponent) == exponent)
        return true;
    }
    return false;
  };
  if (t.isF32()) {
    for (size_t i = 0; i + 3 < data.size(); i += 4) {
      float v;
      std::memcpy(&v, &data[i], 4);
      if (!std::isfinite(v))
        return true;
    }
    return false;
  }
  if (t.isF64()) {
    for (size_t i = 0; i + 7 < data.size(); i += 8) {
      double v;
      std::memcpy(&v, &data[i], 8);
      if (!std::isfinite(v))
        return true;
    }
    return false;
  }
  if (t.isF16())
    return all16(0x7C00);
  if (t.isBF16())
    return all16(0x7F80);
  return false;
}

/// Which float initializers are trained. PyTorch trains what
/// `model.parameters()` lists and leaves buffers (masks, rotary tables, running
/// statistics) alone, but the ONNX file stores both as initializers. The
/// export helper (tools/fastllm_export.py) records the parameter names in the
/// model's metadata; a name it lists as frozen is frozen, and any other
/// initializer under a PyTorch name is a buffer. Whatever the exporter, an
/// initializer is trained only if the loss depends on it differentiably (not
/// only through comparisons, casts to integers or indices: PyTorch leaves
/// such a parameter's gradient None and AdamW skips it, weight decay
/// included) and it holds no infinity or NaN. Each constant keeps its reason
/// (`model.constant_reason`) for the import summary; `--train` and
/// `--freeze` override these decisions later.
LogicalResult GraphImporter::decideTrainable(const onnx::ModelProto &model,
                                             func::FuncOp forward) {
  std::optional<llvm::StringSet<>> trainable;
  llvm::StringSet<> frozen;
  for (const onnx::StringStringEntryProto &kv : model.metadata_props()) {
    bool isTrainable = kv.key() == kTrainableParametersKey;
    if (!isTrainable && kv.key() != kFrozenParametersKey)
      continue;
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(kv.value());
    const llvm::json::Array *names = parsed ? parsed->getAsArray() : nullptr;
    if (!parsed)
      llvm::consumeError(parsed.takeError());
    llvm::StringSet<> &into =
        isTrainable ? trainable.emplace() : frozen;
    bool ok = names != nullptr;
    for (size_t i = 0; ok && i < names->size(); ++i)
      if (auto name = (*names)[i].getAsString())
        into.insert(*name);
      else
        ok = false;
    if (!ok)
      return fileError() << "metadata '" << kv.key()
                         << "' must be a JSON array of parameter names";
  }

  // Values the loss depends on differentiably: walk back from the return
  // through float operands of ops with a float result.
  auto isFloat = [](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && isa<FloatType>(t.getElementType());
  };
  llvm::DenseSet<Value> needed;
  Block &body = forward.getBody().front();
  for (Value v : body.getTerminator()->getOperands())
    if (isFloat(v))
      needed.insert(v);
  llvm::StringSet<> reached;
  for (Operation &op : llvm::reverse(body.without_terminator())) {
    if (!llvm::any_of(op.getResults(),
                      [&](Value r) { return needed.contains(r); }))
      continue;
    if (auto get = dyn_cast<model::GetParameterOp>(op))
      reached.insert(get.getName());
    for (Value v : op.getOperands())
      if (isFloat(v))
        needed.insert(v);
  }

  for (auto param : module.getOps<model::ParameterOp>()) {
    StringRef name = param.getSymName();
    std::string reason;
    // The list cannot name what the exporter named (a folded weight, renamed
    // after its module or not): those are judged as without a list.
    bool exporterNamed = name.starts_with("onnx::") ||
                         param->hasAttr("model.folded_from");
    if (frozen.contains(name))
      reason = "frozen in PyTorch (requires_grad=False)";
    else if (trainable && !trainable->contains(name) && !exporterNamed)
      reason = "a buffer: not among the model's parameters in the exporter's "
               "list";
    else if (!reached.contains(name))
      reason = "the loss does not depend on it differentiably (only through "
               "comparisons, casts to integers or indices)";
    else if (holdsNonFinite(param))
      reason = "holds infinities or NaNs";
    if (reason.empty())
      continue;
    param.setFrozen(true);
    param->setAttr("model.constant_reason", builder.getStringAttr(reason));
  }
  return success();
}

LogicalResult GraphImporter::bindTokenDims(const onnx::GraphProto &graph) {
  if (!options.batchSize && !options.seqLen)
    return success();
  const onnx::ValueInfoProto *tokens = nullptr;
  for (const onnx::ValueInfoProto &info : graph.input()) {
    if (values.count(info.name()) || !info.type().has_tensor_type())
      continue;
    Type t = convertOnnxElementType(context, info.type().tensor_type().elem_type());
    if (t && isa<IntegerType>(t) && !t.isInteger(1)) {
      tokens = &info;
      break;
    }
  }
  if (!tokens || tokens->type().tensor_type().shape().dim_size() != 2)
    return fileError() << "--batch-size and --seq-len bind the dims of the "
                          "token input, but the model has no [batch, seq] "
                          "integer input";
  const auto &shape = tokens->type().tensor_type().shape();
  for (auto [i, value, flag] :
       {std::tuple{0, options.batchSize, "--batch-size"},
        std::tuple{1, options.seqLen, "--seq-len"}}) {
    if (!value)
      continue;
    if (*value <= 0)
      return fileError() << flag << " must be positive, got " << *value;
    const auto &dim = shape.dim(i);
    if (dim.has_dim_value()) {
      if (dim.dim_value() != *value)
        return fileError() << flag << " " << *value << " conflicts with dim "
                           << i << " of input '" << tokens->name()
                           << "', which the model fixes to "
                           << dim.dim_value();
    } else if (dim.has_dim_param()) {
      auto [it, inserted] =
          options.dimBindings.try_emplace(dim.dim_param(), *value);
      if (!inserted && it->second != *value)
        return fileError() << flag << " " << *value << " conflicts with "
                           << "--bind-dim " << dim.dim_param() << "="
                           << it->second;
    }
  }
  return success();
}

FailureOr<RankedTensorType>
GraphImporter::inputType(const onnx::ValueInfoProto &info) {
  if (!info.type().has_tensor_type())
    return fileError() << "graph input '" << info.name()
                       << "' is not a tensor";
  const onnx::TypeProto::Tensor &tt = info.type().tensor_type();
  Type elementType = convertOnnxElementType(context, tt.elem_type());
  if (!elementType)
    return fileError() << "graph input '" << info.name()
                       << "' has unsupported element type "
                       << onnxDataTypeName(tt.elem_type());
  if (!tt.has_shape())
    return fileError() << "graph input '" << info.name()
                       << "' has no shape; its rank must be known";
  SmallVector<int64_t> shape;
  for (auto [i, dim] : llvm::enumerate(tt.shape().dim())) {
    if (dim.has_dim_value()) {
      if (dim.dim_value() < 0)
        return fileError() << "graph input '" << info.name() << "' dim " << i
                           << " is negative";
      shape.push_back(dim.dim_value());
    } else if (dim.has_dim_param()) {
      auto it = options.dimBindings.find(dim.dim_param());
      if (it == options.dimBindings.end())
        return fileError() << "graph input '" << info.name() << "' dim " << i
                           << " is the symbolic dim '" << dim.dim_param()
                           << "'; bind it with --bind-dim " << dim.dim_param()
                           << "=N";
      shape.push_back(it->second);
    } else {
      return fileError() << "graph input '" << info.name() << "' dim " << i
                         << " is unknown (neither a value nor a name)";
    }
  }
  return RankedTensorType::get(shape, elementType);
}

LogicalResult GraphImporter::checkDeclaredType(const onnx::ValueInfoProto &info,
                                               RankedTensorType actual,
                                               const Twine &where) {
  if (!info.type().has_tensor_type())
    return success();
  const onnx::TypeProto::Tensor &tt = info.type().tensor_type();
  if (tt.elem_type() != onnx::TensorProto::UNDEFINED) {
    Type declaredElt = convertOnnxElementType(context, tt.elem_type());
    if (declaredElt != actual.getElementType())
      return fileError() << where << ": value '" << info.name()
                         << "' is declared as "
                         << onnxDataTypeName(tt.elem_type()) << " but is "
                         << actual.getElementType();
  }
  if (!tt.has_shape())
    return success();
  bool mismatch = tt.shape().dim_size() != actual.getRank();
  for (int i = 0; !mismatch && i < tt.shape().dim_size(); ++i) {
    const auto &dim = tt.shape().dim(i);
    std::optional<int64_t> want;
    if (dim.has_dim_value())
      want = dim.dim_value();
    else if (dim.has_dim_param() && options.dimBindings.count(dim.dim_param()))
      want = options.dimBindings.lookup(dim.dim_param());
    mismatch = want && *want != actual.getDimSize(i);
  }
  if (mismatch) {
    std::string declaredShape = "[";
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto &dim = tt.shape().dim(i);
      declaredShape += (i ? ", " : "") + (dim.has_dim_value()
                                              ? std::to_string(dim.dim_value())
                                              : dim.dim_param().empty()
                                                    ? std::string("?")
                                                    : dim.dim_param());
    }
    declaredShape += "]";
    return fileError() << where << ": value '" << info.name()
                       << "' has shape " << shapeString(actual.getShape())
                       << " but the model declares " << declaredShape;
  }
  return success();
}

FailureOr<SmallVector<const onnx::NodeProto *>>
GraphImporter::topologicalOrder(const onnx::GraphProto &graph) {
  // Kahn's algorithm keeping file order among ready nodes: exporters already
  // write a topological order, which we then keep exactly.
  llvm::StringMap<int> producer;
  for (auto [i, node] : llvm::enumerate(graph.node()))
    for (const std::string &out : node.output())
      if (!out.empty()) {
        if (values.count(out) || producer.count(out))
          return fileError() << "value '" << out
                             << "' is defined more than once";
        producer[out] = i;
      }
  size_t n = graph.node_size();
  std::vector<int> pending(n, 0);
  std::vector<SmallVector<int>> consumers(n);
  for (auto [i, node] : llvm::enumerate(graph.node())) {
    for (const std::string &in : node.input()) {
      if (in.empty() || values.count(in))
        continue;
      auto it = producer.find(in);
      if (it == producer.end())
        return fileError() << "node '" << node.name() << "' (" << node.op_type()
                           << "): input '" << in << "' is not defined";
      ++pending[i];
      consumers[it->second].push_back(i);
    }
  }
  SmallVector<const onnx::NodeProto *> order;
  std::vector<bool> done(n, false);
  // The ready node earliest in the file goes first (a min-heap of indices):
  // a file already in topological order keeps it, and any order costs
  // O(n log n).
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (size_t i = 0; i < n; ++i)
    if (!pending[i])
      ready.push(int(i));
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    done[i] = true;
    order.push_back(&graph.node(i));
    for (int c : consumers[i])
      if (--pending[c] == 0)
        ready.push(c);
  }
  if (order.size() < n) {
    for (size_t i = 0; i < n; ++i)
      if (!done[i])
        return fileError() << "the graph has a cycle through node '"
                           << graph.node(i).name() << "' ("
                           << graph.node(i).op_type() << ")";
  }
  return order;
}

LogicalResult GraphImporter::importNode(const onnx::NodeProto &node,
                                        size_t index) {
  std::string nodeName =
      node.name().empty() ? node.op_type() + "#" + std::to_string(index)
                          : node.name();
  Location loc = NameLoc::get(builder.getStringAttr(nodeName), fileLoc);
  if (!node.domain().empty() && node.domain() != "ai.onnx")
    return mlir::emitError(loc)
           << "node '" << nodeName << "': op '" << node.op_type()
           << "' of domain '" << node.domain() << "' is not supported";
  const OnnxConverterEntry *entry = lookupOnnxConverter(node.op_type(), opset);
  if (!entry)
    return mlir::emitError(loc)
           << "node '" << nodeName << "': unsupported op '" << node.op_type()
           << "' (opset " << opset << ")";
  if (std::string why = verifyOnnxNodeSchema(node, opset); !why.empty())
    return mlir::emitError(loc) << "node '" << nodeName << "' ("
                                << node.op_type() << "): " << why;
  NodeImporter importer(*this, node, nodeName, loc, builder, opset);
  for (unsigned i = 0; i < entry->minInputs; ++i)
    if (!importer.hasInput(i))
      return importer.error() << "needs at least " << entry->minInputs
                              << " inputs; input " << i << " is missing";
  LogicalResult converted = entry->convert(importer);
  // An attribute of the wrong type was read as absent: the conversion is not
  // what the model says, whether it failed or not.
  if (!importer.getAttributeError().empty())
    return importer.error() << importer.getAttributeError();
  if (failed(converted))
    return failure();
  for (const std::string &out : node.output()) {
    if (out.empty())
      continue;
    ImportedValue *v = lookup(out);
    if (!v) {
      if (!isUsed(out))
        continue; // an optional output nobody reads
      return importer.error() << "output '" << out << "' is not supported";
    }
    auto it = declared.find(out);
    if (it != declared.end() &&
        failed(checkDeclaredType(*it->second, v->type,
                                 "node '" + nodeName + "' (" + node.op_type() +
                                     ")")))
      return failure();
  }
  return success();
}

OwningOpRef<ModuleOp> GraphImporter::run(onnx::ModelProto &model) {
  if (failed(checkVersions(model)))
    return nullptr;
  onnx::GraphProto &graph = *model.mutable_graph();
  if (graph.node_size() == 0 && graph.output_size() == 0)
    return fileError() << "the graph is empty", nullptr;
  if (graph.output_size() == 0)
    return fileError() << "the graph has no outputs", nullptr;

  OwningOpRef<ModuleOp> owned = ModuleOp::create(fileLoc);
  module = *owned;
  if (!graph.name().empty())
    module->setAttr("model.graph_name", builder.getStringAttr(graph.name()));
  if (failed(importInitializers(graph)))
    return nullptr;
  indexNames(graph);
  if (!options.keepSharedInitializers) {
    tieFoldedCopies();
    nameFoldedWeights();
  }

  if (failed(bindTokenDims(graph)))
    return nullptr;

  // Graph inputs (older IR versions also list the initializers there).
  SmallVector<Type> argTypes;
  SmallVector<const onnx::ValueInfoProto *> args;
  for (const onnx::ValueInfoProto &info : graph.input()) {
    if (values.count(info.name()))
      continue;
    if (!llvm::json::isUTF8(info.name()))
      return fileError() << "input name '" << llvm::json::fixUTF8(info.name())
                         << "' is not valid UTF-8",
             nullptr;
    auto type = inputType(info);
    if (failed(type))
      return nullptr;
    argTypes.push_back(*type);
    args.push_back(&info);
  }
  for (const onnx::ValueInfoProto &info : graph.value_info())
    declared[info.name()] = &info;
  for (const onnx::ValueInfoProto &info : graph.output())
    declared[info.name()] = &info;
  // Only nodes the graph's outputs depend on are imported: a dead node costs
  // nothing, however large the constant it would fold.
  std::vector<bool> live(graph.node_size(), false);
  {
    llvm::StringMap<int> producer;
    for (auto [i, node] : llvm::enumerate(graph.node()))
      for (const std::string &out : node.output())
        if (!out.empty())
          producer[out] = int(i);
    SmallVector<int> work;
    auto need = [&](const std::string &value) {
      auto it = producer.find(value);
      if (it != producer.end() && !live[it->second]) {
        live[it->second] = true;
        work.push_back(it->second);
      }
    };
    for (const onnx::ValueInfoProto &info : graph.output())
      need(info.name());
    while (!work.empty())
      for (const std::string &in : graph.node(work.pop_back_val()).input())
        need(in);
  }
  for (auto [i, node] : llvm::enumerate(graph.node()))
    if (live[i])
      for (const std::string &in : node.input())
        used.insert(in);
  for (const onnx::ValueInfoProto &info : graph.output())
    used.insert(info.name());

  builder.setInsertionPointToEnd(module.getBody());
  auto func = builder.create<func::FuncOp>(
      fileLoc, "forward", builder.getFunctionType(argTypes, {}));
  Block *entry = func.addEntryBlock();
  for (auto [i, info] : llvm::enumerate(args)) {
    func.setArgAttr(i, "model.name", builder.getStringAttr(info->name()));
    ImportedValue v;
    v.type = cast<RankedTensorType>(argTypes[i]);
    v.value = entry->getArgument(i);
    values[info->name()] = std::move(v);
  }
  builder.setInsertionPointToEnd(entry);

  auto order = topologicalOrder(graph);
  if (failed(order))
    return nullptr;
  // Unnamed nodes are called after their position in the file.
  llvm::DenseMap<const onnx::NodeProto *, size_t> position;
  for (auto [i, node] : llvm::enumerate(graph.node()))
    position[&node] = i;
  for (const onnx::NodeProto *node : *order) {
    size_t index = position.lookup(node);
    if (live[index] && failed(importNode(*node, index)))
      return nullptr;
  }

  SmallVector<Value> results;
  SmallVector<Type> resultTypes;
  for (const onnx::ValueInfoProto &info : graph.output()) {
    ImportedValue *v = lookup(info.name());
    if (!v)
      return fileError() << "graph output '" << info.name()
                         << "' is not defined",
             nullptr;
    if (failed(checkDeclaredType(info, v->type, "graph output")))
      return nullptr;
    results.push_back(materialize(*v));
    resultTypes.push_back(v->type);
  }
  builder.create<func::ReturnOp>(fileLoc, results);
  func.setFunctionType(builder.getFunctionType(argTypes, resultTypes));
  for (auto [i, info] : llvm::enumerate(graph.output()))
    func.setResultAttr(i, "model.name", builder.getStringAttr(info.name()));

  // Parameters nothing reads are dropped: they would be trained for nothing.
  for (auto param :
       llvm::make_early_inc_range(module.getOps<model::ParameterOp>()))
    if (SymbolTable::symbolKnownUseEmpty(param, module))
      param.erase();
    else if (param.getTensorType().getNumElements() == 0)
      return fileError() << "initializer '" << param.getSymName()
                         << "' has no elements (dims "
                         << shapeString(param.getTensorType().getShape())
                         << "); a weight the model reads must have some",
             nullptr;

  if (failed(decideTrainable(model, func)))
    return nullptr;

  // Bound every tensor: a bound dim, an Expand or a Range could otherwise
  // ask for more elements than int64 counts (the plan would wrap around).
  auto tooLarge = [](Type type) {
    auto t = dyn_cast<RankedTensorType>(type);
    if (!t)
      return false;
    int64_t count = 1;
    for (int64_t d : t.getShape())
      if (d < 0 || __builtin_mul_overflow(count, d, &count) ||
          count > kMaxTensorElements)
        return true;
    return false;
  };
  for (BlockArgument arg : func.getArguments())
    if (tooLarge(arg.getType()))
      return fileError() << "input '" << args[arg.getArgNumber()]->name()
                         << "' would have more than " << kMaxTensorElements
                         << " elements: " << arg.getType(),
             nullptr;
  WalkResult walk = func.walk([&](Operation *op) {
    for (Type t : op->getResultTypes())
      if (tooLarge(t)) {
        InFlightDiagnostic diag = mlir::emitError(op->getLoc());
        if (auto name = dyn_cast<NameLoc>(op->getLoc()))
          diag << "node '" << name.getName().getValue() << "': ";
        diag << "a value would have more than " << kMaxTensorElements
             << " elements: " << t;
        return WalkResult::interrupt();
      }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return nullptr;

  if (failed(mlir::verify(module)))
    return fileError() << "internal error: the imported IR does not verify",
           nullptr;
  return owned;
}

//===----------------------------------------------------------------------===//
// NodeImporter
//===----------------------------------------------------------------------===//

InFlightDiagnostic NodeImporter::error() {
  return mlir::emitError(loc)
         << "node '" << displayName << "' (" << node.op_type() << "): ";
}

RankedTensorType NodeImporter::inputType(unsigned i) {
  return graph.lookup(node.input(i))->type;
}

const HostTensor *NodeImporter::hostInput(unsigned i) {
  if (!hasInput(i))
    return nullptr;
  return graph.lookup(node.input(i))->host.get();
}

FailureOr<const HostTensor *> NodeImporter::requireHostInput(unsigned i,
                                                             StringRef what) {
  if (!hasInput(i))
    return error() << "missing input " << what, failure();
  if (const HostTensor *t = hostInput(i))
    return t;
  return error() << what << " (input '" << node.input(i)
                 << "') must be known at import time", failure();
}

bool NodeImporter::allInputsHost() {
  for (unsigned i = 0; i < numInputs(); ++i)
    if (hasInput(i) && !hostInput(i))
      return false;
  return true;
}

Value NodeImporter::operand(unsigned i) {
  return graph.materialize(*graph.lookup(node.input(i)));
}

LogicalResult NodeImporter::requireFloat(unsigned i) {
  Type t = inputType(i).getElementType();
  if (isa<FloatType>(t))
    return success();
  return error() << "input '" << node.input(i) << "' must be a float tensor, got "
                 << t;
}

const onnx::AttributeProto *NodeImporter::attribute(StringRef name) const {
  for (const onnx::AttributeProto &a : node.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

const onnx::AttributeProto *
NodeImporter::typedAttribute(StringRef name,
                             onnx::AttributeProto::AttributeType type) const {
  const onnx::AttributeProto *a = attribute(name);
  if (!a || a->type() == type)
    return a;
  if (attributeError.empty())
    attributeError =
        ("attribute '" + name + "' must be of type " +
         onnx::AttributeProto::AttributeType_Name(type) + ", got " +
         onnx::AttributeProto::AttributeType_Name(a->type()))
            .str();
  return nullptr;
}

int64_t NodeImporter::intAttr(StringRef name, int64_t defaultValue) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::INT);
  return a ? a->i() : defaultValue;
}

float NodeImporter::floatAttr(StringRef name, float defaultValue) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::FLOAT);
  return a ? a->f() : defaultValue;
}

std::string NodeImporter::stringAttr(StringRef name,
                                     StringRef defaultValue) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::STRING);
  return a ? a->s() : defaultValue.str();
}

std::optional<SmallVector<int64_t>>
NodeImporter::intsAttr(StringRef name) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::INTS);
  if (!a)
    return std::nullopt;
  return SmallVector<int64_t>(a->ints().begin(), a->ints().end());
}

bool NodeImporter::outputUsed(unsigned i) const {
  return (int)i < node.output_size() && !node.output(i).empty() &&
         graph.isUsed(node.output(i));
}

void NodeImporter::setOutput(unsigned i, Value value) {
  if ((int)i >= node.output_size() || node.output(i).empty())
    return;
  ImportedValue v;
  v.type = cast<RankedTensorType>(value.getType());
  v.value = value;
  graph.define(node.output(i), std::move(v));
}

void NodeImporter::setOutput(unsigned i, HostTensor tensor) {
  if ((int)i >= node.output_size() || node.output(i).empty())
    return;
  ImportedValue v;
  v.type = tensor.getType();
  v.host = std::make_shared<HostTensor>(std::move(tensor));
  graph.define(node.output(i), std::move(v));
}

bool NodeImporter::splitParameter(unsigned out, unsigned in) {
  if ((int)out >= node.output_size() || node.output(out).empty() ||
      !hasInput(in))
    return false;
  return graph.splitParameter(node.input(in), node.output(out));
}

void NodeImporter::forwardInput(unsigned out, unsigned in) {
  if ((int)out >= node.output_size() || node.output(out).empty())
    return;
  ImportedValue copy = *graph.lookup(node.input(in));
  graph.define(node.output(out), std::move(copy));
}

LogicalResult NodeImporter::checkFoldSize(ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d != 0 && count > kMaxFoldElements / d)
      count = kMaxFoldElements + 1;
    else
      count *= d;
  }
  if (count > kMaxFoldElements)
    return error() << "folding this node would create a constant of more than "
                   << kMaxFoldElements << " elements";
  if (!graph.chargeFold(count))
    return error() << "folding this node would take the model's folded "
                      "constants past "
                   << kMaxTotalFoldElements << " elements in all";
  return success();
}

FailureOr<int64_t> NodeImporter::normalizeAxis(int64_t axis, int64_t rank) {
  if (rank == 0 || axis < -rank || axis >= rank)
    return error() << "axis " << axis << " is out of range for rank " << rank,
           failure();
  return axis < 0 ? axis + rank : axis;
}

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

void mlir::fastllm::registerOnnxImportDialects(DialectRegistry &registry) {
  registry.insert<model::ModelDialect, func::FuncDialect>();
}

static OwningOpRef<ModuleOp> importModel(MLIRContext *context,
                                         onnx::ModelProto &model,
                                         StringRef name, StringRef modelDir,
                                         const OnnxImportOptions &options) {
  context->loadDialect<model::ModelDialect, func::FuncDialect>();
  GraphImporter importer(context, name, modelDir, options);
  return importer.run(model);
}

static OwningOpRef<ModuleOp> parseText(MLIRContext *context, StringRef text,
                                       StringRef name, StringRef modelDir,
                                       const OnnxImportOptions &options) {
  onnx::ModelProto model;
  std::string error = parseOnnxText(text.str(), model);
  if (!error.empty())
    return mlir::emitError(FileLineColLoc::get(context, name, 0, 0))
               << "cannot parse ONNX text: " << error,
           nullptr;
  return importModel(context, model, name, modelDir, options);
}

OwningOpRef<ModuleOp>
mlir::fastllm::importOnnxBuffer(MLIRContext *context, StringRef buffer,
                                StringRef name, StringRef modelDir,
                                const OnnxImportOptions &options) {
  Location loc = FileLineColLoc::get(context, name, 0, 0);
  if (buffer.empty())
    return mlir::emitError(loc) << "the file is empty", nullptr;
  if (options.textFormat)
    return parseText(context, buffer, name, modelDir, options);
  onnx::ModelProto model;
  if (buffer.size() > INT_MAX ||
      !model.ParseFromArray(buffer.data(), (int)buffer.size()))
    return mlir::emitError(loc)
               << "not a valid ONNX model (protobuf parsing failed; the file "
                  "may be truncated)",
           nullptr;
  return importModel(context, model, name, modelDir, options);
}

OwningOpRef<ModuleOp> mlir::fastllm::importOnnxFile(MLIRContext *context,
                                                    StringRef path,
                                                    OnnxImportOptions options) {
  Location loc = FileLineColLoc::get(context, path, 0, 0);
  if (path.ends_with(".onnxtext"))
    options.textFormat = true;
  SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";

  uint64_t size = 0;
  std::string openError;
  int fd = openRegularFile(path.str(), size, openError);
  if (fd < 0)
    return mlir::emitError(loc) << openError, nullptr;
  if (size == 0) {
    ::close(fd);
    return mlir::emitError(loc) << "the file is empty", nullptr;
  }
  if (options.textFormat) {
    auto buffer = llvm::MemoryBuffer::getOpenFile(fd, path, size,
                                                  /*RequiresNullTerminator=*/true);
    ::close(fd);
    if (!buffer)
      return mlir::emitError(loc) << "cannot read the file: "
                                  << buffer.getError().message(),
             nullptr;
    return importOnnxBuffer(context, (*buffer)->getBuffer(), path, dir,
                            options);
  }

  // Binary models are parsed from a file stream, so the file's bytes are not
  // held in memory next to the parsed weights.
  onnx::ModelProto model;
  bool parsed;
  {
    google::protobuf::io::FileInputStream stream(fd);
    parsed = model.ParseFromZeroCopyStream(&stream) && stream.GetErrno() == 0;
  }
  ::close(fd);
  if (!parsed)
    return mlir::emitError(loc)
               << "not a valid ONNX model (protobuf parsing failed; the file "
                  "may be truncated)",
           nullptr;
  return importModel(context, model, path, dir, options);
}
