//===- EmitElementwise.cpp - pointwise ops and fused chains ---------------===//
//
// A pointwise op becomes one `elementwise` call with a functor computing its
// expression on the operands x0, x1, ...; a model.fused_elementwise one call
// whose functor runs its body's ops in order on locals. Functors are shared
// by every call site with the same signature and body, so that the generated
// file instantiates each template once.
//
//===----------------------------------------------------------------------===//

#include "codegen/StepEmitter.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

FailureOr<std::string> StepEmitter::pointwiseExpr(Operation *op) {
  auto cmpExpr = [](CmpPredicate p) -> const char * {
    switch (p) {
    case CmpPredicate::eq:
      return "x0 == x1";
    case CmpPredicate::ne:
      return "x0 != x1";
    case CmpPredicate::lt:
      return "x0 < x1";
    case CmpPredicate::le:
      return "x0 <= x1";
    case CmpPredicate::gt:
      return "x0 > x1";
    case CmpPredicate::ge:
      return "x0 >= x1";
    }
    return "false";
  };
  auto gelu = [](GeluApproximation a, StringRef call) {
    return (call + (a == GeluApproximation::tanh ? ", true)" : ", false)"))
        .str();
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
          .Case<GeluOp>(
              [&](GeluOp o) { return gelu(o.getApproximate(), "gelu(x0"); })
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
  SmallVector<std::string> params, operands, storedTypes;
  for (auto [i, v] : llvm::enumerate(op->getOperands())) {
    SmallVector<int64_t> strides =
        splats.count(v) ? SmallVector<int64_t>(rank, 0)
                        : broadcastStrides(tensorType(v).getShape(), rank);
    auto type = cType(tensorType(v).getElementType(), op);
    if (failed(type))
      return failure();
    os << "    static const int64_t s" << i << "[] = " << list(strides)
       << ";\n";
    storedTypes.push_back(*type);
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
  std::string signature =
      outType + " operator()(" + llvm::join(params, ", ") + ") const";
  auto [it, inserted] = functors.try_emplace(
      signature + functorBody, "F" + std::to_string(functors.size()));
  if (inserted)
    functorDefs += "struct " + it->second + " {\n  " +
                   desc.functorQualifier.str() + signature + " {\n    " +
                   functorBody + "\n  }\n};\n";
  // The instance this call needs, for a split source's kernel parts.
  std::string instance =
      *storedOutType + " *, int, const int64_t *, " + it->second;
  for (const std::string &type : storedTypes)
    instance += ", In<" + type + ">";
  if (instanceSet.insert(instance).second)
    instances.push_back(instance);
  os << "    elementwise(" << name(r) << ", " << rank << ", shape, "
     << it->second << "{}, ";
  llvm::interleaveComma(operands, os);
  os << ");\n  }\n";
  return success();
}

LogicalResult StepEmitter::emitPointwise(Operation *op) {
  auto expr = pointwiseExpr(op);
  return failed(expr) ? failure()
                      : emitElementwise(op, "return " + *expr + ";");
}

LogicalResult StepEmitter::emit(FusedElementwiseOp fused) {
  auto body = fusedBody(fused);
  return failed(body) ? failure() : emitElementwise(fused, *body);
}
