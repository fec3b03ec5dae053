//===- Flags.cpp - the training binary's command line ---------------------===//

#include "runtime/Flags.h"

#include "runtime/Plan.h"
#include "runtime/Trace.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <sys/stat.h>
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
  // Decimal only: strtod also reads hexadecimal ("0x10" is 16).
  if (end == v.c_str() || *end || !std::isfinite(x) ||
      std::isspace(static_cast<unsigned char>(v[0])) ||
      v.find_first_of("xX") != std::string::npos)
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

/// A POSIX extended regex flag (checkDecayRegex's rules) into `out`.
Status parseRegex(const char *flag, const std::string &v, std::string &out) {
  if (std::string why = checkDecayRegex(v); !why.empty())
    return errorf("--%s: invalid regex '%s': %s", flag, v.c_str(),
                  why.c_str());
  out = v;
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
    {"decay", "REGEX", "off",
     "also apply weight decay to the parameters whose name matches (POSIX "
     "extended regex searched in the name; '.*' decays every parameter, as "
     "torch.optim.AdamW(model.parameters()) does)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseRegex(f, v, o.adamw.decayRegex);
     }},
    {"no-decay", "REGEX", "off",
     "no weight decay for the parameters whose name matches (wins over "
     "--decay): 'bias|norm|ln|wte|wpe' keeps biases, norms and embeddings "
     "out, as many training scripts' parameter groups do",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseRegex(f, v, o.adamw.noDecayRegex);
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
    {"overwrite", nullptr, "off",
     "replace files that exist at --metrics, --dump-grads, --save-weights "
     "and --trace (without it the run stops before it starts; --resume "
     "continues its --metrics file either way)",
     [](Options &o, const char *, const std::string &, const PlanInfo &) {
       o.overwrite = true;
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
     "abort the job when a collective waits longer than S seconds (at "
     "least 1: a shorter wait fails healthy steps)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 1, false, kInf, o.collectiveTimeout);
     }},
    {"max-skipped-steps", "N", "5",
     "stop with an error after N consecutive steps skipped for a non-finite "
     "gradient norm",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.maxSkippedSteps);
     }},
    {"log-every", "N", "10",
     "print a progress line after every N-th step (and after step 1, the "
     "last step, any skipped step and each evaluated one); 10 keeps a long "
     "run's log readable "
     "while the --metrics file keeps every step",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.logEvery);
     }},
    {"peak-tflops", "F", "by device",
     "the device's peak TFLOP/s that MFU divides by (see 'throughput' "
     "below for the defaults)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseReal(f, v, 0, true, kInf, o.peakTflops);
     }},
    {"val-data", "FILE", "off",
     "validation token file (headered, or raw like --data with "
     "--data-dtype); its mean loss is printed and written as val_loss",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.valDataPath = v;
       return Status();
     }},
    {"eval-every", "N", "the last step only",
     "evaluate on --val-data after every N-th step (and after the last)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.evalEvery);
     }},
    {"eval-steps", "K", "10",
     "global batches of --val-data per evaluation (each costs a training "
     "step's compute: the step runs forward and backward, nothing is "
     "updated)",
     [](Options &o, const char *f, const std::string &v, const PlanInfo &) {
       return parseInt(f, v, 1, o.evalSteps);
     }},
    {"config", "FILE", "off",
     "read flags from a run config file (format below); flags on the "
     "command line override it",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.configPath = v;
       return Status();
     }},
    {"trace", "FILE", "off",
     "write a Chrome trace-event JSON of the --trace-steps for "
     "ui.perfetto.dev or chrome://tracing ('trace' below); FILE must not "
     "exist",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.tracePath = v;
       return Status();
     }},
    {"trace-steps", "A-B", "2-3, cut to --steps",
     "the 1-based steps --trace records (A-B, or A alone); the default "
     "skips step 1, whose first touches of memory, caches and collectives "
     "make it unlike the steps that follow",
     [](Options &o, const char *, const std::string &v, const PlanInfo &) {
       o.traceStepsGiven = true;
       return parseTraceSteps(v, o.traceFirst, o.traceLast);
     }},
    {"help", nullptr, nullptr, "print this help and the model's plan", nullptr},
};

/// The counts a run multiplies (tokens and samples a step and over the
/// run, micro-batches, evaluation batches) must fit in int64 with room to
/// spare (2^62): a --grad-accum or --steps near int64's end would otherwise
/// overflow in the sampler, the metrics and the trace.
Status checkCounts(const Options &opts, const PlanInfo &plan) {
  constexpr int64_t kLimit = int64_t(1) << 62;
  int64_t perStep = 0, total = 0, evalTotal = 0;
  if (__builtin_mul_overflow(plan.batchSize * plan.seqLen,
                             int64_t(plan.dataParallel), &perStep) ||
      __builtin_mul_overflow(perStep, opts.gradAccum, &perStep) ||
      __builtin_mul_overflow(perStep, opts.steps, &total) || total > kLimit)
    return errorf("--steps %lld with --grad-accum %lld (%lld tokens a "
                  "micro-batch on each of %d rank%s) counts more tokens than "
                  "the run can number (2^62); lower them",
                  (long long)opts.steps, (long long)opts.gradAccum,
                  (long long)(plan.batchSize * plan.seqLen),
                  plan.dataParallel, plan.dataParallel == 1 ? "" : "s");
  if (__builtin_mul_overflow(perStep, std::max<int64_t>(opts.evalSteps, 1),
                             &evalTotal) ||
      __builtin_mul_overflow(evalTotal, opts.steps, &evalTotal) ||
      evalTotal > kLimit)
    return errorf("--eval-steps %lld over --steps %lld counts more "
                  "evaluation tokens than the run can number (2^62); lower "
                  "--eval-steps",
                  (long long)opts.evalSteps, (long long)opts.steps);
  return Status();
}

/// The checks between flags, once every flag is read.
Status checkDependencies(const Options &opts) {
  if (opts.checkpointDir.empty() && opts.checkpointEvery)
    return errorf("--checkpoint-every needs --checkpoint-dir DIR");
  if (opts.checkpointDir.empty() && opts.resume)
    return errorf("--resume needs --checkpoint-dir DIR");
  if (!opts.checkpointDir.empty() && !opts.checkpointEvery && !opts.resume)
    return errorf("--checkpoint-dir needs --checkpoint-every N or --resume");
  if (opts.checkpointDir.empty() && opts.keepLast)
    return errorf("--keep-last needs --checkpoint-dir DIR");
  if (opts.valDataPath.empty() && opts.evalEvery)
    return errorf("--eval-every needs --val-data FILE");
  if (opts.tracePath.empty() && opts.traceStepsGiven)
    return errorf("--trace-steps needs --trace FILE");
  if (opts.traceStepsGiven && opts.traceLast > opts.steps)
    return errorf("--trace-steps %lld-%lld: the run has %lld step%s "
                  "(--steps)",
                  (long long)opts.traceFirst, (long long)opts.traceLast,
                  (long long)opts.steps, opts.steps == 1 ? "" : "s");
  return Status();
}

/// The flag whose long name is `name`, or null.
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

/// The edit distance between `a` and `b` counting a swap of two adjacent
/// characters as one edit (optimal string alignment), so that `stpes` is one
/// edit from `steps`.
size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// "did you mean '--steps'?" for the known flag nearest to `name` (no
/// dashes), when one is within a third of its length (at least 2 edits, so
/// that short names still get a suggestion), or when `name` is a prefix of
/// exactly one flag; else "".
std::string suggestion(const std::string &name, const char *dashes = "--") {
  const Flag *best = nullptr, *prefixOf = nullptr;
  size_t bestDistance = SIZE_MAX, prefixes = 0;
  for (const Flag &f : kFlags) {
    size_t d = editDistance(name, f.name);
    if (d < bestDistance)
      best = &f, bestDistance = d;
    if (!name.empty() && std::string(f.name).compare(0, name.size(), name) == 0)
      prefixOf = &f, ++prefixes;
  }
  if (best && bestDistance <= std::max<size_t>(2, name.size() / 3))
    return std::string("did you mean '") + dashes + best->name + "'?";
  if (prefixes == 1)
    return std::string("did you mean '") + dashes + prefixOf->name + "'?";
  return "";
}

/// What an option holds when it was given without a value: CLI11 stores the
/// option's default string, which no real value can be.
const char kNoValue[] = "\x01(no value)";

/// The raw text CLI11 collected for each flag of kFlags (empty vector: not
/// given), and where the config file's values came from.
struct Collected {
  std::vector<std::vector<std::string>> values =
      std::vector<std::vector<std::string>>(std::size(kFlags));
  std::vector<CLI::Option *> options =
      std::vector<CLI::Option *>(std::size(kFlags));
  std::string configPath;
  std::map<std::string, int> configLine; ///< key -> 1-based line
};

/// CLI11's TOML/INI reader, made strict: before CLI11 applies a config file,
/// every line is checked, so that an unknown key, a section, a list or a key
/// given twice is an error naming the file and line (CLI11 would ignore or
/// merge them silently).
class StrictConfig : public CLI::ConfigTOML {
public:
  explicit StrictConfig(Collected &out) : out(out) {}

  std::vector<CLI::ConfigItem> from_config(std::istream &input) const override {
    std::string text((std::istreambuf_iterator<char>(input)),
                     std::istreambuf_iterator<char>());
    // A byte-order mark (some editors write one) is not part of a key.
    if (text.compare(0, 3, "\xEF\xBB\xBF") == 0)
      text.erase(0, 3);
    std::vector<std::string> keys = checkLines(text);
    std::istringstream again(text);
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(again);
    if (items.size() != keys.size())
      throw CLI::ConfigError(where(0) + ": cannot be read as 'key = value' "
                                        "lines");
    for (size_t i = 0; i < items.size(); ++i) {
      const CLI::ConfigItem &item = items[i];
      int line = out.configLine.at(keys[i]);
      if (!item.parents.empty() || item.name != keys[i])
        throw CLI::ConfigError(where(line) + ": cannot read key '" + keys[i] +
                               "'");
      const Flag *flag = findFlag(keys[i]);
      if (item.inputs.size() != 1 && flag->metavar)
        throw CLI::ConfigError(
            where(line) + ": '" + keys[i] +
            "' takes one value (quote a value that holds spaces or commas)");
    }
    return items;
  }

private:
  std::string where(int line) const {
    std::string at = "config file '" + out.configPath + "'";
    return line ? at + " line " + std::to_string(line) : at;
  }

  /// The keys of the `key = value` lines of `text` in order, recording the
  /// line of each; throws CLI::ConfigError at the first line that is not a
  /// comment, blank or `key = value` with a known, new key.
  std::vector<std::string> checkLines(const std::string &text) const {
    std::vector<std::string> keys;
    std::istringstream in(text);
    int number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      // CLI11 would read up to a NUL and drop the rest of the line.
      for (char c : line)
        if ((unsigned char)c < 0x20 && c != '\t' && c != '\r')
          throw CLI::ConfigError(where(number) + ": a control character "
                                 "(byte " + std::to_string(int(c)) +
                                 ") in the line");
      line = CLI::detail::trim_copy(line);
      if (line.empty() || line[0] == '#' || line[0] == ';')
        continue;
      if (line[0] == '[')
        throw CLI::ConfigError(where(number) + ": sections ('" + line +
                               "') are not supported; write 'key = value' "
                               "lines with the flags' long names");
      size_t eq = line.find('=');
      if (eq == std::string::npos)
        throw CLI::ConfigError(where(number) +
                               ": expected 'key = value', "
                               "got '" +
                               line + "'");
      std::string key = CLI::detail::trim_copy(line.substr(0, eq));
      CLI::detail::remove_quotes(key);
      const Flag *flag = findFlag(key);
      if (flag && (!flag->set || !std::strcmp(flag->name, "config")))
        throw CLI::ConfigError(where(number) + ": '" + key +
                               "' cannot be set in a config file");
      if (!flag) {
        std::string hint = suggestion(key, "");
        throw CLI::ConfigError(
            where(number) + ": unknown key '" + key + "' (" +
            (hint.empty() ? "keys are the flags' long names, see --help"
                          : hint) +
            ")");
      }
      std::string value = CLI::detail::trim_copy(line.substr(eq + 1));
      if (!value.empty() && (value[0] == '"' || value[0] == '\'') &&
          value.find(value[0], 1) == std::string::npos)
        throw CLI::ConfigError(where(number) + ": the value of '" + key +
                               "' opens a quote (" + value[0] +
                               ") it does not close");
      if (!value.empty() && (value[0] == '"' || value[0] == '\'')) {
        // The config reader starts a comment at # or ; even inside quotes
        // (`save-weights = "w # 2.st"` wrote to `"w`): refused, not cut.
        std::string quoted = value.substr(1, value.find(value[0], 1) - 1);
        if (quoted.find_first_of("#;") != std::string::npos)
          throw CLI::ConfigError(
              where(number) + ": the value of '" + key + "' holds '" +
              quoted[quoted.find_first_of("#;")] +
              "', which starts a comment in a config file even inside "
              "quotes; give --" + key + " on the command line");
      }
      if (!value.empty() && value[0] == '[')
        throw CLI::ConfigError(where(number) + ": '" + key +
                               "' takes one value, not a list");
      auto [it, fresh] = out.configLine.emplace(key, number);
      if (!fresh)
        throw CLI::ConfigError(where(number) + ": '" + key +
                               "' was already set on line " +
                               std::to_string(it->second));
      keys.push_back(key);
    }
    return keys;
  }

  Collected &out;
};

/// --config FILE, the last one given, must be a regular file that can be
/// read (CLI11 would block on a FIFO and read a device without end).
Status checkConfigFile(int argc, const char *const *argv, std::string &path) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc)
      path = argv[i + 1];
    else if (!std::strncmp(argv[i], "--config=", 9))
      path = argv[i] + 9;
  }
  if (path.empty())
    return Status();
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    return errorf("--config '%s': %s", path.c_str(), std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return errorf("--config '%s' is not a regular file", path.c_str());
  if (st.st_size > (1 << 20))
    return errorf("--config '%s' is %lld bytes; a run config file is at "
                  "most 1 MiB",
                  path.c_str(), (long long)st.st_size);
  if (access(path.c_str(), R_OK) != 0)
    return errorf("--config '%s': %s", path.c_str(), std::strerror(errno));
  return Status();
}

/// The error for what CLI11 could not place: an unknown flag (with the
/// nearest known one) or a stray argument.
Status extraArgumentError(const std::string &arg) {
  if (arg.compare(0, 2, "--") == 0 && arg.size() > 2) {
    std::string name = arg.substr(2, arg.find('=') - 2);
    std::string hint = suggestion(name);
    return errorf("unknown flag '--%s' (%s)", name.c_str(),
                  hint.empty() ? "see --help" : hint.c_str());
  }
  if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-') {
    std::string name = arg.substr(1, arg.find('=') - 1);
    if (findFlag(name))
      return errorf("unexpected argument '%s' (did you mean '--%s'?)",
                    arg.c_str(), name.c_str());
  }
  return errorf("unexpected argument '%s'", arg.c_str());
}

/// Whether --name (or --name=...) is on the command line, where it overrides
/// the config file.
bool onCommandLine(int argc, const char *const *argv, const char *name) {
  std::string flag = std::string("--") + name;
  for (int i = 1; i < argc; ++i)
    if (argv[i] == flag ||
        !std::strncmp(argv[i], (flag + "=").c_str(), flag.size() + 1))
      return true;
  return false;
}

/// Runs CLI11 over the command line and the config file, collecting each
/// flag's raw values.
Status collect(int argc, const char *const *argv, Collected &out) {
  if (Status s = checkConfigFile(argc, argv, out.configPath); !s.ok())
    return s;
  CLI::App app("train");
  app.set_help_flag(); // --help was handled before
  app.allow_extras(true);
  app.allow_config_extras(CLI::config_extras_mode::error);
  // The last occurrence wins, as in most tools.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.config_formatter(std::make_shared<StrictConfig>(out));
  app.set_config("--config");
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    const Flag &f = kFlags[i];
    if (!f.set || !std::strcmp(f.name, "config"))
      continue;
    std::string name = std::string("--") + f.name;
    // A switch takes no value (CLI11 gives "true" for it alone); an option
    // takes one, or none, which is an error below rather than a reason to
    // take the next flag as its value.
    out.options[i] = f.metavar ? app.add_option(name, out.values[i])
                                     ->expected(0, 1)
                                     ->allow_extra_args(false)
                                     ->default_str(kNoValue)
                               : app.add_flag(name, out.values[i]);
    out.options[i]->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return Status::error(e.what());
  }
  if (!app.remaining().empty())
    return extraArgumentError(app.remaining().front());
  return Status();
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
  Collected got;
  if (Status s = collect(argc, argv, got); !s.ok())
    return s;
  opts.configPath = got.configPath;

  std::string missing;
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    const Flag &f = kFlags[i];
    if (!got.options[i])
      continue;
    bool given = !got.values[i].empty();
    if (given) {
      const std::string &value = got.values[i].back();
      // Where a bad value came from, when the config file gave it.
      std::string from;
      if (auto line = got.configLine.find(f.name);
          line != got.configLine.end() && !onCommandLine(argc, argv, f.name))
        from = " (config file '" + got.configPath + "' line " +
               std::to_string(line->second) + ")";
      Status s;
      if (!f.metavar && value != "true" && value != "false")
        s = errorf("--%s takes no value (or true or false), got '%s'", f.name,
                   value.c_str());
      else if (f.metavar && (value == kNoValue || value.empty()))
        s = errorf("--%s needs a value (%s)", f.name, f.metavar);
      else if (value != "false" || f.metavar)
        s = f.set(opts, f.name, value, plan);
      if (!s.ok())
        return Status::error(s.message() + from);
      given = f.metavar || value == "true";
    }
    if (!given && !f.defaultText)
      missing += (missing.empty() ? "" : ", ") + usageName(f);
  }
  if (!missing.empty())
    return errorf("missing required flag%s %s",
                  missing.find(',') == std::string::npos ? "" : "s",
                  missing.c_str());
  if (Status s = checkDependencies(opts); !s.ok())
    return s;
  if (Status s = checkCounts(opts, plan); !s.ok())
    return s;
  for (size_t i = 0; i < std::size(kFlags); ++i)
    if (!std::strcmp(kFlags[i].name, "eval-steps") && !got.values[i].empty() &&
        opts.valDataPath.empty())
      return errorf("--eval-steps needs --val-data FILE");
  if (opts.weightsPath.empty())
    opts.weightsPath = defaultWeightsPath();
  if (!opts.traceStepsGiven) { // the default, within a short run
    opts.traceFirst = std::min(opts.traceFirst, opts.steps);
    opts.traceLast = std::min(opts.traceLast, opts.steps);
  }
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

validation (--val-data FILE): after every --eval-every N-th step and after
the last, the mean loss over --eval-steps K global batches of FILE, drawn
like training batches (same --sampler and --seed, G = dp * batch * accum
samples each) at validation steps 0..K-1: the same batches at every
evaluation, whatever the training position. The step function runs forward
and backward (there is no forward-only step); nothing it leaves behind
reaches training (gradients are zeroed before the next step, no optimizer
update, no change to the weights), so a run with evaluation trains exactly
like one without. Dropout is off during evaluation, as in PyTorch's
model.eval(). Printed as "eval" lines; val_loss in the
metrics line of the step it follows.

throughput: each metrics line has tokens (consumed so far, all ranks),
tokens_per_s, flops_per_step (the model's FLOPs for the global batch, from
the plan: 2*M*N*K per matmul of the forward and backward, attention's
products over its causal triangle, nothing else), model_tflops (per rank) and
mfu = model_tflops / --peak-tflops. The default peak: on CUDA the GPU's dense
peak for the step's precisions (H100 SXM and H200: 989.4 bf16, 66.9 fp32;
H100 PCIe: 756 bf16, 51.2 fp32; A100: 312 bf16, 19.5 fp32 TFLOP/s; fp32
matmuls run in full fp32, not TF32), weighted by the FLOPs of each
precision; on the CPU the fp32 matrix-product rate of its kernels, measured
at start-up (about 20 ms; the log says the figure); on other GPUs and under
the CUDA emulation MFU is omitted unless --peak-tflops is given. Memory: arena_bytes (planned), and rss_peak_bytes (the process's
peak resident set, CPU) or device_mem_bytes (the GPU's memory in use, CUDA);
time: an ISO 8601 UTC timestamp in the metrics, wall-clock in the log.

config file (--config FILE): one flag per line as `key = value`, the key a
flag's long name without the dashes, the value as on the command line
(quote one with spaces: path = "my data.bin"); a switch takes true or false;
`#` starts a comment. An unknown key, a key given twice, a list or a
[section] is an error naming the line. Flags on the command line override
the file. For example:
  data = train.bin
  steps = 1000
  lr = 3e-4
  lr-schedule = cosine
  resume = false

trace (--trace FILE): steps --trace-steps A-B in the Chrome trace-event
format ("traceEvents", "X" spans with "ts"/"dur" in microseconds), which
ui.perfetto.dev and chrome://tracing open. One process per rank ("rank R"),
merged into FILE by rank 0 at the end of the run, with the tracks: "step"
(each step, micro_batch, data_loading and the optimizer update), "compute"
(each kernel call of the step, named by its op: matmul, fused_elementwise,
causal_attention, cross_entropy, ...; args step, micro_batch, stage, layer,
phase forward or backward) and one per collective kind (all_gather,
reduce_scatter, all_reduce; a second track "#2" when two of a kind are in
flight at once), each collective spanning from its start to the return of
its wait, with args stage, bytes, what it moves and whether the step or the
runtime issued it. Times count from a barrier at the start of training.
Memory is bounded: each rank keeps at most 1048576 events; when that is
full, later events are dropped and the log and the file's otherData count
them. FILE is written whole at the end, never over an existing file. On
CUDA each traced span waits for the GPU at its end (kernels are
asynchronous), so traced steps run slower but their spans are real; steps
that are not traced run as without --trace.

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
           130 SIGINT, 138 SIGUSR1, 129 SIGHUP, 141 SIGPIPE (the log's
           reader went away); rerun with --resume to continue
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
