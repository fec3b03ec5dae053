//===- FlagsTest.cpp - the training binary's command line -----------------===//
//
// A flag typo must stop a run before it starts, with a message naming the
// flag; good values must land in the right option whichever spelling is used.
//
//===----------------------------------------------------------------------===//

#include "FakeModel.h"
#include "TestUtil.h"

#include "runtime/Flags.h"

#include <gtest/gtest.h>

#include <vector>

using namespace fastllm::rt;
using namespace fastllm::rt::test;

namespace {

Expected<Options> parse(std::vector<const char *> args) {
  args.insert(args.begin(), "train");
  return parseFlags(args.size(), args.data(), *fastllm_plan());
}

/// Parses the required flags plus `extra`, expecting success.
Options parseOk(std::vector<const char *> extra) {
  std::vector<const char *> args = {"--data", "d.bin", "--steps",
                                    "10",     "--lr",  "1e-3"};
  args.insert(args.end(), extra.begin(), extra.end());
  Expected<Options> opts = parse(args);
  EXPECT_TRUE(opts.ok()) << opts.status().message();
  return opts.ok() ? *opts : Options();
}

/// The error of parsing the required flags plus `extra`.
std::string parseError(std::vector<const char *> extra) {
  std::vector<const char *> args = {"--data", "d.bin", "--steps",
                                    "10",     "--lr",  "1e-3"};
  args.insert(args.end(), extra.begin(), extra.end());
  Expected<Options> opts = parse(args);
  EXPECT_FALSE(opts.ok());
  return opts.ok() ? "" : opts.status().message();
}

TEST(Flags, DefaultsMatchTheDesign) {
  Options o = parseOk({});
  EXPECT_EQ(o.dataPath, "d.bin");
  EXPECT_EQ(o.steps, 10);
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.dataDtype, TokenDtype::U16);
  EXPECT_EQ(o.adamw.beta1, 0.9);
  EXPECT_EQ(o.adamw.beta2, 0.95);
  EXPECT_EQ(o.adamw.eps, 1e-8);
  EXPECT_EQ(o.adamw.weightDecay, 0.1);
  EXPECT_EQ(o.clipGradNorm, 0);
  EXPECT_EQ(o.lrSchedule, LrScheduleKind::Constant);
  EXPECT_EQ(o.warmupSteps, 0);
  EXPECT_EQ(o.gradAccum, 1);
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.sampler, SamplerKind::Random);
  EXPECT_EQ(o.metricsPath, "");
  EXPECT_EQ(o.dumpGradsPath, "");
  EXPECT_EQ(o.saveWeightsPath, "");
  EXPECT_FALSE(o.allowNonfinite);
  EXPECT_FALSE(o.help);
  // Beside the running binary, i.e. this test executable.
  EXPECT_EQ(o.weightsPath, defaultWeightsPath());
  EXPECT_NE(o.weightsPath.find("/weights.safetensors"), std::string::npos);
}

TEST(Flags, EveryFlagTakesBothSpellings) {
  Options o = parseOk({"--data-dtype=u32",
                       "--beta1",
                       "0.8",
                       "--beta2=0.99",
                       "--eps",
                       "1e-6",
                       "--weight-decay=0",
                       "--clip-grad-norm",
                       "1.5",
                       "--lr-schedule=cosine",
                       "--warmup-steps",
                       "3",
                       "--grad-accum=4",
                       "--seed",
                       "42",
                       "--sampler=sequential",
                       "--metrics",
                       "m.jsonl",
                       "--weights=w.safetensors",
                       "--dump-grads",
                       "g.safetensors",
                       "--save-weights=out.safetensors",
                       "--allow-nonfinite",
                       "--input-tokens",
                       "input_ids",
                       "--input-targets=labels"});
  EXPECT_EQ(o.dataDtype, TokenDtype::U32);
  EXPECT_EQ(o.adamw.beta1, 0.8);
  EXPECT_EQ(o.adamw.beta2, 0.99);
  EXPECT_EQ(o.adamw.eps, 1e-6);
  EXPECT_EQ(o.adamw.weightDecay, 0);
  EXPECT_EQ(o.clipGradNorm, 1.5);
  EXPECT_EQ(o.lrSchedule, LrScheduleKind::Cosine);
  EXPECT_EQ(o.warmupSteps, 3);
  EXPECT_EQ(o.gradAccum, 4);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.sampler, SamplerKind::Sequential);
  EXPECT_EQ(o.metricsPath, "m.jsonl");
  EXPECT_EQ(o.weightsPath, "w.safetensors");
  EXPECT_EQ(o.dumpGradsPath, "g.safetensors");
  EXPECT_EQ(o.saveWeightsPath, "out.safetensors");
  EXPECT_TRUE(o.allowNonfinite);

  Expected<Options> eq = parse({"--data=x", "--steps=7", "--lr=0.5"});
  ASSERT_TRUE(eq.ok()) << eq.status().message();
  EXPECT_EQ(eq->dataPath, "x");
  EXPECT_EQ(eq->steps, 7);
  EXPECT_EQ(eq->lr, 0.5);
}

TEST(Flags, CheckpointFlagsGoTogether) {
  Options o = parseOk({"--checkpoint-dir", "ck", "--checkpoint-every=5",
                       "--resume", "--collective-timeout", "2.5"});
  EXPECT_EQ(o.checkpointDir, "ck");
  EXPECT_EQ(o.checkpointEvery, 5);
  EXPECT_TRUE(o.resume);
  EXPECT_EQ(o.collectiveTimeout, 2.5);
  Options d = parseOk({});
  EXPECT_EQ(d.checkpointDir, "");
  EXPECT_EQ(d.checkpointEvery, 0);
  EXPECT_FALSE(d.resume);
  EXPECT_EQ(d.collectiveTimeout, 300);
  EXPECT_TRUE(parseOk({"--checkpoint-dir=ck", "--resume"}).resume);

  EXPECT_EQ(parseError({"--checkpoint-every", "5"}),
            "--checkpoint-every needs --checkpoint-dir DIR");
  EXPECT_EQ(parseError({"--resume"}), "--resume needs --checkpoint-dir DIR");
  EXPECT_EQ(parseError({"--checkpoint-dir", "ck"}),
            "--checkpoint-dir needs --checkpoint-every N or --resume");
  EXPECT_EQ(parseError({"--checkpoint-dir=ck", "--checkpoint-every", "0"}),
            "--checkpoint-every must be at least 1, got 0");
  EXPECT_EQ(parseError({"--collective-timeout", "0"}),
            "--collective-timeout must be >= 1, got 0");
  EXPECT_EQ(parseError({"--collective-timeout", "1e-9"}),
            "--collective-timeout must be >= 1, got 1e-9");
}

TEST(Flags, LastOccurrenceWins) {
  EXPECT_EQ(parseOk({"--steps", "20"}).steps, 20);
}

TEST(Flags, RejectsNonNumbers) {
  EXPECT_EQ(parseError({"--lr", "fast"}), "--lr expects a number, got 'fast'");
  EXPECT_EQ(parseError({"--steps", "10.5"}),
            "--steps expects an integer, got '10.5'");
  EXPECT_EQ(parseError({"--steps", "1e3"}),
            "--steps expects an integer, got '1e3'");
  EXPECT_EQ(parseError({"--grad-accum", "2x"}),
            "--grad-accum expects an integer, got '2x'");
  EXPECT_EQ(parseError({"--lr", "nan"}), "--lr expects a number, got 'nan'");
  EXPECT_EQ(parseError({"--lr", "inf"}), "--lr expects a number, got 'inf'");
  EXPECT_EQ(parseError({"--seed", "99999999999999999999"}),
            "--seed expects an integer, got '99999999999999999999'");
  EXPECT_EQ(parseError({"--eps", " 1"}), "--eps expects a number, got ' 1'");
}

TEST(Flags, RejectsOutOfRangeValues) {
  EXPECT_EQ(parseError({"--lr", "-1"}), "--lr must be > 0, got -1");
  EXPECT_EQ(parseError({"--lr", "0"}), "--lr must be > 0, got 0");
  EXPECT_EQ(parseError({"--steps", "0"}), "--steps must be at least 1, got 0");
  EXPECT_EQ(parseError({"--steps=-5"}), "--steps must be at least 1, got -5");
  EXPECT_EQ(parseError({"--grad-accum", "0"}),
            "--grad-accum must be at least 1, got 0");
  EXPECT_EQ(parseError({"--warmup-steps", "-1"}),
            "--warmup-steps must be at least 0, got -1");
  EXPECT_EQ(parseError({"--seed", "-3"}), "--seed must be at least 0, got -3");
  EXPECT_EQ(parseError({"--beta1", "1"}), "--beta1 must be in [0, 1), got 1");
  EXPECT_EQ(parseError({"--beta2", "-0.1"}),
            "--beta2 must be in [0, 1), got -0.1");
  EXPECT_EQ(parseError({"--eps", "-1e-8"}), "--eps must be >= 0, got -1e-8");
  EXPECT_EQ(parseError({"--weight-decay", "-0.1"}),
            "--weight-decay must be >= 0, got -0.1");
  EXPECT_EQ(parseError({"--clip-grad-norm", "0"}),
            "--clip-grad-norm must be > 0, got 0");
}

TEST(Flags, RejectsUnknownEnumValues) {
  EXPECT_EQ(parseError({"--sampler", "shuffled"}),
            "--sampler must be sequential or random, got 'shuffled'");
  EXPECT_EQ(parseError({"--lr-schedule=linear"}),
            "--lr-schedule must be constant or cosine, got 'linear'");
  EXPECT_EQ(parseError({"--data-dtype", "u8"}),
            "--data-dtype must be u16 or u32, got 'u8'");
}

TEST(Flags, RejectsMalformedCommandLines) {
  EXPECT_EQ(parseError({"--stpes", "3"}),
            "unknown flag '--stpes' (did you mean '--steps'?)");
  EXPECT_EQ(parseError({"--frobnicate"}),
            "unknown flag '--frobnicate' (see --help)");
  EXPECT_EQ(
      parseError({"--chekpoint-dir=ck"}),
      "unknown flag '--chekpoint-dir' (did you mean '--checkpoint-dir'?)");
  EXPECT_EQ(parseError({"--warmup", "3"}),
            "unknown flag '--warmup' (did you mean '--warmup-steps'?)");
  EXPECT_EQ(parseError({"extra.bin"}), "unexpected argument 'extra.bin'");
  EXPECT_EQ(parseError({"--seed", "1", "2"}), "unexpected argument '2'");
  EXPECT_EQ(parseError({"-lr", "1"}),
            "unexpected argument '-lr' (did you mean '--lr'?)");
  EXPECT_EQ(parseError({"--metrics"}), "--metrics needs a value (FILE)");
  // A flag is never taken for the value of the one before it.
  EXPECT_EQ(parseError({"--metrics", "--seed", "1"}),
            "--metrics needs a value (FILE)");
  EXPECT_EQ(parseError({"--metrics="}), "--metrics needs a value (FILE)");
  EXPECT_EQ(parseError({"--allow-nonfinite=yes"}),
            "--allow-nonfinite takes no value (or true or false), got 'yes'");
  EXPECT_FALSE(parseOk({"--allow-nonfinite=false"}).allowNonfinite);
  EXPECT_TRUE(parseOk({"--allow-nonfinite=true"}).allowNonfinite);
}

TEST(Flags, ListsMissingRequiredFlags) {
  Expected<Options> none = parse({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(),
            "missing required flags --data FILE, --steps N, --lr F");
  Expected<Options> noLr = parse({"--data", "d", "--steps", "1"});
  ASSERT_FALSE(noLr.ok());
  EXPECT_EQ(noLr.status().message(), "missing required flag --lr F");
}

TEST(Flags, InputNamesMustMatchTheCompiledModel) {
  std::string error = parseError({"--input-tokens", "tokens"});
  EXPECT_EQ(error, "--input-tokens 'tokens' does not match this binary, which "
                   "was compiled with tokens input 'input_ids' and targets "
                   "input 'labels'");
  EXPECT_NE(parseError({"--input-targets=input_ids"}).find("'labels'"),
            std::string::npos);
}

TEST(Flags, TrainingLoopFlags) {
  Options d = parseOk({});
  EXPECT_EQ(d.logEvery, 10);
  EXPECT_EQ(d.peakTflops, 0);
  EXPECT_EQ(d.valDataPath, "");
  EXPECT_EQ(d.evalEvery, 0);
  EXPECT_EQ(d.evalSteps, 10);
  EXPECT_EQ(d.configPath, "");
  Options o = parseOk({"--log-every=1", "--peak-tflops", "989.5", "--val-data",
                       "v.bin", "--eval-every", "4", "--eval-steps=2"});
  EXPECT_EQ(o.logEvery, 1);
  EXPECT_EQ(o.peakTflops, 989.5);
  EXPECT_EQ(o.valDataPath, "v.bin");
  EXPECT_EQ(o.evalEvery, 4);
  EXPECT_EQ(o.evalSteps, 2);
  EXPECT_EQ(parseError({"--log-every", "0"}),
            "--log-every must be at least 1, got 0");
  EXPECT_EQ(parseError({"--peak-tflops", "0"}),
            "--peak-tflops must be > 0, got 0");
  EXPECT_EQ(parseError({"--eval-every", "5"}),
            "--eval-every needs --val-data FILE");
  EXPECT_EQ(parseError({"--eval-steps", "5"}),
            "--eval-steps needs --val-data FILE");
  EXPECT_EQ(parseError({"--val-data=v", "--eval-steps", "0"}),
            "--eval-steps must be at least 1, got 0");
  EXPECT_EQ(parseError({"--val-data=v", "--eval-every", "1.5"}),
            "--eval-every expects an integer, got '1.5'");
}

/// Parses `args` after writing `text` to a config file that --config names
/// first; returns the options or the error.
Expected<Options> parseWithConfig(const TempDir &dir, const std::string &text,
                                  std::vector<const char *> args = {}) {
  static std::string path;
  path = dir.file("run.toml");
  writeBytes(path, text);
  args.insert(args.begin(), {"--config", path.c_str()});
  return parse(args);
}

TEST(Flags, AConfigFileEqualsItsFlags) {
  TempDir dir;
  Expected<Options> file = parseWithConfig(dir, R"(# a run
data = "my data.bin"
steps = 20
lr=3e-4   # peak
lr-schedule = cosine
warmup-steps = 2
seed = 7
sampler = sequential
allow-nonfinite = true
resume = false
metrics = 'm.jsonl'
)");
  ASSERT_TRUE(file.ok()) << file.status().message();
  Expected<Options> flags = parse(
      {"--data", "my data.bin", "--steps", "20", "--lr", "3e-4",
       "--lr-schedule", "cosine", "--warmup-steps", "2", "--seed", "7",
       "--sampler", "sequential", "--allow-nonfinite", "--metrics", "m.jsonl"});
  ASSERT_TRUE(flags.ok()) << flags.status().message();
  EXPECT_EQ(file->dataPath, flags->dataPath);
  EXPECT_EQ(file->steps, flags->steps);
  EXPECT_EQ(file->lr, flags->lr);
  EXPECT_EQ(file->lrSchedule, flags->lrSchedule);
  EXPECT_EQ(file->warmupSteps, flags->warmupSteps);
  EXPECT_EQ(file->seed, flags->seed);
  EXPECT_EQ(file->sampler, flags->sampler);
  EXPECT_EQ(file->allowNonfinite, flags->allowNonfinite);
  EXPECT_FALSE(file->resume);
  EXPECT_EQ(file->metricsPath, flags->metricsPath);
  EXPECT_EQ(file->configPath, dir.file("run.toml"));
}

TEST(Flags, TheCommandLineOverridesTheConfigFile) {
  TempDir dir;
  Expected<Options> o =
      parseWithConfig(dir, "data = a.bin\nsteps = 20\nlr = 0.1\nseed = 3\n",
                      {"--steps", "5", "--seed=4"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->dataPath, "a.bin");
  EXPECT_EQ(o->steps, 5);
  EXPECT_EQ(o->lr, 0.1);
  EXPECT_EQ(o->seed, 4u);
  // A bad value in the file that the command line overrides is not read.
  o = parseWithConfig(dir, "data = a\nsteps = many\nlr = 1\n", {"--steps=2"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  // A switch set in the file can be turned off on the command line.
  o = parseWithConfig(dir,
                      "data = a\nsteps = 1\nlr = 1\nallow-nonfinite = true",
                      {"--allow-nonfinite=false"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_FALSE(o->allowNonfinite);
}

TEST(Flags, AConfigFileIsCheckedLineByLine) {
  TempDir dir;
  const std::string at = "config file '" + dir.file("run.toml") + "' line ";
  auto error = [&](const std::string &text) {
    Expected<Options> o = parseWithConfig(dir, text, {"--data", "d"});
    EXPECT_FALSE(o.ok()) << text;
    return o.ok() ? "" : o.status().message();
  };
  EXPECT_EQ(error("steps = 1\n\nstpes = 3\n"),
            at + "3: unknown key 'stpes' (did you mean 'steps'?)");
  EXPECT_EQ(error("frobnicate = 1\n"),
            at + "1: unknown key 'frobnicate' (keys are the flags' long "
                 "names, see --help)");
  EXPECT_EQ(error("--steps = 1\n"),
            at + "1: unknown key '--steps' (did you mean 'steps'?)");
  EXPECT_EQ(error("steps = 1\nlr = 1\nsteps = 2\n"),
            at + "3: 'steps' was already set on line 1");
  EXPECT_EQ(error("steps = 1\nsteps = 2\n"),
            at + "2: 'steps' was already set on line 1");
  EXPECT_EQ(error("[run]\nsteps = 1\n"),
            at + "1: sections ('[run]') are not supported; write 'key = "
                 "value' lines with the flags' long names");
  EXPECT_EQ(error("steps = [1, 2]\n"),
            at + "1: 'steps' takes one value, not a list");
  EXPECT_EQ(error("lr = 1\nmetrics = a b\n"),
            at + "2: 'metrics' takes one value (quote a value that holds "
                 "spaces or commas)");
  EXPECT_EQ(error("steps\n"), at + "1: expected 'key = value', got 'steps'");
  EXPECT_EQ(error("config = other.toml\n"),
            at + "1: 'config' cannot be set in a config file");
  EXPECT_EQ(error("help = true\n"),
            at + "1: 'help' cannot be set in a config file");
  // Values are checked as on the command line, and say where they were.
  EXPECT_EQ(error("lr = 1\n\nsteps = 1e3\n"),
            "--steps expects an integer, got '1e3' (" + at + "3)");
  EXPECT_EQ(error("lr = 1\nsteps = 1\nmetrics =\n"),
            "--metrics needs a value (FILE) (" + at + "3)");
  EXPECT_EQ(error("lr = 1\nsteps = 1\nresume = yes\n"),
            "--resume takes no value (or true or false), got 'yes' (" + at +
                "3)");
  EXPECT_EQ(error("lr = 1\nsteps = 1\nresume = true\n"),
            "--resume needs --checkpoint-dir DIR");
  EXPECT_EQ(error("lr = 1\n"), "missing required flag --steps N");

  Expected<Options> missing = parse({"--config", "/nonexistent/run.toml"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "--config '/nonexistent/run.toml': No such file or directory");
  Expected<Options> folder = parse({"--config", dir.path().c_str()});
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().message(),
            "--config '" + dir.path() + "' is not a regular file");
  Expected<Options> device = parse({"--config=/dev/null"});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().message(),
            "--config '/dev/null' is not a regular file");
}

TEST(Flags, HelpNeedsNothingElse) {
  Expected<Options> help = parse({"--steps", "oops", "--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_TRUE(help->help);
}

TEST(Flags, HelpListsEveryFlagAndThePlan) {
  fake::setShape(2, 3);
  std::string text = helpText(*fastllm_plan());
  for (const char *flag : {"--data FILE",
                           "--data-dtype u16|u32",
                           "--input-tokens NAME",
                           "--input-targets NAME",
                           "--steps N",
                           "--lr F",
                           "--beta1 F",
                           "--beta2 F",
                           "--eps F",
                           "--weight-decay F",
                           "--clip-grad-norm F",
                           "--lr-schedule constant|cosine",
                           "--warmup-steps N",
                           "--grad-accum N",
                           "--seed N",
                           "--sampler sequential|random",
                           "--metrics FILE",
                           "--weights FILE",
                           "--dump-grads FILE",
                           "--save-weights FILE",
                           "--allow-nonfinite",
                           "--checkpoint-dir DIR",
                           "--checkpoint-every N",
                           "--resume",
                           "--collective-timeout S",
                           "--log-every N",
                           "--peak-tflops F",
                           "--val-data FILE",
                           "--eval-every N",
                           "--eval-steps K",
                           "--config FILE",
                           "--help"})
    EXPECT_NE(text.find(flag), std::string::npos) << flag;
  for (const char *fact :
       {"[0.95]", "[1e-8]", "[random]", "[required]", "batch 2 x seq 3",
        "132 parameters in 3 tensors (68 trainable)", "cos(pi",
        "config file (--config FILE)", "H100 SXM", "2*M*N*K"})
    EXPECT_NE(text.find(fact), std::string::npos) << fact << "\n" << text;
}

} // namespace
