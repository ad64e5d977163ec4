#include "grammar/grammar_stacks.h"

#include <algorithm>

#include "core/error.h"

namespace serval::grammar {

namespace {

constexpr uint32_t kEmpty = UINT32_MAX;

inline size_t hash_node(uint32_t pos, uint32_t parent) {
  uint64_t h = (uint64_t(pos) << 32 | parent) * 0x9E3779B97F4A7C15ull;
  return size_t(h >> 20);
}

}  // namespace

StackPool::StackPool() {
  nodes_.push_back({UINT32_MAX, kRootNode});    // kRootNode
  nodes_.push_back({UINT32_MAX, kBottomNode});  // kBottomNode
  table_.assign(1024, kEmpty);
}

size_t StackPool::slot_of(uint32_t pos, uint32_t parent) const {
  size_t mask = table_.size() - 1;
  size_t i = hash_node(pos, parent) & mask;
  while (true) {
    uint32_t id = table_[i];
    if (id == kEmpty) return i;
    const StackNode& n = nodes_[id];
    if (n.pos == pos && n.parent == parent) return i;
    i = (i + 1) & mask;
  }
}

void StackPool::rehash(size_t capacity) {
  table_.assign(capacity, kEmpty);
  // In id order, so that truncate() can remove the newest ids first.
  for (uint32_t id = 2; id < nodes_.size(); ++id) table_[slot_of(nodes_[id].pos, nodes_[id].parent)] = id;
}

uint32_t StackPool::intern(uint32_t pos, uint32_t parent) {
  size_t i = slot_of(pos, parent);
  if (table_[i] != kEmpty) return table_[i];
  uint32_t id = uint32_t(nodes_.size());
  nodes_.push_back({pos, parent});
  table_[i] = id;
  if (nodes_.size() * 2 > table_.size()) rehash(table_.size() * 2);
  return id;
}

void StackPool::truncate(size_t mark) {
  // Linear probing: removing the newest entries first restores the table
  // exactly (nothing inserted later can sit in an older entry's probe run).
  while (nodes_.size() > mark) {
    const StackNode& n = nodes_.back();
    table_[slot_of(n.pos, n.parent)] = kEmpty;
    nodes_.pop_back();
  }
}

void StackPool::compact(std::span<std::vector<uint32_t>*> roots) {
  std::vector<uint32_t> remap(nodes_.size(), kEmpty);
  remap[kRootNode] = kRootNode;
  remap[kBottomNode] = kBottomNode;
  for (auto* ids : roots)
    for (uint32_t id : *ids)
      for (uint32_t x = id; remap[x] == kEmpty; x = nodes_[x].parent) remap[x] = 0;  // mark live
  std::vector<StackNode> kept(nodes_.begin(), nodes_.begin() + 2);
  // Parents are older than their children, so one pass in id order renumbers.
  for (uint32_t id = 2; id < nodes_.size(); ++id) {
    if (remap[id] == kEmpty) continue;
    remap[id] = uint32_t(kept.size());
    kept.push_back({nodes_[id].pos, remap[nodes_[id].parent]});
  }
  nodes_ = std::move(kept);
  size_t cap = 1024;
  while (cap < nodes_.size() * 2) cap *= 2;
  rehash(cap);
  for (auto* ids : roots)
    for (uint32_t& id : *ids) id = remap[id];
}

void Stepper::advance(StackPool& pool, uint32_t pos, uint32_t parent, StepResult& out) {
  for (const auto& e : g_->expansion(pos)) {
    uint32_t p = parent;
    for (uint32_t ret : g_->chain(e)) p = pool.intern(ret, p);
    out.stacks.push_back(pool.intern(e.top, p));
  }
  if (g_->pops(pos)) pop_into(pool, parent, out);
}

void Stepper::pop_into(StackPool& pool, uint32_t node, StepResult& out) {
  if (node == kRootNode) {
    out.reached_root = true;
    return;
  }
  if (node == kBottomNode) {
    out.reached_bottom = true;
    return;
  }
  // Several stacks often return into the same frame: close it once.
  if (std::find(popped_.begin(), popped_.end(), node) != popped_.end()) return;
  popped_.push_back(node);
  const StackNode n = pool.node(node);
  advance(pool, n.pos, n.parent, out);
}

void Stepper::step(StackPool& pool, std::span<const uint32_t> in, uint8_t b, StepResult& out) {
  out.clear();
  popped_.clear();
  for (uint32_t s : in) {
    const StackNode n = pool.node(s);
    if (g_->byte_set(n.pos).has(b)) advance(pool, n.pos + 1, n.parent, out);
  }
  finish(out);
}

void Stepper::start(StackPool& pool, StepResult& out) {
  out.clear();
  popped_.clear();
  advance(pool, g_->start(), kRootNode, out);
  finish(out);
}

void Stepper::resume(StackPool& pool, uint32_t node, StepResult& out) {
  out.clear();
  popped_.clear();
  pop_into(pool, node, out);
  finish(out);
}

void Stepper::finish(StepResult& out) {
  if (out.stacks.size() > 1) {
    std::sort(out.stacks.begin(), out.stacks.end());
    out.stacks.erase(std::unique(out.stacks.begin(), out.stacks.end()), out.stacks.end());
  }
  SERVAL_CHECK(out.stacks.size() <= max_stacks_, "grammar is too ambiguous: over ", max_stacks_,
               " parse stacks at once");
}

}  // namespace serval::grammar
