//===- CheckpointCollective.cpp - saving and restoring across ranks -------===//
//
// The collective half of runtime/Checkpoint.h: every rank writes or reads its
// shard, and the ranks agree through the Communicator on which checkpoint
// was written or loaded. The file formats and everything that needs no MPI
// (fastllm-opt consolidate reads checkpoints too) are in Checkpoint.cpp.
//
//===----------------------------------------------------------------------===//

#include "runtime/Checkpoint.h"
#include "runtime/InputFile.h"
#include "runtime/OutputFile.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

//===----------------------------------------------------------------------===//
// Save and restore
//===----------------------------------------------------------------------===//

Status fastllm::rt::saveCheckpoint(Communicator &comm, const std::string &dir,
                                   Manifest m,
                                   const std::vector<Region> &regions) {
  std::string folder = dir + "/" + stepFolderName(m.step);
  std::string manifestPath = folder + "/manifest.json";
  if (comm.rank() == 0) {
    if (mkdir(folder.c_str(), 0777) != 0 && errno != EEXIST)
      return errorf("cannot create checkpoint folder '%s': %s", folder.c_str(),
                    std::strerror(errno));
    // Only into a folder of its own: never through a symlink a user left
    // under the step's name (the save would write, and --keep-last later
    // delete, in the folder it points to).
    struct stat st;
    if (lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return errorf("checkpoint folder '%s' exists and is %s; move it away "
                    "(nothing was written)",
                    folder.c_str(),
                    S_ISLNK(st.st_mode) ? "a symbolic link" : "not a folder");
    // A manifest left by an earlier run must not vouch for the shards about
    // to be replaced.
    if (unlink(manifestPath.c_str()) != 0 && errno != ENOENT)
      return errorf("cannot remove the old '%s': %s", manifestPath.c_str(),
                    std::strerror(errno));
    syncFolder(folder);
    syncFolder(dir);
  }
  comm.barrier(); // the folder exists and holds no stale manifest

  // Every rank writes through its own descriptor of the step folder, opened
  // without following a symlink (its files named /proc/self/fd/N/...): a
  // folder swapped for a symlink after rank 0's check cannot redirect them.
  int folderFd = ::open(folder.c_str(),
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (folderFd < 0)
    return errorf("checkpoint folder '%s': cannot open it as a folder of its "
                  "own: %s (nothing was written)",
                  folder.c_str(), std::strerror(errno));
  InputFd folderGuard(folderFd);
  const std::string via = "/proc/self/fd/" + std::to_string(folderFd);
  // Errors name the folder as the user knows it.
  auto shown = [&](const Status &s) {
    std::string text = s.message();
    for (size_t at; (at = text.find(via)) != std::string::npos;)
      text.replace(at, via.size(), folder);
    return Status::error(text);
  };

  Expected<ShardRecord> mine = writeShard(
      via + "/" + shardFileName(comm.rank()), comm.rank(), m.step, regions);
  if (!mine)
    return shown(mine.status()); // the peers wait below until the job is aborted
  m.dp = comm.size();
  m.shards.assign(comm.size(), ShardRecord());
  comm.allGatherBytes(&*mine, m.shards.data(), sizeof(ShardRecord));
  if (comm.rank() != 0)
    return Status();

  if (Expected<ShardRecord> done =
          writeManifestFile(via + "/manifest.json", manifestJson(m));
      !done)
    return shown(done.status());
  return Status();
}

Expected<Restored>
fastllm::rt::loadLatestCheckpoint(Communicator &comm, const std::string &dir,
                                  const Fingerprint &plan,
                                  const std::vector<Region> &regions) {
  // Rank 0's listing decides which checkpoints everyone tries, in order, so
  // that the ranks' collectives below pair up.
  std::vector<int64_t> steps;
  int64_t count = 0;
  Status listing;
  if (comm.rank() == 0) {
    Expected<std::vector<int64_t>> listed = listCheckpointSteps(dir);
    if (listed)
      steps = std::move(*listed);
    else
      listing = listed.status();
    count = listed ? int64_t(steps.size()) : -1;
  }
  comm.broadcast(&count, sizeof(count), 0);
  if (count < 0)
    return listing.ok()
               ? errorf("cannot read checkpoint folder '%s'", dir.c_str())
               : listing;
  steps.resize(count);
  comm.broadcast(steps.data(), count * int64_t(sizeof(int64_t)), 0);

  constexpr int kReasonBytes = 256;
  Restored result;
  for (int64_t step : steps) {
    std::string folder = dir + "/" + stepFolderName(step);
    Expected<Manifest> m = readManifest(folder);
    std::string why;
    if (!m) {
      why = m.status().message();
    } else if (m->step != step) {
      why = "its manifest is for step " + std::to_string(m->step);
    } else if (std::optional<std::string> diff =
                   firstDifference(m->plan, plan)) {
      return errorf("checkpoint '%s' was written for a different plan: %s; "
                    "resume with the binary that wrote it, or start a new "
                    "--checkpoint-dir",
                    folder.c_str(), diff->c_str());
    } else if (m->dp != comm.size()) {
      // (The plan, compared above, fixes dp: a manifest listing another
      // number of shards than its own plan's dp was altered.)
      why = "its manifest lists " + std::to_string(m->dp) +
            " shards for a run of " + std::to_string(comm.size()) + " ranks";
    } else {
      why = loadShard(folder, comm.rank(), *m, regions);
    }

    // Every rank must have loaded its shard of the same checkpoint.
    char reason[kReasonBytes] = {};
    std::strncpy(reason, why.c_str(), kReasonBytes - 1);
    std::vector<char> reasons(size_t(kReasonBytes) * comm.size());
    comm.allGatherBytes(reason, reasons.data(), kReasonBytes);
    std::vector<std::string> problems;
    for (int r = 0; r < comm.size(); ++r)
      problems.push_back(&reasons[size_t(r) * kReasonBytes]);
    if (std::all_of(problems.begin(), problems.end(),
                    [](const std::string &p) { return p.empty(); })) {
      result.path = folder;
      result.manifest = std::move(*m);
      return result;
    }
    // One reason when the ranks agree (a missing manifest), else each rank's.
    std::string line = "checkpoint '" + folder + "' skipped: ";
    if (std::equal(problems.begin() + 1, problems.end(), problems.begin())) {
      line += problems[0];
    } else {
      bool first = true;
      for (int r = 0; r < comm.size(); ++r)
        if (!problems[r].empty()) {
          line += (first ? "rank " : "; rank ") + std::to_string(r) + ": " +
                  problems[r];
          first = false;
        }
    }
    result.skipped.push_back(line);
    // Rank 0's view decides (every rank read the same folder): a manifest
    // there, readable or not, means a save that finished, so the checkpoint
    // is damaged rather than incomplete.
    int64_t hadManifest = comm.rank() == 0 && hasManifest(folder);
    comm.broadcast(&hadManifest, sizeof(hadManifest), 0);
    result.damaged += hadManifest;
  }
  return result; // none complete: an empty path
}
