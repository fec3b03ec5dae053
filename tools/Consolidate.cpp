//===- Consolidate.cpp - fastllm-opt consolidate --------------------------===//
//
//   fastllm-opt consolidate CKPT [-o weights.safetensors] [--step N]
//                                [--weights INITIAL] [--overwrite]
//
// Turns a sharded checkpoint (runtime/Checkpoint.h) into one safetensors
// file holding every parameter's full fp32 tensor under its model name, in
// the plan's order with the same metadata as `train --save-weights`: the
// same bytes that run would have written at that step. No training binary is
// needed: the manifest's plan fingerprint names every parameter, its shape
// and offset, and the stage table that fixes each rank's shard. The step is
// verified as resume verifies it (manifest, each shard's size, header and
// CRC32C); by default the newest step with a manifest is taken, and newer
// incomplete ones (no manifest: a killed save) are skipped with a warning.
// A newest save whose manifest is there but which does not verify is an
// error, as for train --resume: --step picks an older one deliberately.
//
//===----------------------------------------------------------------------===//

#include "runtime/Checkpoint.h"
#include "tools/WholeNumberFlag.h"
#include "runtime/InputFile.h"
#include "runtime/OutputFile.h"
#include "runtime/Safetensors.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <cerrno>
#include <cstring>
#include <optional>
#include <sys/stat.h>

using namespace fastllm::rt;
namespace cl = llvm::cl;
using llvm::errs;
using llvm::outs;
using llvm::WithColor;

namespace mlir::fastllm {
int consolidateMain(int argc, char **argv);
} // namespace mlir::fastllm

namespace {

/// A checkpoint step chosen and verified: its folder, manifest and layout.
struct Chosen {
  std::string folder;
  Manifest manifest;
  CheckpointLayout layout;
  std::vector<float> weights; ///< the flat parameter array
};

bool isFolder(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

/// Reads and verifies the step folder `folder`; `step` (when known) must be
/// the manifest's.
Expected<Chosen> readStep(const std::string &folder,
                          std::optional<int64_t> step) {
  Chosen c;
  c.folder = folder;
  Expected<Manifest> m = readManifest(folder);
  if (!m)
    return m.status();
  if (step && m->step != *step)
    return errorf("its manifest is for step %lld", (long long)m->step);
  Expected<CheckpointLayout> layout = checkpointLayout(*m);
  if (!layout)
    return Status::error("manifest.json: " + layout.status().message());
  Expected<std::vector<float>> weights =
      readCheckpointWeights(folder, *m, *layout);
  if (!weights)
    return weights.status();
  c.manifest = std::move(*m);
  c.layout = std::move(*layout);
  c.weights = std::move(*weights);
  return c;
}

/// The step to write: `path` itself when it is a step folder (it holds
/// manifest.json or is named step-N), else step `step` or the newest complete
/// one of the checkpoint folder `path`.
Expected<Chosen> choose(const std::string &path, std::optional<int64_t> step) {
  if (!isFolder(path))
    return errorf("'%s' is not a folder (give a --checkpoint-dir or one of "
                  "its step-N folders)",
                  path.c_str());
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (exists(path + "/manifest.json") || base.rfind("step-", 0) == 0) {
    if (step)
      return errorf("--step: '%s' is one step's folder already", path.c_str());
    Expected<Chosen> c = readStep(path, std::nullopt);
    if (!c)
      return errorf("checkpoint '%s': %s", path.c_str(),
                    c.status().message().c_str());
    return c;
  }
  // A run with --keep-last may remove steps while they are read: a step
  // folder gone by then is passed over, and when nothing was found the
  // listing is taken again (three more times at most).
  for (int attempt = 0;; ++attempt) {
    Expected<std::vector<int64_t>> steps = listCheckpointSteps(path);
    if (!steps)
      return steps.status();
    if (steps->empty())
      return errorf("'%s' holds no step-N checkpoint folders", path.c_str());
    std::string skipped, damaged;
    std::vector<std::string> warnings; // printed with the step chosen
    bool vanished = false;
    for (int64_t s : *steps) {
      if (step && s != *step)
        continue;
      std::string folder = path + "/" + stepFolderName(s);
      Expected<Chosen> c = readStep(folder, s);
      if (c && damaged.empty()) {
        for (const std::string &w : warnings)
          WithColor::warning(errs(), "fastllm-opt consolidate") << w << "\n";
        return c;
      }
      if (c)
        // As train --resume: a newer save that finished (its manifest is
        // there) but does not read back is trouble to look at, not to
        // pass over in silence; the older step is written when asked for.
        return errorf("%s; nothing was written. Restore it from a copy, or "
                      "give --step %lld to write the newest step that reads "
                      "back",
                      damaged.c_str(), (long long)s);
      if (!isFolder(folder)) { // removed since the listing
        vanished = true;
        continue;
      }
      // Without its manifest now: incomplete, or being removed (the
      // manifest goes first); a newer step may have completed meanwhile.
      if (!exists(folder + "/manifest.json"))
        vanished = true;
      if (step)
        return errorf("checkpoint '%s': %s", folder.c_str(),
                      c.status().message().c_str());
      if (damaged.empty() && exists(folder + "/manifest.json")) {
        damaged = "checkpoint '" + folder + "' cannot be read: " +
                  c.status().message();
        continue;
      }
      if (damaged.empty())
        warnings.push_back("checkpoint '" + folder +
                           "' skipped: " + c.status().message());
      skipped += "; '" + folder + "': " + c.status().message();
    }
    if (vanished && damaged.empty() && attempt < 3)
      continue;
    if (step)
      return errorf("'%s' has no checkpoint of step %lld", path.c_str(),
                    (long long)*step);
    if (!damaged.empty())
      return errorf("%s%s%s", damaged.c_str(),
                    skipped.empty() ? "" : "; no older step reads back either",
                    skipped.c_str());
    return errorf("no complete checkpoint in '%s'%s", path.c_str(),
                  skipped.c_str());
  }
}

/// What to do about the frozen parameters' file when --weights is not
/// given: why the file the manifest records cannot serve (or that it
/// records none), with the remedy.
std::string recordedWeights(const Manifest &m) {
  const std::string remedy = "pass --weights RUN/weights.safetensors, the "
                             "weights the run started from";
  if (m.initialWeights.empty())
    return remedy + " (this checkpoint's manifest does not record them)";
  struct stat st;
  if (stat(m.initialWeights.c_str(), &st) != 0)
    return "the run started from '" + m.initialWeights + "', which is gone (" +
           std::strerror(errno) + "); " + remedy;
  int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (int64_t(st.st_size) != m.initialWeightsBytes ||
      mtime != m.initialWeightsMtimeNs)
    return "the run started from '" + m.initialWeights +
           "', which has changed since (its size or modification time "
           "differs); " + remedy;
  return "";
}

/// The tensors to write, in the plan's order: trainable parameters from the
/// checkpoint, frozen ones (never checkpointed: they never change) from the
/// run's initial weights file.
Expected<std::vector<TensorRef>>
tensorsOf(const Chosen &c, const std::string &initialPath,
          std::vector<std::vector<float>> &frozenData) {
  std::optional<SafetensorsReader> initial;
  std::vector<TensorRef> tensors;
  for (const CheckpointParam &p : c.layout.params) {
    if (p.trainable) {
      tensors.push_back({p.name, p.shape, c.weights.data() + p.offset});
      continue;
    }
    if (initialPath.empty())
      return errorf("parameter '%s' is frozen: checkpoints do not hold "
                    "frozen parameters (resume reads them from the weights "
                    "again); %s",
                    p.name.c_str(), recordedWeights(c.manifest).c_str());
    if (!initial) {
      Expected<SafetensorsReader> r = SafetensorsReader::open(initialPath);
      if (!r)
        return Status::error("--weights: " + r.status().message());
      initial.emplace(std::move(*r));
    }
    frozenData.emplace_back(size_t(p.elements));
    if (Status s = initial->readF32(p.name, p.shape, frozenData.back().data());
        !s.ok())
      return Status::error("--weights: " + s.message());
    tensors.push_back({p.name, p.shape, frozenData.back().data()});
  }
  return tensors;
}

} // namespace

/// `fastllm-opt consolidate`: see the file comment.
int mlir::fastllm::consolidateMain(int argc, char **argv) {
  cl::OptionCategory category("consolidate options");
  cl::opt<std::string> checkpoint(
      cl::Positional, cl::Required,
      cl::desc("<checkpoint folder (train --checkpoint-dir) or one of its "
               "step-N folders>"),
      cl::cat(category));
  cl::opt<std::string> output(
      "o",
      cl::desc("The safetensors file to write (default: "
               "weights.safetensors in the current folder)"),
      cl::value_desc("file"), cl::init("weights.safetensors"),
      cl::cat(category));
  Flag<int64_t> step("step",
                        cl::desc("The step to write (default: the newest "
                                 "complete, verified one)"),
                        cl::value_desc("N"), cl::init(-1), cl::cat(category));
  cl::opt<std::string> initial(
      "weights",
      cl::desc("The weights the run started from (RUN/weights.safetensors): "
               "needed only when the model has frozen parameters, which "
               "checkpoints do not hold (default: none)"),
      cl::value_desc("file"), cl::cat(category));
  cl::opt<bool> overwrite(
      "overwrite",
      cl::desc("Replace the output file if it exists (default: refuse)"),
      cl::cat(category));
  cl::HideUnrelatedOptions({&category});
  cl::ParseCommandLineOptions(
      argc, argv,
      "fastllm-opt consolidate: a sharded training checkpoint to one "
      "safetensors file with every parameter's full fp32 tensor under its "
      "model name (what `train --save-weights` writes), without the training "
      "binary. Load it into PyTorch with tools/fastllm_weights.py.\n");

  auto fail = [](const std::string &message) {
    WithColor::error(errs(), "fastllm-opt consolidate") << message << "\n";
    return 1;
  };
  if (step.getNumOccurrences() && step < 0)
    return fail("--step must be a non-negative step number");
  std::string path = checkpoint;
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  // The input first: a typo in it is the error to see, not one about -o.
  if (!exists(path))
    return fail("'" + path + "' does not exist");
  // --weights is checked when given, frozen parameters or not: a typo in it
  // is not passed over because this checkpoint happens not to need it.
  if (!std::string(initial).empty()) {
    Expected<OpenedInput> in =
        openInput(initial, "--weights '" + initial + "'", InputOptions());
    if (!in)
      return fail(in.status().message());
  }
  std::string out = output;
  if (out.empty())
    return fail("-o: an empty path");
  if (exists(out) && !overwrite)
    return fail("'" + out +
                "' exists; pass --overwrite to replace it, or choose another "
                "-o");
  if (std::string why = checkReplaceable(out); !why.empty())
    return fail("-o: " + why);
  // Nor a file a checkpoint folder keeps: this one's (a step folder given:
  // its parent's) or any other's, a running job's lock included.
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (std::string why = checkpointFolderEntry(
          out, base.rfind("step-", 0) == 0 ? folderOf(path) : path);
      !why.empty())
    return fail("-o '" + out + "' " + why + "; choose another path");

  Expected<Chosen> chosen =
      choose(path, step.getNumOccurrences() ? std::optional<int64_t>(step)
                                            : std::nullopt);
  if (!chosen)
    return fail(chosen.status().message());
  // -o may not be one of the files read (--overwrite or not): the step's
  // manifest and shards, and --weights; nor the weights the run started
  // from, which its frozen parameters and any resume read again.
  std::vector<NamedPath> files = {
      {"the manifest", chosen->folder + "/manifest.json"},
      {"--weights", initial},
      {"the weights the run started from (its manifest records them)",
       chosen->manifest.initialWeights},
      {"-o", out, true}};
  for (int64_t r = 0; r < chosen->layout.dp; ++r)
    files.push_back({"the shard", chosen->folder + "/" + shardFileName(int(r))});
  if (std::string clash = distinctPaths(files); !clash.empty())
    return fail(clash);
  std::vector<std::vector<float>> frozenData;
  // Frozen parameters come from the run's initial weights: --weights, or
  // the file the manifest records when it is still the same.
  std::string initialPath = initial;
  bool anyFrozen = false;
  for (const CheckpointParam &p : chosen->layout.params)
    anyFrozen |= !p.trainable;
  if (initialPath.empty() && anyFrozen &&
      recordedWeights(chosen->manifest).empty()) {
    initialPath = chosen->manifest.initialWeights;
    outs() << "frozen parameters from '" << initialPath
           << "', the weights the run started from (as its manifest "
              "records)\n";
  }
  // The frozen values must be the run's: the bytes it started from.
  const std::string &recordedCrc = chosen->manifest.initialWeightsCrc;
  if (anyFrozen && !initialPath.empty() && !recordedCrc.empty()) {
    std::string crc = fileCrc32c(initialPath);
    if (crc != recordedCrc)
      return fail("--weights '" + initialPath +
                  "' is not the file the run started from (crc32c " + crc +
                  ", the run's " + recordedCrc + ", '" +
                  chosen->manifest.initialWeights +
                  "'): its frozen parameters would not be the run's");
  }
  Expected<std::vector<TensorRef>> tensors =
      tensorsOf(*chosen, initialPath, frozenData);
  if (!tensors)
    return fail(tensors.status().message());
  WrittenFile written;
  // Without --overwrite, put in place only where nothing is: another
  // consolidate's output that appeared meanwhile is not replaced.
  if (Status s = writeSafetensors(out, *tensors, {{"format", "pt"}}, &written,
                                  /*durable=*/true, /*replace=*/overwrite);
      !s.ok())
    return fail(s.message());
  outs() << "wrote '" << out << "': " << written.tensors << " tensors, "
         << written.bytes << " bytes, step " << chosen->manifest.step << " of '"
         << chosen->folder << "' (dp " << chosen->layout.dp << ", ZeRO-"
         << chosen->layout.zeroStage << ")\n";
  return 0;
}
