//===- MpiTest.cpp - the runtime on several ranks, under mpirun -----------===//
//
// Run by ctest as `mpirun -np N fastllm-rt-mpi-test MODE`:
//
//   collectives  every collective, blocking and not, against sums computed
//                here, and the bytes each kind counts
//   zero         ZeRO-1 through train(): the fake model trained on N ranks
//                matches a 1-rank run of the same global batch (losses,
//                norms, gradients, weights within 1e-5), frozen weights and
//                padding stay put, and each step moves the bytes the plan
//                predicts
//   resume       sharded checkpoints through train(): a run resumed after one
//                rank's newest shard was damaged repeats the uninterrupted run
//   timeout      rank 0 enters an all-reduce the others skip: it must abort
//                the job after the 2 s timeout, naming rank, step and op
//   kill         rank 1 dies of SIGKILL mid-run: the job must end
//   bad-root     an MPI error (a broadcast from a rank that does not exist)
//                must abort with MPI's description
//
// A failed check prints the rank and line and aborts the job.
//
//===----------------------------------------------------------------------===//

#include "FakeModel.h"

#include "runtime/Checkpoint.h"
#include "runtime/Comm.h"
#include "runtime/Json.h"
#include "runtime/Safetensors.h"
#include "runtime/Train.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace fastllm::rt;

namespace {

Communicator *world;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      world->abort(std::string("check failed at line ") +                      \
                   std::to_string(__LINE__) + ": " #cond);                     \
  } while (0)

/// A failed Status aborts the job with its message.
#define CHECK_OK(status)                                                       \
  do {                                                                         \
    Status s_ = (status);                                                      \
    if (!s_.ok())                                                              \
      world->abort(std::string("at line ") + std::to_string(__LINE__) + ": " + \
                   s_.message());                                              \
  } while (0)

/// Exact in fp32: every value and sum here stays below 2^24.
void testCollectives(Communicator &comm) {
  const int p = comm.size(), r = comm.rank();
  for (int64_t n : {1, 7, 100003}) {
    // reduce-scatter: block r of the sum over ranks.
    std::vector<float> in(p * n), out(n);
    for (int64_t j = 0; j < p * n; ++j)
      in[j] = float((r + 1) * (j % 1000 + 1));
    comm.resetBytes();
    comm.reduceScatterSum(in.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i)
      CHECK(out[i] == float(((r * n + i) % 1000 + 1) * p * (p + 1) / 2));
    CHECK(comm.bytes().reduceScatter == p * n * 4);

    // all-gather, out of place and in place.
    std::vector<float> mine(n), all(p * n, -1);
    for (int64_t i = 0; i < n; ++i)
      mine[i] = float(r * n + i);
    comm.allGather(mine.data(), all.data(), n);
    for (int64_t j = 0; j < p * n; ++j)
      CHECK(all[j] == float(j));
    std::vector<float> inPlace(p * n, -1);
    std::copy(mine.begin(), mine.end(), inPlace.begin() + r * n);
    comm.allGather(inPlace.data() + r * n, inPlace.data(), n);
    CHECK(inPlace == all);
    CHECK(comm.bytes().allGather == 2 * p * n * 4);

    // all-reduce, out of place and in place.
    std::vector<float> sum(n);
    comm.allReduceSum(mine.data(), sum.data(), n);
    for (int64_t i = 0; i < n; ++i)
      CHECK(sum[i] == float(p * i + n * p * (p - 1) / 2));
    comm.allReduceSum(mine.data(), mine.data(), n);
    CHECK(mine == sum);
    CHECK(comm.bytes().allReduce == 2 * n * 4);
  }

  // Three non-blocking collectives in flight at once, completed out of order.
  const int64_t n = 4096;
  std::vector<float> a(n, float(r)), rsIn(p * n, 1), rsOut(n),
      agIn(n, float(r)), agOut(p * n);
  comm.resetBytes();
  Request ar = comm.iallReduceSum(a.data(), a.data(), n);
  Request rs = comm.ireduceScatterSum(rsIn.data(), rsOut.data(), n);
  Request ag = comm.iallGather(agIn.data(), agOut.data(), n);
  while (!ag.test()) {
  }
  rs.wait();
  ar.wait();
  ar.wait(); // a completed request waits no more
  for (int64_t i = 0; i < n; ++i)
    CHECK(a[i] == float(p * (p - 1) / 2) && rsOut[i] == float(p));
  for (int64_t j = 0; j < p * n; ++j)
    CHECK(agOut[j] == float(j / n));
  CHECK(comm.bytes().allReduce == n * 4 &&
        comm.bytes().reduceScatter == p * n * 4);
  CHECK(comm.bytes().allGather == p * n * 4);

  // Broadcast, control gathers and barrier.
  char text[16] = {};
  if (r == p - 1)
    std::strcpy(text, "from the last");
  comm.broadcast(text, sizeof(text), p - 1);
  CHECK(std::strcmp(text, "from the last") == 0);
  int64_t id = 1000 + r;
  std::vector<int64_t> ids(p);
  comm.allGatherBytes(&id, ids.data(), sizeof(id));
  for (int q = 0; q < p; ++q)
    CHECK(ids[q] == 1000 + q);
  comm.barrier();
  CHECK(comm.bytes().broadcast == 16 && comm.bytes().control == p * 8);

  // The ordered double all-reduce: the same bits on every rank, in place.
  comm.resetBytes();
  std::vector<double> mineD(5), sumD(5);
  for (int i = 0; i < 5; ++i)
    mineD[i] = 0.1 * (r + 1) + 1e-9 * i;
  comm.allReduceSumOrdered(mineD.data(), sumD.data(), 5);
  for (int i = 0; i < 5; ++i) {
    double expected = 0;
    for (int q = 0; q < p; ++q)
      expected += 0.1 * (q + 1) + 1e-9 * i;
    CHECK(sumD[i] == expected);
  }
  comm.allReduceSumOrdered(mineD.data(), mineD.data(), 5);
  CHECK(mineD == sumD);
  CHECK(comm.bytes().allReduce == 2 * 5 * 8);

  // A 1-rank world beside the job's.
  {
    Expected<std::unique_ptr<Communicator>> self = Communicator::createSelf();
    CHECK(self.ok() && (*self)->size() == 1 && (*self)->rank() == 0);
    float x = float(r);
    (*self)->allReduceSum(&x, &x, 1);
    CHECK(x == float(r));
  }
  comm.resetBytes();
  CHECK(comm.bytes().allReduce == 0 && comm.bytes().reduceScatter == 0 &&
        comm.bytes().allGather == 0 && comm.bytes().broadcast == 0 &&
        comm.bytes().control == 0);
  std::printf("rank %d of %d: collectives ok\n", r, p);
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The losses of a metrics file, as written.
std::vector<std::string> losses(const std::string &path) {
  std::vector<std::string> out;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) {
    Expected<JsonValue> v = parseJson(line);
    CHECK(v.ok() && v->get("loss"));
    out.push_back(v->get("loss")->text);
  }
  return out;
}

/// Sharded checkpoints through the real training loop: every rank trains the
/// fake model on its own samples, so the ranks' shards differ.
void testResume(Communicator &comm) {
  fake::setShape(2, 3, comm.size());
  PlanInfo plan = *fastllm_plan();

  // Rank 0 makes the folder and the inputs; everyone learns where.
  char root[256] = {};
  if (comm.rank() == 0) {
    std::snprintf(root, sizeof(root), "%s/fastllm-mpi-XXXXXX",
                  std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(root));
    std::mt19937 rng(3);
    std::vector<uint16_t> tokens(400);
    for (uint16_t &t : tokens)
      t = rng() % fake::kVocab;
    std::ofstream(std::string(root) + "/tokens.u16", std::ios::binary)
        .write(reinterpret_cast<const char *>(tokens.data()),
               tokens.size() * 2);
    std::normal_distribution<float> normal;
    std::vector<float> weights(plan.paramElements);
    for (float &w : weights)
      w = normal(rng);
    CHECK(saveParams(std::string(root) + "/init.safetensors", plan,
                     weights.data(), false)
              .ok());
  }
  comm.broadcast(root, sizeof(root), 0);
  std::string dir = root;

  Options opts;
  opts.dataPath = dir + "/tokens.u16";
  opts.weightsPath = dir + "/init.safetensors";
  opts.steps = 8;
  opts.lr = 0.05;
  opts.sampler = SamplerKind::Random;
  opts.seed = 11;
  opts.clipGradNorm = 1;
  opts.checkpointEvery = 2;
  opts.collectiveTimeout = 30;

  Options full = opts;
  full.checkpointDir = dir + "/full";
  full.metricsPath = dir + "/full.jsonl";
  CHECK_OK(train(plan, fastllm_step, full, comm, nullptr));

  // Stopped after step 7 (checkpointed: the last step), then the last rank's
  // newest shard (step 7) damaged.
  Options killed = opts;
  killed.steps = 7;
  killed.checkpointDir = dir + "/killed";
  killed.metricsPath = dir + "/killed.jsonl";
  CHECK_OK(train(plan, fastllm_step, killed, comm, nullptr));
  comm.barrier();
  std::string shard = killed.checkpointDir + "/" + stepFolderName(7) + "/" +
                      shardFileName(comm.size() - 1);
  if (comm.rank() == comm.size() - 1)
    std::ofstream(shard, std::ios::binary | std::ios::in) << "damage";

  // Every rank refuses to go on past the damaged checkpoint, together, and
  // leaves it as it was.
  Options resumed = killed;
  resumed.steps = 8;
  resumed.resume = true;
  comm.barrier(); // the damage is on disk before anyone reads the shard
  std::string damaged = readFile(shard);
  Status refused = train(plan, fastllm_step, resumed, comm, nullptr);
  CHECK(!refused.ok() &&
        refused.message().find("cannot be loaded") != std::string::npos);
  CHECK(readFile(shard) == damaged);
  comm.barrier();
  // Moved away, as the refusal says: every rank falls back to step 6
  // together.
  if (comm.rank() == 0)
    CHECK(std::rename((killed.checkpointDir + "/" + stepFolderName(7)).c_str(),
                      (dir + "/damaged-step-7").c_str()) == 0);
  comm.barrier();
  CHECK_OK(train(plan, fastllm_step, resumed, comm, nullptr));

  if (comm.rank() == 0) {
    std::vector<std::string> a = losses(full.metricsPath),
                             b = losses(resumed.metricsPath);
    CHECK(a.size() == 8 && a == b);
    // Step 8's shards hold the same state as the uninterrupted run's.
    for (int r = 0; r < comm.size(); ++r) {
      std::string name = "/" + stepFolderName(8) + "/" + shardFileName(r);
      CHECK(readFile(full.checkpointDir + name) ==
            readFile(killed.checkpointDir + name));
    }
    Expected<Manifest> m = parseManifest(readFile(
        full.checkpointDir + "/" + stepFolderName(8) + "/manifest.json"));
    CHECK(m.ok() && m->dp == comm.size() &&
          int(m->shards.size()) == comm.size());
    std::system(("rm -rf '" + dir + "'").c_str());
  }
  comm.barrier();
  std::printf("rank %d of %d: checkpoint resume ok\n", comm.rank(),
              comm.size());
}

/// Every tensor of a safetensors file written by the runtime, by name.
std::vector<std::vector<float>>
readTensors(const std::string &path, const PlanInfo &plan, bool trainableOnly) {
  Expected<SafetensorsReader> r = SafetensorsReader::open(path);
  CHECK(r.ok());
  std::vector<std::vector<float>> out;
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    out.push_back(std::vector<float>(p.numel));
    if (p.trainable || !trainableOnly)
      CHECK(r->readF32(p.name, std::vector<int64_t>(p.shape, p.shape + p.rank),
                       out.back().data())
                .ok());
  }
  return out;
}

bool near(double a, double b, double tolerance) {
  return std::abs(a - b) <= tolerance * std::max(1.0, std::abs(b));
}

/// ZeRO-1 on comm.size() ranks against one rank doing the same global batch
/// as gradAccum * dp micro-batches.
void testZero(Communicator &comm) {
  const int p = comm.size();
  const int64_t B = 2, T = 3, A = 2;
  fake::setShape(B, T, p);
  const fake::Layout layout = fake::layout(p);
  char root[256] = {};
  if (comm.rank() == 0) {
    std::snprintf(root, sizeof(root), "%s/fastllm-zero-XXXXXX",
                  std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(root));
    std::mt19937 rng(5);
    std::vector<uint16_t> tokens(600);
    for (uint16_t &t : tokens)
      t = rng() % fake::kVocab;
    std::ofstream(std::string(root) + "/tokens.u16", std::ios::binary)
        .write(reinterpret_cast<const char *>(tokens.data()),
               tokens.size() * 2);
    std::normal_distribution<float> normal;
    std::vector<float> weights(layout.paramElements);
    for (float &w : weights)
      w = normal(rng);
    CHECK(saveParams(std::string(root) + "/init.safetensors", *fastllm_plan(),
                     weights.data(), false)
              .ok());
  }
  comm.broadcast(root, sizeof(root), 0);
  std::string dir = root;

  Options opts;
  opts.dataPath = dir + "/tokens.u16";
  opts.weightsPath = dir + "/init.safetensors";
  opts.steps = 8;
  opts.lr = 0.05;
  opts.warmupSteps = 2;
  opts.sampler = SamplerKind::Sequential;
  opts.clipGradNorm = 0.3; // below the norm: every rank must scale alike
  opts.gradAccum = A;
  opts.collectiveTimeout = 60;
  Options sharded = opts;
  sharded.metricsPath = dir + "/dp.jsonl";
  sharded.saveWeightsPath = dir + "/dp.safetensors";
  sharded.dumpGradsPath = dir + "/dp-grads.safetensors";
  fake::takePaddingViolations();
  fake::takeStepContexts();
  CHECK_OK(train(*fastllm_plan(), fastllm_step, sharded, comm, nullptr));
  CHECK(fake::takePaddingViolations() == 0);
  // Dropout's key: rank r's micro-batch m starts at global sample
  // r * A * B + m * B of the step, whatever the rank count.
  std::vector<StepContext> contexts = fake::takeStepContexts();
  CHECK(int64_t(contexts.size()) == opts.steps * A);
  for (size_t i = 0; i < contexts.size(); ++i)
    CHECK(contexts[i].step == int64_t(i) / A &&
          contexts[i].firstSample ==
              comm.rank() * A * B + (int64_t(i) % A) * B);
  comm.barrier();

  if (comm.rank() == 0) {
    // The same global batch on one rank: dp * A micro-batches of B.
    fake::setShape(B, T, 1);
    Expected<std::unique_ptr<Communicator>> self = Communicator::createSelf();
    CHECK(self.ok());
    Options single = opts;
    single.gradAccum = A * p;
    single.metricsPath = dir + "/single.jsonl";
    single.saveWeightsPath = dir + "/single.safetensors";
    single.dumpGradsPath = dir + "/single-grads.safetensors";
    CHECK_OK(train(*fastllm_plan(), fastllm_step, single, **self, nullptr));
    CHECK(fake::takePaddingViolations() == 0);

    std::vector<JsonValue> a, b;
    for (auto [path, out] : {std::pair{sharded.metricsPath, &a},
                             std::pair{single.metricsPath, &b}}) {
      std::istringstream in(readFile(path));
      for (std::string line; std::getline(in, line);) {
        Expected<JsonValue> v = parseJson(line);
        CHECK(v.ok());
        out->push_back(*v);
      }
    }
    CHECK(a.size() == 8 && b.size() == 8);
    auto number = [](const JsonValue &v, const char *key) {
      CHECK(v.get(key));
      return std::stod(v.get(key)->text);
    };
    const double predicted = double(layout.paramElements * 4);
    for (size_t i = 0; i < a.size(); ++i) {
      double lossA = number(a[i], "loss"), lossB = number(b[i], "loss");
      std::printf("step %zu: loss %.9g (dp %d) %.9g (1 rank), grad_norm "
                  "%.9g %.9g\n",
                  i + 1, lossA, p, lossB, number(a[i], "grad_norm"),
                  number(b[i], "grad_norm"));
      CHECK(std::abs(lossA - lossB) <= 1e-5 * std::abs(lossB));
      CHECK(near(number(a[i], "grad_norm"), number(b[i], "grad_norm"), 1e-5));
      CHECK(number(a[i], "lr") == number(b[i], "lr"));
      // ZeRO-1: the full padded array through each of reduce-scatter and
      // all-gather (the gradient dump's gather is not counted), one double
      // for the norm and one for the stop flag; nothing with one rank.
      CHECK(number(a[i], "reduce_scatter_bytes") == (p > 1 ? predicted : 0));
      CHECK(number(a[i], "all_gather_bytes") == (p > 1 ? predicted : 0));
      CHECK(number(a[i], "all_reduce_bytes") == (p > 1 ? 16 : 0));
      for (const char *key :
           {"reduce_scatter_bytes", "all_gather_bytes", "all_reduce_bytes"})
        CHECK(number(b[i], key) == 0);
    }

    const PlanInfo &plan = *fastllm_plan();
    std::vector<std::vector<float>> init =
        readTensors(opts.weightsPath, plan, false);
    std::vector<std::vector<float>> wa =
        readTensors(sharded.saveWeightsPath, plan, false);
    std::vector<std::vector<float>> wb =
        readTensors(single.saveWeightsPath, plan, false);
    std::vector<std::vector<float>> ga =
        readTensors(sharded.dumpGradsPath, plan, true);
    std::vector<std::vector<float>> gb =
        readTensors(single.dumpGradsPath, plan, true);
    for (int32_t t = 0; t < plan.numParams; ++t) {
      bool trainable = plan.params[t].trainable;
      for (size_t j = 0; j < wa[t].size(); ++j) {
        CHECK(near(wa[t][j], wb[t][j], 1e-5));
        CHECK(near(ga[t][j], gb[t][j], 1e-6));
        if (!trainable) // frozen: bit for bit the initial value
          CHECK(wa[t][j] == init[t][j] && wb[t][j] == init[t][j]);
        else
          CHECK(wa[t][j] != init[t][j]);
      }
    }
    std::system(("rm -rf '" + dir + "'").c_str());
  }
  comm.barrier();
  std::printf("rank %d of %d: ZeRO-1 matches one rank\n", comm.rank(),
              comm.size());
}

} // namespace

int main(int argc, char **argv) {
  Expected<std::unique_ptr<Communicator>> created =
      Communicator::create(&argc, &argv);
  if (!created) {
    std::fprintf(stderr, "%s\n", created.status().message().c_str());
    return 1;
  }
  Communicator &comm = **created;
  world = &comm;
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "collectives") {
    testCollectives(comm);
  } else if (mode == "resume") {
    testResume(comm);
  } else if (mode == "zero") {
    testZero(comm);
  } else if (mode == "timeout") {
    comm.setTimeout(2);
    comm.setStep(3);
    float x = 1;
    if (comm.rank() == 0)
      comm.allReduceSum(&x, &x, 1);
    else
      sleep(60); // a hung peer; mpirun ends it when rank 0 aborts
  } else if (mode == "kill") {
    for (int step = 1; step <= 1000; ++step) {
      comm.setStep(step);
      float x = 1;
      comm.allReduceSum(&x, &x, 1);
      if (step == 3 && comm.rank() == 1)
        raise(SIGKILL);
      usleep(10000);
    }
  } else if (mode == "bad-root") {
    char byte = 0;
    comm.broadcast(&byte, 1, comm.size());
  } else {
    std::fprintf(stderr,
                 "usage: %s collectives|zero|resume|timeout|kill|bad-root\n",
                 argv[0]);
    return 2;
  }
  return 0;
}
