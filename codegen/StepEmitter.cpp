//===- StepEmitter.cpp - the walk of the training step --------------------===//
//
// One kernel call per op of @train_step, in program order. Every tensor is a
// pointer: into the arena at its planned offset (activations, and the weight
// or gradient a parameter read or accumulation names), to a static array
// (model.constant; CUDA: a __device__ array), or to its source (a view). The
// CUDA source makes the same calls on the CUDA kernel library, whose calls
// enqueue work on one stream; the loss is read back after the stream
// finishes. This file holds the walk, the names and buffers, the ops that
// move no data through a kernel (parameters, collectives, views, gradient
// accumulation, the return) and the frame of the generated file.
//
//===----------------------------------------------------------------------===//

#include "codegen/StepEmitter.h"
#include "passes/Zero.h"
#include "runtime/ModelABI.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

int64_t mlir::fastllm::product(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

SmallVector<int64_t> mlir::fastllm::broadcastStrides(ArrayRef<int64_t> operand,
                                                     int64_t rank) {
  SmallVector<int64_t> strides(rank, 0);
  int64_t stride = 1;
  for (int64_t i = (int64_t)operand.size() - 1; i >= 0; --i) {
    int64_t dst = rank - (int64_t)operand.size() + i;
    strides[dst] = operand[i] == 1 ? 0 : stride;
    stride *= operand[i];
  }
  return strides;
}

// Only letters, digits, space and a few punctuation characters that mean
// nothing inside a literal are written as themselves; every other byte
// (quotes, backslashes, '?' of trigraphs, control characters, NUL, UTF-8) is
// a three-digit octal escape, which never combines with what follows.
std::string mlir::fastllm::cString(StringRef s) {
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

std::string mlir::fastllm::list(ArrayRef<int64_t> values) {
  std::string s = "{";
  for (auto [i, v] : llvm::enumerate(values))
    s += (i ? ", " : "") + std::to_string(v);
  if (values.empty())
    s += "0"; // zero-length arrays are not C++
  return s + "}";
}

std::string mlir::fastllm::floatLiteral(const APFloat &value) {
  std::string s;
  llvm::raw_string_ostream(s)
      << llvm::format("%.9e", value.convertToDouble()) << "f";
  return s;
}

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
             << type << " is not supported by the " << desc.name << " target",
         failure();
}

std::string StepEmitter::paramRef(StringRef symbol) const {
  auto it = paramIndex.find(symbol);
  return it == paramIndex.end() ? std::string("parameter")
                                : "kParams[" + std::to_string(it->second) + "]";
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

LogicalResult StepEmitter::bindResults(Operation *op) {
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    if (failed(bindResult(op, i)))
      return failure();
  return success();
}

FailureOr<std::string> StepEmitter::gradAddress(Operation *op) {
  auto offset = op->getAttrOfType<IntegerAttr>(kGradOffsetAttr);
  if (!offset)
    return op->emitOpError("has no planned gradient address; run "
                           "fastllm-plan-memory"),
           failure();
  return "reinterpret_cast<float *>(arena + " +
         std::to_string(offset.getInt()) + ")";
}

//===----------------------------------------------------------------------===//
// Memory, collectives and the step's end
//===----------------------------------------------------------------------===//

LogicalResult StepEmitter::emit(GetParameterOp get) {
  auto offsets = get->getAttrOfType<DenseI64ArrayAttr>(kResultOffsetsAttr);
  if (!offsets || offsets.size() != 1)
    return get.emitOpError("has no planned address; run fastllm-plan-memory"),
           failure();
  std::string n = "v" + std::to_string(counter++);
  names[get.getResult()] = n;
  os << "  float *" << n << " = reinterpret_cast<float *>(arena + "
     << offsets[0] << "); // " << paramRef(get.getName()) << "\n";
  return success();
}

LogicalResult StepEmitter::emitCollective(Operation *op) {
  auto [stage, slot] = isa<AllGatherOp>(op)
                           ? std::pair{cast<AllGatherOp>(op).getStage(),
                                       cast<AllGatherOp>(op).getSlot()}
                           : std::pair{cast<ReduceScatterOp>(op).getStage(),
                                       cast<ReduceScatterOp>(op).getSlot()};
  std::string n = "r" + std::to_string(counter++);
  names[op->getResult(0)] = n;
  os << "  int32_t " << n << " = comm->"
     << (isa<AllGatherOp>(op) ? "allGather" : "reduceScatter")
     << "(comm->context, " << stage << ", " << slot << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(WaitOp w) {
  os << "  comm->wait(comm->context, " << name(w.getRequest()) << ");\n";
  return success();
}

LogicalResult StepEmitter::emit(ClearGradsOp c) {
  if (int64_t(c.getSlot()) >= int64_t(plan->gradSlotOffsets.size()) ||
      int64_t(c.getStage()) >= plan->numStages())
    return c.emitOpError("names a slot or stage the plan does not have"),
           failure();
  os << "  fill(reinterpret_cast<float *>(arena + "
     << plan->gradSlotOffsets[c.getSlot()] << "), "
     << plan->stageElements[c.getStage()] << ", 0.0f); // stage "
     << c.getStage() << "\n";
  return success();
}

LogicalResult StepEmitter::emit(ViewLikeOpInterface view) {
  // A view names its source's memory.
  Value source = view.getViewSource(), result = view->getResult(0);
  names[result] = name(source);
  if (splats.count(source))
    splats.insert(result);
  return success();
}

LogicalResult StepEmitter::emit(AccumulateGradOp acc) {
  auto address = gradAddress(acc);
  if (failed(address))
    return failure();
  os << "  addInto(" << *address << ", " << name(acc.getGrad()) << ", "
     << tensorType(acc.getGrad()).getNumElements() << "); // "
     << paramRef(acc.getName()) << "\n";
  return success();
}

LogicalResult StepEmitter::emit(func::ReturnOp ret) {
  if (desc.lossOnDevice)
    os << "  return readScalar(" << name(ret.getOperand(0)) << ");\n";
  else
    os << "  return " << name(ret.getOperand(0)) << "[0];\n";
  return success();
}

//===----------------------------------------------------------------------===//
// The walk
//===----------------------------------------------------------------------===//

bool StepEmitter::isTraced(Operation *op) {
  return !isa<ConstantOp, AllGatherOp, ReduceScatterOp, ViewLikeOpInterface,
              GetParameterOp, WaitOp, func::ReturnOp>(op);
}

int StepEmitter::traceBegin(Operation *op) {
  auto attr = [&](StringRef name) {
    auto a = op->getAttrOfType<IntegerAttr>(name);
    return a ? a.getInt() : int64_t(-1);
  };
  int64_t stage = attr(kStageAttr);
  if (auto clear = dyn_cast<ClearGradsOp>(op))
    stage = clear.getStage();
  int index = int(traceOps.size());
  // The name is the op's own ("matmul"): letters and underscores only.
  traceOps.push_back("{\"" + op->getName().stripDialect().str() + "\", " +
                     std::to_string(stage) + ", " +
                     std::to_string(attr(kLayerAttr)) + ", " +
                     (isBackward(op) ? "1" : "0") + "}");
  os << "  if (trace) trace->begin(trace->context, " << index << ");\n";
  return index;
}

void StepEmitter::traceEnd(int index) {
  os << "  if (trace) trace->end(trace->context, " << index << ");\n";
}

std::string StepEmitter::traceTable() const {
  std::string t = "// {name, stage, layer, backward}: the step's kernel "
                  "calls, for train --trace\nconstexpr int32_t kNumTraceOps "
                  "= " +
                  std::to_string(traceOps.size()) +
                  ";\nconst TraceOp kTraceOps[] = {\n";
  for (const std::string &row : traceOps)
    t += "    " + row + ",\n";
  if (traceOps.empty())
    t += "    {\"\", -1, -1, 0},\n";
  return t + "};\n\n";
}

LogicalResult StepEmitter::emitOp(Operation *op) {
  // A split is one call per result, each traced by emit(SplitOp).
  if (!isTraced(op) || isa<SplitOp>(op))
    return emitCalls(op);
  int index = traceBegin(op);
  if (failed(emitCalls(op)))
    return failure();
  traceEnd(index);
  return success();
}

LogicalResult StepEmitter::emitCalls(Operation *op) {
  if (op->hasTrait<PointwiseTrait>())
    return emitPointwise(op);
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<ConstantOp>([&](auto) { return success(); }) // emitConstants
      .Case<AllGatherOp, ReduceScatterOp>(
          [&](Operation *o) { return emitCollective(o); })
      .Case<ViewLikeOpInterface>([&](ViewLikeOpInterface v) { return emit(v); })
      .Case<GetParameterOp, WaitOp, ClearGradsOp, AccumulateGradOp,
            func::ReturnOp, FusedElementwiseOp, MatmulOp,
            MatmulAccumulateGradOp, TransposeOp, SplitOp, ConcatOp, LayerNormOp,
            LayerNormGradOp, RmsNormOp, RmsNormGradOp, CrossEntropyGradOp,
            NllLossGradOp, DropoutOp, CausalAttentionOp, CausalAttentionGradOp>(
          [&](auto o) { return emit(o); })
      .Case<GatherOp, GatherGradOp>(
          [&](Operation *o) { return emitGather(o, isa<GatherGradOp>(o)); })
      .Case<SliceOp, SliceGradOp>(
          [&](Operation *o) { return emitSlice(o, isa<SliceGradOp>(o)); })
      .Case<ReduceSumOp>([&](ReduceSumOp o) {
        return emitReduce(o, o.getDims(), "ReduceKind::Sum");
      })
      .Case<ReduceMeanOp>([&](ReduceMeanOp o) {
        return emitReduce(o, o.getDims(), "ReduceKind::Mean");
      })
      .Case<ReduceMaxOp>([&](ReduceMaxOp o) {
        return emitReduce(o, o.getDims(), "ReduceKind::Max");
      })
      .Case<SoftmaxOp, LogSoftmaxOp>(
          [&](Operation *o) { return emitSoftmax(o, isa<LogSoftmaxOp>(o)); })
      .Case<SoftmaxGradOp, LogSoftmaxGradOp>([&](Operation *o) {
        return emitSoftmaxGrad(o, isa<LogSoftmaxGradOp>(o));
      })
      .Case<CrossEntropyOp>([&](CrossEntropyOp o) {
        return emitLoss(o, "crossEntropy", o.getIgnoreIndex(),
                        o.getReduction());
      })
      .Case<NllLossOp>([&](NllLossOp o) {
        return emitLoss(o, "nllLoss", o.getIgnoreIndex(), o.getReduction());
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
  for (auto [arg, offset] :
       {std::pair{plan->tokensArg, plan->tokensOffset},
        std::pair{plan->targetsArg, plan->targetsOffset}}) {
    if (arg < 0 || arg >= int64_t(step.getNumArguments()))
      return step.emitOpError("has no argument ")
             << arg << ", which the plan names as tokens or targets";
    std::string n = "a" + std::to_string(arg);
    names[step.getArgument(arg)] = n;
    os << "  const int64_t *" << n
       << " = reinterpret_cast<const int64_t *>(arena + " << offset << ");\n";
  }
  for (Operation &op : step.getBody().front())
    if (failed(emitOp(&op)))
      return failure();

  writeFile(planText);
  return success();
}

/// The most `elementwise` instances one kernel part of a split source
/// instantiates: each costs about 10 ms at -O3 (a float one; the library
/// holds the float drivers), a part's headers about half a second.
static constexpr size_t kInstancesPerPart = 32;
/// A split source defines its constants of at least kConstantElementsApart
/// elements (parsing one costs about 5 us) in parts of their own, each at
/// most kConstantElementsPerPart elements (or one constant): a part costs
/// about 0.25 s before it parses anything.
static constexpr int64_t kConstantElementsApart = 4096;
static constexpr int64_t kConstantElementsPerPart = 262144;

/// `text` as `//` comment lines of at most 80 columns.
static std::string commentLines(StringRef text) {
  std::string out, line = "//";
  SmallVector<StringRef> words;
  text.split(words, ' ', -1, /*KeepEmpty=*/false);
  for (StringRef word : words) {
    if (line.size() + 1 + word.size() > 80) {
      out += line + "\n";
      line = "//";
    }
    line += " " + word.str();
  }
  return out + line + "\n";
}

std::string StepEmitter::instantiations(bool declare, size_t first,
                                        size_t stride) const {
  std::string text = "namespace " + desc.kernelNamespace.str() + " {\n";
  for (size_t i = first; i < instances.size(); i += stride)
    text += std::string(declare ? "extern " : "") +
            "template void elementwise(" + instances[i] + ");\n";
  return text + "} // namespace " + desc.kernelNamespace.str() + "\n";
}

void StepEmitter::writeFile(const std::string &planText) {
  // A split source: part 1 the plan and the step; then, when they are
  // large, the constants' parts; then the kernels' parts.
  size_t kernelParts =
      desc.splitParts
          ? (instances.size() + kInstancesPerPart - 1) / kInstancesPerPart
          : 0;
  // Large constants apart, packed in order; the others stay in part 1.
  std::vector<std::string> constantParts;
  std::string constantDecls, partOneConstants;
  int64_t filled = kConstantElementsPerPart;
  for (const ConstantDef &c : constantDefs) {
    if (!desc.splitParts || c.elements < kConstantElementsApart) {
      partOneConstants += c.definition;
      continue;
    }
    if (filled + c.elements > kConstantElementsPerPart) {
      constantParts.emplace_back();
      filled = 0;
    }
    constantParts.back() += c.definition;
    constantDecls += c.declaration;
    filled += c.elements;
  }
  size_t unoptimised = 1 + constantParts.size();
  size_t parts = desc.splitParts ? unoptimised + kernelParts : 0;
  out << "// Generated by fastllm-opt: the training step of one rank ("
      << desc.displayName << ").\n"
      << "// Do not edit; recompile the model instead.\n";
  if (parts) {
    std::string about =
        "One translation unit as it is. `fastllm-opt compile` builds it as " +
        std::to_string(parts) +
        " instead, compiled in parallel and linked together: part k is this "
        "file compiled with -DFASTLLM_PART=k. Part 1 is the plan and "
        "fastllm_step, whose body only computes pointers and calls kernels";
    if (!constantParts.empty())
      about += "; parts 2.." + std::to_string(unoptimised) +
               " are the large constants";
    about += ": " + std::string(unoptimised > 1 ? "they need" : "it needs") +
             " no optimisation.";
    if (kernelParts)
      about += " Parts " + std::to_string(unoptimised + 1) + ".." +
               std::to_string(parts) +
               " instantiate the kernels the step's functors need: compile "
               "them with the kernel library's flags.";
    out << "//\n"
        << commentLines(about) << "// fastllm-parts: " << parts
        << " unoptimised: " << unoptimised << "\n";
  }
  out << "\n#include \"runtime/ModelABI.h\"\n"
      << "#include \"" << desc.kernelHeader << "\"\n\n"
      << "#include <cmath>\n#include <cstdint>\n\n"
      << "using namespace fastllm::rt;\nusing namespace "
      << desc.kernelNamespace << ";\n\n"
      << "static_assert(kAbiVersion == " << ::fastllm::rt::kAbiVersion
      << ",\n              \"this file was generated for runtime ABI "
      << ::fastllm::rt::kAbiVersion
      << "; recompile the model with the fastllm-opt of this runtime\");\n\n";
  if (parts) {
    // Every part names the functors and the constants defined apart: they
    // need external linkage, so that the step calls the instances the
    // kernel parts define and reads the constants the constants' parts do.
    out << "namespace fastllm_generated {\n" << functorDefs;
    if (!constantParts.empty())
      out << "// Defined by parts 2.." << unoptimised << ".\n" << constantDecls;
    out << "} // namespace fastllm_generated\n"
        << "using namespace fastllm_generated;\n\n"
        << "#if !defined(FASTLLM_PART) || FASTLLM_PART == 1\n";
  }
  out << "namespace {\n"
      << traceTable() << planText << "\n"
      << (parts ? partOneConstants : constants) << "\n"
      << (parts ? "" : functorDefs) << "} // namespace\n\n";
  if (kernelParts)
    out << "#ifdef FASTLLM_PART\n"
        << "// Defined by parts " << unoptimised + 1 << ".." << parts << ".\n"
        << instantiations(/*declare=*/true, 0, 1) << "#endif\n\n";
  out << "extern \"C\" const PlanInfo *fastllm_plan() {\n"
      << "  static const PlanInfo plan = makePlan();\n"
      << "  return &plan;\n"
      << "}\n\n"
      << "extern \"C\" float fastllm_step(char *arena, const Collectives "
         "*comm,\n"
      << "                              const StepContext *context) {\n"
      << "  (void)comm;\n  (void)context;\n"
      << "  const TraceHooks *trace = context->trace;\n  (void)trace;\n"
      << constantPointers << text << "}\n";
  if (!parts)
    return;
  out << "#endif // part 1\n";
  for (size_t k = 0; k < constantParts.size(); ++k)
    out << "\n#if !defined(FASTLLM_PART) || FASTLLM_PART == " << k + 2
        << "\nnamespace fastllm_generated {\n"
        << constantParts[k] << "} // namespace fastllm_generated\n#endif\n";
  for (size_t k = 0; k < kernelParts; ++k)
    out << "\n#if defined(FASTLLM_PART) && FASTLLM_PART == "
        << unoptimised + 1 + k << "\n"
        << instantiations(/*declare=*/false, k, kernelParts) << "#endif\n";
}

SourceParts mlir::fastllm::sourceParts(StringRef source) {
  // `// fastllm-parts: N unoptimised: S`, among the header's first lines.
  StringRef key = "\n// fastllm-parts: ";
  size_t at = source.take_front(4096).find(key);
  if (at == StringRef::npos)
    return {};
  StringRef line = source.drop_front(at + key.size()).take_until([](char c) {
    return c == '\n';
  });
  auto [count, rest] = line.split(" unoptimised: ");
  SourceParts parts;
  if (count.getAsInteger(10, parts.count) ||
      rest.getAsInteger(10, parts.unoptimised) || parts.unoptimised < 1 ||
      parts.unoptimised > parts.count)
    return {};
  return parts;
}

//===----------------------------------------------------------------------===//
// Targets and the entry point
//===----------------------------------------------------------------------===//

const TargetDescription &TargetDescription::get(Target target) {
  static const TargetDescription cpu{"cpu",
                                     "CPU",
                                     "train_step.cpp",
                                     "runtime/cpu/Kernels.h",
                                     "fastllm::rt::cpu",
                                     "",
                                     "",
                                     /*constantsOnDevice=*/false,
                                     /*lossOnDevice=*/false,
                                     /*splitParts=*/true};
  static const TargetDescription cuda{"cuda",
                                      "CUDA",
                                      "train_step.cu",
                                      "runtime/cuda/Generated.cuh",
                                      "fastllm::rt::cuda",
                                      "__host__ __device__ ",
                                      "__nv_bfloat16",
                                      /*constantsOnDevice=*/true,
                                      /*lossOnDevice=*/true,
                                      /*splitParts=*/false};
  return target == Target::Cuda ? cuda : cpu;
}

StringRef mlir::fastllm::targetName(Target target) {
  return TargetDescription::get(target).name;
}

LogicalResult mlir::fastllm::emitSource(ModuleOp module, Target target,
                                        raw_ostream &os) {
  return StepEmitter(module, target, os).emit();
}
