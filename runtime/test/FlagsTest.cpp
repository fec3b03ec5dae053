//===- FlagsTest.cpp - the training binary's command line -----------------===//
//
// A flag typo must stop a run before it starts, with a message naming the
// flag; good values must land in the right option whichever spelling is used.
//
//===----------------------------------------------------------------------===//

#include "FakeModel.h"

#include "runtime/Flags.h"

#include <gtest/gtest.h>

#include <vector>

using namespace fastllm::rt;

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
            "--collective-timeout must be > 0, got 0");
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
            "unknown flag '--stpes' (see --help)");
  EXPECT_EQ(parseError({"extra.bin"}), "unexpected argument 'extra.bin'");
  EXPECT_EQ(parseError({"-lr", "1"}), "unexpected argument '-lr'");
  EXPECT_EQ(parseError({"--metrics"}), "--metrics needs a value (FILE)");
  EXPECT_EQ(parseError({"--metrics", "--seed", "1"}),
            "--metrics needs a value (FILE)");
  EXPECT_EQ(parseError({"--metrics="}),
            "--metrics needs a non-empty value (FILE)");
  EXPECT_EQ(parseError({"--allow-nonfinite=yes"}),
            "--allow-nonfinite takes no value");
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
                           "--help"})
    EXPECT_NE(text.find(flag), std::string::npos) << flag;
  for (const char *fact :
       {"[0.95]", "[1e-8]", "[random]", "[required]", "batch 2 x seq 3",
        "132 parameters in 3 tensors (68 trainable)", "cos(pi"})
    EXPECT_NE(text.find(fact), std::string::npos) << fact << "\n" << text;
}

} // namespace
