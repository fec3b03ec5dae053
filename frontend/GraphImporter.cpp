//===- GraphImporter.cpp - the walk over an ONNX graph ----------*- C++ -*-===//
//
// The importer walks the graph once in topological order. Every ONNX value is
// tracked as an ImportedValue: host tensors (integer initializers, Constant
// nodes and everything computed only from them and from static shapes) are
// evaluated here, float initializers become model.parameter symbols (see
// Initializers.cpp), and the rest is emitted as model-dialect ops into
// `func.func @forward`, one converter per node (Converters.cpp).
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"
#include "frontend/OnnxLibrary.h"
#include "ir/ModelDialect.h"

#include "mlir/IR/Verifier.h"
#include "llvm/Support/JSON.h"

#include <functional>
#include <queue>

using namespace mlir;
using namespace mlir::fastllm;

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
    tieFoldedRows(graph);
    nameFoldedWeights();
  }

  if (failed(bindTokenDims(graph)))
    return nullptr;
  SmallVector<Type> argTypes;
  SmallVector<const onnx::ValueInfoProto *> args;
  if (failed(declareInputs(graph, args, argTypes)))
    return nullptr;
  for (const onnx::ValueInfoProto &info : graph.value_info())
    declared[info.name()] = &info;
  for (const onnx::ValueInfoProto &info : graph.output())
    declared[info.name()] = &info;

  std::vector<bool> live = markLive(graph);
  func::FuncOp forward = createForward(args, argTypes);
  if (failed(importNodes(graph, live)) || failed(returnOutputs(graph, forward)))
    return nullptr;

  if (failed(dropUnreadParameters()) ||
      failed(decideTrainable(model, forward)) ||
      failed(checkTensorSizes(forward, args)))
    return nullptr;
  if (failed(mlir::verify(module)))
    return fileError() << "internal error: the imported IR does not verify",
           nullptr;
  return owned;
}

/// The function's arguments: the graph inputs that are not initializers
/// (older IR versions also list the initializers there).
LogicalResult GraphImporter::declareInputs(
    const onnx::GraphProto &graph,
    SmallVectorImpl<const onnx::ValueInfoProto *> &args,
    SmallVectorImpl<Type> &argTypes) {
  for (const onnx::ValueInfoProto &info : graph.input()) {
    if (values.count(info.name()))
      continue;
    if (!llvm::json::isUTF8(info.name()))
      return fileError() << "input name '" << llvm::json::fixUTF8(info.name())
                         << "' is not valid UTF-8";
    auto type = inputType(info);
    if (failed(type))
      return failure();
    argTypes.push_back(*type);
    args.push_back(&info);
  }
  return success();
}

/// Which nodes the graph's outputs depend on, by index; only those are
/// imported: a dead node costs nothing, however large the constant it would
/// fold. Records the values they read (and the outputs) as used.
std::vector<bool> GraphImporter::markLive(const onnx::GraphProto &graph) {
  std::vector<bool> live(graph.node_size(), false);
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

  for (auto [i, node] : llvm::enumerate(graph.node()))
    if (live[i])
      for (const std::string &in : node.input())
        used.insert(in);
  for (const onnx::ValueInfoProto &info : graph.output())
    used.insert(info.name());
  return live;
}

/// `func.func @forward` taking the graph inputs, its entry block the
/// builder's insertion point.
func::FuncOp
GraphImporter::createForward(ArrayRef<const onnx::ValueInfoProto *> args,
                             ArrayRef<Type> argTypes) {
  builder.setInsertionPointToEnd(module.getBody());
  auto forward = builder.create<func::FuncOp>(
      fileLoc, "forward", builder.getFunctionType(argTypes, {}));
  Block *entry = forward.addEntryBlock();
  for (auto [i, info] : llvm::enumerate(args)) {
    forward.setArgAttr(i, "model.name", builder.getStringAttr(info->name()));
    ImportedValue v;
    v.type = cast<RankedTensorType>(argTypes[i]);
    v.value = entry->getArgument(i);
    values[info->name()] = std::move(v);
  }
  builder.setInsertionPointToEnd(entry);
  return forward;
}

/// Imports the live nodes in topological order.
LogicalResult GraphImporter::importNodes(const onnx::GraphProto &graph,
                                         const std::vector<bool> &live) {
  auto order = topologicalOrder(graph);
  if (failed(order))
    return failure();
  // Unnamed nodes are called after their position in the file.
  llvm::DenseMap<const onnx::NodeProto *, size_t> position;
  for (auto [i, node] : llvm::enumerate(graph.node()))
    position[&node] = i;
  for (const onnx::NodeProto *node : *order) {
    size_t index = position.lookup(node);
    if (live[index] && failed(importNode(*node, index)))
      return failure();
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
          return fileError()
                 << "value '" << out << "' is defined more than once";
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
  std::string nodeName = node.name().empty()
                             ? node.op_type() + "#" + std::to_string(index)
                             : node.name();
  Location loc = NameLoc::get(builder.getStringAttr(nodeName), fileLoc);
  if (!node.domain().empty() && node.domain() != "ai.onnx")
    return mlir::emitError(loc)
           << "node '" << nodeName << "': op '" << node.op_type()
           << "' of domain '" << node.domain() << "' is not supported";
  const OnnxConverterEntry *entry = lookupOnnxConverter(node.op_type(), opset);
  if (!entry) {
    InFlightDiagnostic d = mlir::emitError(loc)
                           << "node '" << nodeName << "': unsupported op '"
                           << node.op_type() << "' (opset " << opset << ")";
    // Sequences and loops are what the exporter makes of shape-dependent
    // code (repeat_interleave, a loop over heads) once a dim is symbolic;
    // with every shape fixed it traces them into plain ops.
    StringRef op = node.op_type();
    if (op.starts_with("Sequence") || op == "Loop" || op == "If" ||
        op == "Scan" || op == "ConcatFromSequence" || op == "SplitToSequence")
      d << "; the exporter makes it of code whose shapes are not fixed (a "
           "symbolic dim, such as dynamic_axes or a symbolic batch): export "
           "with static shapes";
    return d;
  }
  if (std::string why = verifyOnnxNodeSchema(node, opset); !why.empty())
    return mlir::emitError(loc)
           << "node '" << nodeName << "' (" << node.op_type() << "): " << why;
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

/// Returns the graph's outputs from @forward, checked against their
/// declared types.
LogicalResult GraphImporter::returnOutputs(const onnx::GraphProto &graph,
                                           func::FuncOp forward) {
  SmallVector<Value> results;
  SmallVector<Type> resultTypes;
  for (const onnx::ValueInfoProto &info : graph.output()) {
    ImportedValue *v = lookup(info.name());
    if (!v)
      return fileError() << "graph output '" << info.name()
                         << "' is not defined";
    if (failed(checkDeclaredType(info, v->type, "graph output")))
      return failure();
    results.push_back(materialize(*v));
    resultTypes.push_back(v->type);
  }
  builder.create<func::ReturnOp>(fileLoc, results);
  forward.setFunctionType(
      builder.getFunctionType(forward.getArgumentTypes(), resultTypes));
  for (auto [i, info] : llvm::enumerate(graph.output()))
    forward.setResultAttr(i, "model.name", builder.getStringAttr(info.name()));
  return success();
}

/// Parameters nothing reads are dropped: they would be trained for nothing.
/// One the model reads must have elements.
LogicalResult GraphImporter::dropUnreadParameters() {
  for (auto param :
       llvm::make_early_inc_range(module.getOps<model::ParameterOp>()))
    if (SymbolTable::symbolKnownUseEmpty(param, module))
      param.erase();
    else if (param.getTensorType().getNumElements() == 0)
      return fileError() << "initializer '" << param.getSymName()
                         << "' has no elements (dims "
                         << shapeString(param.getTensorType().getShape())
                         << "); a weight the model reads must have some";
  return success();
}

/// Bounds every tensor: a bound dim, an Expand or a Range could otherwise
/// ask for more elements than int64 counts (the plan would wrap around).
LogicalResult
GraphImporter::checkTensorSizes(func::FuncOp forward,
                                ArrayRef<const onnx::ValueInfoProto *> args) {
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
  for (BlockArgument arg : forward.getArguments())
    if (tooLarge(arg.getType()))
      return fileError() << "input '" << args[arg.getArgNumber()]->name()
                         << "' would have more than " << kMaxTensorElements
                         << " elements: " << arg.getType();
  WalkResult walk = forward.walk([&](Operation *op) {
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
  return failure(walk.wasInterrupted());
}

//===----------------------------------------------------------------------===//
// Versions, inputs and declared types
//===----------------------------------------------------------------------===//

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

LogicalResult GraphImporter::bindTokenDims(const onnx::GraphProto &graph) {
  if (!options.batchSize && !options.seqLen)
    return success();
  const onnx::ValueInfoProto *tokens = nullptr;
  for (const onnx::ValueInfoProto &info : graph.input()) {
    if (values.count(info.name()) || !info.type().has_tensor_type())
      continue;
    Type t =
        convertOnnxElementType(context, info.type().tensor_type().elem_type());
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
                           << "', which the model fixes to " << dim.dim_value();
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
    return fileError() << "graph input '" << info.name() << "' is not a tensor";
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
      if (it == options.dimBindings.end()) {
        // A [batch, seq] integer input's dims are what `compile`'s
        // --batch-size and --seq-len bind.
        bool tokenDim = tt.shape().dim_size() == 2 && i < 2 &&
                        isa<IntegerType>(elementType);
        return fileError() << "graph input '" << info.name() << "' dim " << i
                           << " is the symbolic dim '" << dim.dim_param()
                           << "'; bind it with --bind-dim " << dim.dim_param()
                           << "=N"
                           << (!tokenDim ? ""
                               : i == 0  ? " (compile: or --batch-size N)"
                                         : " (compile: or --seq-len N)");
      }
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
      declaredShape += (i ? ", " : "") +
                       (dim.has_dim_value() ? std::to_string(dim.dim_value())
                        : dim.dim_param().empty() ? std::string("?")
                                                  : dim.dim_param());
    }
    declaredShape += "]";
    return fileError() << where << ": value '" << info.name() << "' has shape "
                       << shapeString(actual.getShape())
                       << " but the model declares " << declaredShape;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

Value GraphImporter::materialize(ImportedValue &v) {
  if (v.value)
    return v.value;
  if (v.host) {
    v.value = builder.create<model::ConstantOp>(fileLoc, v.host->toAttr());
  } else if (!v.rows.empty()) {
    auto loc = NameLoc::get(builder.getStringAttr(v.parameter), fileLoc);
    Value read = builder.create<model::GetParameterOp>(
        loc, v.parameterType, FlatSymbolRefAttr::get(context, v.parameter));
    if (v.transposed)
      read = builder.create<model::TransposeOp>(loc, read,
                                                ArrayRef<int64_t>{1, 0});
    ArrayRef<int64_t> shape = v.type.getShape();
    auto indexType = RankedTensorType::get(shape.drop_back(),
                                           builder.getIntegerType(64));
    Value indices = builder.create<model::ConstantOp>(
        loc, DenseElementsAttr::get(indexType, ArrayRef<int64_t>(v.rows)));
    v.value = builder.create<model::GatherOp>(loc, v.type, read, indices,
                                              builder.getI64IntegerAttr(0));
  } else if (v.transposed) {
    auto loc = NameLoc::get(builder.getStringAttr(v.parameter), fileLoc);
    RankedTensorType stored = RankedTensorType::get(
        {v.type.getDimSize(1), v.type.getDimSize(0)}, v.type.getElementType());
    Value read = builder.create<model::GetParameterOp>(
        loc, stored, FlatSymbolRefAttr::get(context, v.parameter));
    v.value =
        builder.create<model::TransposeOp>(loc, read, ArrayRef<int64_t>{1, 0});
  } else {
    v.value = builder.create<model::GetParameterOp>(
        NameLoc::get(builder.getStringAttr(v.parameter), fileLoc), v.type,
        FlatSymbolRefAttr::get(context, v.parameter));
  }
  return v.value;
}
