//===- Compile.cpp - `fastllm-opt compile`: ONNX in, training binary out --===//
//
// Import -> the named training pipeline -> artifacts in the output folder:
//   plan.mlir            the planned IR (weights elided: they are below)
//   train_step.cpp       generated C++ (the training step and the plan)
//   weights.safetensors  initial weights (the ONNX initializers)
//   plan.json            the memory plan and parameter table
//   train                the training binary (generated code + runtime)
//
//===----------------------------------------------------------------------===//

#include "tools/Compile.h"
#include "tools/WholeNumberFlag.h"
#include "tools/BuildConfig.h"

#include "codegen/CppEmitter.h"
#include "frontend/OnnxImporter.h"
#include "ir/ModelDialect.h"
#include "ir/ModelSummary.h"
#include "ir/Plan.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "runtime/OutputFile.h"
#include "runtime/Version.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

using namespace mlir;
using namespace llvm;
using mlir::fastllm::Flag;

static raw_ostream &compileError() {
  return WithColor::error(errs(), "fastllm-opt compile");
}

namespace {
/// `--time-phases`: the wall time of each phase of a compile and the peak
/// resident memory so far (getrusage: this process's, and the C++ build's
/// compiler and linker as the largest child), printed to stderr as each
/// phase ends. A no-op unless enabled.
class PhaseTimer {
public:
  using Clock = std::chrono::steady_clock;

  explicit PhaseTimer(bool enabled)
      : enabled(enabled), start(Clock::now()), last(start) {}

  /// Ends the phase `name` (begun when the previous one ended).
  void end(StringRef name) {
    if (!enabled)
      return;
    Clock::time_point now = Clock::now();
    print(name, seconds(last, now));
    last = now;
  }
  /// Reports phase `name`, which ran `wall` seconds alongside another (the
  /// total is less than the sum); a later end() still counts from the
  /// previous end().
  void alongside(StringRef name, double wall) {
    if (enabled)
      print(name, wall);
  }
  /// Wall seconds since `from`, for alongside().
  static double since(Clock::time_point from) {
    return seconds(from, Clock::now());
  }
  /// Prints the total once the compile is done.
  void total() {
    if (enabled)
      errs() << format("phase %-10s %8.3f s\n", (const char *)"total",
                       seconds(start, Clock::now()));
  }

private:
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  static void print(StringRef name, double wall) {
    struct rusage self {
    }, children{};
    ::getrusage(RUSAGE_SELF, &self);
    ::getrusage(RUSAGE_CHILDREN, &children);
    errs() << format("phase %-10s %8.3f s   peak RSS %8.1f MB   children "
                     "%8.1f MB\n",
                     name.str().c_str(), wall, self.ru_maxrss / 1024.0,
                     children.ru_maxrss / 1024.0);
  }
  bool enabled;
  Clock::time_point start, last;
};
} // namespace

/// Writes `text` to `path` through a temporary file and a rename (never
/// through a symlink or into a device).
static bool writeFile(StringRef path, StringRef text) {
  std::string error =
      ::fastllm::rt::writeFileAtomically(path.str(), text.data(), text.size());
  if (!error.empty()) {
    compileError() << error << "\n";
    return false;
  }
  return true;
}

/// Every file `compile` may leave in the output folder.
static constexpr const char *kArtifacts[] = {
    "plan.mlir",           "plan.json", "train_step.cpp", "train_step.cu",
    "weights.safetensors", "build.log", "train",          "memory.png"};

namespace {
/// The output folder's next contents, made in a staging folder inside it and
/// moved into place only once all of it exists: a compile that fails (a bad
/// model, a C++ build error) leaves the previous run's artifacts as they
/// were, and one that succeeds replaces them all, removing those this run
/// does not make (no stale `train` beside a new plan).
class StagedOutput {
public:
  ~StagedOutput() {
    if (!staging.empty())
      sys::fs::remove_directories(staging);
  }

  bool create(StringRef folder) {
    dir = folder.str();
    if (std::error_code ec = sys::fs::create_directories(dir)) {
      compileError() << "cannot create '" << dir << "': " << ec.message()
                     << "\n";
      return false;
    }
    if (!sys::fs::is_directory(dir)) {
      compileError() << "'" << dir << "' is not a folder\n";
      return false;
    }
    removeAbandonedStaging();
    // The name holds the process id, so that a later compile can tell a
    // staging folder whose compile was killed from one still at work.
    std::string pattern = (Twine(dir) + "/" + kStagingPrefix +
                           Twine(::getpid()) + "-XXXXXX")
                              .str();
    if (!::mkdtemp(pattern.data())) {
      compileError() << "cannot create a staging folder in '" << dir
                     << "': " << std::strerror(errno) << "\n";
      return false;
    }
    staging = pattern;
    return true;
  }

  const std::string &stagingDir() const { return staging; }
  /// Where artifact `name` is written during the compile.
  std::string path(StringRef name) const {
    SmallString<256> p(staging);
    sys::path::append(p, name);
    return std::string(p);
  }

  /// Moves every artifact made into the output folder, after checking that
  /// each target is a regular file or absent and none is one of `inputs`
  /// (the model and its external-data files: `-o` the model's own folder),
  /// and removes the other artifacts of an earlier run.
  bool commit(const std::vector<std::string> &inputs) {
    auto target = [&](StringRef name) {
      SmallString<256> p(dir);
      sys::path::append(p, name);
      return std::string(p);
    };
    for (const char *name : kArtifacts) {
      sys::fs::UniqueID artifact, read;
      if (sys::fs::getUniqueID(target(name), artifact))
        continue;
      for (const std::string &in : inputs)
        if (!sys::fs::getUniqueID(in, read) && read == artifact) {
          compileError() << "'" << target(name) << "' is the input '" << in
                         << "': an output never replaces an input; choose "
                            "another -o (nothing was written)\n";
          return false;
        }
    }
    for (const char *name : kArtifacts)
      if (std::string why = ::fastllm::rt::checkReplaceable(target(name));
          !why.empty()) {
        compileError() << why << "; nothing was written\n";
        return false;
      }
    // What an earlier compile made here, which this one replaces or
    // removes: the list its plan.json keeps (every artifact for a plan.json
    // from before the list; none without a plan.json: a folder that holds
    // a user's train_step.cu or memory.png is not a compile's).
    llvm::StringSet<> previous;
    if (auto old = MemoryBuffer::getFile(target("plan.json"))) {
      Expected<json::Value> parsed = json::parse((*old)->getBuffer());
      const json::Object *root = parsed ? parsed->getAsObject() : nullptr;
      if (!parsed)
        consumeError(parsed.takeError());
      if (const json::Array *listed =
              root ? root->getArray("artifacts") : nullptr) {
        for (const json::Value &name : *listed)
          if (std::optional<StringRef> text = name.getAsString())
            previous.insert(*text);
      } else if (root && root->get("plan")) {
        for (const char *name : kArtifacts)
          previous.insert(name);
      }
    }
    for (const char *name : kArtifacts) {
      if (sys::fs::exists(path(name))) {
        if (std::string why =
                ::fastllm::rt::renameInto(path(name), target(name));
            !why.empty()) {
          compileError() << why << "\n";
          return false;
        }
      } else if (previous.contains(name) && sys::fs::exists(target(name))) {
        sys::fs::remove(target(name));
      }
    }
    return true;
  }

private:
  static constexpr const char *kStagingPrefix = ".fastllm-staging-";

  /// Removes the staging folders of compiles into this folder that were
  /// killed (Ctrl-C, SIGTERM, SIGKILL): named `.fastllm-staging-PID-XXXXXX`
  /// for a process PID that no longer runs. A running compile's, a
  /// symlink, or any other name is left alone.
  void removeAbandonedStaging() {
    std::error_code ec;
    for (sys::fs::directory_iterator it(dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      StringRef name = sys::path::filename(it->path());
      if (!name.consume_front(kStagingPrefix))
        continue;
      auto [digits, rest] = name.split('-');
      unsigned long long pid = 0;
      if (digits.getAsInteger(10, pid) || pid == 0 || pid > INT32_MAX ||
          rest.size() != 6 || it->type() != sys::fs::file_type::directory_file)
        continue;
      if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH)
        continue; // still running (or not ours to ask about)
      sys::fs::remove_directories(it->path());
    }
  }

  std::string dir, staging;
};
} // namespace

/// What each rank holds and moves, from the plan (docs/DESIGN.md section 5).
struct Report {
  int64_t weights, grads, master, optimizer, gradShard, inputs, activations,
      total;
  /// The global gradient norm's sum of squares and the ranks' stop flag
  /// (two doubles, runtime/Train.cpp).
  int64_t allReduce;
};

static Report makeReport(const mlir::fastllm::MemoryPlan &plan) {
  int64_t full = plan.paramElements * 4;
  int64_t shard = plan.paramElements / plan.dataParallel * 4;
  // ZeRO-3 holds weight slots instead of the full weights, ZeRO-2/3
  // gradient slots (and their reduce-scatters' receive shards) instead of
  // the full gradients.
  int64_t weights = plan.paramsOffset >= 0 ? full : 0;
  for (int64_t e : plan.weightSlotElements)
    weights += e * 4;
  int64_t grads = plan.gradsOffset >= 0 ? full : 0;
  for (int64_t e : plan.gradSlotElements)
    grads += e * 4;
  weights += plan.frozenElements * 4;
  return {weights,
          grads,
          shard,
          2 * shard,
          shard,
          plan.activationsOffset - plan.tokensOffset,
          plan.activationsBytes,
          plan.arenaBytes,
          plan.dataParallel > 1 ? 16 : 0};
}

/// `artifacts`: what this compile writes to the folder (artifactsOf), which
/// the next compile into it may remove (StagedOutput::commit).
static std::string planJson(ModuleOp module,
                            const mlir::fastllm::MemoryPlan &plan,
                            StringRef target,
                            const std::vector<std::string> &artifacts) {
  json::Array params;
  for (auto p : module.getOps<mlir::fastllm::model::ParameterOp>()) {
    json::Array shape;
    for (int64_t d : p.getTensorType().getShape())
      shape.push_back(d);
    auto stage = p->getAttrOfType<IntegerAttr>("model.stage");
    params.push_back(json::Object{
        {"name", p.getSymName()},
        {"shape", std::move(shape)},
        {"offset",
         p->getAttrOfType<IntegerAttr>(mlir::fastllm::kParamOffsetAttr)
             .getInt()},
        {"stage", stage ? stage.getInt() : 0},
        {"trainable", !p.getFrozen()}});
  }
  json::Array stages;
  for (int64_t k = 0; k < plan.numStages(); ++k)
    stages.push_back(json::Object{{"offset", plan.stageOffsets[k]},
                                  {"elements", plan.stageElements[k]},
                                  {"grad_slot", plan.stageGradSlot[k]},
                                  {"weight_slot", plan.stageWeightSlot[k]},
                                  {"tie_slot", plan.stageTieSlot[k]}});
  auto slots = [](ArrayRef<int64_t> offsets, ArrayRef<int64_t> elements) {
    json::Array a;
    for (auto [o, e] : llvm::zip(offsets, elements))
      a.push_back(json::Object{{"offset", o}, {"elements", e}});
    return a;
  };
  Report r = makeReport(plan);
  // Every scalar of the plan, under the key runtime/PlanFields.def gives it.
  json::Object fields;
#define FASTLLM_PLAN_FIELD(type, name, key, none, part, doc)                   \
  fields[#key] = plan.name;
#include "runtime/PlanFields.def"
  json::Object root{
      {"producer",
       std::string("fastllm-opt ") + ::fastllm::rt::versionString()},
      {"target", target.str()},
      {"artifacts", json::Array(ArrayRef<std::string>(artifacts))},
      {"plan", std::move(fields)},
      {"stages", std::move(stages)},
      {"grad_slots", slots(plan.gradSlotOffsets, plan.gradSlotElements)},
      {"weight_slots", slots(plan.weightSlotOffsets, plan.weightSlotElements)},
      {"params", std::move(params)},
      {"memory_per_rank",
       json::Object{
           {"weight_buffers_bytes", r.weights},
           {"gradient_buffers_bytes", r.grads},
           {"master_weights_shard_bytes", r.master},
           {"optimizer_shard_bytes", r.optimizer},
           {"gradient_shard_bytes", r.gradShard},
           {"inputs_bytes", r.inputs},
           {"activations_bytes", plan.activationsBytes},
           {"activations_unshared_bytes", plan.activationsUnsharedBytes},
           {"total_bytes", r.total}}},
      {"communication_bytes",
       json::Object{
           {"per_step",
            json::Object{{"reduce_scatter", plan.reduceScatterBytesPerStep},
                         {"all_gather", plan.allGatherBytesPerStep},
                         {"all_reduce", r.allReduce}}},
           {"per_micro_batch",
            json::Object{
                {"reduce_scatter", plan.reduceScatterBytesPerMicroBatch},
                {"all_gather", plan.allGatherBytesPerMicroBatch}}}}}};
  std::string text;
  raw_string_ostream os(text);
  os << formatv("{0:2}", json::Value(std::move(root))) << "\n";
  return text;
}

static void printReport(const mlir::fastllm::MemoryPlan &plan,
                        raw_ostream &os) {
  auto mib = [](int64_t bytes) {
    return format("%10.2f MiB", bytes / 1048576.0);
  };
  Report r = makeReport(plan);
  auto count = [](size_t n, StringRef what) {
    return std::to_string(n) + " " + what.str() + (n == 1 ? "" : "s");
  };
  std::string weightsWhat = plan.zeroStage == 3
                                ? count(plan.weightSlotElements.size(), "slot")
                                : "one per stage";
  if (plan.frozenElements)
    weightsWhat +=
        " + frozen " + std::to_string(plan.frozenElements * 4) + " B";
  std::string gradsWhat = plan.zeroStage >= 2
                              ? count(plan.gradSlotElements.size(), "slot")
                              : "one per stage";
  os << "memory plan per rank (dp = " << plan.dataParallel << ", ZeRO-"
     << plan.zeroStage << ", " << plan.numStages() << " stages)\n"
     << "  weight buffers (fp32)         " << mib(r.weights) << "   ("
     << weightsWhat << ")\n"
     << "  gradient buffers (fp32)       " << mib(r.grads) << "   ("
     << gradsWhat << ")\n"
     << "  master weights shard (fp32)   " << mib(r.master) << "\n"
     << "  optimizer shard (AdamW m, v)  " << mib(r.optimizer) << "\n"
     << "  gradient shard (fp32)         " << mib(r.gradShard) << "\n"
     << "  tokens + targets              " << mib(r.inputs) << "\n"
     << "  activations (peak)            " << mib(r.activations) << "   ("
     << mib(plan.activationsUnsharedBytes) << " if nothing were shared)\n"
     << "  total arena                   " << mib(r.total) << "\n";
  os << "stages (elements, padded to dp * 32; slots: gradient / weight / "
        "tie)\n";
  auto slot = [](int64_t s) {
    return s < 0 ? std::string("-") : std::to_string(s);
  };
  for (int64_t k = 0; k < plan.numStages(); ++k)
    os << format("  stage %-3lld %12lld", (long long)k,
                 (long long)plan.stageElements[k])
       << "   " << slot(plan.stageGradSlot[k]) << " / "
       << slot(plan.stageWeightSlot[k]) << " / " << slot(plan.stageTieSlot[k])
       << "\n";
  os << "communication per rank: reduce-scatter "
     << plan.reduceScatterBytesPerStep << " B per step + "
     << plan.reduceScatterBytesPerMicroBatch
     << " B per micro-batch, all-gather " << plan.allGatherBytesPerStep
     << " B per step + " << plan.allGatherBytesPerMicroBatch
     << " B per micro-batch, all-reduce " << r.allReduce << " B per step\n";
}

/// One command of the C++ build: args[0] is the program.
struct BuildCommand {
  std::vector<std::string> args;
  std::string what; ///< for messages: "compiling FILE"
};

/// Runs `commands`, at most `jobs` at a time (in the order given: each waits
/// for a free slot), each one's output to a file of its own; then appends
/// every command line and its output to `log` in the order given, whatever
/// order they finished in. On a failure prints what failed and the log;
/// The variable `name` of the environment, or null when it is unset or
/// empty (`FASTLLM_CXX= fastllm-opt ...` means the default).
static const char *setting(const char *name) {
  const char *env = std::getenv(name);
  return env && *env ? env : nullptr;
}

/// The host compiler: the build's, or FASTLLM_CXX.
static std::string hostCompiler() {
  const char *env = setting("FASTLLM_CXX");
  return env ? env : FASTLLM_HOST_CXX;
}

/// commands not yet started then are not started.
static bool runAllLogged(ArrayRef<BuildCommand> commands, StringRef log,
                         unsigned jobs) {
  struct Job {
    sys::ProcessInfo process;
    std::string output;
    bool started = false, done = false;
    int rc = 0;
    std::string error;
  };
  std::vector<Job> run(commands.size());
  for (size_t i = 0; i < commands.size(); ++i)
    run[i].output = (log + ".part" + Twine(i)).str();
  size_t next = 0, running = 0;
  bool failed = false;
  auto start = [&](size_t i) {
    const BuildCommand &c = commands[i];
    Job &job = run[i];
    job.started = true;
    auto program = sys::findProgramByName(c.args[0]);
    if (!program) {
      job.done = true;
      job.rc = -1;
      job.error = "cannot find '" + c.args[0] + "'" +
                  (c.args[0] == hostCompiler() && setting("FASTLLM_CXX")
                       ? " (FASTLLM_CXX)"
                   : setting("FASTLLM_NVCC") && c.args[0] == setting("FASTLLM_NVCC")
                       ? " (FASTLLM_NVCC)"
                       : "");
      return;
    }
    SmallVector<StringRef> argRefs(c.args.begin(), c.args.end());
    std::optional<StringRef> redirects[] = {std::nullopt, StringRef(job.output),
                                            StringRef(job.output)};
    bool execFailed = false;
    job.process = sys::ExecuteNoWait(*program, argRefs, std::nullopt, redirects,
                                     0, &job.error, &execFailed);
    if (execFailed) {
      job.done = true;
      job.rc = -1;
      return;
    }
    ++running;
  };
  while (true) {
    while (!failed && next < commands.size() && running < std::max(jobs, 1u))
      start(next++);
    if (!running)
      break;
    // Reap whichever finished (a non-blocking wait on each), else sleep.
    bool reaped = false;
    for (Job &job : run) {
      if (!job.started || job.done)
        continue;
      sys::ProcessInfo status =
          sys::Wait(job.process, /*SecondsToWait=*/0, &job.error);
      if (status.Pid == 0)
        continue;
      job.done = reaped = true;
      job.rc = status.ReturnCode;
      --running;
    }
    for (const Job &job : run)
      failed |= job.done && job.rc != 0;
    if (!reaped)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  {
    std::error_code ec;
    raw_fd_ostream os(log, ec, sys::fs::OF_Append);
    for (size_t i = 0; i < commands.size() && !ec; ++i) {
      if (!run[i].started)
        continue;
      os << "$";
      for (const std::string &arg : commands[i].args)
        os << " " << arg;
      os << "\n";
      if (auto text = MemoryBuffer::getFile(run[i].output))
        os << (*text)->getBuffer();
    }
  }
  for (const Job &job : run)
    sys::fs::remove(job.output);
  for (size_t i = 0; i < commands.size(); ++i) {
    if (!run[i].started || run[i].rc == 0)
      continue;
    compileError() << commands[i].what << " failed"
                   << (run[i].error.empty() ? "" : ": " + run[i].error) << "\n";
    if (auto text = MemoryBuffer::getFile(log))
      errs() << (*text)->getBuffer();
    return false;
  }
  return true;
}

/// Runs `args` (args[0] is the program) and appends the command line and
/// its output to `log`; on failure prints what failed and the log.
static bool runLogged(ArrayRef<std::string> args, StringRef log,
                      StringRef what) {
  return runAllLogged({BuildCommand{args.vec(), what.str()}}, log, 1);
}

/// How one target's step becomes a binary: the compiler and its flags for
/// the generated source (from the build's configuration, tools/BuildConfig.h)
/// and the libraries it links besides the runtime.
struct BuildRecipe {
  std::string compiler;
  std::vector<std::string> compileFlags;
  /// The flags of the parts of a source in parts that need no optimisation
  /// (the plan and the step's calls, the constants), in place of
  /// compileFlags.
  std::vector<std::string> stepFlags;
  /// The linker's flags: the linker the build's configuration chose, when
  /// the compiler is the build's.
  std::vector<std::string> linkFlags;
  /// The step's headers precompiled by the build (runtime/cpu/CMakeLists.txt)
  /// with compileFlags and stepFlags, in the runtime's lib/; used when
  /// usablePch() says so. Empty: none (another compiler, another target).
  std::string kernelsPch, stepPch;
  std::vector<std::string> targetLibraries; ///< archives in the runtime's lib/
  std::vector<std::string> systemLibraries;
};

template <size_t N>
static void appendFlags(std::vector<std::string> &to,
                        const char *const (&flags)[N]) {
  for (const char *flag : flags)
    if (*flag)
      to.push_back(flag);
}

/// The recipe for `target`, or nullopt with an error when this fastllm-opt
/// cannot build it. FASTLLM_CXX and FASTLLM_NVCC override the compilers.
static std::optional<BuildRecipe> recipeFor(mlir::fastllm::Target target,
                                            bool cudaEmulation,
                                            StringRef targetCpu) {
  const std::string cxx = hostCompiler();
  BuildRecipe r;
  if (cxx == FASTLLM_HOST_CXX)
    appendFlags(r.linkFlags, ::fastllm::build::kLinkFlags);
  if (target == mlir::fastllm::Target::Cpu) {
    r.compiler = cxx;
    bool native = targetCpu == "native";
    if (native) {
      appendFlags(r.compileFlags, ::fastllm::build::kCpuNativeFlags);
      appendFlags(r.stepFlags, ::fastllm::build::kCpuNativeStepFlags);
    } else {
      appendFlags(r.compileFlags, ::fastllm::build::kCpuPortableFlags);
      appendFlags(r.stepFlags, ::fastllm::build::kCpuPortableStepFlags);
    }
    if (cxx == FASTLLM_HOST_CXX) {
      std::string prefix =
          native ? "fastllm_cpu_native_" : "fastllm_cpu_portable_";
      r.kernelsPch = prefix + "kernels.pch";
      r.stepPch = prefix + "step.pch";
    }
    r.targetLibraries = {"libfastllm_rt_cpu.a",
                         native ? "libfastllm_cpu_kernels_native.a"
                                : "libfastllm_cpu_kernels.a"};
    r.systemLibraries = {"-lopenblas"};
  } else if (cudaEmulation) {
    // The same train_step.cu, built by the host compiler against the CUDA
    // emulation (runtime/cuda/emu/), linked with its libraries.
    r.compiler = cxx;
    r.compileFlags = {"-std=c++17"};
    appendFlags(r.compileFlags, ::fastllm::build::kCudaEmulationFlags);
    r.targetLibraries = {"libfastllm_rt_cuda_emu.a",
                         "libfastllm_cuda_kernels_emu.a",
                         "libfastllm_cuda_emu.a"};
    r.systemLibraries = {"-lboost_context", "-lpthread"};
  } else {
    r.compiler = FASTLLM_NVCC;
    if (const char *env = setting("FASTLLM_NVCC"))
      r.compiler = env;
    if (r.compiler.empty()) {
      compileError() << "this fastllm-opt was built without the CUDA toolkit "
                        "(nvcc not found), so it cannot build a CUDA binary; "
                        "--emit source writes train_step.cu (or set "
                        "FASTLLM_NVCC)\n";
      return std::nullopt;
    }
    appendFlags(r.compileFlags, ::fastllm::build::kNvccFlags);
    r.compileFlags.insert(r.compileFlags.end(), {"-ccbin", cxx});
    r.targetLibraries = {"libfastllm_rt_cuda.a", "libfastllm_cuda_kernels.a"};
    std::string cudaLib = FASTLLM_CUDA_LIBRARY_DIR;
    r.systemLibraries = {"-L" + cudaLib, "-Wl,-rpath," + cudaLib, "-lnccl",
                         "-lcublasLt", "-lcudart"};
  }
  return r;
}

/// Where `compile` finds the runtime's headers and archives.
struct RuntimeLocation {
  std::string includeDir; ///< holds runtime/ModelABI.h
  std::string libDir;     ///< holds libfastllm_rt.a
};

/// An installed fastllm-opt (`cmake --install`: PREFIX/bin/fastllm-opt)
/// finds the runtime under PREFIX/include/fastllm and PREFIX/lib/fastllm;
/// one in its build tree, the sources and build/lib it was built from.
/// Reports and returns nullopt for a fastllm-opt outside its build tree
/// without an installed runtime (one copied away alone): the message names
/// what an install holds, never the build machine's paths.
static std::optional<RuntimeLocation> runtimeLocation() {
  static int anchor;
  std::string exe = sys::fs::getMainExecutable(nullptr, &anchor);
  SmallString<256> prefix(sys::path::parent_path(sys::path::parent_path(exe)));
  SmallString<256> include(prefix), abi, lib(prefix);
  sys::path::append(include, "include", "fastllm");
  abi = include;
  sys::path::append(abi, "runtime", "ModelABI.h");
  sys::path::append(lib, "lib", "fastllm");
  if (!exe.empty() && sys::fs::exists(abi))
    return RuntimeLocation{std::string(include), std::string(lib)};
  // The build tree's own fastllm-opt (BUILD/bin beside BUILD/lib) uses the
  // tree; a copy elsewhere never reaches back into it.
  SmallString<256> exeDir, buildBin;
  sys::fs::real_path(sys::path::parent_path(exe), exeDir);
  sys::fs::real_path(Twine(FASTLLM_RUNTIME_LIB_DIR) + "/../bin", buildBin);
  if (!exe.empty() && !exeDir.empty() && exeDir == buildBin)
    return RuntimeLocation{FASTLLM_SOURCE_DIR, FASTLLM_RUNTIME_LIB_DIR};
  compileError() << "cannot find the training runtime: an installed "
                    "fastllm-opt finds it in '"
                 << include << "' and '" << lib
                 << "' (`cmake --install BUILD --prefix "
                 << (prefix.empty() ? StringRef("PREFIX") : StringRef(prefix))
                 << "` puts it there); --emit source needs no runtime\n";
  return std::nullopt;
}

/// `dir`/`name` when it is a precompiled header that is up to date: it
/// exists, and every file it was built from (`name`.d, the compiler's
/// dependency list) still exists and is no newer than it. Clang refuses a
/// header changed since, so a stale or moved one is not used (the parts then
/// parse the headers themselves). Empty otherwise.
static std::string usablePch(StringRef dir, StringRef name) {
  if (name.empty())
    return "";
  SmallString<256> pch(dir);
  sys::path::append(pch, name);
  sys::fs::file_status pchStatus;
  auto deps = MemoryBuffer::getFile(pch + ".d");
  if (sys::fs::status(pch, pchStatus) || !deps)
    return "";
  SmallVector<StringRef> words;
  (*deps)->getBuffer().split(words, ' ', -1, /*KeepEmpty=*/false);
  bool any = false;
  for (StringRef word : words) {
    word = word.trim();
    if (word.empty() || word == "\\" || word.ends_with(":"))
      continue;
    sys::fs::file_status status;
    if (word.ends_with("\\") || sys::fs::status(word, status) ||
        status.getLastModificationTime() > pchStatus.getLastModificationTime())
      return ""; // an escaped space, a missing or a newer file
    any = true;
  }
  return any ? std::string(pch) : "";
}

/// Compiles and links the training binary DIR/train: the generated step, the
/// runtime, and the target's device and kernel libraries. The compilers'
/// output goes to DIR/build.log and is shown on failure.
static bool buildBinary(StringRef dir, mlir::fastllm::Target target,
                        bool cudaEmulation, StringRef targetCpu) {
  std::optional<BuildRecipe> recipe =
      recipeFor(target, cudaEmulation, targetCpu);
  if (!recipe)
    return false;
  auto path = [&](StringRef name) {
    SmallString<256> p(dir);
    sys::path::append(p, name);
    return std::string(p);
  };
  std::string source =
      path(mlir::fastllm::TargetDescription::get(target).sourceFile);
  std::string log = path("build.log"), binary = path("train");
  std::optional<RuntimeLocation> found = runtimeLocation();
  if (!found)
    return false;
  const RuntimeLocation &runtime = *found;

  // A source in parts (codegen/CppEmitter.h, sourceParts()) is compiled as
  // one translation unit per part, concurrently; otherwise as one.
  mlir::fastllm::SourceParts split;
  if (auto text = MemoryBuffer::getFile(source))
    split = mlir::fastllm::sourceParts((*text)->getBuffer());
  unsigned parts = split.count;
  std::vector<BuildCommand> compiles;
  std::vector<std::string> objects;
  for (unsigned k = parts ? 1 : 0; k <= parts; ++k) {
    std::string object =
        path(k ? "train_step.part" + std::to_string(k) + ".o" : "train_step.o");
    BuildCommand c;
    c.args = {recipe->compiler};
    bool unoptimised = k && k <= split.unoptimised;
    const auto &flags = unoptimised && !recipe->stepFlags.empty()
                            ? recipe->stepFlags
                            : recipe->compileFlags;
    c.args.insert(c.args.end(), flags.begin(), flags.end());
    if (k) {
      std::string pch = usablePch(
          runtime.libDir, unoptimised ? recipe->stepPch : recipe->kernelsPch);
      if (!pch.empty())
        c.args.insert(c.args.end(), {"-include-pch", pch});
      c.args.push_back("-DFASTLLM_PART=" + std::to_string(k));
    }
    c.args.insert(c.args.end(),
                  {"-I" + runtime.includeDir, "-c", source, "-o", object});
    c.what = k ? "compiling part " + std::to_string(k) + " of " + source
               : "compiling " + source;
    compiles.push_back(std::move(c));
    objects.push_back(object);
  }
  unsigned jobs = llvm::hardware_concurrency().compute_thread_count();
  if (!runAllLogged(compiles, log, jobs))
    return false;

  const std::string cxx = hostCompiler();
  const std::string &lib = runtime.libDir;
  // The runtime and its target libraries call each other: one group.
  std::vector<std::string> link = {cxx};
  link.insert(link.end(), recipe->linkFlags.begin(), recipe->linkFlags.end());
  link.push_back("-fopenmp");
  link.insert(link.end(), objects.begin(), objects.end());
  link.insert(link.end(),
              {"-Wl,--start-group", lib + "/libfastllm_rt_main.a",
               lib + "/libfastllm_rt.a", lib + "/libfastllm_rt_files.a"});
  for (const std::string &archive : recipe->targetLibraries)
    link.push_back(lib + "/" + archive);
  link.push_back("-Wl,--end-group");
  link.insert(link.end(), recipe->systemLibraries.begin(),
              recipe->systemLibraries.end());
  link.insert(link.end(), {"-lmpi", "-lm", "-o", binary});
  if (!runLogged(link, log, "building " + binary))
    return false;
  // A "compiler" that exits 0 without making anything (FASTLLM_CXX=true)
  // must not replace a working `train` with none.
  sys::fs::file_status status;
  if (sys::fs::status(binary, status) || !sys::fs::is_regular_file(status) ||
      !(status.permissions() & sys::fs::owner_exe) || status.getSize() == 0) {
    compileError() << "the C++ compiler '" << cxx
                   << "' reported success but made no executable '" << binary
                   << "'; nothing was replaced\n";
    return false;
  }
  return true;
}

namespace {

/// `compile`'s command line: its own flags and the pipeline's (expanded
/// from passes/TrainingOptions.def under the same names).
struct CompileFlags {
  explicit CompileFlags(cl::OptionCategory &category);
  /// Checks the flags against each other and fills `pipeline` and
  /// `options`; reports and fails on the first problem.
  bool check(mlir::fastllm::TrainingPipelineOptions &pipeline,
             mlir::fastllm::OnnxImportOptions &options) const;
  mlir::fastllm::Target emitTarget() const {
    return target == "cuda" ? mlir::fastllm::Target::Cuda
                            : mlir::fastllm::Target::Cpu;
  }

  cl::opt<std::string> input;
  cl::opt<std::string> outDir;
  Flag<int64_t> batchSize;
  Flag<int64_t> seqLen;
  mlir::fastllm::ImportFlags importFlags;
  cl::opt<std::string> target;
  cl::opt<std::string> targetCpu;
  cl::opt<bool> cudaEmulation;
#define FASTLLM_TRAINING_OPTION(type, member, flag, initial, help)             \
  Flag<type> member##Flag;
#include "passes/TrainingOptions.def"
  Flag<int64_t> stagesPerPipelineStage;
  cl::opt<bool> report;
  cl::opt<bool> reportChart;
  cl::opt<std::string> emit;
  cl::opt<bool> timePhases;
};

} // namespace

CompileFlags::CompileFlags(cl::OptionCategory &category)
    : input(cl::Positional, cl::Required,
            cl::desc("<model.onnx | model.onnxtext | model.mlir>"),
            cl::cat(category)),
      outDir("o", cl::Required,
             cl::desc("Output folder (required; created if needed); its "
                      "artifacts are replaced all together, only on success"),
             cl::value_desc("dir"), cl::cat(category)),
      batchSize("batch-size",
                cl::desc("Micro-batch per rank (samples); binds dim 0 of the "
                         "token input (default: the model's, when it fixes "
                         "it)"),
                cl::cat(category)),
      seqLen("seq-len",
             cl::desc("Tokens per sample; binds dim 1 of the token input "
                      "(default: the model's, when it fixes it)"),
             cl::cat(category)),
      importFlags(category),
      target("target",
             cl::desc("cpu (the default), or cuda (CUDA C++ built with nvcc "
                      "for " FASTLLM_CUDA_ARCH ")"),
             cl::init("cpu"), cl::cat(category)),
      targetCpu(
          "target-cpu",
          cl::desc("--target cpu: the CPU the binary is built for: portable "
                   "(" FASTLLM_CPU_PORTABLE_NAME ", for the machines a `train` "
                   "is copied to; the default) or native (every instruction "
                   "set of this machine: faster here, may not start "
                   "elsewhere)"),
          cl::init("portable"), cl::cat(category)),
      cudaEmulation(
          "cuda-emulation",
          cl::desc("--target cuda: build the same CUDA source with the host "
                   "compiler against the CUDA emulation, for a `train` that "
                   "runs on CPUs (one emulated H100 per rank; kernels, "
                   "cuBLASLt and NCCL emulated; default: off)"),
          cl::cat(category)),
#define FASTLLM_TRAINING_OPTION(type, member, flag, initial, help)             \
  member##Flag(flag, cl::desc(help), cl::init(initial), cl::cat(category)),
#include "passes/TrainingOptions.def"
      stagesPerPipelineStage(
          "stages-per-pipeline-stage",
          cl::desc("Pipeline parallelism: only 1 (none, the default) is "
                   "supported"),
          cl::init(1), cl::cat(category)),
      report("report",
             cl::desc("Print the per-rank memory plan (default: off)"),
             cl::cat(category)),
      reportChart("report-chart",
                  cl::desc("Also draw the per-rank memory plan as "
                           "DIR/memory.png (fastllm-plot memory, with "
                           "python3-matplotlib; default: off)"),
                  cl::cat(category)),
      emit("emit",
           cl::desc("Stop after writing: mlir | source | binary (the "
                    "default)"),
           cl::init("binary"), cl::cat(category)),
      timePhases("time-phases",
                 cl::desc("Print each phase's wall time and the peak memory "
                          "so far to stderr: import, passes, plan (plan.mlir "
                          "and plan.json), source, weights, build (the C++ "
                          "compiler and linker, while the weights are "
                          "written) (default: off)"),
                 cl::cat(category)) {
}

bool CompileFlags::check(mlir::fastllm::TrainingPipelineOptions &pipeline,
                         mlir::fastllm::OnnxImportOptions &options) const {
  if (target != "cpu" && target != "cuda") {
    compileError() << "--target " << target
                   << " is not supported (supported: cpu, cuda)\n";
    return false;
  }
  if (targetCpu != "portable" && targetCpu != "native") {
    compileError() << "--target-cpu " << targetCpu
                   << " is not a CPU target (portable or native)\n";
    return false;
  }
  if (targetCpu.getNumOccurrences() &&
      emitTarget() != mlir::fastllm::Target::Cpu) {
    compileError() << "--target-cpu applies to --target cpu\n";
    return false;
  }
  if (cudaEmulation && emitTarget() != mlir::fastllm::Target::Cuda) {
    compileError() << "--cuda-emulation needs --target cuda\n";
    return false;
  }
  if (cudaEmulation && !*FASTLLM_CUDA_INCLUDE_DIR) {
    compileError() << "this fastllm-opt was built without the CUDA toolkit, "
                      "whose headers the CUDA emulation is built against\n";
    return false;
  }
#define FASTLLM_TRAINING_OPTION(type, member, flag, initial, help)             \
  if (member##Flag.getNumOccurrences())                                        \
    pipeline.member = member##Flag.getValue();
#include "passes/TrainingOptions.def"
  if (failed(mlir::fastllm::verifyTrainingOptions(
          pipeline, "--",
          [](const Twine &message) { compileError() << message << "\n"; })))
    return false;
  if (pipeline.precision == "bf16" &&
      emitTarget() != mlir::fastllm::Target::Cuda) {
    compileError() << "--precision bf16 needs --target cuda (the CPU target "
                      "computes in fp32)\n";
    return false;
  }
  if (stagesPerPipelineStage != 1) {
    compileError() << "--stages-per-pipeline-stage " << stagesPerPipelineStage
                   << ": pipeline parallelism is not supported; use 1\n";
    return false;
  }
  if (emit != "mlir" && emit != "source" && emit != "binary") {
    compileError() << "--emit must be mlir, source or binary, got '" << emit
                   << "'\n";
    return false;
  }
  // A binary needs the runtime: checked before anything is made.
  if (emit == "binary" && !runtimeLocation())
    return false;
  if (!importFlags.fill(options))
    return false;
  if (batchSize.getNumOccurrences())
    options.batchSize = batchSize;
  if (seqLen.getNumOccurrences())
    options.seqLen = seqLen;
  return true;
}

/// Parses a model-dialect module (`fastllm-opt import` output, or
/// hand-written IR for compiler work), which skips the importer: its shapes
/// are already static and must agree with --batch-size / --seq-len.
static OwningOpRef<ModuleOp>
parseModelModule(MLIRContext &context, StringRef input,
                 const mlir::fastllm::OnnxImportOptions &options) {
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(input, &context);
  if (!module)
    return nullptr;
  auto forward = module->lookupSymbol<func::FuncOp>("forward");
  if (!forward || forward.getNumArguments() == 0) {
    compileError() << input << " has no func.func @forward with inputs\n";
    return nullptr;
  }
  auto tokens = dyn_cast<RankedTensorType>(forward.getArgument(0).getType());
  if (!tokens || tokens.getRank() != 2 ||
      (options.batchSize && tokens.getDimSize(0) != *options.batchSize) ||
      (options.seqLen && tokens.getDimSize(1) != *options.seqLen)) {
    compileError() << "the first input of @forward is "
                   << forward.getArgument(0).getType()
                   << ", not [batch-size, seq-len] tokens"
                   << (options.batchSize || options.seqLen
                           ? " of the sizes given"
                           : "")
                   << "\n";
    return nullptr;
  }
  return module;
}

/// Whether @forward has a [batch, seq] integer input for the token ids. A
/// model without one gets this plain message rather than the pipeline's
/// (the pipeline decides the inputs' roles and sizes).
static bool hasTokenInput(ModuleOp module, StringRef input) {
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  for (BlockArgument arg :
       forward ? forward.getArguments() : ArrayRef<BlockArgument>{}) {
    auto t = dyn_cast<RankedTensorType>(arg.getType());
    if (t && t.getRank() == 2 && isa<IntegerType>(t.getElementType()) &&
        !t.getElementType().isInteger(1))
      return true;
  }
  compileError() << input
                 << ": the model has no [batch, seq] integer token input\n";
  return false;
}

/// Draws the per-rank memory chart of `planJson` into `png` with
/// fastllm-plot, installed beside this executable.
static bool drawMemoryChart(StringRef planJson, StringRef png, StringRef log) {
  static int anchor;
  std::string exe = sys::fs::getMainExecutable(nullptr, &anchor);
  SmallString<256> plot(sys::path::parent_path(exe));
  sys::path::append(plot, "fastllm-plot");
  if (!sys::fs::can_execute(plot)) {
    compileError() << "--report-chart needs fastllm-plot beside fastllm-opt ("
                   << plot << " is missing)\n";
    return false;
  }
  return runLogged(
      {std::string(plot), "memory", planJson.str(), "-o", png.str()}, log,
      "drawing the memory chart");
}

/// Writes the artifacts `flags.emit` asks for into the staging folder of
/// The artifacts a successful compile with `flags` writes to its folder.
static std::vector<std::string> artifactsOf(const CompileFlags &flags) {
  std::vector<std::string> names = {"plan.mlir", "plan.json"};
  if (flags.reportChart)
    names.push_back("memory.png");
  if (flags.emit != "mlir") {
    names.push_back(
        mlir::fastllm::TargetDescription::get(flags.emitTarget())
            .sourceFile.str());
    names.push_back("weights.safetensors");
  }
  if (flags.emit == "binary") {
    names.push_back("build.log");
    names.push_back("train");
  }
  return names;
}

/// `output` and builds the binary; the caller commits.
static bool writeArtifacts(ModuleOp module,
                           const mlir::fastllm::MemoryPlan &plan,
                           const CompileFlags &flags, StagedOutput &output,
                           PhaseTimer &timer) {
  auto path = [&](StringRef name) { return output.path(name); };
  // The plan is for reading: constants of more than 64 elements print as
  // `dense_resource<__elided__>` and the weights are named, never printed
  // (weights.safetensors holds them). The module is printed as a local scope
  // so that the printer does not build the `dialect_resources` section at
  // all: MLIR 19 renders every referenced blob as hex before deciding to
  // elide it, which cost three quarters of `--emit mlir` and twice the
  // largest weight in memory. (Attribute aliases, which plan.mlir does not
  // have today, would print inline.)
  std::string text;
  raw_string_ostream os(text);
  os << "// The planned IR, for reading: constants of more than 64 elements "
        "are\n// elided (dense_resource<__elided__>) and weights are named, "
        "not included\n// (weights.safetensors holds them). `fastllm-opt "
        "translate` reads this file\n// only when no constant the step uses "
        "is elided.\n";
  module.print(os,
               OpPrintingFlags().elideLargeElementsAttrs(64).useLocalScope());
  os << "\n";
  if (!writeFile(path("plan.mlir"), text) ||
      !writeFile(path("plan.json"),
                 planJson(module, plan, flags.target, artifactsOf(flags))))
    return false;
  if (flags.report)
    printReport(plan, outs());
  if (flags.reportChart &&
      !drawMemoryChart(path("plan.json"), path("memory.png"),
                       output.path("build.log")))
    return false;
  timer.end("plan");
  if (flags.emit == "mlir")
    return true;

  mlir::fastllm::Target target = flags.emitTarget();
  {
    std::string source;
    raw_string_ostream sourceStream(source);
    if (failed(mlir::fastllm::emitSource(module, target, sourceStream)) ||
        !writeFile(
            path(mlir::fastllm::TargetDescription::get(target).sourceFile),
            source))
      return false;
  }
  timer.end("source");
  if (flags.emit == "source") {
    if (failed(
            mlir::fastllm::writeWeights(module, path("weights.safetensors"))))
      return false;
    timer.end("weights");
    return true;
  }
  // The weights are written by a thread of this process while the
  // compilers (child processes) build the binary: neither waits for the
  // other (GPT-2: writing 0.5 GB, syncing it, and the C++ build). Only the
  // writer reads the module meanwhile (MLIR's diagnostic engine is
  // thread-safe).
  bool weightsWritten = false;
  double weightsWall = 0;
  std::thread writer([&] {
    PhaseTimer::Clock::time_point start = PhaseTimer::Clock::now();
    weightsWritten = succeeded(
        mlir::fastllm::writeWeights(module, path("weights.safetensors")));
    weightsWall = PhaseTimer::since(start);
  });
  PhaseTimer::Clock::time_point buildStart = PhaseTimer::Clock::now();
  bool built = buildBinary(output.stagingDir(), target, flags.cudaEmulation,
                           flags.targetCpu);
  double buildWall = PhaseTimer::since(buildStart);
  writer.join();
  timer.alongside("weights", weightsWall);
  timer.alongside("build", buildWall);
  return built && weightsWritten;
}

void mlir::fastllm::printVersion(raw_ostream &os) {
  os << "fastllm-opt " << ::fastllm::rt::versionString()
     << "\n  built on LLVM/MLIR " << LLVM_VERSION_STRING << "\n";
}

int mlir::fastllm::compileMain(int argc, char **argv) {
  cl::OptionCategory category("fastllm-opt compile options");
  CompileFlags flags(category);
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  // --mlir-print-ir-after=PASS and the like name the pipeline's passes,
  // registered before the flags that list them.
  mlir::fastllm::registerFastllmPasses();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  cl::HideUnrelatedOptions({&category, &getColorCategory()});
  cl::ParseCommandLineOptions(
      argc, argv,
      "fastllm-opt compile: ONNX training graph (output: the loss) to a "
      "training program in the output folder: plan.mlir, train_step.cpp, "
      "weights.safetensors, plan.json and the `train` binary\n\n"
      "MLIR's pass-manager flags work here too (--help-hidden lists them): "
      "--mlir-print-ir-after-all, --mlir-print-ir-before=PASS, "
      "--mlir-timing, --mlir-pass-statistics, ...\n");

  mlir::fastllm::TrainingPipelineOptions pipeline;
  mlir::fastllm::OnnxImportOptions options;
  if (!flags.check(pipeline, options))
    return 1;
  // The files the model is read from: no artifact may replace one.
  std::vector<std::string> inputsRead = {flags.input};
  options.filesRead = &inputsRead;

  PhaseTimer timer(flags.timePhases);
  mlir::fastllm::DriverContext driver;
  MLIRContext &context = driver.context;
  StringRef input = flags.input;
  OwningOpRef<ModuleOp> module =
      input.ends_with(".mlir")
          ? parseModelModule(context, input, options)
          : mlir::fastllm::importOnnxFile(&context, input, options);
  if (!module || !hasTokenInput(*module, input))
    return 1;
  timer.end("import");

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  applyDefaultTimingPassManagerCLOptions(pm);
  mlir::fastllm::buildTrainingPipeline(pm, pipeline);
  if (failed(pm.run(*module)))
    return 1;
  std::optional<mlir::fastllm::MemoryPlan> plan =
      mlir::fastllm::MemoryPlan::get(*module);
  if (!plan)
    return 1;
  timer.end("passes");

  StagedOutput output;
  if (!output.create(flags.outDir) ||
      !writeArtifacts(*module, *plan, flags, output, timer))
    return 1;
  if (!output.commit(inputsRead))
    return 1;
  timer.total();
  return 0;
}
