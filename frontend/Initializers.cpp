//===- Initializers.cpp - initializers to parameters ------------*- C++ -*-===//
//
// Float initializers become model.parameter symbols whose bytes are moved
// (not copied) out of the protobuf into a resource blob; the others become
// host tensors, folded like any constant. Once the graph is imported, each
// parameter is trained or frozen (decideTrainable).
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"
#include "ir/ModelDialect.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/JSON.h"

#include <cmath>
#include <cstring>

using namespace mlir;
using namespace mlir::fastllm;

LogicalResult GraphImporter::importInitializers(onnx::GraphProto &graph) {
  if (graph.sparse_initializer_size())
    return fileError() << "sparse initializers are not supported ('"
                       << graph.sparse_initializer(0).values().name() << "')";
  for (auto [index, tensor] : llvm::enumerate(*graph.mutable_initializer())) {
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

    // The bytes: external data (mapped), raw_data left in the mapped model
    // file or taken over from the proto, or a copy of the typed fields
    // (small tensors only, in practice).
    TensorBytes bytes;
    std::optional<ArrayRef<char>> inFile;
    if (index < mappedRawData.size())
      inFile = mappedRawData[index];
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
      auto ext = readExternalData(tensor, expected, width,
                                  "initializer '" + tname + "'");
      if (failed(ext))
        return failure();
      bytes = std::move(*ext);
    } else if (inFile) {
      if (inFile->size() != expected)
        return error() << "has " << inFile->size()
                       << " bytes of data but its dims "
                       << shapeString(type->getShape()) << " need " << expected;
      bytes = {*inFile, modelFile, /*mapped=*/true};
    } else if (tensor.has_raw_data() && tensor.raw_data().size() == expected) {
      std::shared_ptr<std::string> owned(tensor.release_raw_data());
      bytes = {ArrayRef<char>(owned->data(), owned->size()), std::move(owned)};
    } else {
      auto copied = tensorProtoBytes(tensor, *type, error);
      if (failed(copied))
        return failure();
      std::shared_ptr<std::string> owned(std::move(*copied));
      bytes = {ArrayRef<char>(owned->data(), owned->size()), std::move(owned)};
    }

    ImportedValue value;
    value.type = *type;
    if (isa<FloatType>(elementType)) {
      // A weight: its bytes become the parameter's resource blob, held once
      // (the blob keeps their owner alive).
      // nameFoldedWeights transposes a weight in place unless it is mapped.
      // Raw data inside a mapped .onnx lies wherever protobuf put it: its
      // readers load elements with memcpy, and the blob says how aligned it
      // is.
      size_t alignment =
          reinterpret_cast<uintptr_t>(bytes.data.data()) % width ? 1 : width;
      AsmResourceBlob blob(
          bytes.data, alignment,
          [owner = std::move(bytes.owner)](void *, size_t, size_t) mutable {
            owner.reset();
          },
          /*dataIsMutable=*/!bytes.mapped);
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
      value.host = std::make_shared<HostTensor>(
          decodeHost(*type, StringRef(bytes.data.data(), bytes.data.size())));
    }
    values[tname] = std::move(value);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Trained or frozen
//===----------------------------------------------------------------------===//

/// True when some element of `data`, read as UInt, has all the bits of
/// `exponent` set (an infinity or a NaN). Blocks of 4096 elements without an
/// early exit inside, so the compiler vectorises the scan.
template <typename UInt>
static bool anyExponentAllOnes(ArrayRef<char> data, UInt exponent) {
  size_t n = data.size() / sizeof(UInt);
  for (size_t i0 = 0; i0 < n; i0 += 4096) {
    size_t i1 = std::min(n, i0 + 4096);
    bool found = false;
    for (size_t i = i0; i < i1; ++i) {
      UInt bits;
      std::memcpy(&bits, data.data() + i * sizeof(UInt), sizeof(UInt));
      found |= (bits & exponent) == exponent;
    }
    if (found)
      return true;
  }
  return false;
}

/// True when `data`, elements of type `t`, holds an infinity or a NaN.
static bool anyNonFinite(ArrayRef<char> data, Type t) {
  if (t.isF32())
    return anyExponentAllOnes<uint32_t>(data, 0x7F800000u);
  if (t.isF64())
    return anyExponentAllOnes<uint64_t>(data, 0x7FF0000000000000ull);
  if (t.isF16())
    return anyExponentAllOnes<uint16_t>(data, 0x7C00);
  if (t.isBF16())
    return anyExponentAllOnes<uint16_t>(data, 0x7F80);
  return false;
}

/// True when the parameter's initial value holds an infinity or a NaN (an
/// additive `-inf` attention mask, say): such a tensor is not a weight.
static bool holdsNonFinite(model::ParameterOp p) {
  auto res =
      dyn_cast_or_null<DenseResourceElementsAttr>(p.getInitialValueAttr());
  AsmResourceBlob *blob = res ? res.getRawHandle().getBlob() : nullptr;
  if (!blob)
    return false;
  Type type = p.getTensorType().getElementType();
  bool found =
      scanBytes(blob->getData(), byteWidth(type), [&](ArrayRef<char> piece) {
        return anyNonFinite(piece, type);
      });
  releaseMappedPages(blob->getData());
  return found;
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
    llvm::StringSet<> &into = isTrainable ? trainable.emplace() : frozen;
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

  auto isFloat = [](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && isa<FloatType>(t.getElementType());
  };
  // The parameters a walk back from the return reaches through float
  // operands of ops with a float result; with `throughSinCos` false, not
  // past sin and cos: what the loss reaches only through them is an angle
  // table (rotary or positional frequencies, computed from a buffer that
  // constant folding may have folded with them), which PyTorch keeps in
  // buffers, not weights.
  Block &body = forward.getBody().front();
  auto reachedFromLoss = [&](bool throughSinCos) {
    llvm::DenseSet<Value> needed;
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
      if (!throughSinCos && isa<model::SinOp, model::CosOp>(op))
        continue;
      for (Value v : op.getOperands())
        if (isFloat(v))
          needed.insert(v);
    }
    return reached;
  };
  llvm::StringSet<> reached = reachedFromLoss(true);
  llvm::StringSet<> reachedDirectly = reachedFromLoss(false);

  for (auto param : module.getOps<model::ParameterOp>()) {
    StringRef name = param.getSymName();
    std::string reason;
    // The list cannot name what the exporter named (a folded weight, renamed
    // after its module or not): those are judged as without a list.
    bool exporterNamed =
        name.starts_with("onnx::") || param->hasAttr("model.folded_from");
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
    if (reason.empty()) {
      // Without the exporter's list, a table read only through sin and
      // cos is a buffer in all likelihood, but not for certain (a learned
      // frequency): compile asks (passes/Autodiff.cpp).
      if ((!trainable || exporterNamed) && !reachedDirectly.contains(name))
        param->setAttr("model.undecided",
                       builder.getStringAttr(
                           "the loss reads it only through sin and cos, as "
                           "a rotary or positional frequency table that "
                           "PyTorch keeps in a buffer"));
      continue;
    }
    param.setFrozen(true);
    param->setAttr("model.constant_reason", builder.getStringAttr(reason));
  }
  return success();
}
