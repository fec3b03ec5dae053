//===- CppEmitter.cpp - the CPU and CUDA emitter --------------------------===//
//
// One kernel call per op of @train_step, in program order. Every tensor is a
// pointer: into the arena at its planned offset (activations, and the weight
// or gradient a parameter read or accumulation names), to a static array
// (model.constant; CUDA: a __device__ array), or to its source
// (model.reshape). A pointwise op becomes one `elementwise` call with a
// functor; a model.fused_elementwise one call whose functor runs its body's
// ops in order on locals. The CUDA source
// makes the same calls on the CUDA kernel library, whose calls enqueue work on
// one stream; the loss is read back after the stream finishes.
//
//===----------------------------------------------------------------------===//

#include "codegen/CppEmitter.h"
#include "ir/ModelDialect.h"
#include "ir/Plan.h"
#include "runtime/ModelABI.h"
#include "runtime/Safetensors.h"
#include "runtime/Philox.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Traits.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/Path.h"


using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {

RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

int64_t product(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Row-major strides of `operand` as seen from a broadcast result of rank
/// `rank` (0 where the operand is broadcast).
SmallVector<int64_t> broadcastStrides(ArrayRef<int64_t> operand, int64_t rank) {
  SmallVector<int64_t> strides(rank, 0);
  int64_t stride = 1;
  for (int64_t i = (int64_t)operand.size() - 1; i >= 0; --i) {
    int64_t dst = rank - (int64_t)operand.size() + i;
    strides[dst] = operand[i] == 1 ? 0 : stride;
    stride *= operand[i];
  }
  return strides;
}

/// A C++ string literal holding exactly the bytes of `s`, whatever they are.
/// Only letters, digits, space and a few punctuation characters that mean
/// nothing inside a literal are written as themselves; every other byte
/// (quotes, backslashes, '?' of trigraphs, control characters, NUL, UTF-8)
/// is a three-digit octal escape, which never combines with what follows.
/// This is the only way text from the input reaches generated code.
std::string cString(StringRef s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (llvm::isAlnum(c) || StringRef("_.-/:+=, ").contains(c)) {
      out += char(c);
      continue;
    }
    out += '\\';
    out += char('0' + ((c >> 6) & 7));
    out += char('0' + ((c >> 3) & 7));
    out += char('0' + (c & 7));
  }
  return out + "\"";
}

std::string list(ArrayRef<int64_t> values) {
  std::string s = "{";
  for (auto [i, v] : llvm::enumerate(values))
    s += (i ? ", " : "") + std::to_string(v);
  if (values.empty())
    s += "0"; // zero-length arrays are not C++
  return s + "}";
}

class StepEmitter {
public:
  StepEmitter(ModuleOp module, Target target, raw_ostream &out)
      : module(module), desc(TargetDescription::get(target)), out(out) {}
  LogicalResult emit();

private:
  FailureOr<std::string> cType(Type type, Operation *where);
  /// The type a functor computes in for stored type `stored`: bf16 operands
  /// are widened to float, so a functor computes in fp32 and its result is
  /// rounded once when stored.
  std::string computeType(const std::string &stored) const {
    return !desc.bf16Type.empty() && stored == desc.bf16Type ? "float"
                                                               : stored;
  }
  LogicalResult emitConstants(func::FuncOp step);
  LogicalResult emitPlan(const MemoryPlan &plan);
  LogicalResult emitOp(Operation *op);
  /// One `elementwise` call computing `op`'s result from its operands with
  /// a functor whose body is `functorBody` (statements on x0, x1, ...).
  LogicalResult emitElementwise(Operation *op, const std::string &functorBody);
  /// A `call` (matmul, addMatmul) of op(lhs)·op(rhs) into `out`.
  void emitMatmul(StringRef call, const std::string &out, Value lhs, Value rhs,
                  bool transA, bool transB, const std::string &comment);
  /// The C++ expression of a pointwise op on its operands x0, x1, ...
  FailureOr<std::string> pointwiseExpr(Operation *op);
  /// The functor body of a fused op: its ops in order, one local each.
  FailureOr<std::string> fusedBody(FusedElementwiseOp fused);
  std::string name(Value v) { return names.lookup(v); }
  /// How a comment refers to parameter `symbol`: by its index in kParams,
  /// never by its name (names come from the input: only cString() may print
  /// them).
  std::string paramRef(StringRef symbol) const {
    auto it = paramIndex.find(symbol);
    return it == paramIndex.end() ? std::string("parameter")
                                  : "kParams[" + std::to_string(it->second) + "]";
  }
  /// Declares the pointer for result `i` of `op` at its planned offset.
  LogicalResult bindResult(Operation *op, unsigned i);

  ModuleOp module;
  const TargetDescription &desc;
  raw_ostream &out;
  /// Sections are written here first and assembled into `out` at the end.
  std::string text;
  llvm::raw_string_ostream os{text};
  DenseMap<Value, std::string> names;
  DenseSet<Value> splats; ///< 1-element arrays standing for a splat
  unsigned counter = 0;
  std::string constants;
  std::string constantPointers; ///< CUDA: the step's pointers to them
  std::optional<MemoryPlan> plan; ///< the module's, read once
  int64_t microBatch = 1; ///< samples per micro-batch: the tokens' rows
  llvm::StringMap<std::string> functors; ///< signature and body -> name
  std::string functorDefs;
  llvm::StringMap<int> paramIndex; ///< parameter symbol -> index in kParams
};
} // namespace

FailureOr<std::string> StepEmitter::cType(Type type, Operation *where) {
  if (type.isF32())
    return std::string("float");
  if (type.isF64())
    return std::string("double");
  if (type.isBF16() && !desc.bf16Type.empty())
    return desc.bf16Type.str();
  if (type.isInteger(64))
    return std::string("int64_t");
  if (type.isInteger(32))
    return std::string("int32_t");
  if (type.isInteger(8))
    return std::string("int8_t");
  if (type.isInteger(1))
    return std::string("bool");
  return where->emitOpError("element type ")
         << type << " is not supported by the " << desc.name
         << " target", failure();
}

LogicalResult StepEmitter::bindResult(Operation *op, unsigned i) {
  auto offsets = op->getAttrOfType<DenseI64ArrayAttr>(kResultOffsetsAttr);
  if (!offsets || (int64_t)i >= offsets.size() || offsets[i] < 0)
    return op->emitOpError("has no planned buffer; run fastllm-plan-memory");
  Value r = op->getResult(i);
  auto type = cType(tensorType(r).getElementType(), op);
  if (failed(type))
    return failure();
  std::string n = "v" + std::to_string(counter++);
  names[r] = n;
  os << "  " << *type << " *" << n << " = reinterpret_cast<" << *type
     << " *>(arena + " << offsets[i] << ");\n";
  return success();
}

LogicalResult StepEmitter::emitConstants(func::FuncOp step) {
  llvm::raw_string_ostream cs(constants);
  for (auto c : step.getOps<ConstantOp>()) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense)
      return c.emitOpError("only dense constants are supported by the ")
             << desc.name << " target";
    auto type = cType(dense.getElementType(), c);
    if (failed(type))
      return failure();
    std::string n = "c" + std::to_string(names.size());
    names[c.getResult()] = n;
    int64_t count = dense.isSplat() ? 1 : dense.getNumElements();
    if (dense.isSplat())
      splats.insert(c.getResult());
    // CUDA: the array lives on the device as gN; the step names it through
    // a pointer cN it looks up once.
    if (desc.constantsOnDevice) {
      cs << "__device__ const " << *type << " g" << n.substr(1) << "[" << count
         << "] = {";
      constantPointers += "  static const " + *type + " *" + n +
                          " = deviceAddress(g" + n.substr(1) + ");\n";
    } else {
      cs << "alignas(64) const " << *type << " " << n << "[" << count
         << "] = {";
    }
    auto print = [&](int64_t k) {
      if (k)
        cs << ", ";
      Type et = dense.getElementType();
      if (et.isBF16()) {
        // Its bits: a __device__ array needs a constant initializer, and
        // only the raw form of __nv_bfloat16 has a constexpr constructor.
        APFloat f = dense.getValues<APFloat>()[k];
        cs << "__nv_bfloat16_raw{"
           << llvm::format_hex(f.bitcastToAPInt().getZExtValue(), 6) << "}";
      } else if (isa<FloatType>(et)) {
        APFloat f = dense.getValues<APFloat>()[k];
        double d = f.convertToDouble();
        if (std::isnan(d))
          cs << "NAN";
        else if (std::isinf(d))
          cs << (d < 0 ? "-INFINITY" : "INFINITY");
        else
          cs << llvm::format("%.9e", d) << (et.isF32() ? "f" : "");
      } else if (et.isInteger(1)) {
        cs << (dense.getValues<bool>()[k] ? "1" : "0");
      } else {
        cs << dense.getValues<APInt>()[k].getSExtValue();
        if (et.isInteger(64))
          cs << "LL";
      }
    };
    for (int64_t k = 0; k < count; ++k)
      print(k);
    cs << "};\n";
  }
  return success();
}

LogicalResult StepEmitter::emitPlan(const MemoryPlan &plan) {
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (plan.vocabSize < 1 || plan.batchSize < 1)
    return module.emitError("the plan has no data sizes; run "
                            "fastllm-prepare-emission");
  auto argName = [&](int64_t i) {
    auto n = step.getArgAttrOfType<StringAttr>(i, "model.name");
    return n ? n.getValue().str() : "arg" + std::to_string(i);
  };

  // The tables: rows of a few numbers each, in the order of the members of
  // runtime/ModelABI.h's ParamInfo, StageInfo and SlotInfo (named in a
  // comment above each table).
  os << "// {name, nameBytes, rank, shape, numel, offset, trainable, "
        "weightDecay}\n"
     << "const ParamInfo kParams[] = {\n";
  int numParams = 0;
  for (auto p : module.getOps<ParameterOp>()) {
    RankedTensorType t = p.getTensorType();
    auto offset = p->getAttrOfType<IntegerAttr>(kParamOffsetAttr);
    auto decay = p->getAttrOfType<BoolAttr>(kWeightDecayAttr);
    if (!offset || !decay)
      return p.emitOpError("has no planned offset or weight decay; run "
                           "fastllm-plan-memory and fastllm-prepare-emission");
    if (t.getRank() > 8)
      return p.emitOpError("has rank ") << t.getRank() << "; at most 8 is supported";
    paramIndex[p.getSymName()] = numParams;
    os << "    {" << cString(p.getSymName()) << ", " << p.getSymName().size()
       << ", " << t.getRank() << ", "
       << list(t.getShape()) << ", " << t.getNumElements() << ", "
       << offset.getInt() << ", " << (p.getFrozen() ? 0 : 1) << ", "
       << (decay.getValue() ? 1 : 0) << "},\n";
    ++numParams;
  }
  if (!numParams)
    os << "    {\"\", 0, 0, {0}, 0, 0, 0, 0},\n";
  os << "};\n\n";
  os << "// {offset, elements, gradSlot, weightSlot}\n"
     << "const StageInfo kStages[] = {\n";
  for (int64_t k = 0; k < plan.numStages(); ++k)
    os << "    {" << plan.stageOffsets[k] << ", " << plan.stageElements[k]
       << ", " << plan.stageGradSlot[k] << ", " << plan.stageWeightSlot[k]
       << "},\n";
  if (!plan.numStages())
    os << "    {0, 0, -1, -1},\n";
  os << "};\n\n";
  auto slots = [&](StringRef name, ArrayRef<int64_t> offsets,
                   ArrayRef<int64_t> elements) {
    os << "// {offset, elements}\n"
       << "const SlotInfo " << name << "[] = {\n";
    for (size_t i = 0; i < offsets.size(); ++i)
      os << "    {" << offsets[i] << ", " << elements[i] << "},\n";
    if (offsets.empty())
      os << "    {0, 0},\n";
    os << "};\n\n";
  };
  slots("kGradSlots", plan.gradSlotOffsets, plan.gradSlotElements);
  slots("kWeightSlots", plan.weightSlotOffsets, plan.weightSlotElements);

  // PlanInfo by member name: the plan's scalars from runtime/PlanFields.def,
  // then the rest.
  os << "PlanInfo makePlan() {\n"
     << "  PlanInfo p{};\n"
     << "  p.abiVersion = kAbiVersion;\n";
#define FASTLLM_PLAN_FIELD(type, name, key, none, doc)                         \
  os << "  p." #name " = " << plan.name << ";\n";
#include "runtime/PlanFields.def"
  os << "  p.target = \"" << desc.name << "\";\n"
     << "  p.tokensInput = " << cString(argName(plan.tokensArg)) << ";\n"
     << "  p.targetsInput = " << cString(argName(plan.targetsArg)) << ";\n"
     << "  p.numParams = " << numParams << ";\n"
     << "  p.params = kParams;\n"
     << "  p.numStages = " << plan.numStages() << ";\n"
     << "  p.stages = kStages;\n"
     << "  p.numGradSlots = " << plan.gradSlotOffsets.size() << ";\n"
     << "  p.gradSlots = kGradSlots;\n"
     << "  p.numWeightSlots = " << plan.weightSlotOffsets.size() << ";\n"
     << "  p.weightSlots = kWeightSlots;\n"
     << "  return p;\n"
     << "}\n";
  return success();
}

FailureOr<std::string> StepEmitter::pointwiseExpr(Operation *op) {
  auto cmpExpr = [](CmpPredicate p) -> const char * {
    switch (p) {
    case CmpPredicate::eq: return "x0 == x1";
    case CmpPredicate::ne: return "x0 != x1";
    case CmpPredicate::lt: return "x0 < x1";
    case CmpPredicate::le: return "x0 <= x1";
    case CmpPredicate::gt: return "x0 > x1";
    case CmpPredicate::ge: return "x0 >= x1";
    }
    return "false";
  };
  auto gelu = [](GeluApproximation a, StringRef call) {
    return (call + (a == GeluApproximation::tanh ? ", true)" : ", false)")).str();
  };
  if (auto cast = dyn_cast<CastOp>(op)) {
    Type to = tensorType(cast.getResult()).getElementType();
    if (to.isInteger(1))
      return std::string("x0 != 0");
    // The stored type, even in a fused body: a cast to bf16 rounds.
    auto type = cType(to, op);
    if (failed(type))
      return failure();
    return "static_cast<" + *type + ">(x0)";
  }
  std::string expr =
      llvm::TypeSwitch<Operation *, std::string>(op)
          .Case<AddOp>([](auto) { return "x0 + x1"; })
          .Case<SubOp>([](auto) { return "x0 - x1"; })
          .Case<MulOp>([](auto) { return "x0 * x1"; })
          .Case<DivOp>([](auto) { return "x0 / x1"; })
          .Case<PowOp>([](auto) { return "std::pow(x0, x1)"; })
          .Case<AndOp>([](auto) { return "x0 && x1"; })
          .Case<OrOp>([](auto) { return "x0 || x1"; })
          .Case<NotOp>([](auto) { return "!x0"; })
          .Case<CmpOp>([&](CmpOp o) { return cmpExpr(o.getPredicate()); })
          .Case<SelectOp>([](auto) { return "x0 ? x1 : x2"; })
          .Case<SqrtOp>([](auto) { return "std::sqrt(x0)"; })
          .Case<RsqrtOp>([](auto) { return "1.0f / std::sqrt(x0)"; })
          .Case<ReciprocalOp>([](auto) { return "1.0f / x0"; })
          .Case<NegOp>([](auto) { return "-x0"; })
          .Case<ExpOp>([](auto) { return "fastExp(x0)"; })
          .Case<LogOp>([](auto) { return "std::log(x0)"; })
          .Case<TanhOp>([](auto) { return "fastTanh(x0)"; })
          .Case<ErfOp>([](auto) { return "fastErf(x0)"; })
          .Case<SigmoidOp>([](auto) { return "sigmoid(x0)"; })
          .Case<ReluOp>([](auto) { return "x0 > 0.0f ? x0 : 0.0f"; })
          .Case<SiluOp>([](auto) { return "silu(x0)"; })
          .Case<SinOp>([](auto) { return "std::sin(x0)"; })
          .Case<CosOp>([](auto) { return "std::cos(x0)"; })
          .Case<GeluOp>([&](GeluOp o) {
            return gelu(o.getApproximate(), "gelu(x0");
          })
          .Case<GeluGradOp>([&](GeluGradOp o) {
            return gelu(o.getApproximate(), "geluGrad(x0, x1");
          })
          .Case<BroadcastOp>([](auto) { return "x0"; })
          .Default([](Operation *) { return ""; });
  if (expr.empty())
    return op->emitOpError("has no pointwise expression"), failure();
  return expr;
}

/// `expr` with each operand placeholder xI (an identifier of its own)
/// replaced by names[I].
static std::string substituteOperands(StringRef expr,
                                      ArrayRef<std::string> names) {
  std::string out;
  auto isIdent = [](char c) { return llvm::isAlnum(c) || c == '_'; };
  for (size_t i = 0; i < expr.size();) {
    size_t digits = i + 1;
    while (digits < expr.size() && llvm::isDigit(expr[digits]))
      ++digits;
    bool placeholder = expr[i] == 'x' && digits > i + 1 &&
                       (i == 0 || !isIdent(expr[i - 1])) &&
                       (digits == expr.size() || !isIdent(expr[digits]));
    if (!placeholder) {
      out += expr[i++];
      continue;
    }
    unsigned index;
    expr.slice(i + 1, digits).getAsInteger(10, index);
    out += names[index];
    i = digits;
  }
  return out;
}

FailureOr<std::string> StepEmitter::fusedBody(FusedElementwiseOp fused) {
  // One local per op in the compute type of its result (bf16 ones in float:
  // not rounded between the ops), the inputs being x0, x1, ...
  Block &body = fused.getBody().front();
  DenseMap<Value, std::string> local;
  for (BlockArgument arg : body.getArguments())
    local[arg] = "x" + std::to_string(arg.getArgNumber());
  std::string text;
  for (Operation &op : body.without_terminator()) {
    auto expr = pointwiseExpr(&op);
    auto type = cType(tensorType(op.getResult(0)).getElementType(), &op);
    if (failed(expr) || failed(type))
      return failure();
    SmallVector<std::string> operands;
    for (Value v : op.getOperands())
      operands.push_back(local.lookup(v));
    std::string t = "t" + std::to_string(local.size() - body.getNumArguments());
    text += computeType(*type) + " " + t + " = " +
            substituteOperands(*expr, operands) + ";\n    ";
    local[op.getResult(0)] = t;
  }
  return text + "return " +
         local.lookup(cast<YieldOp>(body.getTerminator()).getValue()) + ";";
}

LogicalResult StepEmitter::emitElementwise(Operation *op,
                                          const std::string &functorBody) {
  Value r = op->getResult(0);
  ArrayRef<int64_t> shape = tensorType(r).getShape();
  int64_t rank = shape.size();
  if (failed(bindResult(op, 0)))
    return failure();
  os << "  {\n    static const int64_t shape[] = " << list(shape) << ";\n";
  SmallVector<std::string> params, operands;
  for (auto [i, v] : llvm::enumerate(op->getOperands())) {
    SmallVector<int64_t> strides =
        splats.count(v) ? SmallVector<int64_t>(rank, 0)
                        : broadcastStrides(tensorType(v).getShape(), rank);
    auto type = cType(tensorType(v).getElementType(), op);
    if (failed(type))
      return failure();
    os << "    static const int64_t s" << i << "[] = " << list(strides) << ";\n";
    params.push_back(computeType(*type) + " x" + std::to_string(i));
    operands.push_back("In<" + *type + ">{" + name(v) + ", s" +
                       std::to_string(i) + "}");
  }
  // One functor per distinct expression and signature: every call site
  // with the same one shares a single template instantiation, which keeps
  // the generated file quick to compile.
  auto storedOutType = cType(tensorType(r).getElementType(), op);
  if (failed(storedOutType))
    return failure();
  std::string outType = computeType(*storedOutType);
  std::string signature = outType + " operator()(" + llvm::join(params, ", ") +
                          ") const";
  auto [it, inserted] = functors.try_emplace(
      signature + functorBody, "F" + std::to_string(functors.size()));
  if (inserted)
    functorDefs += "struct " + it->second + " {\n  " +
                   desc.functorQualifier.str() +
                   signature + " {\n    " + functorBody + "\n  }\n};\n";
  os << "    elementwise(" << name(r) << ", " << rank << ", shape, "
     << it->second << "{}, ";
  llvm::interleaveComma(operands, os);
  os << ");\n  }\n";
  return success();
}

void StepEmitter::emitMatmul(StringRef call, const std::string &out, Value lhs,
                            Value rhs, bool transA, bool transB,
                            const std::string &comment) {
  ArrayRef<int64_t> a = tensorType(lhs).getShape(),
                    b = tensorType(rhs).getShape();
  // A transposed operand is stored [..., K, M] (lhs) or [..., N, K] (rhs);
  // its batch strides are the same as the product's view.
  int64_t m = transA ? a.back() : a[a.size() - 2];
  int64_t k = transA ? a[a.size() - 2] : a.back();
  int64_t n = transB ? b[b.size() - 2] : b.back();
  SmallVector<int64_t> batch;
  OpTrait::util::getBroadcastedShape(a.drop_back(2), b.drop_back(2), batch);
  int64_t batchRank = batch.size();
  auto batchStrides = [&](ArrayRef<int64_t> s) {
    SmallVector<int64_t> full = broadcastStrides(s, batchRank + 2);
    return SmallVector<int64_t>(ArrayRef<int64_t>(full).take_front(batchRank));
  };
  os << "  {\n    static const int64_t bs[] = " << list(batch)
     << ", as[] = " << list(batchStrides(a)) << ", bs2[] = "
     << list(batchStrides(b)) << ";\n    " << call << "(" << out << ", "
     << name(lhs) << ", " << name(rhs) << ", " << batchRank << ", bs, as, bs2, "
     << m << ", " << n << ", " << k << ", " << (transA ? "true" : "false")
     << ", " << (transB ? "true" : "false") << ");" << comment << "\n  }\n";
}

LogicalResult StepEmitter::emitOp(Operation *op) {
  auto shapeOf = [](Value v) { return tensorType(v).getShape(); };
  auto bindAll = [&]() -> LogicalResult {
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      if (failed(bindResult(op, i)))
        return failure();
    return success();
  };
  auto idxType = [&](Value v) {
    return tensorType(v).getElementType().isInteger(64) ? "int64_t" : "int32_t";
  };
  auto reductionName = [](LossReduction r) {
    switch (r) {
    case LossReduction::none: return "Reduction::None";
    case LossReduction::sum: return "Reduction::Sum";
    case LossReduction::mean: return "Reduction::Mean";
    }
    return "Reduction::Mean";
  };
  auto ignoreArgs = [](std::optional<int64_t> ignore) {
    return ignore ? "true, " + std::to_string(*ignore) : std::string("false, 0");
  };
  // Rows and columns of a normalisation over dims [dim, rank).
  auto rowsCols = [&](Value x, int64_t dim) {
    ArrayRef<int64_t> s = shapeOf(x);
    return std::to_string(product(s.take_front(dim))) + ", " +
           std::to_string(product(s.drop_front(dim)));
  };
  auto outerNInner = [&](Value x, int64_t dim) {
    ArrayRef<int64_t> s = shapeOf(x);
    return std::to_string(product(s.take_front(dim))) + ", " +
           std::to_string(s[dim]) + ", " +
           std::to_string(product(s.drop_front(dim + 1)));
  };

  if (op->hasTrait<PointwiseTrait>()) {
    auto expr = pointwiseExpr(op);
    return failed(expr) ? failure()
                        : emitElementwise(op, "return " + *expr + ";");
  }
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<ConstantOp>([&](auto) { return success(); })
      .Case<GetParameterOp>([&](GetParameterOp get) {
        auto offsets = get->getAttrOfType<DenseI64ArrayAttr>(kResultOffsetsAttr);
        if (!offsets || offsets.size() != 1)
          return get.emitOpError("has no planned address; run fastllm-plan-memory"),
                 failure();
        std::string n = "v" + std::to_string(counter++);
        names[get.getResult()] = n;
        os << "  float *" << n << " = reinterpret_cast<float *>(arena + "
           << offsets[0] << "); // " << paramRef(get.getName()) << "\n";
        return success();
      })
      .Case<AllGatherOp, ReduceScatterOp>([&](Operation *o) {
        auto [stage, slot] = isa<AllGatherOp>(o)
            ? std::pair{cast<AllGatherOp>(o).getStage(), cast<AllGatherOp>(o).getSlot()}
            : std::pair{cast<ReduceScatterOp>(o).getStage(),
                        cast<ReduceScatterOp>(o).getSlot()};
        std::string n = "r" + std::to_string(counter++);
        names[o->getResult(0)] = n;
        os << "  int32_t " << n << " = comm->"
           << (isa<AllGatherOp>(o) ? "allGather" : "reduceScatter")
           << "(comm->context, " << stage << ", " << slot << ");\n";
        return success();
      })
      .Case<WaitOp>([&](WaitOp w) {
        os << "  comm->wait(comm->context, " << name(w.getRequest()) << ");\n";
        return success();
      })
      .Case<ClearGradsOp>([&](ClearGradsOp c) {
        if (int64_t(c.getSlot()) >= int64_t(plan->gradSlotOffsets.size()) ||
            int64_t(c.getStage()) >= plan->numStages())
          return c.emitOpError("names a slot or stage the plan does not have"),
                 failure();
        os << "  fill(reinterpret_cast<float *>(arena + "
           << plan->gradSlotOffsets[c.getSlot()] << "), "
           << plan->stageElements[c.getStage()] << ", 0.0f); // stage "
           << c.getStage() << "\n";
        return success();
      })
      .Case<ViewLikeOpInterface>([&](ViewLikeOpInterface view) {
        // A view names its source's memory.
        Value source = view.getViewSource(), result = view->getResult(0);
        names[result] = name(source);
        if (splats.count(source))
          splats.insert(result);
        return success();
      })
      .Case<AccumulateGradOp>([&](AccumulateGradOp acc) {
        auto offset = acc->getAttrOfType<IntegerAttr>(kGradOffsetAttr);
        if (!offset)
          return acc.emitOpError("has no planned gradient address; run "
                                 "fastllm-plan-memory"),
                 failure();
        os << "  addInto(reinterpret_cast<float *>(arena + " << offset.getInt()
           << "), " << name(acc.getGrad()) << ", "
           << tensorType(acc.getGrad()).getNumElements() << "); // "
           << paramRef(acc.getName()) << "\n";
        return success();
      })
      .Case<func::ReturnOp>([&](func::ReturnOp ret) {
        if (desc.lossOnDevice)
          os << "  return readScalar(" << name(ret.getOperand(0)) << ");\n";
        else
          os << "  return " << name(ret.getOperand(0)) << "[0];\n";
        return success();
      })
      .Case<FusedElementwiseOp>([&](FusedElementwiseOp fused) {
        auto body = fusedBody(fused);
        return failed(body) ? failure() : emitElementwise(fused, *body);
      })
      // Everything else is a kernel call.
      .Case<MatmulOp>([&](MatmulOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        emitMatmul("matmul", name(o.getResult()), o.getLhs(), o.getRhs(),
                   o.getTransposeLhs(), o.getTransposeRhs(), "");
        return success();
      })
      .Case<MatmulAccumulateGradOp>([&](MatmulAccumulateGradOp o) {
        auto offset = o->getAttrOfType<IntegerAttr>(kGradOffsetAttr);
        if (!offset)
          return o.emitOpError("has no planned gradient address; run "
                               "fastllm-plan-memory"),
                 failure();
        emitMatmul("addMatmul",
                   "reinterpret_cast<float *>(arena + " +
                       std::to_string(offset.getInt()) + ")",
                   o.getLhs(), o.getRhs(), o.getTransposeLhs(),
                   o.getTransposeRhs(), " // " + paramRef(o.getName()));
        return success();
      })
      .Case<TransposeOp>([&](TransposeOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  {\n    static const int64_t shape[] = "
           << list(shapeOf(o.getInput())) << ", perm[] = "
           << list(o.getPermutation()) << ";\n    transpose("
           << name(o.getResult()) << ", " << name(o.getInput()) << ", "
           << shapeOf(o.getInput()).size() << ", shape, perm);\n  }\n";
        return success();
      })
      .Case<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>([&](auto o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> in = shapeOf(o.getInput());
        std::string reduced = "{";
        for (int64_t i = 0; i < (int64_t)in.size(); ++i)
          reduced += std::string(i ? ", " : "") +
                     (llvm::is_contained(o.getDims(), i) ? "true" : "false");
        reduced += in.empty() ? "false}" : "}";
        const char *kind = isa<ReduceSumOp>(o)    ? "ReduceKind::Sum"
                           : isa<ReduceMeanOp>(o) ? "ReduceKind::Mean"
                                                  : "ReduceKind::Max";
        os << "  {\n    static const int64_t shape[] = " << list(in)
           << ";\n    static const bool reduced[] = " << reduced
           << ";\n    reduce(" << name(o.getResult()) << ", "
           << name(o.getInput()) << ", " << in.size() << ", shape, reduced, "
           << kind << ");\n  }\n";
        return success();
      })
      .Case<SoftmaxOp, LogSoftmaxOp>([&](auto o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  softmax(" << name(o.getResult()) << ", " << name(o.getInput())
           << ", " << outerNInner(o.getInput(), o.getDim()) << ", "
           << (isa<LogSoftmaxOp>(o) ? "true" : "false") << ");\n";
        return success();
      })
      .Case<SoftmaxGradOp, LogSoftmaxGradOp>([&](auto o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  softmaxGrad(" << name(o.getResult()) << ", "
           << name(o.getOutput()) << ", " << name(o.getGrad()) << ", "
           << outerNInner(o.getOutput(), o.getDim()) << ", "
           << (isa<LogSoftmaxGradOp>(o) ? "true" : "false") << ");\n";
        return success();
      })
      .Case<LayerNormOp>([&](LayerNormOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  layerNorm(" << name(o.getResult()) << ", " << name(o.getInput())
           << ", " << name(o.getScale()) << ", "
           << (o.getBias() ? name(o.getBias()) : "nullptr") << ", "
           << rowsCols(o.getInput(), o.getDim()) << ", "
           << llvm::format("%.9e", o.getEpsilon().convertToDouble()) << "f);\n";
        return success();
      })
      .Case<LayerNormGradOp>([&](LayerNormGradOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  layerNormGrad(" << name(o.getInputGrad()) << ", "
           << name(o.getScaleGrad()) << ", " << name(o.getBiasGrad()) << ", "
           << name(o.getInput()) << ", " << name(o.getScale()) << ", "
           << name(o.getGrad()) << ", " << rowsCols(o.getInput(), o.getDim())
           << ", " << llvm::format("%.9e", o.getEpsilon().convertToDouble())
           << "f);\n";
        return success();
      })
      .Case<RmsNormOp>([&](RmsNormOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  rmsNorm(" << name(o.getResult()) << ", " << name(o.getInput())
           << ", " << name(o.getScale()) << ", "
           << rowsCols(o.getInput(), o.getDim()) << ", "
           << llvm::format("%.9e", o.getEpsilon().convertToDouble()) << "f);\n";
        return success();
      })
      .Case<RmsNormGradOp>([&](RmsNormGradOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        os << "  rmsNormGrad(" << name(o.getInputGrad()) << ", "
           << name(o.getScaleGrad()) << ", " << name(o.getInput()) << ", "
           << name(o.getScale()) << ", " << name(o.getGrad()) << ", "
           << rowsCols(o.getInput(), o.getDim()) << ", "
           << llvm::format("%.9e", o.getEpsilon().convertToDouble()) << "f);\n";
        return success();
      })
      .Case<CrossEntropyOp, NllLossOp>([&](auto o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> in = shapeOf(o.getInput());
        os << "  " << (isa<CrossEntropyOp>(o) ? "crossEntropy" : "nllLoss")
           << "<" << idxType(o.getTargets()) << ">(" << name(o.getResult())
           << ", " << name(o.getInput()) << ", " << name(o.getTargets()) << ", "
           << product(in.drop_back()) << ", " << in.back() << ", "
           << ignoreArgs(o.getIgnoreIndex()) << ", "
           << reductionName(o.getReduction()) << ");\n";
        return success();
      })
      .Case<CrossEntropyGradOp>([&](CrossEntropyGradOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> in = shapeOf(o.getInput());
        os << "  crossEntropyGrad<" << idxType(o.getTargets()) << ">("
           << name(o.getResult()) << ", " << name(o.getInput()) << ", "
           << name(o.getTargets()) << ", " << name(o.getGrad()) << ", "
           << product(in.drop_back()) << ", " << in.back() << ", "
           << ignoreArgs(o.getIgnoreIndex()) << ", "
           << reductionName(o.getReduction()) << ");\n";
        return success();
      })
      .Case<NllLossGradOp>([&](NllLossGradOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> in = shapeOf(o.getResult());
        os << "  nllLossGrad<" << idxType(o.getTargets()) << ">("
           << name(o.getResult()) << ", " << name(o.getTargets()) << ", "
           << name(o.getGrad()) << ", " << product(in.drop_back()) << ", "
           << in.back() << ", " << ignoreArgs(o.getIgnoreIndex()) << ", "
           << reductionName(o.getReduction()) << ");\n";
        return success();
      })
      .Case<GatherOp, GatherGradOp>([&](auto o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        bool grad = isa<GatherGradOp>(o);
        Value table = grad ? o->getResult(0) : o->getOperand(0);
        Value data = grad ? o->getOperand(0) : o->getOperand(0);
        Value indices = grad ? o->getOperand(1) : o->getOperand(1);
        ArrayRef<int64_t> s = shapeOf(table);
        int64_t dim = o.getDim();
        auto type = cType(tensorType(table).getElementType(), o);
        if (failed(type))
          return failure();
        os << "  " << (grad ? "gatherGrad" : "gather") << "<" << *type << ", "
           << idxType(indices) << ">(" << name(o->getResult(0)) << ", "
           << name(data) << ", " << name(indices) << ", "
           << product(s.take_front(dim)) << ", " << s[dim] << ", "
           << tensorType(indices).getNumElements() << ", "
           << product(s.drop_front(dim + 1)) << ");\n";
        return success();
      })
      .Case<SliceOp, SliceGradOp>([&](auto o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        bool grad = isa<SliceGradOp>(o);
        Value big = grad ? o->getResult(0) : o->getOperand(0);
        Value small = grad ? o->getOperand(0) : o->getResult(0);
        os << "  {\n    static const int64_t big[] = " << list(shapeOf(big))
           << ", start[] = " << list(o.getStart()) << ", stride[] = "
           << list(o.getStride()) << ", small[] = " << list(shapeOf(small))
           << ";\n    " << (grad ? "sliceGrad(" : "slice(")
           << name(o->getResult(0)) << ", " << name(o->getOperand(0)) << ", "
           << shapeOf(big).size() << ", big, start, stride, small);\n  }\n";
        return success();
      })
      .Case<SplitOp>([&](SplitOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> in = shapeOf(o.getInput());
        SmallVector<int64_t> start(in.size(), 0), stride(in.size(), 1);
        for (Value r : o.getResults()) {
          os << "  {\n    static const int64_t big[] = " << list(in)
             << ", start[] = " << list(start) << ", stride[] = " << list(stride)
             << ", small[] = " << list(shapeOf(r)) << ";\n    slice(" << name(r)
             << ", " << name(o.getInput()) << ", " << in.size()
             << ", big, start, stride, small);\n  }\n";
          start[o.getDim()] += tensorType(r).getDimSize(o.getDim());
        }
        return success();
      })
      .Case<ConcatOp>([&](ConcatOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> out = shapeOf(o.getResult());
        int64_t dim = o.getDim();
        auto type = cType(tensorType(o.getResult()).getElementType(), o);
        if (failed(type))
          return failure();
        SmallVector<int64_t> sizes;
        SmallVector<std::string> ins;
        for (Value in : o.getInputs()) {
          sizes.push_back(tensorType(in).getDimSize(dim));
          ins.push_back(name(in));
        }
        os << "  {\n    static const int64_t sizes[] = " << list(sizes)
           << ";\n    const " << *type << " *ins[] = {";
        llvm::interleaveComma(ins, os);
        os << "};\n    concat(" << name(o.getResult()) << ", " << ins.size()
           << ", ins, sizes, " << product(out.take_front(dim)) << ", "
           << product(out.drop_front(dim + 1)) << ");\n  }\n";
        return success();
      })
      .Case<DropoutOp>([&](DropoutOp o) -> LogicalResult {
        // The mask is keyed by sample: the input's leading dim must hold
        // whole samples, the batch first (a [B, ...] activation, or [B * T,
        // ...] flattened), so that each sample's elements are the same
        // whatever the micro-batch is.
        ArrayRef<int64_t> s = shapeOf(o.getInput());
        int64_t n = product(s);
        if (s.empty() || s[0] % microBatch != 0)
          return o.emitOpError("input's leading dimension (shape ")
                 << tensorType(o.getInput())
                 << ") is not a multiple of the micro-batch " << microBatch
                 << ": dropout keys its mask by sample and needs the batch "
                    "as the leading dimension",
                 failure();
        int64_t perSample = n / microBatch;
        if ((perSample + 3) / 4 > int64_t(UINT32_MAX))
          return o.emitOpError("has ") << perSample
                 << " elements per sample; at most 2^34 are supported",
                 failure();
        if (failed(bindAll()))
          return failure();
        float ratio = o.getRatio().convertToFloat();
        os << "  dropout(" << name(o.getResult()) << ", "
           << name(o.getInput()) << ", "
           << (splats.count(o.getInput()) ? "true" : "false") << ", " << n
           << ", " << perSample << ", " << o.getSite() << "u, "
           << llvm::format_hex(::fastllm::rt::dropoutThreshold(ratio), 10)
           << "u, "
           << llvm::format("%.9e", ::fastllm::rt::dropoutScale(ratio))
           << "f, context->seed, context->step, context->firstSample);\n";
        return success();
      })
      .Case<CausalAttentionOp>([&](CausalAttentionOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> q = shapeOf(o.getQuery());
        os << "  causalAttention(" << name(o.getResult()) << ", "
           << name(o.getLse()) << ", " << name(o.getQuery()) << ", "
           << name(o.getKey()) << ", " << name(o.getValue()) << ", "
           << product(q.drop_back(2)) << ", " << q[q.size() - 2] << ", "
           << q.back() << ", " << shapeOf(o.getValue()).back() << ", "
           << llvm::format("%.9e", o.getScale().convertToDouble()) << "f);\n";
        return success();
      })
      .Case<CausalAttentionGradOp>([&](CausalAttentionGradOp o) -> LogicalResult {
        if (failed(bindAll()))
          return failure();
        ArrayRef<int64_t> q = shapeOf(o.getQuery());
        os << "  causalAttentionGrad(" << name(o.getQueryGrad()) << ", "
           << name(o.getKeyGrad()) << ", " << name(o.getValueGrad()) << ", "
           << name(o.getQuery()) << ", " << name(o.getKey()) << ", "
           << name(o.getValue()) << ", " << name(o.getOutput()) << ", "
           << name(o.getLse()) << ", " << name(o.getGrad()) << ", "
           << product(q.drop_back(2)) << ", " << q[q.size() - 2] << ", "
           << q.back() << ", " << shapeOf(o.getValue()).back() << ", "
           << llvm::format("%.9e", o.getScale().convertToDouble()) << "f);\n";
        return success();
      })
      .Default([&](Operation *o) {
        return o->emitOpError("is not supported by the ")
               << desc.name << " target";
      });
}

LogicalResult StepEmitter::emit() {
  plan = MemoryPlan::get(module);
  if (!plan)
    return failure();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step)
    return module.emitError("no func.func @train_step; run fastllm-autodiff");
  if (failed(emitConstants(step)) || failed(emitPlan(*plan)))
    return failure();
  std::string planText = std::move(text);
  text.clear();

  microBatch = plan->batchSize;
  // The step's body first: it decides which functors exist.
  for (auto [arg, offset] : {std::pair{plan->tokensArg, plan->tokensOffset},
                             std::pair{plan->targetsArg, plan->targetsOffset}}) {
    std::string n = "a" + std::to_string(arg);
    names[step.getArgument(arg)] = n;
    os << "  const int64_t *" << n
       << " = reinterpret_cast<const int64_t *>(arena + " << offset << ");\n";
  }
  for (Operation &op : step.getBody().front())
    if (failed(emitOp(&op)))
      return failure();

  out << "// Generated by fastllm-opt: the training step of one rank ("
      << desc.displayName << ").\n"
      << "// Do not edit; recompile the model instead.\n\n"
      << "#include \"runtime/ModelABI.h\"\n"
      << "#include \"" << desc.kernelHeader << "\"\n\n"
      << "#include <cmath>\n#include <cstdint>\n\n"
      << "using namespace fastllm::rt;\nusing namespace "
      << desc.kernelNamespace << ";\n\n"
      << "static_assert(kAbiVersion == " << ::fastllm::rt::kAbiVersion
      << ",\n              \"this file was generated for runtime ABI "
      << ::fastllm::rt::kAbiVersion
      << "; recompile the model with the fastllm-opt of this runtime\");\n\n"
      << "namespace {\n"
      << planText << "\n"
      << constants << "\n"
      << functorDefs << "} // namespace\n\n"
      << "extern \"C\" const PlanInfo *fastllm_plan() {\n"
      << "  static const PlanInfo plan = makePlan();\n"
      << "  return &plan;\n"
      << "}\n\n"
      << "extern \"C\" float fastllm_step(char *arena, const Collectives *comm,\n"
      << "                              const StepContext *context) {\n"
      << "  (void)comm;\n  (void)context;\n"
      << constantPointers << text << "}\n";
  return success();
}

const TargetDescription &TargetDescription::get(Target target) {
  static const TargetDescription cpu{
      "cpu", "CPU", "train_step.cpp", "runtime/cpu/Kernels.h",
      "fastllm::rt::cpu", "", "", /*constantsOnDevice=*/false,
      /*lossOnDevice=*/false};
  static const TargetDescription cuda{
      "cuda", "CUDA", "train_step.cu", "runtime/cuda/Generated.cuh",
      "fastllm::rt::cuda", "__host__ __device__ ", "__nv_bfloat16",
      /*constantsOnDevice=*/true, /*lossOnDevice=*/true};
  return target == Target::Cuda ? cuda : cpu;
}

StringRef mlir::fastllm::targetName(Target target) {
  return TargetDescription::get(target).name;
}

LogicalResult mlir::fastllm::emitSource(ModuleOp module, Target target,
                                        raw_ostream &os) {
  return StepEmitter(module, target, os).emit();
}

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

LogicalResult mlir::fastllm::writeWeights(ModuleOp module, StringRef path) {
  // The runtime's safetensors writer, pointed at the initial values where
  // they lie: an imported weight's resource blob is written from the blob;
  // only a dense attribute (hand-written IR) is converted first.
  std::vector<::fastllm::rt::TensorRef> tensors;
  std::vector<std::vector<float>> converted;
  for (auto p : module.getOps<ParameterOp>()) {
    ElementsAttr init = p.getInitialValueAttr();
    RankedTensorType t = p.getTensorType();
    const size_t bytes = t.getNumElements() * sizeof(float);
    const float *data = nullptr;
    if (!init)
      return p.emitOpError("has no initial value");
    if (auto res = dyn_cast<DenseResourceElementsAttr>(init)) {
      AsmResourceBlob *blob = res.getRawHandle().getBlob();
      if (!blob || blob->getData().size() != bytes)
        return p.emitOpError("initial value blob is missing or has the wrong "
                             "size");
      data = reinterpret_cast<const float *>(blob->getData().data());
    } else if (auto dense = dyn_cast<DenseElementsAttr>(init)) {
      std::vector<float> &values = converted.emplace_back();
      values.reserve(t.getNumElements());
      for (APFloat f : dense.getValues<APFloat>())
        values.push_back(f.convertToFloat());
      data = values.data();
    } else {
      return p.emitOpError("initial value kind is not supported");
    }
    tensors.push_back({p.getSymName().str(),
                       std::vector<int64_t>(t.getShape().begin(),
                                            t.getShape().end()),
                       data});
  }
  ::fastllm::rt::Status status = ::fastllm::rt::writeSafetensors(
      path.str(), tensors, {{"format", "pt"}, {"producer", "fastllm-opt"}});
  if (!status.ok())
    return module.emitError(status.message());
  return success();
}
