//===- Flags.cpp - the training binary's command line ---------------------===//

#include "runtime/Flags.h"

#include "runtime/Plan.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <unistd.h>
#include <utility>
#include <vector>

using namespace fastllm::rt;

namespace {

using Setter = Status (*)(Options &opts, const char *flag,
                          const std::string &value, const PlanInfo &plan);

struct Flag {
  const char *name;        ///< without the leading "--"
  const char *metavar;     ///< null for a switch, which takes no value
  const char *defaultText; ///< null for a required flag
  const char *help;
  Setter set;
};

/// A whole decimal integer no smaller than `min`.
Status parseInt(const char *flag, const std::string &v, int64_t min,
                int64_t &out) {
  errno = 0;
  char *end;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end || errno == ERANGE ||
      std::isspace(static_cast<unsigned char>(v[0])))
    return errorf("--%s expects an integer, got '%s'", flag, v.c_str());
  if (x < min)
    return errorf("--%s must be at least %lld, got %lld", flag, (long long)min,
                  x);
  out = x;
  return Status();
}

/// A finite number in [lo, hi), or in (lo, hi) when `openLo`.
Status parseReal(const char *flag, const std::string &v, double lo, bool openLo,
                 double hi, double &out) {
  char *end;
  double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end || !std::isfinite(x) ||
      std::isspace(static_cast<unsigned char>(v[0])))
    return errorf("--%s expects a number, got '%s'", flag, v.c_str());
  if (x < lo || (openLo && x == lo) || x >= hi) {
    if (hi != INFINITY)
      return errorf("--%s must be in [%g, %g), got %s", flag, lo, hi,
                    v.c_str());
    return errorf("--%s must be %s %g, got %s", flag, openLo ? ">" : ">=", lo,
                  v.c_str());
  }
  out = x;
  return Status();
}

template <typename E>
Status parseEnum(const char *flag, const std::string &v,
                 std::initializer_list<std::pair<const char *, E>> choices,
                 E &out) {
  std::string names;
  for (const auto &[name, value] : choices) {
    if (v == name) {
      out = value;
      return Status();
    }
    names += std::string(names.empty() ? "" : " or ") + name;
  }
  return errorf("--%s must be %s, got '%s'", flag, names.c_str(), v.c_str());
}

/// --input-tokens/--input-targets cannot rebind the compiled model's inputs;
/// they exist so that a launch script written for another model fails loudly.
Status checkInputName(const char *flag, const std::string &v,
                      const char *compiled, const PlanInfo &plan) {
  if (v == compiled)
    return Status();
  return errorf("--%s '%s' does not match this binary, which was compiled "
                "with tokens input '%s' and targets input '%s'",
                flag, v.c_str(), plan.tokensInput, plan.targetsInput);
}

constexpr double kInf = INFINITY;

const Flag kFlags[] = {
    {"data", "FILE", nullptr,
     "token file: `fastllm-opt data`'s output, or raw little-endian ids",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.dataPath = v;
       return Status();
     }},
    {"data-dtype", "u16|u32", "u16",
     "width of the token ids in a raw --data file (a file with a header says "
     "its own; the flag must then agree)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       o.dataDtypeGiven = true;
       return parseEnum(f, v,
                        {{"u16", TokenDtype::U16}, {"u32", TokenDtype::U32}},
                        o.dataDtype);
     }},
    {"input-tokens", "NAME", "as compiled",
     "name of the tokens input; must match the model",
     [](Options &, const char *f, const std::string &v, const PlanInfo &p) {
       return checkInputName(f, v, p.tokensInput, p);
     }},
    {"input-targets", "NAME", "as compiled",
     "name of the targets input; must match the model",
     [](Options &, const char *f, const std::string &v, const PlanInfo &p) {
       return checkInputName(f, v, p.targetsInput, p);
     }},
    {"steps", "N", nullptr, "optimizer steps to run",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.steps);
     }},
    {"lr", "F", nullptr, "peak learning rate",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, true, kInf, o.lr);
     }},
    {"beta1", "F", "0.9", "AdamW first-moment decay",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, false, 1, o.adamw.beta1);
     }},
    {"beta2", "F", "0.95", "AdamW second-moment decay",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, false, 1, o.adamw.beta2);
     }},
    {"eps", "F", "1e-8", "AdamW denominator epsilon",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, false, kInf, o.adamw.eps);
     }},
    {"weight-decay", "F", "0.1",
     "AdamW decoupled weight decay (parameters of rank >= 2)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, false, kInf, o.adamw.weightDecay);
     }},
    {"clip-grad-norm", "F", "off", "clip the global gradient L2 norm to F",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, true, kInf, o.clipGradNorm);
     }},
    {"lr-schedule", "constant|cosine", "constant",
     "learning-rate schedule (formulas below)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseEnum(f, v,
                        {{"constant", LrScheduleKind::Constant},
                         {"cosine", LrScheduleKind::Cosine}},
                        o.lrSchedule);
     }},
    {"warmup-steps", "N", "0", "steps of linear learning-rate warmup",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 0, o.warmupSteps);
     }},
    {"grad-accum", "N", "1", "micro-batches per optimizer step",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.gradAccum);
     }},
    {"seed", "N", "0",
     "seed of the random sampler and of dropout masks (a sample's masks "
     "do not depend on --dp or --grad-accum)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       int64_t seed;
       Status s = parseInt(f, v, 0, seed);
       o.seed = seed;
       return s;
     }},
    {"sampler", "sequential|random", "random",
     "sample order (sequential: the tests' reference order)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseEnum(f, v,
                        {{"sequential", SamplerKind::Sequential},
                         {"random", SamplerKind::Random}},
                        o.sampler);
     }},
    {"metrics", "FILE", "off", "write one JSON object per step to FILE",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.metricsPath = v;
       return Status();
     }},
    {"weights", "FILE", "weights.safetensors beside this binary",
     "initial weights, safetensors",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.weightsPath = v;
       return Status();
     }},
    {"dump-grads", "FILE", "off",
     "write step 1's averaged gradients (before clipping)",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.dumpGradsPath = v;
       return Status();
     }},
    {"save-weights", "FILE", "off", "write the final weights",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.saveWeightsPath = v;
       return Status();
     }},
    {"allow-nonfinite", nullptr, "off",
     "keep training when the loss is NaN or infinite (updates with a "
     "non-finite gradient norm are still skipped)",
     [](Options &o, const char *, const std::string &, const PlanInfo &) {
       o.allowNonfinite = true;
       return Status();
     }},
    {"checkpoint-dir", "DIR", "off",
     "folder of sharded checkpoints (created if needed)",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.checkpointDir = v;
       return Status();
     }},
    {"checkpoint-every", "N", "off",
     "checkpoint after every N-th step (needs --checkpoint-dir); the last "
     "step and a stop on a signal are checkpointed too",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.checkpointEvery);
     }},
    {"keep-last", "N", "all",
     "keep the N newest complete checkpoints, removing older ones once a "
     "newer one is complete",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.keepLast);
     }},
    {"resume", nullptr, "off",
     "continue from the newest complete checkpoint in --checkpoint-dir (from "
     "the initial weights when it holds none)",
     [](Options &o, const char *, const std::string &, const PlanInfo &) {
       o.resume = true;
       return Status();
     }},
    {"collective-timeout", "S", "300",
     "abort the job when a collective waits longer than S seconds",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, true, kInf, o.collectiveTimeout);
     }},
    {"max-skipped-steps", "N", "5",
     "stop with an error after N consecutive steps skipped for a non-finite "
     "gradient norm",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.maxSkippedSteps);
     }},
    {"help", nullptr, nullptr, "print this help and the model's plan", nullptr},
};

const Flag *findFlag(const std::string &name) {
  for (const Flag &f : kFlags)
    if (name == f.name)
      return &f;
  return nullptr;
}

std::string usageName(const Flag &f) {
  std::string name = std::string("--") + f.name;
  return f.metavar ? name + " " + f.metavar : name;
}

} // namespace

Expected<Options> fastllm::rt::parseFlags(int argc, const char *const *argv,
                                          const PlanInfo &plan) {
  Options opts;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      opts.help = true;
      return opts;
    }

  std::vector<bool> seen(std::size(kFlags));
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.compare(0, 2, "--") != 0)
      return errorf("unexpected argument '%s'", arg.c_str());
    size_t eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? eq : eq - 2);
    const Flag *flag = findFlag(name);
    if (!flag)
      return errorf("unknown flag '--%s' (see --help)", name.c_str());
    std::string value;
    if (!flag->metavar) {
      if (eq != std::string::npos)
        return errorf("--%s takes no value", flag->name);
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    } else {
      return errorf("--%s needs a value (%s)", flag->name, flag->metavar);
    }
    if (flag->metavar && value.empty())
      return errorf("--%s needs a non-empty value (%s)", flag->name,
                    flag->metavar);
    if (Status s = flag->set(opts, flag->name, value, plan); !s.ok())
      return s;
    seen[flag - kFlags] = true;
  }

  std::string missing;
  for (const Flag &f : kFlags)
    if (!f.defaultText && f.set && !seen[&f - kFlags])
      missing += (missing.empty() ? "" : ", ") + usageName(f);
  if (!missing.empty())
    return errorf("missing required flag%s %s",
                  missing.find(',') == std::string::npos ? "" : "s",
                  missing.c_str());
  if (opts.checkpointDir.empty() && opts.checkpointEvery)
    return errorf("--checkpoint-every needs --checkpoint-dir DIR");
  if (opts.checkpointDir.empty() && opts.resume)
    return errorf("--resume needs --checkpoint-dir DIR");
  if (!opts.checkpointDir.empty() && !opts.checkpointEvery && !opts.resume)
    return errorf("--checkpoint-dir needs --checkpoint-every N or --resume");
  if (opts.checkpointDir.empty() && opts.keepLast)
    return errorf("--keep-last needs --checkpoint-dir DIR");
  if (opts.weightsPath.empty())
    opts.weightsPath = defaultWeightsPath();
  return opts;
}

std::string fastllm::rt::helpText(const PlanInfo &plan) {
  ParamCounts counts = countParams(plan);
  char model[1024];
  std::snprintf(
      model, sizeof(model),
      "model: target %s, batch %lld x seq %lld tokens per micro-batch, vocab "
      "%lld\n  %lld parameters in %d tensors (%lld trainable) in %d "
      "stage%s; arena %lld bytes (%.1f MiB)\n  data parallel over %d rank%s "
      "(mpirun -np %d), ZeRO stage %d\n  tokens input '%s', targets input "
      "'%s'\n",
      plan.target, (long long)plan.batchSize, (long long)plan.seqLen,
      (long long)plan.vocabSize, (long long)counts.total, plan.numParams,
      (long long)counts.trainable, plan.numStages,
      plan.numStages == 1 ? "" : "s", (long long)plan.arenaBytes,
      plan.arenaBytes / 1048576.0, plan.dataParallel,
      plan.dataParallel == 1 ? "" : "s", plan.dataParallel, plan.zeroStage,
      plan.tokensInput, plan.targetsInput);

  std::string text = "usage: train --data FILE --steps N --lr F [flags]\n\n";
  text += model;
  text += "\nflags:\n";
  size_t width = 0;
  for (const Flag &f : kFlags)
    width = std::max(width, usageName(f).size());
  for (const Flag &f : kFlags) {
    std::string name = usageName(f);
    text += "  " + name + std::string(width + 2 - name.size(), ' ') + f.help;
    if (f.set)
      text += std::string(" [") + (f.defaultText ? f.defaultText : "required") +
              "]";
    text += "\n";
  }
  text += R"(
learning rate at 0-based step s, with S = --steps and W = --warmup-steps:
  s < W           lr * (s + 1) / W
  constant        lr
  cosine          lr * 0.5 * (1 + cos(pi * (s - W) / max(1, S - W)))
AdamW at step t = 1, 2, ... (torch.optim.AdamW in fp32; decay only on
parameters of rank >= 2, frozen parameters untouched):
  p = p * (1 - lr * wd);  m = beta1 * m + (1 - beta1) * g;
  v = beta2 * v + (1 - beta2) * g * g;
  p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
--clip-grad-norm F first scales all gradients by F / (norm + 1e-6) when that
is below 1 (torch.nn.utils.clip_grad_norm_); grad_norm reports the norm before.

a step whose global gradient norm is NaN or infinite is skipped: no weight,
AdamW moment or step count changes; it is logged with "SKIPPED" and its
metrics line has "skipped": true. --max-skipped-steps in a row end the run.
A checkpoint is never written with a non-finite value in it (refused).

checkpoints (--checkpoint-dir DIR): DIR/step-NNNNNNNN/, complete once its
manifest.json is written; also written after the last step and on a stop.
One job at a time: rank 0 holds an flock on DIR/train.lock (a second job
fails at once, naming the holder from DIR/train.lock.owner). At start rank 0
removes temporaries (*.tmp-XXXXXX) that killed saves left. A fresh run is
refused only where a complete checkpoint lies; --resume takes the newest
complete one, or the initial weights when there is none (and says so).

signals: SIGTERM, SIGINT or SIGUSR1 on any rank stops the job after the
current step, the same step on every rank (agreed through the gradient-norm
all-reduce), with a checkpoint when --checkpoint-dir is set; a second signal
of the same kind ends that process at once. Under mpirun, signal the train
processes (or send mpirun SIGUSR1, which Open MPI forwards to them).

exit status:
  0        every step ran (and the last one was checkpointed, with
           --checkpoint-dir)
  1        an error: bad input or flags, a non-finite loss, too many skipped
           steps, a checkpoint refused, a checkpoint folder in use, a
           collective timeout (its message names the ranks that never arrived)
  128 + N  stopped early by signal N after a complete step: 143 SIGTERM,
           130 SIGINT, 138 SIGUSR1; rerun with --resume to continue
)";
  return text;
}

std::string fastllm::rt::defaultWeightsPath() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string path = n > 0 ? std::string(exe, n) : std::string();
  size_t slash = path.find_last_of('/');
  return (slash == std::string::npos ? std::string()
                                     : path.substr(0, slash + 1)) +
         "weights.safetensors";
}
