//===- FuseElementwise.cpp - chains of pointwise ops become one kernel ----===//
//
// After the distributed plan and before memory planning, a pointwise op
// (Model_Pointwise) and the pointwise producers only it (or others of its
// group) reads become one model.fused_elementwise at its place: one pass
// over memory instead of one per op, and no buffers for the intermediates.
//
// A producer joins its consumer's group when
//  - every use of its result is in the group (single-output groups: a value
//    also read elsewhere, e.g. by the backward, stays stored),
//  - it is in the same block, stage and direction (forward or backward),
//  - no op with memory effects lies between it and the group's root, since
//    its inputs are read there instead: a collective could have refilled
//    the weight slot a model.get_parameter points into,
//  - its result has the group's shape, or it is a cast or a broadcast (cheap
//    enough to redo for each element it is broadcast to),
//  - the group keeps at most kMaxInputs inputs and kMaxGroupOps ops (a
//    longer chain becomes several kernels: the functor's C++ stays small and
//    the pass linear in the block's length).
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/Zero.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_FUSEELEMENTWISEPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct FuseElementwisePass
    : fastllm::impl::FuseElementwisePassBase<FuseElementwisePass> {
  void runOnOperation() override;
};

/// Inputs a fused kernel takes at most (each is a pointer and a stride
/// array among the kernel's parameters).
constexpr unsigned kMaxInputs = 8;
/// Ops one fused kernel holds at most.
constexpr size_t kMaxGroupOps = 64;

/// Positions of a block's ops as the pass found them, and how many ops with
/// memory effects precede each: "no such op between two ops" in O(1) rather
/// than a walk (Zero.h's quietBetween), and program order without the
/// block's order index, which every fused op inserted would invalidate.
struct BlockIndex {
  explicit BlockIndex(Block &block) {
    effectsBefore.push_back(0);
    for (Operation &op : block) {
      position[&op] = int64_t(effectsBefore.size()) - 1;
      effectsBefore.push_back(effectsBefore.back() +
                              (isMemoryEffectFree(&op) ? 0 : 1));
    }
  }
  /// True when no op with memory effects lies strictly between `from` and
  /// `to` (`from` before `to`, both ops the block had when indexed).
  bool quietBetween(Operation *from, Operation *to) const {
    int64_t i = position.lookup(from), j = position.lookup(to);
    return effectsBefore[j] - effectsBefore[i + 1] == 0;
  }
  bool before(Operation *a, Operation *b) const {
    return position.lookup(a) < position.lookup(b);
  }
  DenseMap<Operation *, int64_t> position;
  SmallVector<int64_t> effectsBefore;
};

bool isPointwise(Operation *op) {
  return op->hasTrait<PointwiseTrait>() && op->getNumResults() == 1;
}

/// The values the group's ops read that no op of the group defines, in
/// first-use order (program order of the readers).
SmallVector<Value> groupInputs(ArrayRef<Operation *> ordered,
                               const llvm::SetVector<Operation *> &group) {
  llvm::SetVector<Value> inputs;
  for (Operation *op : ordered)
    for (Value v : op->getOperands())
      if (!group.contains(v.getDefiningOp()))
        inputs.insert(v);
  return inputs.takeVector();
}

SmallVector<Operation *> inProgramOrder(const llvm::SetVector<Operation *> &g,
                                        const BlockIndex &index) {
  SmallVector<Operation *> ops(g.begin(), g.end());
  llvm::sort(ops,
             [&](Operation *a, Operation *b) { return index.before(a, b); });
  return ops;
}

/// Grows `root`'s group over its producers (see the file comment).
llvm::SetVector<Operation *> growGroup(Operation *root,
                                       const BlockIndex &index) {
  llvm::SetVector<Operation *> group;
  group.insert(root);
  auto shape = cast<RankedTensorType>(root->getResult(0).getType()).getShape();
  auto joins = [&](Operation *p) {
    if (!p || group.contains(p) || !isPointwise(p) ||
        p->getBlock() != root->getBlock())
      return false;
    if (stageOf(p) != stageOf(root) || isBackward(p) != isBackward(root))
      return false;
    if (!llvm::all_of(p->getUsers(),
                      [&](Operation *u) { return group.contains(u); }))
      return false;
    auto type = cast<RankedTensorType>(p->getResult(0).getType());
    if (type.getShape() != shape && !isa<CastOp, BroadcastOp>(p))
      return false;
    return index.quietBetween(p, root);
  };
  // A producer read twice in the group joins once both readers have.
  for (bool grew = true; grew && group.size() < kMaxGroupOps;) {
    grew = false;
    for (size_t i = 0; i < group.size() && group.size() < kMaxGroupOps; ++i)
      for (Value v : group[i]->getOperands()) {
        Operation *p = v.getDefiningOp();
        if (group.size() >= kMaxGroupOps || !joins(p))
          continue;
        group.insert(p);
        if (groupInputs(inProgramOrder(group, index), group).size() >
            kMaxInputs) {
          group.pop_back();
          continue;
        }
        grew = true;
      }
  }
  return group;
}

/// Replaces the group's ops by one model.fused_elementwise at the root.
void fuse(Operation *root, const llvm::SetVector<Operation *> &group,
          const BlockIndex &index) {
  SmallVector<Operation *> ordered = inProgramOrder(group, index);
  SmallVector<Value> inputs = groupInputs(ordered, group);
  SmallVector<Location> locs;
  for (Operation *op : ordered)
    locs.push_back(op->getLoc());
  OpBuilder b(root);
  auto fused = b.create<FusedElementwiseOp>(
      b.getFusedLoc(locs), root->getResult(0).getType(), inputs);
  fused->setDiscardableAttrs(root->getDiscardableAttrDictionary());
  Block *body = b.createBlock(&fused.getBody());
  IRMapping map;
  for (Value input : inputs)
    map.map(input, body->addArgument(input.getType(), input.getLoc()));
  for (Operation *op : ordered) {
    Operation *copy = b.clone(*op, map);
    // Stage and plan attributes describe top-level ops only.
    copy->setDiscardableAttrs(DictionaryAttr::get(b.getContext()));
  }
  b.create<YieldOp>(root->getLoc(), map.lookup(root->getResult(0)));
  root->getResult(0).replaceAllUsesWith(fused.getResult());
  for (Operation *op : llvm::reverse(ordered))
    op->erase();
}
} // namespace

void FuseElementwisePass::runOnOperation() {
  getOperation().walk([&](func::FuncOp func) {
    for (Block &block : func.getBody()) {
      // Roots are taken last to first, so a root's group holds the longest
      // chain ending at it; ops already fused are skipped (by their address,
      // which stays unique while `ops` lives: erased ops are only compared).
      SmallVector<Operation *> ops;
      for (Operation &op : block)
        if (isPointwise(&op))
          ops.push_back(&op);
      // Fused ops replace their root in place and are pure, so the counts
      // of effectful ops stay valid; a group only ever holds indexed ops
      // (fused ops come after every root still to be taken).
      BlockIndex index(block);
      DenseSet<Operation *> fusedAway;
      for (Operation *root : llvm::reverse(ops)) {
        if (fusedAway.contains(root))
          continue;
        llvm::SetVector<Operation *> group = growGroup(root, index);
        if (group.size() < 2)
          continue;
        fusedAway.insert(group.begin(), group.end());
        fuse(root, group, index);
      }
    }
  });
}
