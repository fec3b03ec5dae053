//===- FoldedWeights.cpp - the identity and names of weights ----*- C++ -*-===//
//
// Exporters blur which initializer is which weight: PyTorch's exporter keeps
// one initializer for parameters of equal value and names the others as
// Identity outputs, and constant folding stores a transposed copy of a
// weight under a generated name (`onnx::MatMul_N`). The importer restores
// the model's parameters: an Identity copy becomes a parameter of its own
// (splitParameter), a folded copy a view of its weight (tieFoldedCopies),
// and a folded Linear weight gets its module's name and PyTorch's layout
// back (nameFoldedWeights).
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"
#include "ir/ModelDialect.h"

#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/JSON.h"

#include "llvm/ADT/DenseMap.h"

#include <cstring>
#include <memory>
#include <vector>

using namespace mlir;
using namespace mlir::fastllm;

/// The bytes of a parameter's f32 initial value, when held as a blob. They
/// may lie unaligned in a mapped .onnx file: elements are compared as bytes.
static ArrayRef<char> parameterBytes(model::ParameterOp p) {
  auto res =
      dyn_cast_or_null<DenseResourceElementsAttr>(p.getInitialValueAttr());
  if (!res || !p.getTensorType().getElementType().isF32())
    return {};
  AsmResourceBlob *blob = res.getRawHandle().getBlob();
  if (!blob)
    return {};
  ArrayRef<char> data = blob->getData();
  return data.take_front(data.size() / sizeof(float) * sizeof(float));
}

/// True when every 4-byte element of `data` has the bits of the first.
static bool allElementsEqual(ArrayRef<char> data) {
  if (data.size() < sizeof(float))
    return true;
  char first[sizeof(float)];
  std::memcpy(first, data.data(), sizeof(float));
  bool differs = scanBytes(data, sizeof(float), [&](ArrayRef<char> piece) {
    for (size_t k = 0; k < piece.size(); k += sizeof(float))
      if (std::memcmp(first, piece.data() + k, sizeof(float)))
        return true;
    return false;
  });
  return !differs;
}

/// True when `a` (rows x cols f32) holds the transpose of `b` (cols x rows),
/// bit for bit. In 32x32 tiles copied out of both (an element-by-element
/// walk down `b`'s columns misses the cache on every element: GPT-2's
/// 154 MB head).
static bool isTranspose(const char *a, const char *b, int64_t rows,
                        int64_t cols) {
  constexpr int64_t kTile = 32, w = sizeof(float);
  uint32_t ta[kTile][kTile], tb[kTile][kTile];
  for (int64_t i0 = 0; i0 < rows; i0 += kTile)
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      int64_t ni = std::min(kTile, rows - i0), nj = std::min(kTile, cols - j0);
      for (int64_t i = 0; i < ni; ++i)
        std::memcpy(ta[i], a + ((i0 + i) * cols + j0) * w, nj * w);
      for (int64_t j = 0; j < nj; ++j)
        std::memcpy(tb[j], b + ((j0 + j) * rows + i0) * w, ni * w);
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t j = 0; j < nj; ++j)
          if (ta[i][j] != tb[j][i])
            return false;
    }
  return true;
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
    ArrayRef<char> data = parameterBytes(copy);
    bool allEqual = allElementsEqual(data);
    releaseMappedPages(data);
    if (data.empty() || allEqual)
      continue;
    int64_t rows = type.getDimSize(0), cols = type.getDimSize(1);
    for (model::ParameterOp source : params) {
      if (source == copy || source.getSymName().starts_with("onnx::") ||
          source.getTensorType().getElementType() != type.getElementType())
        continue;
      ArrayRef<int64_t> shape = source.getTensorType().getShape();
      ArrayRef<char> src = parameterBytes(source);
      if (src.size() != data.size() || shape.size() != 2)
        continue;
      bool same = shape == type.getShape() &&
                  std::memcmp(src.data(), data.data(), data.size()) == 0;
      bool transposed = !same && shape[0] == cols && shape[1] == rows &&
                        isTranspose(data.data(), src.data(), rows, cols);
      releaseMappedPages(data);
      releaseMappedPages(src);
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
          (name + (transposed ? " = transpose(" : " = copy(") +
           source.getSymName() + ")")
              .str()));
      source->setAttr("model.folded_views", builder.getArrayAttr(views));
      // The copy's bytes go now: nothing else reads its blob (each
      // initializer has its own), and the blob manager would keep them
      // (GPT-2's tied head: 154 MB) until the context goes.
      cast<DenseResourceElementsAttr>(copy.getInitialValueAttr())
          .getRawHandle()
          .getResource()
          ->setBlob(AsmResourceBlob());
      copy.erase();
      break;
    }
  }
}

/// A 64-bit hash of `bytes` (FNV-1a), to find equal rows among many.
static uint64_t hashBytes(const char *bytes, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i)
    h = (h ^ (unsigned char)bytes[i]) * 1099511628211ull;
  return h;
}

namespace {
/// The rows of a 2-D parameter (or of its transpose: its columns), hashed,
/// to find which row a folded vector is.
struct RowIndex {
  model::ParameterOp source;
  bool columns = false;
  int64_t count = 0, width = 0; ///< rows of `width` elements
  std::vector<char> bytes;      ///< the rows, row-major (copied for columns)
  llvm::DenseMap<uint64_t, SmallVector<int64_t, 1>> byHash;

  const char *row(int64_t i) const {
    return bytes.data() + i * width * int64_t(sizeof(float));
  }
  /// The rows equal to `data` (`width` floats), bit for bit.
  SmallVector<int64_t, 1> find(const char *data) const {
    SmallVector<int64_t, 1> found;
    auto it = byHash.find(hashBytes(data, width * sizeof(float)));
    if (it != byHash.end())
      for (int64_t i : it->second)
        if (std::memcmp(row(i), data, width * sizeof(float)) == 0)
          found.push_back(i);
    return found;
  }
};
} // namespace

/// Constant folding also turns a weight's row used as a vector (a learned
/// special token `wte.weight[k]`, a [MASK] embedding added after the
/// lookup, a column `W[:, j]`) into an initializer under a generated name
/// (`onnx::Where_N`). Trained as a parameter of its own it would get no
/// weight decay and break the tie with its table; step 1's loss is equal,
/// later ones drift. A generated-name float initializer whose rows (its last
/// dim, the leading dims flattened) are each exactly one row of one 2-D
/// parameter, or one column, is read as a gather of that parameter
/// instead. Rows found in two places (duplicate rows, two parameters) are
/// left alone and marked `model.undecided` (compile refuses them unless
/// --train or --freeze decides); vectors whose elements are all equal are
/// left alone (equal values prove nothing).
void GraphImporter::tieFoldedRows(const onnx::GraphProto &graph) {
  SmallVector<model::ParameterOp> params(module.getOps<model::ParameterOp>());
  // Parameters of equal value are stored once, the others read through
  // Identity nodes (split apart later): a row of such a tensor may be a row
  // of any of them.
  llvm::StringMap<std::string> identityCopy;
  for (const onnx::NodeProto &node : graph.node())
    if (node.op_type() == "Identity" && node.input_size() == 1 &&
        node.output_size() == 1)
      identityCopy.try_emplace(node.input(0), node.output(0));
  std::vector<std::unique_ptr<RowIndex>> indexes; // built when first needed
  auto indexFor = [&](model::ParameterOp source, bool columns) -> RowIndex * {
    for (auto &ix : indexes)
      if (ix->source == source && ix->columns == columns)
        return ix.get();
    ArrayRef<int64_t> shape = source.getTensorType().getShape();
    ArrayRef<char> src = parameterBytes(source);
    auto ix = std::make_unique<RowIndex>();
    ix->source = source;
    ix->columns = columns;
    ix->count = columns ? shape[1] : shape[0];
    ix->width = columns ? shape[0] : shape[1];
    const int64_t w = sizeof(float), cols = shape[1];
    if (columns) {
      ix->bytes.resize(src.size());
      for (int64_t i = 0; i < shape[0]; ++i)
        for (int64_t j = 0; j < cols; ++j)
          std::memcpy(ix->bytes.data() + (j * shape[0] + i) * w,
                      src.data() + (i * cols + j) * w, w);
    } else {
      ix->bytes.assign(src.begin(), src.end());
    }
    releaseMappedPages(src);
    for (int64_t i = 0; i < ix->count; ++i)
      ix->byHash[hashBytes(ix->row(i), ix->width * w)].push_back(i);
    indexes.push_back(std::move(ix));
    return indexes.back().get();
  };

  for (model::ParameterOp copy : params) {
    StringRef name = copy.getSymName();
    RankedTensorType type = copy.getTensorType();
    if (!name.starts_with("onnx::") || type.getRank() < 1 ||
        !type.getElementType().isF32() || !type.hasStaticShape())
      continue;
    const int64_t width = type.getShape().back();
    ArrayRef<char> data = parameterBytes(copy);
    if (width < 2 || data.empty() || allElementsEqual(data))
      continue;
    const int64_t rows = int64_t(data.size() / sizeof(float)) / width;
    // Every match: (index, row indices); a row found twice in one index
    // makes that index ambiguous.
    struct Match {
      RowIndex *index;
      std::vector<int64_t> rows;
    };
    SmallVector<Match> matches;
    bool ambiguous = false;
    std::string repeatedIn; // a parameter in which a row appears twice
    for (model::ParameterOp source : params) {
      RankedTensorType st = source.getTensorType();
      if (source == copy || source.getSymName().starts_with("onnx::") ||
          st.getRank() != 2 || !st.getElementType().isF32() ||
          !st.hasStaticShape() || parameterBytes(source).empty())
        continue;
      for (bool columns : {false, true}) {
        if ((columns ? st.getDimSize(0) : st.getDimSize(1)) != width)
          continue;
        RowIndex *ix = indexFor(source, columns);
        Match m{ix, {}};
        for (int64_t r = 0; r < rows; ++r) {
          SmallVector<int64_t, 1> found =
              ix->find(data.data() + r * width * int64_t(sizeof(float)));
          if (found.size() != 1) {
            if (found.size() > 1 && !ambiguous) {
              ambiguous = true;
              repeatedIn = source.getSymName().str();
            }
            m.rows.clear();
            break;
          }
          m.rows.push_back(found.front());
        }
        if (!m.rows.empty())
          matches.push_back(std::move(m));
      }
    }
    releaseMappedPages(data);
    if (matches.size() != 1 || ambiguous) {
      std::string why;
      if (ambiguous)
        why = "it is a constant the exporter folded out of a row that '" +
              repeatedIn + "' holds twice, and which row cannot be told";
      else if (matches.size() > 1)
        why = "it is a constant the exporter folded out of rows of both '" +
              matches[0].index->source.getSymName().str() + "' and '" +
              matches[1].index->source.getSymName().str() + "'" +
              (matches[0].index->source == matches[1].index->source
                   ? " (rows and columns)"
                   : "");
      if (!why.empty())
        copy->setAttr("model.undecided", builder.getStringAttr(why));
      continue;
    }
    Match &m = matches.front();
    model::ParameterOp source = m.index->source;
    if (auto it = identityCopy.find(source.getSymName());
        it != identityCopy.end()) {
      copy->setAttr("model.undecided",
                    builder.getStringAttr(
                        "it is a constant the exporter folded out of rows of '" +
                        source.getSymName().str() +
                        "', which the exporter also stores for '" +
                        it->second + "' (parameters of equal value are "
                        "stored once), and whose rows cannot be told"));
      continue;
    }
    ImportedValue view;
    view.type = type;
    view.parameter = source.getSymName().str();
    view.parameterType = source.getTensorType();
    view.transposed = m.index->columns;
    view.rows = m.rows;
    std::string shown;
    for (size_t i = 0; i < m.rows.size() && i < 8; ++i)
      shown += (i ? ", " : "") + std::to_string(m.rows[i]);
    if (m.rows.size() > 8)
      shown += ", ... (" + std::to_string(m.rows.size()) + ")";
    SmallVector<Attribute> views;
    if (auto old = source->getAttrOfType<ArrayAttr>("model.folded_views"))
      views.append(old.begin(), old.end());
    views.push_back(builder.getStringAttr(
        (name + " = " + (m.index->columns ? "columns" : "rows") + " [" +
         shown + "] of " + source.getSymName())
            .str()));
    source->setAttr("model.folded_views", builder.getArrayAttr(views));
    values[name] = std::move(view);
    cast<DenseResourceElementsAttr>(copy.getInitialValueAttr())
        .getRawHandle()
        .getResource()
        ->setBlob(AsmResourceBlob());
    copy.erase();
  }
}

/// The PyTorch module path in an exporter's node name: `/h.0/c_attn/MatMul`
/// is node MatMul of module `h.0.c_attn`. A container's child is scoped by
/// its full attribute path under the container's own scope
/// (`/blocks.0/mlp/mlp.0/MatMul` for `blocks[0].mlp[0]`), so a component
/// that extends the one before it replaces it: `blocks.0.mlp.0`. Empty
/// when the node is not inside a module (`/MatMul`) or the name has no such
/// form.
static std::string modulePath(StringRef nodeName) {
  if (!nodeName.consume_front("/"))
    return {};
  size_t last = nodeName.rfind('/');
  if (last == StringRef::npos || last == 0)
    return {};
  SmallVector<StringRef> scopes, path;
  nodeName.take_front(last).split(scopes, '/');
  for (StringRef scope : scopes) {
    if (!path.empty() && scope.size() > path.back().size() &&
        scope.starts_with(path.back()) && scope[path.back().size()] == '.')
      path.back() = scope;
    else
      path.push_back(scope);
  }
  return llvm::join(path, ".");
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
  // Every proper prefix of a module path, from node scopes and named
  // modules, is a container: `blocks.0` of `blocks.0.ln`.
  auto addContainers = [&](StringRef path) {
    for (size_t dot = path.find('.'); dot != StringRef::npos;
         dot = path.find('.', dot + 1))
      containerScopes.insert(path.take_front(dot));
  };
  for (const onnx::NodeProto &node : graph.node()) {
    std::string path = modulePath(node.name());
    addContainers(path);
    if (!path.empty() && node.op_type() == "MatMul" && node.input_size() == 2 &&
        StringRef(node.input(1)).starts_with("onnx::"))
      scopeWeights[path].insert(node.input(1));
  }
  for (const auto &m : namedModules)
    addContainers(m.getKey());
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
/// when that name is taken or would be a guess. The name must be one the
/// model has, never one that only looks like it: a scope that holds other
/// modules (`blocks.0`, whose `ln` is a module) is a module calling
/// `F.linear` or a submodule's `forward` itself, not a Linear; a scope whose
/// MatMul nodes read several weights is no single Linear either; and a
/// scope that several named modules fit (`layers.0.fc` of both
/// `enc.layers.0.fc` and `dec.layers.0.fc`) cannot be told. Each keeps the
/// exporter's name. (A scope that skipped a container the model calls
/// through, an `nn.ModuleDict` indexed in a lambda, cannot be seen in the
/// file: the export helper keeps every name.)
std::string GraphImporter::claimWeightName(StringRef path) {
  if (containerScopes.contains(path))
    return {};
  if (auto it = scopeWeights.find(path);
      it != scopeWeights.end() && it->second.size() > 1)
    return {};
  std::string full;
  int fits = 0;
  for (const auto &m : namedModules)
    if (scopeMatches(path, m.getKey()) && ++fits == 1)
      full = m.getKey().str();
  if (fits > 1 && !namedModules.contains(path))
    return {};
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

/// See NodeImporter::splitParameter.
bool GraphImporter::splitParameter(StringRef from, StringRef to) {
  ImportedValue *source = lookup(from);
  if (options.keepSharedInitializers || !source || source->parameter.empty() ||
      values.count(to) || module.lookupSymbol(to) || !llvm::json::isUTF8(to) ||
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
  else if (!copyModule.empty()) // as nameFoldedWeights does
    copy->setAttr(model::kModuleScopeAttr, builder.getStringAttr(copyModule));
  // The same bytes, in the same layout.
  if (original->hasAttr(kInitialValueTransposedAttr))
    copy->setAttr(kInitialValueTransposedAttr, builder.getUnitAttr());
  ImportedValue v;
  v.type = source->type;
  v.parameter = name;
  v.transposed = source->transposed;
  values[to] = std::move(v);
  return true;
}

/// Transposes the rows x cols elements of `width` bytes in `bytes` where
/// they are (one scratch copy). In 32x32 tiles: a row-by-row transpose of a
/// 768x2304 matrix misses the cache on every element.
static void transposeInPlace(MutableArrayRef<char> bytes, int64_t rows,
                             int64_t cols, size_t width) {
  std::vector<char> scratch(bytes.begin(), bytes.end());
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile)
    for (int64_t j0 = 0; j0 < cols; j0 += kTile)
      for (int64_t i = i0; i < std::min(rows, i0 + kTile); ++i)
        for (int64_t j = j0; j < std::min(cols, j0 + kTile); ++j)
          std::memcpy(&bytes[(j * rows + i) * width],
                      &scratch[(i * cols + j) * width], width);
}

void GraphImporter::nameFoldedWeights() {
  SmallVector<model::ParameterOp> params(module.getOps<model::ParameterOp>());
  for (model::ParameterOp param : params) {
    StringRef old = param.getSymName();
    RankedTensorType type = param.getTensorType();
    auto res = dyn_cast_or_null<DenseResourceElementsAttr>(
        param.getInitialValueAttr());
    if (!old.starts_with("onnx::") || type.getRank() != 2 || !res ||
        !res.getRawHandle().getBlob())
      continue;
    std::string path = matmulModule(old);
    std::string name = path.empty() ? std::string() : claimWeightName(path);
    if (name.empty()) {
      // Kept under the exporter's name, its module is still known: the
      // weights file says it, so that tools/fastllm_weights.py can tell
      // apart tensors of equal initial values (the layers of an
      // nn.TransformerEncoder, deep copies of one) by where they are read.
      if (!path.empty())
        param->setAttr(model::kModuleScopeAttr, builder.getStringAttr(path));
      continue;
    }
    // Transpose the bytes where they are (one scratch copy of this tensor),
    // or, when they lie in a read-only mapping of external data, when they
    // are written out (kInitialValueTransposedAttr).
    int64_t rows = type.getDimSize(0), cols = type.getDimSize(1);
    AsmResourceBlob *blob = res.getRawHandle().getBlob();
    bool inPlace = blob->isMutable();
    if (inPlace)
      transposeInPlace(blob->getMutableData(), rows, cols,
                       byteWidth(type.getElementType()));
    auto stored = RankedTensorType::get({cols, rows}, type.getElementType());
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointAfter(param);
    auto renamed = builder.create<model::ParameterOp>(
        NameLoc::get(builder.getStringAttr(name), fileLoc), name, stored,
        DenseResourceElementsAttr::get(stored, res.getRawHandle()));
    renamed->setAttr("model.folded_from", builder.getStringAttr(old));
    if (!inPlace)
      renamed->setAttr(kInitialValueTransposedAttr, builder.getUnitAttr());
    ImportedValue view;
    view.type = type;
    view.parameter = name;
    view.transposed = true;
    values[old] = std::move(view);
    param.erase();
  }
}
