//===- Trace.cpp - a Chrome trace-event file of chosen steps --------------===//

#include "runtime/Trace.h"

#include "runtime/Device.h"
#include "runtime/OutputFile.h"
#include "runtime/Version.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

static_assert(sizeof(TraceEvent) == 48, "TraceEvent is sent as bytes");

Tracer::Tracer(const PlanInfo &plan, int64_t first, int64_t last,
               int64_t gradAccum, Communicator &comm)
    : plan(plan), first(first), last(last) {
  // What the traced steps produce: each micro-batch's kernel calls, at most
  // two collectives per stage and its own phases; each step's per-stage
  // collectives and phases. Twice that, within the bound.
  int64_t ops = std::max<int64_t>(plan.numTraceOps, 0);
  int64_t perStep = gradAccum * (ops + 4 * int64_t(plan.numStages) + 8) +
                    4 * int64_t(plan.numStages) + 16;
  int64_t steps = std::max<int64_t>(last - first + 1, 1);
  int64_t capacity = perStep > kMaxTraceEvents / (2 * steps)
                         ? kMaxTraceEvents
                         : 2 * perStep * steps;
  events.reserve(size_t(capacity));
  table.context = this;
  table.begin = &Tracer::beginHook;
  table.end = &Tracer::endHook;
  comm.barrier();
  origin = Clock::now();
}

Tracer *Tracer::beginStep(int64_t step) {
  currentMicro = -1;
  if (step < first || step > last)
    return nullptr;
  currentStep = int32_t(step);
  ++stepsTraced;
  return this;
}

void Tracer::record(TraceKind kind, int64_t start, int32_t index, int64_t bytes,
                    TraceMoves moves, bool fromStep) {
  if (events.size() == events.capacity()) {
    ++dropped;
    return;
  }
  events.push_back({start, now(), bytes, currentStep, currentMicro, kind, index,
                    moves, fromStep ? 1 : 0});
}

void Tracer::beginHook(void *self, int32_t op) {
  Tracer *t = static_cast<Tracer *>(self);
  t->opStart = t->now();
}

void Tracer::endHook(void *self, int32_t op) {
  Tracer *t = static_cast<Tracer *>(self);
  synchronizeDevice(); // CUDA: the kernel has run (nothing on the CPU)
  if (op >= 0 && op < t->plan.numTraceOps)
    t->record(TraceKind::Op, t->opStart, op);
}

void TraceSpan::end() {
  if (!tracer)
    return;
  synchronizeDevice();
  tracer->record(kind, start, index, bytes, moves);
  tracer = nullptr;
}

Status fastllm::rt::checkTracePath(const std::string &path, bool overwrite) {
  if (path.empty())
    return Status();
  // What the path is first: a folder, a FIFO or a device is never
  // replaced, --overwrite or not.
  if (std::string why = checkReplaceable(path); !why.empty())
    return errorf("--trace: %s", why.c_str());
  struct stat st;
  if (!overwrite && lstat(path.c_str(), &st) == 0)
    return errorf("--trace '%s' exists; pass --overwrite to replace it",
                  path.c_str());
  std::string dir = folderOf(path);
  if (access(dir.c_str(), W_OK) != 0)
    return errorf("--trace '%s': cannot write to folder '%s': %s", path.c_str(),
                  dir.c_str(), std::strerror(errno));
  return Status();
}

Status fastllm::rt::parseTraceSteps(const std::string &text, int64_t &first,
                                    int64_t &last) {
  auto number = [](const std::string &s, int64_t &out) {
    if (s.empty() || s.size() > 12 ||
        !std::all_of(s.begin(), s.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    out = std::strtoll(s.c_str(), nullptr, 10);
    return out >= 1;
  };
  size_t dash = text.find('-');
  std::string a = text.substr(0, dash),
              b = dash == std::string::npos ? a : text.substr(dash + 1);
  if (!number(a, first) || !number(b, last))
    return errorf("--trace-steps expects A-B or A, 1-based step numbers "
                  "(such as 2-3), got '%s'",
                  text.c_str());
  if (first > last)
    return errorf("--trace-steps %s: the first step is after the last",
                  text.c_str());
  return Status();
}

namespace {

/// `s` as a JSON string literal.
std::string jsonString(const char *s) {
  std::string out = "\"";
  for (const char *p = s ? s : ""; *p; ++p) {
    unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

/// Microseconds with nanosecond digits, as the format's "ts" and "dur".
std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld.%03lld", (long long)(ns / 1000),
                (long long)(ns % 1000));
  return buf;
}

const char *kindName(TraceKind k) {
  switch (k) {
  case TraceKind::Op:
    return "op";
  case TraceKind::AllGather:
    return "all_gather";
  case TraceKind::ReduceScatter:
    return "reduce_scatter";
  case TraceKind::AllReduce:
    return "all_reduce";
  case TraceKind::Step:
    return "step";
  case TraceKind::MicroBatch:
    return "micro_batch";
  case TraceKind::DataLoading:
    return "data_loading";
  case TraceKind::Optimizer:
    return "optimizer";
  }
  return "unknown";
}

const char *movesName(TraceMoves m) {
  switch (m) {
  case TraceMoves::Weights:
    return "weights";
  case TraceMoves::Gradients:
    return "gradients";
  case TraceMoves::GradNorm:
    return "grad_norm";
  case TraceMoves::Loss:
    return "loss";
  case TraceMoves::None:
    break;
  }
  return "";
}

bool isCollective(TraceKind k) {
  return k == TraceKind::AllGather || k == TraceKind::ReduceScatter ||
         k == TraceKind::AllReduce;
}

// Tracks (tids) of each rank's process.
constexpr int kStepTrack = 1, kComputeTrack = 2, kCollectiveTracks = 10;
constexpr int kLanes = 16; ///< tracks per collective kind

/// A metadata ("M") event naming or ordering a process or track.
std::string meta(const char *name, int pid, int tid, const std::string &key,
                 const std::string &value) {
  return "{\"name\":\"" + std::string(name) +
         "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"" + key +
         "\":" + value + "}}";
}

/// One "X" event.
std::string complete(const PlanInfo &plan, const TraceEvent &e, int pid,
                     int tid) {
  const bool op = e.kind == TraceKind::Op;
  const TraceOp *info = op ? &plan.traceOps[e.index] : nullptr;
  std::string s =
      "{\"name\":" + jsonString(op ? info->name : kindName(e.kind)) +
      ",\"cat\":\"" +
      (op                     ? "compute"
       : isCollective(e.kind) ? "collective"
                              : "runtime") +
      "\",\"ph\":\"X\",\"pid\":" + std::to_string(pid) +
      ",\"tid\":" + std::to_string(tid) + ",\"ts\":" + micros(e.start) +
      ",\"dur\":" + micros(std::max<int64_t>(e.end - e.start, 0)) +
      ",\"args\":{\"step\":" + std::to_string(e.step);
  if (e.micro >= 0)
    s += ",\"micro_batch\":" + std::to_string(e.micro);
  if (op)
    s += ",\"op\":" + std::to_string(e.index) +
         ",\"stage\":" + std::to_string(info->stage) +
         ",\"layer\":" + std::to_string(info->layer) + ",\"phase\":\"" +
         (info->backward ? "backward" : "forward") + "\"";
  if (isCollective(e.kind))
    s += ",\"stage\":" + std::to_string(e.index) +
         ",\"bytes\":" + std::to_string(e.bytes) + ",\"moves\":\"" +
         movesName(e.moves) + "\",\"issued_by\":\"" +
         (e.fromStep ? "step" : "runtime") + "\"";
  return s + "}}";
}

/// The trace-event JSON of every rank's events (`perRank[r]`).
std::string formatTrace(const PlanInfo &plan,
                        const std::vector<std::vector<TraceEvent>> &perRank,
                        const std::vector<int64_t> &dropped, int64_t first,
                        int64_t last) {
  std::string out = "{\"traceEvents\":[\n";
  bool firstLine = true;
  auto line = [&](const std::string &s) {
    out += (firstLine ? "" : ",\n") + s;
    firstLine = false;
  };
  for (size_t r = 0; r < perRank.size(); ++r) {
    int pid = int(r);
    line(meta("process_name", pid, 0, "name",
              jsonString(("rank " + std::to_string(r)).c_str())));
    line(meta("process_sort_index", pid, 0, "sort_index", std::to_string(r)));
    line(meta("thread_name", pid, kStepTrack, "name", "\"step\""));
    line(meta("thread_sort_index", pid, kStepTrack, "sort_index", "0"));
    line(meta("thread_name", pid, kComputeTrack, "name", "\"compute\""));
    line(meta("thread_sort_index", pid, kComputeTrack, "sort_index", "1"));
    // Collectives of a kind that overlap (two reduce-scatters in flight)
    // go to lanes of their own: spans on one track must nest.
    std::vector<TraceEvent> sorted = perRank[r];
    std::sort(sorted.begin(), sorted.end(),
              [](const TraceEvent &a, const TraceEvent &b) {
                return a.start != b.start ? a.start < b.start : a.end > b.end;
              });
    std::vector<std::vector<int64_t>> laneEnd(3);
    for (const TraceEvent &e : sorted) {
      int tid = e.kind == TraceKind::Op ? kComputeTrack : kStepTrack;
      if (isCollective(e.kind)) {
        int k = int(e.kind) - int(TraceKind::AllGather);
        std::vector<int64_t> &ends = laneEnd[k];
        size_t lane = 0;
        while (lane < ends.size() && ends[lane] > e.start)
          ++lane;
        lane = std::min<size_t>(lane, kLanes - 1);
        if (lane == ends.size()) {
          ends.push_back(0);
          tid = kCollectiveTracks + k * kLanes + int(lane);
          std::string name = kindName(e.kind);
          if (lane)
            name += " #" + std::to_string(lane + 1);
          line(meta("thread_name", pid, tid, "name", jsonString(name.c_str())));
          line(meta("thread_sort_index", pid, tid, "sort_index",
                    std::to_string(tid)));
        }
        ends[lane] = std::max(ends[lane], e.end);
        tid = kCollectiveTracks + k * kLanes + int(lane);
      }
      line(complete(plan, e, pid, tid));
    }
  }
  out += "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":" +
         jsonString(versionString()) + ",\"steps\":\"" + std::to_string(first) +
         "-" + std::to_string(last) +
         "\",\"clock\":\"microseconds since a barrier at the start of "
         "training, per rank\",\"dropped_events\":[";
  for (size_t r = 0; r < dropped.size(); ++r)
    out += (r ? "," : "") + std::to_string(dropped[r]);
  return out + "]}}\n";
}

/// Writes `text` to `path` whole, never over an existing file: the complete
/// temporary is linked to the name, which fails if the name exists.
std::string writeNew(const std::string &path, const std::string &text) {
  OutputFile file(path);
  if (!file.open() || !file.write(text) || !file.finishWithoutRename())
    return file.error();
  std::string why;
  if (::link(file.temporaryPath().c_str(), path.c_str()) != 0)
    why = errno == EEXIST
              ? "'" + path +
                    "' appeared during the run; a trace is never "
                    "written over a file"
              : "cannot write '" + path + "': " + std::strerror(errno);
  ::unlink(file.temporaryPath().c_str());
  if (why.empty())
    syncFolder(folderOf(path));
  return why;
}

} // namespace

Status Tracer::write(Communicator &comm, const std::string &path, FILE *log) {
  const int size = comm.size();
  int64_t mine[2] = {int64_t(events.size()), dropped};
  std::vector<int64_t> counts(2 * size);
  comm.allGatherBytes(mine, counts.data(), sizeof(mine));
  std::vector<std::vector<TraceEvent>> perRank(size);
  std::vector<int64_t> droppedPerRank(size);
  for (int r = 0; r < size; ++r) {
    droppedPerRank[r] = counts[2 * r + 1];
    if (r == comm.rank()) {
      perRank[r] = events;
    } else {
      perRank[r].resize(size_t(counts[2 * r]));
    }
    // Every rank takes part in every broadcast; only rank 0 keeps them.
    if (r > 0 && counts[2 * r] > 0)
      comm.broadcast(perRank[r].data(),
                     counts[2 * r] * int64_t(sizeof(TraceEvent)), r);
    if (comm.rank() != 0 && r != comm.rank())
      std::vector<TraceEvent>().swap(perRank[r]);
  }
  int32_t failed = 0;
  std::string why;
  if (comm.rank() == 0) {
    // Events come from another rank's memory: an op index out of the table
    // would read outside it.
    for (std::vector<TraceEvent> &list : perRank)
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const TraceEvent &e) {
                                  return e.kind == TraceKind::Op &&
                                         (e.index < 0 ||
                                          e.index >= plan.numTraceOps);
                                }),
                 list.end());
    why =
        writeNew(path, formatTrace(plan, perRank, droppedPerRank, first, last));
    failed = !why.empty();
  }
  comm.broadcast(&failed, sizeof(failed), 0);
  if (failed)
    return comm.rank() == 0 ? Status::error("--trace: " + why)
                            : Status::error("--trace: rank 0 could not write "
                                            "the trace");
  if (log) {
    int64_t total = 0, lost = 0;
    for (int r = 0; r < size; ++r)
      total += counts[2 * r], lost += counts[2 * r + 1];
    std::fprintf(log,
                 "trace: '%s' (%lld events of steps %lld-%lld, %d "
                 "rank%s; open it in ui.perfetto.dev or "
                 "chrome://tracing)\n",
                 path.c_str(), (long long)total, (long long)first,
                 (long long)last, size, size == 1 ? "" : "s");
    if (lost)
      std::fprintf(log,
                   "trace: warning: the event buffers were full; %lld "
                   "later events were dropped (trace fewer steps)\n",
                   (long long)lost);
    if (!stepsTraced)
      std::fprintf(log,
                   "trace: warning: no step of %lld-%lld ran in this "
                   "run; the trace holds no spans\n",
                   (long long)first, (long long)last);
  }
  return Status();
}
