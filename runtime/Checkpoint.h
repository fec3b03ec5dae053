//===- Checkpoint.h - sharded, verified training checkpoints ----*- C++ -*-===//
//
// docs/DESIGN.md section 6. A checkpoint of step s is a folder
//
//   DIR/step-00000012/rank-00000.bin ... rank-<dp-1>.bin, manifest.json
//
// Each rank saves the byte regions it owns (with ZeRO-1: its shards of the
// fp32 master weights and AdamW's m and v) to a temporary file, fsyncs it and
// renames it into place. Then rank 0 gathers every shard's size and CRC32C and
// writes manifest.json last, the same way, and syncs the folder: a checkpoint
// without a manifest is incomplete by construction.
//
// Resume takes the newest step folder whose manifest parses and whose every
// shard has the size and checksum the manifest records; incomplete or damaged
// ones are skipped with a warning saying why. A checkpoint written for another
// plan is refused, naming the first field that differs.
//
// Shard file: "FLCKPT01", a little-endian u64 header length, a JSON header
// {"rank", "step", "regions": [{"name", "bytes"}...]}, then the regions'
// bytes in that order.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CHECKPOINT_H
#define FASTLLM_RUNTIME_CHECKPOINT_H

#include "runtime/Comm.h"
#include "runtime/ModelABI.h"
#include "runtime/Status.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fastllm::rt {

/// CRC32C (Castagnoli), continuing from `crc` (0 to start), so that
/// crc32c(crc32c(0, a), b) == crc32c(0, a + b). Uses SSE4.2 when the CPU has
/// it.
uint32_t crc32c(uint32_t crc, const void *data, size_t bytes);
/// The table-driven form, which crc32c must agree with.
uint32_t crc32cPortable(uint32_t crc, const void *data, size_t bytes);

/// Ordered (field, value) pairs that identify what a checkpoint belongs to,
/// compared field by field so a refusal can name the difference.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

/// The plan's identifying fields: target, batch and sequence sizes, vocab,
/// input names, dp, the ZeRO stage, the flat array length, the stage table
/// (which, with dp, fixes what each rank's shard holds) and every
/// parameter's name, shape, offset and trainability.
Fingerprint planFingerprint(const PlanInfo &plan);

/// "FIELD is A in the checkpoint but B in this run" for the first field in
/// which `saved` and `current` differ, or nothing when they agree.
std::optional<std::string> firstDifference(const Fingerprint &saved,
                                           const Fingerprint &current);

/// Every difference, in the same words, for warnings.
std::vector<std::string> allDifferences(const Fingerprint &saved,
                                        const Fingerprint &current);

/// A named byte range of this rank's training state, saved and restored
/// verbatim.
struct Region {
  std::string name;
  void *data;
  int64_t bytes;
};

struct ShardRecord {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct Manifest {
  int64_t step = 0;          ///< optimizer steps completed (1-based last step)
  int64_t optimizerStep = 0; ///< AdamW's t after the last update
  int64_t dp = 0;
  Fingerprint plan;
  /// The training options the run was started with; a resumed run that
  /// changes them is warned that it will not repeat the original.
  Fingerprint run;
  std::vector<ShardRecord> shards; ///< indexed by rank
  /// The weights file the run started from (absolute), which holds the
  /// frozen parameters no checkpoint stores, with its size and modification
  /// time (nanoseconds) then, so that `consolidate` can find it and tell
  /// whether it changed since. Empty in manifests from before.
  std::string initialWeights;
  int64_t initialWeightsBytes = -1, initialWeightsMtimeNs = -1;
  /// Tokens consumed by the steps up to `step` (all ranks), so that a run
  /// resumed with another global batch keeps counting from there; -1 in
  /// manifests from before (then step * the current global batch).
  int64_t tokens = -1;
  /// The loss of step `step` as the metrics file has it (lossText), so that
  /// `--resume` knows the run's metrics file; empty in manifests from before.
  std::string loss;
  /// fileCrc32c of that file, recorded when the plan has frozen
  /// parameters (their values come from it on resume); empty otherwise.
  std::string initialWeightsCrc;
};

/// CRC32C of the file at `path` as 8 hex digits, or "unreadable": its
/// size and whole contents, or with `sample` >= 0 its size and first and
/// last `sample` bytes (a data file of many GB: a copy that differs almost
/// always differs there).
std::string fileCrc32c(const std::string &path, int64_t sample = -1);

std::string manifestJson(const Manifest &m);
Expected<Manifest> parseManifest(std::string_view json);

/// "step-00000012" and "rank-00003.bin".
std::string stepFolderName(int64_t step);
std::string shardFileName(int rank);

/// The steps of the step-N folders under `dir`, complete or not, newest
/// first.
Expected<std::vector<int64_t>> listCheckpointSteps(const std::string &dir);

/// Writes the checkpoint `m` describes (m.shards is filled in here) under
/// `dir`, which must exist. Collective: every rank calls it with its own
/// regions.
Status saveCheckpoint(Communicator &comm, const std::string &dir, Manifest m,
                      const std::vector<Region> &regions);

struct Restored {
  std::string path; ///< the step folder loaded
  Manifest manifest;
  /// One line per newer checkpoint skipped, saying why.
  std::vector<std::string> skipped;
  /// How many of those had a manifest (a save that finished: readable or
  /// not) but failed to load: damaged, not merely incomplete. --resume
  /// refuses to go on past one.
  int64_t damaged = 0;
};

/// Loads this rank's regions from the newest complete checkpoint under `dir`
/// whose plan fingerprint equals `plan`. Collective: every rank calls it, and
/// all end on the same checkpoint. When none is complete, the result has an
/// empty path (and says in `skipped` why each was passed over). The regions'
/// contents are unspecified unless a checkpoint was loaded.
Expected<Restored> loadLatestCheckpoint(Communicator &comm,
                                        const std::string &dir,
                                        const Fingerprint &plan,
                                        const std::vector<Region> &regions);

//===----------------------------------------------------------------------===//
// Files (no MPI: fastllm-opt links these too; the collectives above are in
// CheckpointCollective.cpp)
//===----------------------------------------------------------------------===//

/// Writes one rank's shard file (synced, renamed into place); its size and
/// CRC32C.
Expected<ShardRecord> writeShard(const std::string &path, int rank,
                                 int64_t step,
                                 const std::vector<Region> &regions);

/// Reads rank `rank`'s shard of the checkpoint in `folder` into `regions`,
/// which must be exactly the regions it was saved from; an empty string, or
/// what is wrong with the shard (size, header, checksum).
std::string loadShard(const std::string &folder, int rank, const Manifest &m,
                      const std::vector<Region> &regions);

/// Writes a manifest's text to `path` atomically; its size and CRC32C.
Expected<ShardRecord> writeManifestFile(const std::string &path,
                                        const std::string &json);

/// The manifest of the step folder `folder`, parsed and checked; the error
/// says why not (no manifest: the checkpoint is incomplete). Never blocks or
/// follows a symlink: the manifest must be a regular file.
Expected<Manifest> readManifest(const std::string &folder);

/// Whether `folder` has an entry named manifest.json, whatever it is: a save
/// that finished, so a manifest there that does not read back is damage, not
/// an interrupted save.
bool hasManifest(const std::string &folder);

//===----------------------------------------------------------------------===//
// Reading a checkpoint's weights without the training binary
//===----------------------------------------------------------------------===//

/// The name of the region that holds a rank's shard of the fp32 master
/// weights, the first of optimizerStateRegions().
extern const char *const kMasterRegion;

/// The regions a rank's shard holds, in order: the fp32 master weights and
/// AdamW's m and v, `shardBytes` each (null data: a layout to compare a
/// header with).
std::vector<Region> optimizerStateRegions(void *master, void *adamM,
                                          void *adamV, int64_t shardBytes);

/// Values of `state`'s float regions that no saved checkpoint holds: not
/// finite anywhere, or negative in AdamW's v (a mean of squares). Counted
/// before a checkpoint is written (one that would hold them is refused) and
/// after one is read (a shard whose checksum passes but holds them was
/// written by something else).
int64_t countInvalid(const std::vector<Region> &state);

/// A parameter as the manifest's plan fingerprint records it.
struct CheckpointParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t elements = 0;
  /// Into the flat parameter array (a trainable parameter); a frozen one is
  /// not in the checkpoint (it never changes: resume reads it from the run's
  /// weights file again).
  int64_t offset = 0;
  bool trainable = true;
};

/// Where a checkpoint keeps each parameter: the flat parameter array of
/// `paramElements` is cut into stages, and stage k's elements [offset_k + r
/// * e_k / dp, + e_k / dp) are rank r's master shard at [offset_k / dp, +
/// e_k / dp) (runtime/Zero.h), for every ZeRO stage and for dp = 1.
struct CheckpointLayout {
  int64_t dp = 0, zeroStage = 0, paramElements = 0;
  std::vector<std::pair<int64_t, int64_t>> stages; ///< (offset, elements)
  std::vector<CheckpointParam> params;             ///< in the plan's order
};

/// The layout the manifest's plan fingerprint describes, every field checked
/// (numbers, stages tiling the array in dp equal shards, each trainable
/// parameter inside one stage), so that a hostile manifest gives an error.
Expected<CheckpointLayout> checkpointLayout(const Manifest &m);

/// The master shard of rank `rank` of the checkpoint in `folder`, read as
/// resume reads it: the file's size, header and CRC32C must be what the
/// manifest says. `out` receives the region's paramElements / dp floats; the
/// result is empty, or what is wrong.
std::string readMasterShard(const std::string &folder, int rank,
                            const Manifest &m, const CheckpointLayout &layout,
                            float *out);

/// The full flat parameter array (paramElements floats) of the checkpoint in
/// `folder`: every rank's master shard, verified, put back in place.
Expected<std::vector<float>>
readCheckpointWeights(const std::string &folder, const Manifest &m,
                      const CheckpointLayout &layout);

/// The steps under `dir` whose folder holds a manifest for that step (a save
/// that finished), newest first. Shards are not read: this is what a fresh
/// run refuses to start among and what --keep-last counts.
Expected<std::vector<int64_t>>
listCompleteCheckpointSteps(const std::string &dir);

/// "" when every step-N entry under `dir` is a folder of its own, else why
/// not (a symlink or another file under a step's name): checkpoints are
/// read, written and removed only in real step folders.
std::string checkStepFolders(const std::string &dir);

/// Removes the temporaries a killed save left (OutputFile's
/// `<target>.tmp-XXXXXX`, regular files) in `dir` and its step folders, only
/// for targets fastllm-opt writes there (manifest.json, rank-NNNNN.bin,
/// train.lock.owner) and never through a symlink; returns how many. Only for
/// a folder this process holds the lock of.
Expected<int64_t> removeOrphanTemporaries(const std::string &dir);

/// Removes step `step`'s folder, but only what a checkpoint wrote there:
/// the manifest first (so a half-removed folder reads as incomplete), then
/// the shards its own list names, and their temporaries; for a folder
/// without a manifest (a save cut short), the shards whose header proves
/// them this step's. A step folder that is a symlink, whose manifest does
/// not read back (damage is evidence), or that still holds other files
/// after that, is left: false. Opened relative to `dir`, never following a
/// symlink.
Expected<bool> removeCheckpoint(const std::string &dir, int64_t step);

/// --keep-last: when more than `keep` complete checkpoints exist, removes
/// (as removeCheckpoint does) every step folder older than the keep-th
/// newest complete one; returns the steps removed. `keep` <= 0 keeps
/// everything.
Expected<std::vector<int64_t>> pruneCheckpoints(const std::string &dir,
                                                int64_t keep);

/// The lock file in a checkpoint folder.
extern const char *const kLockFileName;

/// Why an output at `path` would replace a file a checkpoint folder keeps
/// (its lock files, a step folder, or a file in one), or "" when it would
/// not. A checkpoint folder is `dir` (when given; it may not hold a lock
/// yet) or any folder holding a lock file: a running job's, or a finished
/// one's.
std::string checkpointFolderEntry(const std::string &path,
                                  const std::string &dir = "");

/// An exclusive flock on DIR/train.lock, held while the object lives, so two
/// jobs never share a checkpoint folder. Its holder is named in
/// DIR/train.lock.owner ("pid N on HOST") for the refusal message.
class CheckpointLock {
public:
  /// Fails at once (no waiting) when another process holds it.
  static Expected<CheckpointLock> acquire(const std::string &dir);
  CheckpointLock() = default;
  CheckpointLock(CheckpointLock &&other) noexcept;
  CheckpointLock &operator=(CheckpointLock &&other) noexcept;
  CheckpointLock(const CheckpointLock &) = delete;
  CheckpointLock &operator=(const CheckpointLock &) = delete;
  ~CheckpointLock();

private:
  int fd = -1;
};

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_CHECKPOINT_H
