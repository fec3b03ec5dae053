//===- Train.cpp - the training loop --------------------------------------===//

#include "runtime/Train.h"
#include "runtime/Version.h"

#include "runtime/Checkpoint.h"
#include "runtime/InputFile.h"
#include "runtime/Data.h"
#include "runtime/Device.h"
#include "runtime/Json.h"
#include "runtime/Metrics.h"
#include "runtime/Optimizer.h"
#include "runtime/OutputFile.h"
#include "runtime/Plan.h"
#include "runtime/Safetensors.h"
#include "runtime/Signals.h"
#include "runtime/Trace.h"
#include "runtime/Zero.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace fastllm::rt;

namespace {

/// The folder that will hold `path` must exist and be writable, and `path`
/// must be nothing or a regular file (OutputFile replaces nothing else),
/// checked before training so a typo does not cost a finished run its output.
Status checkOutputPath(const char *flag, const std::string &path) {
  if (path.empty())
    return Status();
  size_t slash = path.find_last_of('/');
  std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (access(dir.c_str(), W_OK) != 0)
    return errorf("--%s '%s': cannot write to folder '%s': %s", flag,
                  path.c_str(), dir.c_str(), std::strerror(errno));
  if (std::string why = checkReplaceable(path); !why.empty())
    return errorf("--%s: %s", flag, why.c_str());
  return Status();
}

/// Creates the --checkpoint-dir folder and its parents if needed; it must
/// end up a writable folder. Then takes the folder's lock for the job and
/// removes the temporaries of killed saves. A fresh run must not start among
/// another run's complete checkpoints: a later --resume would take the
/// newest, which is not its own; incomplete ones are ignored.
Expected<CheckpointLock> prepareCheckpointDir(const std::string &dir,
                                              bool resume, FILE *log) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    std::string prefix = dir.substr(0, slash);
    if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      return errorf("--checkpoint-dir '%s': cannot create '%s': %s",
                    dir.c_str(), prefix.c_str(), std::strerror(errno));
    if (slash == std::string::npos)
      break;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      access(dir.c_str(), W_OK) != 0)
    return errorf("--checkpoint-dir '%s' is not a writable folder",
                  dir.c_str());
  Expected<CheckpointLock> lock = CheckpointLock::acquire(dir);
  if (!lock)
    return lock;
  if (std::string why = checkStepFolders(dir); !why.empty())
    return errorf("--checkpoint-dir '%s': %s", dir.c_str(), why.c_str());
  Expected<int64_t> orphans = removeOrphanTemporaries(dir);
  if (!orphans)
    return orphans.status();
  if (*orphans && log)
    std::fprintf(log,
                 "checkpoint folder: removed %lld temporary file%s left by "
                 "an interrupted save\n",
                 (long long)*orphans, *orphans == 1 ? "" : "s");
  // Any save that finished, whether it reads back or not, is the user's:
  // a fresh run would overwrite and then prune it.
  Expected<std::vector<int64_t>> steps = listCheckpointSteps(dir);
  if (!steps)
    return steps.status();
  if (!resume)
    for (int64_t step : *steps)
      if (hasManifest(dir + "/" + stepFolderName(step)))
        return errorf("--checkpoint-dir '%s' already holds checkpoints (the "
                      "newest is step %lld); pass --resume to continue from "
                      "them or choose an empty folder",
                      dir.c_str(), (long long)step);
  return lock;
}

/// The options a checkpointed run depends on besides its plan. A resumed run
/// may change them, but is warned that it will not repeat the original.
Fingerprint runFingerprint(const Options &opts, int64_t dataTokens) {
  auto real = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", x);
    return std::string(buf);
  };
  bool cosine = opts.lrSchedule == LrScheduleKind::Cosine;
  // The data by its size and ends, not only its token count: a resume on
  // another file of the same length is warned too.
  Fingerprint f = {{"data_tokens", std::to_string(dataTokens)},
                   {"data_sample_crc32c", fileCrc32c(opts.dataPath, 1 << 20)},
                   {"sampler", opts.sampler == SamplerKind::Sequential
                                   ? "sequential"
                                   : "random"},
                   {"seed", std::to_string(opts.seed)},
                   {"grad_accum", std::to_string(opts.gradAccum)},
                   {"lr", real(opts.lr)},
                   {"lr_schedule", cosine ? "cosine" : "constant"},
                   {"warmup_steps", std::to_string(opts.warmupSteps)},
                   {"beta1", real(opts.adamw.beta1)},
                   {"beta2", real(opts.adamw.beta2)},
                   {"eps", real(opts.adamw.eps)},
                   {"weight_decay", real(opts.adamw.weightDecay)},
                   {"clip_grad_norm", real(opts.clipGradNorm)}};
  if (cosine) // the cosine schedule spans --steps; a constant one does not
    f.push_back({"steps", std::to_string(opts.steps)});
  // (Only when given: checkpoints from before the flags compare equal.)
  if (!opts.adamw.decayRegex.empty())
    f.push_back({"decay", opts.adamw.decayRegex});
  if (!opts.adamw.noDecayRegex.empty())
    f.push_back({"no_decay", opts.adamw.noDecayRegex});
  return f;
}

/// What every rank must have been started with alike: the run's
/// fingerprint and every flag that decides what the ranks do together
/// (step counts, collectives, checkpoints, evaluation). Paths may differ
/// from node to node; whether an output is written may not (the ZeRO-3
/// gather for --save-weights involves every rank).
Fingerprint sharedOptions(const Options &opts, int64_t dataTokens,
                          int64_t valTokens) {
  Fingerprint f = runFingerprint(opts, dataTokens);
  // Not only the flags: the files they name must hold the same bytes on
  // every rank (a stale copy of the run folder on one node trained a mix of
  // two models). The weights whole; the data by its ends.
  // (The data's is in the run fingerprint.)
  f.push_back({"weights_crc32c", fileCrc32c(opts.weightsPath)});
  if (!opts.valDataPath.empty())
    f.push_back({"val_data_sample_crc32c", fileCrc32c(opts.valDataPath, 1 << 20)});
  auto flag = [](bool b) { return std::string(b ? "given" : "not given"); };
  for (auto [key, value] : Fingerprint{
           {"steps", std::to_string(opts.steps)},
           {"val_data_tokens", std::to_string(valTokens)},
           {"eval_every", std::to_string(opts.evalEvery)},
           {"eval_steps", std::to_string(opts.evalSteps)},
           {"checkpoint_dir", flag(!opts.checkpointDir.empty())},
           {"checkpoint_every", std::to_string(opts.checkpointEvery)},
           {"keep_last", std::to_string(opts.keepLast)},
           {"resume", flag(opts.resume)},
           {"max_skipped_steps", std::to_string(opts.maxSkippedSteps)},
           {"allow_nonfinite", flag(opts.allowNonfinite)},
           {"save_weights", flag(!opts.saveWeightsPath.empty())},
           {"dump_grads", flag(!opts.dumpGradsPath.empty())},
           {"trace", flag(!opts.tracePath.empty())},
           {"trace_steps", std::to_string(opts.traceFirst) + "-" +
                               std::to_string(opts.traceLast)}})
    if (key != "steps" ||
        std::none_of(f.begin(), f.end(),
                     [](const auto &kv) { return kv.first == "steps"; }))
      f.push_back({key, value});
  return f;
}

/// Refuses a job whose ranks were started with different flags (an mpirun
/// with a command per rank, or config files that differ between nodes):
/// they would train with mixed settings, or wait on each other's
/// collectives until the timeout. Compares a hash of sharedOptions; on a
/// mismatch each rank names its first difference from rank 0.
Status checkRanksAgree(const Fingerprint &mine, Communicator &comm) {
  if (comm.size() == 1)
    return Status();
  std::string text;
  for (const auto &[key, value] : mine)
    text += key + "=" + value + "\n";
  uint64_t hash = 1469598103934665603ull; // FNV-1a
  for (unsigned char c : text)
    hash = (hash ^ c) * 1099511628211ull;
  std::vector<uint64_t> hashes(size_t(comm.size()));
  comm.allGatherBytes(&hash, hashes.data(), sizeof(hash));
  if (std::all_of(hashes.begin(), hashes.end(),
                  [&](uint64_t h) { return h == hashes[0]; }))
    return Status();
  // Rank 0's list, then each rank's first difference from it.
  int64_t bytes = int64_t(text.size());
  comm.broadcast(&bytes, sizeof(bytes), 0);
  std::string first(size_t(bytes), '\0');
  if (comm.rank() == 0)
    first = text;
  comm.broadcast(first.data(), bytes, 0);
  Fingerprint theirs;
  for (size_t at = 0, end; (end = first.find('\n', at)) != std::string::npos;
       at = end + 1) {
    std::string line = first.substr(at, end - at);
    size_t eq = line.find('=');
    theirs.push_back({line.substr(0, eq), line.substr(eq + 1)});
  }
  constexpr int kReasonBytes = 160;
  char reason[kReasonBytes] = {};
  for (size_t i = 0; i < mine.size(); ++i)
    if (i >= theirs.size() || theirs[i] != mine[i]) {
      std::snprintf(reason, sizeof(reason), "%s is %s (rank 0: %s)",
                    mine[i].first.c_str(), mine[i].second.c_str(),
                    i < theirs.size() && theirs[i].first == mine[i].first
                        ? theirs[i].second.c_str()
                        : "another flag");
      break;
    }
  std::vector<char> reasons(size_t(kReasonBytes) * comm.size());
  comm.allGatherBytes(reason, reasons.data(), kReasonBytes);
  std::string message = "the ranks were started with different flags";
  int shown = 0;
  for (int r = 1; r < comm.size() && shown < 4; ++r)
    if (const char *why = &reasons[size_t(r) * kReasonBytes]; *why) {
      message += (shown++ ? "; rank " : ": rank ") + std::to_string(r) +
                 " differs from rank 0: " + why;
    }
  return Status::error(message + "; start every rank with the same flags");
}

/// Keeps the metrics file's lines up to `step`, dropping later ones (and a
/// line torn by a kill), so that a resumed run appends to the history of the
/// checkpoint it continues. `loss` (lossText, empty when the manifest has
/// none) must be step `step`'s loss in the file: another run's file with the
/// same steps is refused, never cut.
Status truncateMetrics(const std::string &path, int64_t step,
                       const std::string &loss, std::string *gap) {
  if (std::string why = checkReplaceable(path); !why.empty())
    return Status::error("metrics file: " + why);
  Expected<OpenedInput> in =
      openInput(path, "--metrics '" + path + "'", InputOptions());
  if (!in)
    return notFound(in.status()) ? Status() // the resumed run starts it
                                 : in.status();
  // Read a chunk at a time; only the kept lines are held. Every complete
  // line must be one of a run's metrics lines (a JSON object with a step),
  // and text after the last newline may only be the start of one, cut
  // short by a killed run: any other file is the user's and is refused,
  // never cut.
  constexpr size_t kMaxLine = size_t(64) << 10;
  std::string kept, line;
  int64_t nextStep = 1;
  std::vector<char> chunk(size_t(1) << 20);
  int64_t number = 0;
  bool done = false;
  // Losses compare as numbers: "5.627004620" is the checkpoint's
  // "5.62700462"; NaN matches NaN.
  auto sameLoss = [](const std::string &a, const std::string &b) {
    auto value = [](const std::string &text) {
      return text == "NaN" ? std::nan("") : std::strtod(text.c_str(), nullptr);
    };
    double x = value(a), y = value(b);
    return !a.empty() && (x == y || (std::isnan(x) && std::isnan(y)));
  };
  auto refuse = [&](const std::string &why) {
    return errorf("--metrics '%s' is not this run's metrics file (line %lld "
                  "%s); it is left as it is: move it away or choose another "
                  "--metrics",
                  path.c_str(), (long long)number, why.c_str());
  };
  for (uint64_t offset = 0; !done && offset < uint64_t(in->size);) {
    size_t n = size_t(std::min<uint64_t>(chunk.size(), in->size - offset));
    if (!readAt(in->fd.get(), chunk.data(), n, offset))
      return errorf("cannot read --metrics '%s'", path.c_str());
    offset += n;
    for (size_t i = 0; i < n && !done; ++i) {
      if (chunk[i] != '\n') {
        if (line.size() >= kMaxLine)
          return ++number, refuse("is longer than 64 KiB");
        line.push_back(chunk[i]);
        continue;
      }
      ++number;
      Expected<MetricsLine> parsed = parseMetricsLine(line);
      if (!parsed)
        return refuse("is not a metrics line");
      if (parsed->step > uint64_t(step)) {
        done = true; // a later step of this run: dropped with the rest
      } else {
        if (int64_t(parsed->step) == step && !loss.empty() &&
            !sameLoss(parsed->loss, loss))
          return refuse("has step " + std::to_string(step) + "'s loss " +
                        (parsed->loss.empty() ? "missing" : parsed->loss) +
                        ", the checkpoint's is " + loss);
        kept += line + "\n";
        // This run's history is steps 1, 2, ... in order, once each.
        if (gap->empty() && int64_t(parsed->step) != nextStep)
          *gap = "step " + std::to_string(parsed->step) + " where step " +
                 std::to_string(nextStep) + " was due";
        nextStep = int64_t(parsed->step) + 1;
      }
      line.clear();
    }
  }
  if (!done && !line.empty() && line[0] != '{')
    return ++number, refuse("is not a metrics line");
  if (gap->empty() && nextStep != step + 1)
    *gap = "it ends at step " + std::to_string(nextStep - 1) +
           ", the checkpoint is at step " + std::to_string(step);
  if (std::string why = writeFileAtomically(path, kept); !why.empty())
    return Status::error("cannot rewrite metrics file: " + why);
  return Status();
}

using Clock = std::chrono::steady_clock;

/// The process's own peak resident set so far, in bytes: VmHWM from
/// /proc/self/status. (getrusage's ru_maxrss survives exec: a run started
/// from a large Python process reported the parent's 1176 MiB.) -1 when it
/// cannot be read.
int64_t peakRssBytes() {
  FILE *f = std::fopen("/proc/self/status", "re");
  if (!f)
    return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof(line), f))
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1)
      break;
  std::fclose(f);
  return kib < 0 ? -1 : int64_t(kib) * 1024;
}

/// Now as ISO 8601 UTC with milliseconds, and as local hh:mm:ss.
void stampTime(StepRecord &r) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  long ms = long(std::chrono::duration_cast<std::chrono::milliseconds>(
                     now.time_since_epoch())
                     .count() %
                 1000);
  std::tm utc, local;
  gmtime_r(&t, &utc);
  localtime_r(&t, &local);
  char buf[64], iso[80];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(iso, sizeof(iso), "%s.%03ldZ", buf, ms);
  r.timestamp = iso;
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &local);
  r.clock = buf;
}

std::string planSummary(const PlanInfo &plan, const Options &opts) {
  ParamCounts counts = countParams(plan);
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "plan: %s | %lld params (%lld trainable) | dp %d, ZeRO-%d, "
                "%d stage%s | arena %.1f MiB | batch %lld x seq %lld x accum "
                "%lld | %lld steps",
                deviceDescription(), (long long)counts.total,
                (long long)counts.trainable, plan.dataParallel, plan.zeroStage,
                plan.numStages, plan.numStages == 1 ? "" : "s",
                plan.arenaBytes / 1048576.0, (long long)plan.batchSize,
                (long long)plan.seqLen, (long long)opts.gradAccum,
                (long long)opts.steps);
  return buf;
}

} // namespace

Status fastllm::rt::checkWorldSize(const PlanInfo &plan, int worldSize) {
  if (plan.dataParallel != worldSize)
    return errorf("this binary was compiled for --dp %d but runs on %d "
                  "rank%s",
                  plan.dataParallel, worldSize, worldSize == 1 ? "" : "s");
  return Status();
}

Status fastllm::rt::train(const PlanInfo &plan, StepFunction step,
                          const Options &opts, Communicator &comm, FILE *log,
                          RunOutcome *outcome) {
  RunOutcome ignored;
  if (!outcome)
    outcome = &ignored;
  *outcome = RunOutcome();
  if (Status s = validatePlan(plan); !s.ok())
    return s;
  if (Status s = checkWorldSize(plan, comm.size()); !s.ok())
    return s;
  const int64_t dp = comm.size(), rank = comm.rank();
  const bool leader = rank == 0;
  if (!leader)
    log = nullptr;
  comm.setTimeout(opts.collectiveTimeout);
  comm.setStep(0);
  Expected<TokenFile> data =
      TokenFile::open(opts.dataPath, opts.dataDtype, plan.seqLen,
                      plan.vocabSize, opts.dataDtypeGiven);
  if (!data)
    return data.status();
  std::optional<TokenFile> valData;
  if (!opts.valDataPath.empty()) {
    Expected<TokenFile> val =
        TokenFile::open(opts.valDataPath, opts.dataDtype, plan.seqLen,
                        plan.vocabSize, opts.dataDtypeGiven);
    if (!val)
      return Status::error("--val-data: " + val.status().message());
    valData = std::move(*val);
  }
  // Where the run will write, before anything is loaded or computed: no
  // output may be an input (the data, the weights, the binary itself) or
  // another output.
  {
    std::vector<NamedPath> files = {
        {"--data", opts.dataPath},
        {"--val-data", opts.valDataPath},
        {"--weights", opts.weightsPath},
        {"--config", opts.configPath},
        {"the training binary", "/proc/self/exe"},
        {"--metrics", opts.metricsPath, true},
        {"--dump-grads", opts.dumpGradsPath, true},
        {"--save-weights", opts.saveWeightsPath, true},
        {"--trace", opts.tracePath, true},
        {"--checkpoint-dir", opts.checkpointDir, true}};
    if (std::string clash = distinctPaths(files); !clash.empty())
      return Status::error(clash);
    // Nor a file the checkpoint folder keeps: its lock, a step folder or
    // anything in one (a user's own file beside them is fine), of this
    // run's folder or of another's.
    for (const NamedPath &f : files)
      if (f.output && f.flag != "--checkpoint-dir" && !f.path.empty())
        if (std::string why = checkpointFolderEntry(f.path, opts.checkpointDir);
            !why.empty())
          return errorf("%s '%s' %s; choose another path", f.flag.c_str(),
                        f.path.c_str(), why.c_str());
  }
  for (Status s : {checkOutputPath("metrics", opts.metricsPath),
                   checkOutputPath("dump-grads", opts.dumpGradsPath),
                   checkOutputPath("save-weights", opts.saveWeightsPath),
                   checkTracePath(opts.tracePath, opts.overwrite)})
    if (!s.ok())
      return s;
  // An output that exists is replaced only with --overwrite (--resume
  // continues its --metrics file). Rank 0 writes them and alone checks:
  // another rank could look after rank 0 made the metrics file.
  if (leader && !opts.overwrite)
    for (auto [flag, path] : {std::pair{"--dump-grads", &opts.dumpGradsPath},
                              {"--save-weights", &opts.saveWeightsPath},
                              {"--metrics", &opts.metricsPath}}) {
      struct stat st;
      if (path->empty() || lstat(path->c_str(), &st) != 0 ||
          (opts.resume && std::string(flag) == "--metrics"))
        continue;
      return errorf("%s '%s' exists; pass --overwrite to replace it%s", flag,
                    path->c_str(),
                    std::string(flag) == "--metrics" &&
                            !opts.checkpointDir.empty()
                        ? " (or --resume to continue the run it records)"
                        : "");
    }

  // Padding (between parameters and at the ends of stages) starts zero and
  // stays zero: no optimizer chunk covers it, so the master shards keep the
  // zeros they are copied with and the all-gathers bring them back.
  Expected<Arena> allocated = allocateArena(plan.arenaBytes);
  if (!allocated)
    return allocated.status();
  ArenaPtr *arena = &allocated->data;
  auto region = [&](int64_t offset) {
    return reinterpret_cast<float *>(arena->get() + offset);
  };
  float *params = plan.paramsOffset >= 0 ? region(plan.paramsOffset) : nullptr;
  float *grads = plan.gradsOffset >= 0 ? region(plan.gradsOffset) : nullptr;
  float *frozen = plan.frozenElements ? region(plan.frozenOffset) : nullptr;
  float *master = region(plan.masterOffset), *adamM = region(plan.adamMOffset),
        *adamV = region(plan.adamVOffset),
        *gradShard = region(plan.gradShardOffset);
  auto *tokens = reinterpret_cast<int64_t *>(arena->get() + plan.tokensOffset);
  auto *targets =
      reinterpret_cast<int64_t *>(arena->get() + plan.targetsOffset);
  Expected<std::unique_ptr<ShardComm>> shardComm =
      createShardComm(comm, opts.collectiveTimeout);
  if (!shardComm)
    return shardComm.status();
  Zero zero(plan, comm, **shardComm, arena->get());
  // The full weights, where the step reads them (ZeRO-1/2) or, for ZeRO-3,
  // outside the arena while they are loaded and for --save-weights.
  std::vector<float> fullOutside;
  auto fullParams = [&]() {
    if (params)
      return params;
    fullOutside.assign(plan.paramElements, 0.0f);
    return fullOutside.data();
  };

  // The checkpoint folder, locked by rank 0 until train() returns.
  const bool checkpointing = !opts.checkpointDir.empty();
  std::optional<CheckpointLock> folderLock;
  if (checkpointing && leader) {
    Expected<CheckpointLock> lock =
        prepareCheckpointDir(opts.checkpointDir, opts.resume, log);
    if (!lock)
      return lock.status();
    folderLock = std::move(*lock);
  }

  // What a checkpoint holds: this rank's shards of the optimizer state. The
  // full params are the all-gathered master shards; grads are zeroed every
  // step.
  const int64_t shardBytes = shardElements(plan) * int64_t(sizeof(float));
  const std::vector<Region> state =
      optimizerStateRegions(master, adamM, adamV, shardBytes);
  if (log)
    std::fprintf(log, "fastllm-opt %s: training %s\n%s\n", versionString(),
                 plan.target, planSummary(plan, opts).c_str());
  if (log && (!opts.adamw.decayRegex.empty() ||
              !opts.adamw.noDecayRegex.empty())) {
    // What the regexes chose, before a step is spent on it.
    int64_t trained = 0, decayed = 0;
    for (int32_t i = 0; i < plan.numParams; ++i) {
      const ParamInfo &p = plan.params[i];
      if (!p.trainable)
        continue;
      ++trained;
      if (decays(p, opts.adamw))
        ++decayed;
    }
    std::fprintf(log,
                 "weight decay %g on %lld of %lld trained tensors (--decay "
                 "'%s', --no-decay '%s')\n",
                 opts.adamw.weightDecay, (long long)decayed,
                 (long long)trained, opts.adamw.decayRegex.c_str(),
                 opts.adamw.noDecayRegex.c_str());
  }
  // The weights file as it is now (the frozen parameters come from it), for
  // the manifests: consolidate finds it there.
  struct {
    std::string path, crc;
    int64_t bytes = -1, mtimeNs = -1;
  } initialWeights;
  if (struct stat st; stat(opts.weightsPath.c_str(), &st) == 0) {
    if (char *real = realpath(opts.weightsPath.c_str(), nullptr)) {
      initialWeights.path = real;
      std::free(real);
      initialWeights.bytes = int64_t(st.st_size);
      initialWeights.mtimeNs =
          int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      // Its digest, when checkpoints will record it: a resume (or
      // consolidate) must read the frozen parameters from the same bytes.
      if (!opts.checkpointDir.empty() && plan.frozenElements > 0)
        initialWeights.crc = fileCrc32c(opts.weightsPath);
    }
  }
  const Fingerprint planPrint = planFingerprint(plan);
  const Fingerprint runPrint = runFingerprint(opts, data->size());
  if (comm.size() > 1)
    if (Status s = checkRanksAgree(
            sharedOptions(opts, data->size(), valData ? valData->size() : 0),
            comm);
        !s.ok())
      return s;
  int64_t firstStep = 0, optimizerStep = 0, restoredTokens = -1;
  std::string restoredLoss; // the checkpoint step's loss, as lossText

  bool restoredState = false;
  if (opts.resume) {
    // Frozen parameters never change: they are not checkpointed but read
    // from the weights again.
    if (frozen)
      if (Status s = loadParams(opts.weightsPath, plan, nullptr, frozen,
                                Which::Frozen);
          !s.ok())
        return Status::error("weights (the frozen parameters): " + s.message());
    Expected<Restored> restored =
        loadLatestCheckpoint(comm, opts.checkpointDir, planPrint, state);
    if (!restored)
      return Status::error("--resume: " + restored.status().message());
    restoredState = !restored->path.empty();
    if (restored->damaged) {
      // A save that finished does not read back: the folder (or the disk)
      // is in trouble. Starting over, or from an older checkpoint, would
      // later overwrite or prune the evidence, so nothing goes on.
      std::string why;
      for (const std::string &line : restored->skipped)
        why += "; " + line;
      return errorf("--resume: %lld checkpoint%s in '%s' cannot be loaded%s; "
                    "nothing was changed. Restore %s from a copy, or move "
                    "%s away to resume from %s",
                    (long long)restored->damaged,
                    restored->damaged == 1 ? "" : "s",
                    opts.checkpointDir.c_str(), why.c_str(),
                    restored->damaged == 1 ? "it" : "them",
                    restored->damaged == 1 ? "its step folder"
                                           : "their step folders",
                    restoredState ? ("'" + restored->path + "'").c_str()
                                  : "the initial weights");
    }
    if (leader)
      for (const std::string &line : restored->skipped)
        std::fprintf(stderr, "train: warning: %s\n", line.c_str());
    if (restoredState) {
      const Manifest &m = restored->manifest;
      if (m.step > opts.steps)
        return errorf("--resume: checkpoint '%s' is at step %lld, past "
                      "--steps %lld",
                      restored->path.c_str(), (long long)m.step,
                      (long long)opts.steps);
      if (leader)
        for (const std::string &diff : allDifferences(m.run, runPrint))
          std::fprintf(stderr,
                       "train: warning: resuming with other options than the "
                       "checkpointed run (%s); the run will not repeat it\n",
                       diff.c_str());
      if (log)
        std::fprintf(log, "resumed from '%s' at step %lld\n",
                     restored->path.c_str(), (long long)m.step);
      // Frozen parameters are read from --weights again, not from the
      // checkpoint: they must be the bytes the run started from.
      if (plan.frozenElements > 0 && !m.initialWeightsCrc.empty() &&
          m.initialWeightsCrc != initialWeights.crc)
        return errorf("--resume: the frozen parameters come from --weights "
                      "'%s', whose bytes differ from those the checkpointed "
                      "run started from ('%s', crc32c %s, now %s): the run "
                      "would go on with other frozen values. Pass --weights "
                      "with the run's initial weights",
                      opts.weightsPath.c_str(), m.initialWeights.c_str(),
                      m.initialWeightsCrc.c_str(),
                      initialWeights.crc.empty() ? "unread"
                                                 : initialWeights.crc.c_str());
      firstStep = m.step;
      optimizerStep = m.optimizerStep;
      restoredTokens = m.tokens;
      restoredLoss = m.loss;
      if (params)
        zero.gather(master, params);
      synchronizeDevice();
    } else {
      // A run started with --resume from its first launch on.
      if (log)
        std::fprintf(log,
                     "--resume: no complete checkpoint in '%s'; starting "
                     "from the initial weights at step 0\n",
                     opts.checkpointDir.c_str());
      // A shard that failed to load may have left bytes behind.
      deviceFill(adamM, shardElements(plan), 0.0f);
      deviceFill(adamV, shardElements(plan), 0.0f);
    }
  }
  if (!restoredState) {
    float *full = fullParams();
    std::vector<std::string> unused;
    if (Status s = loadParams(opts.weightsPath, plan, full, frozen, Which::All,
                              &unused);
        !s.ok())
      return Status::error("weights: " + s.message());
    if (leader && !unused.empty())
      std::fprintf(stderr,
                   "train: warning: --weights '%s' holds %zu tensor%s the "
                   "model has no parameter for (first: '%s'): not used; a "
                   "file of another model?\n",
                   opts.weightsPath.c_str(), unused.size(),
                   unused.size() == 1 ? "" : "s",
                   printable(unused.front()).c_str());
    zero.shardParams(full);
    std::vector<float>().swap(fullOutside);
    synchronizeDevice();
  }

  if (leader && firstStep > 0 && !opts.dumpGradsPath.empty())
    std::fprintf(stderr,
                 "train: warning: --dump-grads writes step 1's gradients, "
                 "and this run resumes after step %lld: '%s' is not "
                 "written\n",
                 (long long)firstStep, opts.dumpGradsPath.c_str());
  std::optional<MetricsFile> metrics;
  if (leader && !opts.metricsPath.empty()) {
    if (opts.resume) {
      std::string gap;
      if (Status s = truncateMetrics(opts.metricsPath, firstStep,
                                     restoredLoss, &gap);
          !s.ok())
        return s;
      if (!gap.empty())
        std::fprintf(stderr,
                     "train: warning: --metrics '%s' is not this run's whole "
                     "history up to its checkpoint (%s): another run's file, "
                     "or lines lost; it goes on from here\n",
                     opts.metricsPath.c_str(), gap.c_str());
    }
    Expected<MetricsFile> file =
        MetricsFile::create(opts.metricsPath, /*append=*/opts.resume,
                            /*replace=*/opts.overwrite);
    if (!file)
      return file.status();
    metrics = std::move(*file);
  }

  Sampler sampler(opts.sampler, opts.seed, data->size(), plan.seqLen,
                  plan.batchSize, opts.gradAccum, dp);
  AdamW adamw(plan, opts.adamw, rank);
  LrSchedule schedule{opts.lrSchedule, opts.lr, opts.warmupSteps, opts.steps};
  const double tokensPerStep = double(sampler.globalBatch()) * plan.seqLen;
  // Tokens consumed before this run's first step: the checkpoint's count
  // (a resumed run may have another global batch), else firstStep's worth.
  const int64_t tokensBefore = restoredTokens >= 0
                                   ? restoredTokens
                                   : firstStep * int64_t(tokensPerStep);
  // The loss is the mean over the global batch: every micro-batch's gradient
  // is a mean over its tokens, summed over gradAccum micro-batches and dp
  // ranks.
  const float gradScale = 1.0f / float(opts.gradAccum * dp);
  zero.setGradScale(gradScale);
  // --trace: every rank starts its clock at the same barrier.
  std::optional<Tracer> tracer;
  if (!opts.tracePath.empty())
    tracer.emplace(plan, opts.traceFirst, opts.traceLast, opts.gradAccum, comm);

  // Throughput: the plan's FLOPs, per rank and for the global step, and the
  // peak MFU divides by (--peak-tflops, else the device's if known).
  const double rankFlopsPerStep =
      double(plan.flopsPerMicroBatch) * double(opts.gradAccum);
  double peakTflops =
      opts.peakTflops > 0
          ? opts.peakTflops
          : defaultPeakTflops(deviceName(), double(plan.flopsPerMicroBatch),
                              double(plan.bf16FlopsPerMicroBatch));
  if (peakTflops <= 0) {
    // (Every rank measures, at once: each sees the others' load, as in
    // training.)
    peakTflops = measuredPeakTflops();
    if (log && peakTflops > 0)
      std::fprintf(log,
                   "MFU: against %.4g TFLOP/s, this CPU's fp32 matrix-product "
                   "rate measured at start-up (--peak-tflops sets another)\n",
                   peakTflops);
  }

  // Validation: the mean loss over opts.evalSteps global batches of the
  // validation file, drawn like training batches at validation steps
  // 0..K-1, so every evaluation sees the same ones, with dropout off (as
  // PyTorch's model.eval()). The step runs forward and backward; its
  // gradients are zeroed again and nothing is updated, so training goes on
  // exactly as without it.
  std::optional<Sampler> valSampler;
  if (valData)
    valSampler.emplace(opts.sampler, opts.seed, valData->size(), plan.seqLen,
                       plan.batchSize, opts.gradAccum, dp);
  auto evaluate = [&]() {
    double sum = 0;
    for (int64_t k = 0; k < opts.evalSteps; ++k)
      for (int64_t micro = 0; micro < opts.gradAccum; ++micro) {
        synchronizeDevice();
        fillMicroBatch(*valData, *valSampler, k, rank, micro, tokens, targets);
        // Evaluating: dropout is the identity (PyTorch's model.eval()); the
        // step number is kept apart from every training step's (>= 0).
        const StepContext context = {opts.seed, -1 - k,
                                     valSampler->sampleIndex(rank, micro, 0),
                                     /*trace=*/nullptr, /*evaluating=*/true};
        sum += step(arena->get(), zero.collectives(), &context);
        synchronizeDevice();
      }
    if (plan.zeroStage == 1)
      deviceFill(grads, plan.paramElements, 0.0f);
    deviceFill(gradShard, shardElements(plan), 0.0f);
    synchronizeDevice();
    if (dp > 1) { // in rank order, as the training loss
      std::vector<double> parts(dp);
      comm.allGatherBytes(&sum, parts.data(), sizeof(double));
      sum = 0;
      for (double part : parts)
        sum += part;
    }
    return sum / double(opts.evalSteps * opts.gradAccum * dp);
  };

  // Writes step `at`'s checkpoint, refusing one that would hold a value that
  // is not finite (every rank counts its own and all learn the counts).
  auto checkpoint = [&](int64_t at, double loss) -> Status {
    Clock::time_point saveStart = Clock::now();
    int64_t bad = countInvalid(state);
    std::vector<int64_t> counts(dp);
    comm.allGatherBytes(&bad, counts.data(), sizeof(int64_t));
    std::string badRanks;
    for (int64_t r = 0; r < dp; ++r)
      if (counts[r])
        badRanks += (badRanks.empty() ? "" : ", ") + std::to_string(r) + " (" +
                    std::to_string(counts[r]) + ")";
    if (!badRanks.empty())
      return errorf("refusing to write the checkpoint of step %lld: the "
                    "optimizer state holds values that are not finite (rank "
                    "and count: %s); the newest checkpoint is an earlier one",
                    (long long)at, badRanks.c_str());
    Manifest m;
    m.step = at;
    m.optimizerStep = optimizerStep;
    m.plan = planPrint;
    m.run = runPrint;
    m.initialWeights = initialWeights.path;
    m.initialWeightsBytes = initialWeights.bytes;
    m.initialWeightsMtimeNs = initialWeights.mtimeNs;
    m.initialWeightsCrc = initialWeights.crc;
    m.tokens = tokensBefore + (at - firstStep) * int64_t(tokensPerStep);
    m.loss = lossText(loss);
    if (Status st = saveCheckpoint(comm, opts.checkpointDir, m, state);
        !st.ok())
      return st;
    if (log)
      std::fprintf(
          log, "checkpoint: %s/%s (%.1f MiB per rank) in %.1f s\n",
          opts.checkpointDir.c_str(), stepFolderName(at).c_str(),
          3.0 * shardBytes / 1048576.0,
          std::chrono::duration<double>(Clock::now() - saveStart).count());
    // Rank 0 wrote the manifest last: the new checkpoint is complete.
    if (leader && opts.keepLast) {
      Expected<std::vector<int64_t>> removed =
          pruneCheckpoints(opts.checkpointDir, opts.keepLast);
      // Removing old checkpoints is housekeeping: one that cannot be
      // removed (another user's files) stays, and the run goes on.
      if (!removed)
        std::fprintf(stderr,
                     "train: warning: --keep-last: %s; that checkpoint "
                     "stays, training goes on\n",
                     removed.status().message().c_str());
      else if (log && !removed->empty()) {
        std::string list;
        for (int64_t r : *removed)
          list += (list.empty() ? "" : ", ") + std::to_string(r);
        std::fprintf(log, "checkpoint: removed step%s %s (--keep-last %lld)\n",
                     removed->size() == 1 ? "" : "s", list.c_str(),
                     (long long)opts.keepLast);
      }
    }
    return Status();
  };

  double totalSeconds = 0;
  // The bytes moved per step, for the summary: the first step's, and
  // whether a later one differed.
  std::optional<StepRecord> commFirst;
  bool commVaries = false;
  int64_t skippedInARow = 0, lastStep = firstStep;
  int stopSignal = 0;
  std::string stoppedRanks;
  std::vector<double> perRank;
  // From here a stop signal waits for the step and its checkpoint.
  setStopWaitsForStep(true);
  for (int64_t s = firstStep; s < opts.steps; ++s) {
    Clock::time_point start = Clock::now();
    Tracer *trace = tracer ? tracer->beginStep(s + 1) : nullptr;
    TraceSpan stepSpan(trace, TraceKind::Step);
    zero.setTracer(trace);
    comm.setStep(s + 1);
    comm.resetBytes();
    if (plan.zeroStage == 1)
      deviceFill(grads, plan.paramElements, 0.0f);
    else // the step's reduce-scatters accumulate into the shard
      deviceFill(gradShard, shardElements(plan), 0.0f);
    double lossSum = 0;
    for (int64_t micro = 0; micro < opts.gradAccum; ++micro) {
      // The host writes the tokens into the arena: nothing may run on the
      // device meanwhile (the fill above), since managed memory without
      // concurrent access may not be touched by the host while a kernel runs.
      synchronizeDevice();
      if (trace)
        trace->setMicroBatch(int32_t(micro));
      TraceSpan microSpan(trace, TraceKind::MicroBatch);
      {
        TraceSpan loading(trace, TraceKind::DataLoading);
        fillMicroBatch(*data, sampler, s, rank, micro, tokens, targets);
      }
      // Dropout's masks are keyed by the samples, not by rank or
      // micro-batch: dp, --grad-accum and ZeRO stage do not change them.
      const StepContext context = {opts.seed, s,
                                   sampler.sampleIndex(rank, micro, 0),
                                   trace ? trace->hooks() : nullptr,
                                   /*evaluating=*/false};
      lossSum += step(arena->get(), zero.collectives(), &context);
      synchronizeDevice();
      microSpan.end();
      if (trace)
        trace->setMicroBatch(-1);
    }
    if (dp > 1) {
      // The step's loss is the mean over the global batch; summing the ranks'
      // parts in rank order gives every rank the same value.
      std::vector<double> parts(dp);
      TraceSpan exchange(trace, TraceKind::AllGather, -1,
                         dp * int64_t(sizeof(double)), TraceMoves::Loss);
      comm.allGatherBytes(&lossSum, parts.data(), sizeof(double));
      exchange.end();
      lossSum = 0;
      for (double part : parts)
        lossSum += part;
    }
    double loss = lossSum / double(opts.gradAccum * dp);
    if (!std::isfinite(loss) && !opts.allowNonfinite)
      return errorf("loss is %s at step %lld (pass --allow-nonfinite to keep "
                    "training)",
                    std::isnan(loss) ? "NaN" : "infinite", (long long)(s + 1));
    if (plan.zeroStage == 1)
      zero.reduceScatterGrads(gradScale);
    // The dump's gather is a diagnostic, not part of the step's traffic.
    int64_t dumpGatherBytes = 0;
    if (s == 0 && !opts.dumpGradsPath.empty()) {
      int64_t before = comm.bytes().allGather;
      std::vector<float> reduced(plan.paramElements);
      zero.gatherToHost(gradShard, reduced.data());
      dumpGatherBytes = comm.bytes().allGather - before;
      if (leader)
        if (Status st = saveParams(opts.dumpGradsPath, plan, reduced.data(),
                                   /*trainableOnly=*/true, nullptr, nullptr,
                                   /*replace=*/opts.overwrite);
            !st.ok())
          return st;
    }
    // One all-reduce carries the gradient norm's sum of squares and each
    // rank's stop request, so every rank decides alike on both.
    TraceSpan optimizerSpan(trace, TraceKind::Optimizer);
    const double mine[2] = {deviceSumOfSquares(adamw, gradShard),
                            double(stopRequest())};
    double sums[2] = {mine[0], mine[1]};
    perRank.assign(mine, mine + 2);
    if (dp > 1) { // (one rank moves nothing: the plan says 0 bytes)
      perRank.resize(2 * dp);
      TraceSpan norm(trace, TraceKind::AllReduce, -1, 2 * sizeof(double),
                     TraceMoves::GradNorm);
      comm.allReduceSumOrdered(mine, sums, 2, perRank.data());
    }
    double gradNorm = std::sqrt(sums[0]);
    for (int64_t r = 0; r < dp; ++r)
      if (int sig = int(perRank[2 * r + 1])) {
        if (!stopSignal)
          stopSignal = sig;
        stoppedRanks += (stoppedRanks.empty() ? "" : ", ") + std::to_string(r) +
                        " (" + stopSignalName(sig) + ")";
      }
    // A non-finite norm means some gradient is NaN or infinite: the update
    // would spread it into every weight it touches. Nothing is applied.
    const bool skipped = !std::isfinite(gradNorm);
    double lr = schedule.at(s);
    if (!skipped) {
      if (opts.clipGradNorm > 0)
        deviceClipGradients(adamw, gradShard, gradNorm, opts.clipGradNorm);
      deviceAdamWStep(adamw, master, gradShard, adamM, adamV, lr,
                      ++optimizerStep);
      if (params) // ZeRO-3 gathers in the next step, stage by stage
        zero.gather(master, params);
    }
    skippedInARow = skipped ? skippedInARow + 1 : 0;
    // Host code (the next micro-batch's tokens, a checkpoint) comes next.
    synchronizeDevice();
    optimizerSpan.end();
    stepSpan.end();
    zero.setTracer(nullptr);

    double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    totalSeconds += seconds;
    StepRecord record;
    record.step = s + 1;
    record.loss = loss;
    record.lr = lr;
    record.gradNorm = gradNorm;
    record.tokensPerSecond = tokensPerStep / seconds;
    record.stepMs = seconds * 1e3;
    record.memBytes = allocated->measuredBytes;
    record.reduceScatterBytes = comm.bytes().reduceScatter;
    record.allGatherBytes = comm.bytes().allGather - dumpGatherBytes;
    record.allReduceBytes = comm.bytes().allReduce;
    record.skipped = skipped;
    record.tokens = tokensBefore + (s + 1 - firstStep) * int64_t(tokensPerStep);
    record.flopsPerStep = rankFlopsPerStep * double(dp);
    record.modelTflops = rankFlopsPerStep / seconds / 1e12;
    record.mfu = peakTflops > 0 ? record.modelTflops / peakTflops : -1;
    record.arenaBytes = plan.arenaBytes;
    record.deviceMemBytes = deviceMemoryInUse();
    record.rssPeakBytes = record.deviceMemBytes < 0 ? peakRssBytes() : -1;
    const bool evaluating = valData && !stopSignal &&
                            (s + 1 == opts.steps ||
                             (opts.evalEvery && (s + 1) % opts.evalEvery == 0));
    Clock::time_point evalStart = Clock::now();
    if (evaluating) {
      record.valLoss = evaluate();
      record.hasValLoss = true;
    }
    stampTime(record);
    if (!commFirst)
      commFirst = record;
    commVaries = commVaries ||
                 record.reduceScatterBytes != commFirst->reduceScatterBytes ||
                 record.allGatherBytes != commFirst->allGatherBytes ||
                 record.allReduceBytes != commFirst->allReduceBytes;
    if (metrics)
      if (Status st = metrics->append(record); !st.ok())
        return st;
    // An evaluation's line follows its step's line, whatever --log-every.
    const bool logged = s == 0 || (s + 1) % opts.logEvery == 0 ||
                        s + 1 == opts.steps || skipped || stopSignal ||
                        s == firstStep || evaluating;
    if (log && logged) {
      double eta =
          totalSeconds / double(s + 1 - firstStep) * double(opts.steps - s - 1);
      std::fprintf(log, "%s\n", logLine(record, opts.steps, eta).c_str());
    }
    if (log && evaluating)
      std::fprintf(
          log,
          "%s eval after step %lld | val_loss %.6f | %lld batches of %lld "
          "samples | %.1f s\n",
          record.clock.c_str(), (long long)(s + 1), record.valLoss,
          (long long)opts.evalSteps, (long long)sampler.globalBatch(),
          std::chrono::duration<double>(Clock::now() - evalStart).count());
    if (log)
      std::fflush(log);
    lastStep = s + 1;
    if (skippedInARow >= opts.maxSkippedSteps)
      return errorf("the global gradient norm was not finite for %lld "
                    "consecutive steps (%lld to %lld), each skipped; stopping "
                    "(--max-skipped-steps %lld)",
                    (long long)skippedInARow,
                    (long long)(s + 2 - skippedInARow), (long long)(s + 1),
                    (long long)opts.maxSkippedSteps);

    const bool last = s + 1 == opts.steps || stopSignal;
    if (checkpointing &&
        (last || (opts.checkpointEvery && (s + 1) % opts.checkpointEvery == 0)))
      if (Status st = checkpoint(s + 1, loss); !st.ok())
        return st;
    if (stopSignal) {
      if (log) {
        std::fprintf(log,
                     "stopped after step %lld of %lld: stop requested on "
                     "rank%s %s%s\n",
                     (long long)(s + 1), (long long)opts.steps,
                     stoppedRanks.find(',') == std::string::npos ? "" : "s",
                     stoppedRanks.c_str(),
                     checkpointing ? "; rerun with --resume to continue" : "");
        std::fflush(log);
      }
      break;
    }
  }

  if (!opts.saveWeightsPath.empty()) {
    float *full = params;
    if (!full) { // ZeRO-3: every rank takes part in the gather
      full = fullParams();
      zero.gatherToHost(master, full);
    }
    synchronizeDevice();
    WrittenFile written;
    if (leader)
      if (Status s = saveParams(opts.saveWeightsPath, plan, full,
                                /*trainableOnly=*/false, frozen, &written,
                                /*replace=*/opts.overwrite);
          !s.ok()) {
        // The trained weights are the run's result: when their path cannot
        // take them (its folder removed meanwhile, say), they go to a new
        // file in the current folder, named in the error, before giving up.
        std::string base = opts.saveWeightsPath.substr(
            opts.saveWeightsPath.find_last_of('/') + 1);
        // (A name the folder's limit leaves room for: the base may be the
        // reason the first write failed.)
        std::string rescue =
            base.substr(0, 160) + ".rescued-" + std::to_string(getpid());
        // (Not when the write itself kept them: an output appeared there.)
        bool kept = s.message().find("what was written is kept in") !=
                    std::string::npos;
        if (!kept &&
            saveParams(rescue, plan, full, /*trainableOnly=*/false, frozen,
                       nullptr, /*replace=*/false)
                .ok())
          return Status::error(s.message() + "; the trained weights were "
                                             "written to '" +
                               rescue + "' in the current folder instead");
        return s;
      }
    if (log)
      std::fprintf(log, "saved weights: '%s' (%lld tensors, %lld bytes)\n",
                   opts.saveWeightsPath.c_str(), (long long)written.tensors,
                   (long long)written.bytes);
  }
  // After the weights: a trace that cannot be written (a full disk) must
  // not cost the run its result.
  if (tracer)
    if (Status st = tracer->write(comm, opts.tracePath, log); !st.ok())
      return st;
  int64_t ran = lastStep - firstStep;
  if (log && ran == 0)
    std::fprintf(log, "done: the checkpoint is at the last step, %lld\n",
                 (long long)opts.steps);
  else if (log)
    std::fprintf(log, "%s: %lld steps in %s, %.0f tok/s\n",
                 stopSignal ? "stopped early" : "done", (long long)ran,
                 formatDuration(totalSeconds).c_str(),
                 tokensPerStep * double(ran) / totalSeconds);
  if (log)
    std::fprintf(log, "memory: the arena took %lld bytes (plan %lld)\n",
                 (long long)allocated->measuredBytes,
                 (long long)plan.arenaBytes);
  if (log && commFirst) {
    // The plan's figures, as the compiler proved the schedule.
    long long reduce = plan.reduceScatterBytesPerStep +
                       opts.gradAccum * plan.reduceScatterBytesPerMicroBatch;
    long long gather = plan.allGatherBytesPerStep +
                       opts.gradAccum * plan.allGatherBytesPerMicroBatch;
    std::fprintf(log,
                 "communication per step%s: reduce-scatter %lld bytes (plan "
                 "%lld), all-gather %lld bytes (plan %lld), all-reduce %lld "
                 "bytes (the gradient norm and the stop flag)\n",
                 commVaries ? " (first step; later steps differ)" : "",
                 (long long)commFirst->reduceScatterBytes, reduce,
                 (long long)commFirst->allGatherBytes, gather,
                 (long long)commFirst->allReduceBytes);
  }
  // Every rank has received all it will: the shard communicator may now be
  // torn down without waiting for peers (NCCL's is aborted, not finalised,
  // so that a rank leaving on an error never hangs there).
  synchronizeDevice();
  comm.barrier();
  outcome->stopSignal = stopSignal;
  outcome->lastStep = lastStep;
  return Status();
}
