//===- ZeroCollectives.cpp - the collectives of a ZeRO-2/3 step -----------===//
//
// Step 2 of the ZeRO pass: places the collectives of one micro-batch in
// @train_step, from the slots fastllm-zero-layout chose (docs/DESIGN.md section
// 3):
//
//  forward (ZeRO-3)   before stage s runs, wait for the all-gather of its
//                     weights (and of the tie slots it reads), then start the
//                     next stage's all-gather: it runs during s's compute;
//  backward (2 and 3) before stage s's backward (before the first backward
//                     adding into s's gradients: a later stage reading a
//                     tied parameter of s), wait for the reduce-scatter
//                     that last used its gradient slot and clear the slot;
//                     ZeRO-3 waits for its weights when its weight slot was
//                     overwritten since its forward (and its backward reads
//                     them) and starts the next stage's such all-gather;
//                     after s's backward, start its reduce-scatter: it runs
//                     while the previous stage computes.
//  end                wait for every reduce-scatter still in flight.
//
// With one buffer of a kind nothing can be prefetched: the collective is
// started where it is waited for. ZeRO-1 has no collective in the step (the
// runtime reduces and gathers once per step).
//
//===----------------------------------------------------------------------===//

#include "ir/Plan.h"
#include "passes/Passes.h"
#include "passes/Zero.h"

#include "mlir/IR/Builders.h"

#include <map>
#include <set>

namespace mlir::fastllm {
#define GEN_PASS_DEF_ZEROCOLLECTIVESPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct ZeroCollectivesPass
    : fastllm::impl::ZeroCollectivesPassBase<ZeroCollectivesPass> {
  void runOnOperation() override;
};

/// One op to create before the op at a position of the step.
struct Action {
  enum Kind { Gather, ReduceScatter, Wait, Clear } kind;
  int64_t stage, slot;
  int64_t request; ///< Gather/ReduceScatter: the id it defines; Wait: waits
};

/// Ops that compute (and so read or write buffers), as opposed to views and
/// constants, which only name memory.
bool computes(Operation *op) {
  return !isa<GetParameterOp, ConstantOp, ViewLikeOpInterface>(op);
}

/// The collectives of one ZeRO-2/3 step, decided position by position (a
/// position is the index of an op of the step, or the end) and then created.
class CollectiveSchedule {
public:
  CollectiveSchedule(const MemoryPlan &plan, Block &body);

  /// ZeRO-3's forward: each stage waits for its weights (and the tie slots it
  /// reads) and starts the next stage's all-gather.
  void scheduleForwardGathers();
  /// The backward: gradient slots cleared and reduced, weights regathered
  /// (ZeRO-3), and every reduce-scatter waited for at the end.
  void scheduleBackward(ModuleOp module);
  /// Creates the scheduled ops before the ops at their positions.
  void createOps(MLIRContext *context);

private:
  /// The first computing op of stage s's forward / backward (or of the first
  /// later stage, or the end).
  int64_t forwardStart(int64_t s) const;
  int64_t backwardStart(int64_t s) const;
  /// What the stages read: the tie slots a stage reads, and whether its
  /// backward reads its own weight slot (ZeRO-3).
  void findReads();
  /// Schedules a collective at `pos`; returns its request.
  int64_t start(int64_t pos, Action::Kind kind, int64_t stage, int64_t slot);
  void wait(int64_t pos, int64_t request);

  const MemoryPlan &plan;
  Block &body;
  const bool zero3;
  SmallVector<Operation *> ops;
  int64_t n, numStages, firstBackward;
  std::vector<std::set<int64_t>> tiesRead;
  std::vector<bool> backwardReadsWeights;
  /// The stages with parameters, and the number of weight slots the stages
  /// share round-robin (a tied stage's own slot is not shared): with one,
  /// nothing can be prefetched.
  SmallVector<int64_t> withParams;
  int64_t numWeightSlots = 0;
  std::vector<SmallVector<Action>> at;
  int64_t nextRequest = 0;
};
} // namespace

CollectiveSchedule::CollectiveSchedule(const MemoryPlan &plan, Block &body)
    : plan(plan), body(body), zero3(plan.zeroStage == 3) {
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  n = ops.size();
  numStages = plan.numStages();
  firstBackward = n;
  for (int64_t i = 0; i < n; ++i)
    if (isBackward(ops[i]) && computes(ops[i])) {
      firstBackward = i;
      break;
    }
  at.resize(n + 1);
  findReads();
  for (int64_t s = 0; s < numStages; ++s)
    if (plan.stageElements[s])
      withParams.push_back(s);
  for (int64_t s = 0; s < numStages; ++s)
    if (plan.stageTieSlot[s] < 0)
      numWeightSlots = std::max(numWeightSlots, plan.stageWeightSlot[s] + 1);
}

int64_t CollectiveSchedule::forwardStart(int64_t s) const {
  for (int64_t i = 0; i < firstBackward; ++i)
    if (computes(ops[i]) && stageOf(ops[i]) >= s)
      return i;
  return firstBackward;
}

int64_t CollectiveSchedule::backwardStart(int64_t s) const {
  for (int64_t i = firstBackward; i < n; ++i)
    if (computes(ops[i]) && stageOf(ops[i]) <= s)
      return i;
  return n;
}

void CollectiveSchedule::findReads() {
  tiesRead.assign(numStages, {});
  backwardReadsWeights.assign(numStages, false);
  for (auto get : body.getOps<GetParameterOp>()) {
    int64_t slot = slotOf(get), s = stageOf(get);
    if (slot < 0 || s < 0 || s >= numStages)
      continue;
    SmallVector<Value> views = {get.getResult()};
    bool backwardRead = false;
    while (!views.empty()) {
      Value v = views.pop_back_val();
      for (Operation *user : v.getUsers()) {
        if (isa<ViewLikeOpInterface>(user))
          views.push_back(user->getResult(0));
        else if (isBackward(user))
          backwardRead = true;
      }
    }
    if (slot == plan.stageWeightSlot[s])
      backwardReadsWeights[s] = backwardReadsWeights[s] || backwardRead;
    for (int64_t owner = 0; owner < numStages; ++owner)
      if (owner != s && plan.stageTieSlot[owner] == slot)
        tiesRead[s].insert(owner);
  }
}

int64_t CollectiveSchedule::start(int64_t pos, Action::Kind kind, int64_t stage,
                                  int64_t slot) {
  at[pos].push_back({kind, stage, slot, nextRequest});
  return nextRequest++;
}

void CollectiveSchedule::wait(int64_t pos, int64_t request) {
  at[pos].push_back({Action::Wait, -1, -1, request});
}

void CollectiveSchedule::scheduleForwardGathers() {
  // The stages that gather (their own weights or a tie slot).
  SmallVector<int64_t> gathering;
  for (int64_t s = 0; s < numStages; ++s)
    if (plan.stageElements[s] || !tiesRead[s].empty())
      gathering.push_back(s);
  std::map<int64_t, int64_t> own;  // stage -> request
  std::map<int64_t, int64_t> ties; // owner -> request (once per step)
  std::set<int64_t> waited;        // requests already waited
  auto issue = [&](int64_t pos, int64_t s) {
    if (plan.stageElements[s] && !own.count(s)) {
      own[s] = start(pos, Action::Gather, s, plan.stageWeightSlot[s]);
      // A stage that keeps its own slot as its tie slot serves its
      // readers with this one gather.
      if (plan.stageTieSlot[s] == plan.stageWeightSlot[s])
        ties[s] = own[s];
    }
    for (int64_t owner : tiesRead[s])
      if (!ties.count(owner))
        ties[owner] =
            start(pos, Action::Gather, owner, plan.stageTieSlot[owner]);
  };
  for (auto [i, s] : llvm::enumerate(gathering)) {
    int64_t pos = forwardStart(s);
    issue(pos, s);
    SmallVector<int64_t> needed;
    if (own.count(s))
      needed.push_back(own[s]);
    for (int64_t owner : tiesRead[s])
      needed.push_back(ties[owner]);
    for (int64_t r : needed)
      if (waited.insert(r).second)
        wait(pos, r);
    if (numWeightSlots >= 2 && i + 1 < gathering.size())
      issue(pos, gathering[i + 1]);
  }
}

void CollectiveSchedule::scheduleBackward(ModuleOp module) {
  // The latest stage whose backward adds into each stage's gradients: its
  // own, or a later one reading one of its parameters.
  std::vector<int64_t> firstGrad(numStages);
  for (int64_t s = 0; s < numStages; ++s)
    firstGrad[s] = s;
  SymbolTable symbols(module);
  for (auto acc : body.getOps<AccumulateGradOp>()) {
    int64_t owner = parameterStage(symbols.lookup<ParameterOp>(acc.getName()));
    if (owner < numStages)
      firstGrad[owner] = std::max(firstGrad[owner], stageOf(acc));
  }
  auto lastInSlot = [&](int64_t s) {
    int64_t last = -1;
    for (int64_t t : withParams)
      if (plan.stageWeightSlot[t] == plan.stageWeightSlot[s])
        last = t;
    return last;
  };
  auto regathers = [&](int64_t s) {
    return zero3 && backwardReadsWeights[s] && lastInSlot(s) != s;
  };
  std::map<int64_t, int64_t> pendingReduce; // grad slot -> request
  std::map<int64_t, int64_t> regather;      // stage -> request
  SmallVector<int64_t> backward(llvm::reverse(withParams));
  for (auto [i, s] : llvm::enumerate(backward)) {
    int64_t pos = backwardStart(s);
    if (regathers(s)) {
      if (!regather.count(s))
        regather[s] = start(pos, Action::Gather, s, plan.stageWeightSlot[s]);
      wait(pos, regather[s]);
    }
    int64_t g = plan.stageGradSlot[s], clearPos = backwardStart(firstGrad[s]);
    if (auto it = pendingReduce.find(g); it != pendingReduce.end()) {
      wait(clearPos, it->second);
      pendingReduce.erase(it);
    }
    at[clearPos].push_back({Action::Clear, s, g, -1});
    if (numWeightSlots >= 2 && i + 1 < backward.size() &&
        regathers(backward[i + 1]))
      regather[backward[i + 1]] = start(pos, Action::Gather, backward[i + 1],
                                        plan.stageWeightSlot[backward[i + 1]]);
    pendingReduce[g] = start(backwardStart(s - 1), Action::ReduceScatter, s, g);
  }
  SmallVector<int64_t> last;
  for (auto [slot, request] : pendingReduce)
    last.push_back(request);
  llvm::sort(last);
  for (int64_t r : last)
    wait(n, r);
}

void CollectiveSchedule::createOps(MLIRContext *context) {
  OpBuilder b(context);
  SmallVector<Value> requests(nextRequest);
  for (int64_t pos = 0; pos <= n; ++pos) {
    Operation *anchor = pos < n ? ops[pos] : body.getTerminator();
    b.setInsertionPoint(anchor);
    Location loc = anchor->getLoc();
    for (const Action &a : at[pos]) {
      Operation *op = nullptr;
      switch (a.kind) {
      case Action::Gather:
        op = b.create<AllGatherOp>(loc, a.stage, a.slot);
        requests[a.request] = op->getResult(0);
        break;
      case Action::ReduceScatter:
        op = b.create<ReduceScatterOp>(loc, a.stage, a.slot);
        requests[a.request] = op->getResult(0);
        break;
      case Action::Wait:
        op = b.create<WaitOp>(loc, requests[a.request]);
        break;
      case Action::Clear:
        op = b.create<ClearGradsOp>(loc, a.stage, a.slot);
        break;
      }
      if (pos >= firstBackward && pos < n)
        op->setAttr(kBackwardAttr, b.getUnitAttr());
    }
  }
}

void ZeroCollectivesPass::runOnOperation() {
  ModuleOp module = getOperation();
  std::optional<MemoryPlan> plan =
      MemoryPlan::get(module, PlanParts(PlanPart::Layout));
  if (!plan)
    return signalPassFailure();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step) {
    module.emitError("no func.func @train_step");
    return signalPassFailure();
  }
  if (plan->zeroStage == 1)
    return;
  CollectiveSchedule schedule(*plan, step.getBody().front());
  if (plan->zeroStage == 3)
    schedule.scheduleForwardGathers();
  schedule.scheduleBackward(module);
  schedule.createOps(module.getContext());
}
