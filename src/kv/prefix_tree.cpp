#include "kv/prefix_tree.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

PrefixTree::PrefixTree(BlockPool& pool, int32_t block_size, BlockHashFn hash)
    : pool_(pool), block_size_(block_size), hash_(std::move(hash)) {
  SERVAL_CHECK(block_size >= 1, "KV block size must be at least 1, got ", block_size);
  nodes_.resize(size_t(pool.num_blocks()));
}

uint64_t PrefixTree::hash_of(uint64_t parent_hash, std::span<const int32_t> tokens) const {
  return hash_ ? hash_(parent_hash, tokens) : hash_block_tokens(parent_hash, tokens);
}

const std::unordered_map<uint64_t, BlockId>& PrefixTree::children_of(BlockId parent) const {
  return parent == kRoot ? root_children_ : nodes_[size_t(parent)].children;
}

std::unordered_map<uint64_t, BlockId>& PrefixTree::children_of(BlockId parent) {
  return parent == kRoot ? root_children_ : nodes_[size_t(parent)].children;
}

bool PrefixTree::contains(BlockId block) const {
  return block >= 0 && block < BlockId(nodes_.size()) && nodes_[size_t(block)].in_tree;
}

bool PrefixTree::is_evictable(BlockId block) const {
  const Node& n = nodes_[size_t(block)];
  return n.in_tree && n.children.empty() && pool_.ref_count(block) == 0;
}

void PrefixTree::refresh(BlockId block) {
  if (block == kRoot) return;
  const std::pair<uint64_t, BlockId> key{nodes_[size_t(block)].last_access, block};
  if (is_evictable(block))
    evictable_.insert(key);
  else
    evictable_.erase(key);
}

void PrefixTree::set_last_access(BlockId block, uint64_t tick) {
  Node& n = nodes_[size_t(block)];
  evictable_.erase({n.last_access, block});
  n.last_access = tick;
  refresh(block);
}

std::vector<BlockId> PrefixTree::match(std::span<const int32_t> tokens, int64_t max_blocks) {
  std::vector<BlockId> matched;
  const int64_t limit = std::min<int64_t>(max_blocks, int64_t(tokens.size()) / block_size_);
  BlockId cur = kRoot;
  uint64_t cur_hash = kRootBlockHash;
  for (int64_t i = 0; i < limit; ++i) {
    const auto span = tokens.subspan(size_t(i * block_size_), size_t(block_size_));
    const uint64_t h = hash_of(cur_hash, span);
    const auto& children = children_of(cur);
    const auto it = children.find(h);
    if (it == children.end()) break;
    const Node& child = nodes_[size_t(it->second)];
    // Same hash, other tokens: a collision. Treat it as the miss it is.
    if (!std::equal(child.tokens.begin(), child.tokens.end(), span.begin(), span.end())) break;
    matched.push_back(it->second);
    cur = it->second;
    cur_hash = h;
  }
  touch(matched);
  return matched;
}

bool PrefixTree::insert(BlockId parent, std::span<const int32_t> tokens, BlockId block) {
  SERVAL_CHECK(int64_t(tokens.size()) == block_size_, "prefix cache: a block holds ",
               block_size_, " tokens, got ", tokens.size());
  SERVAL_CHECK(parent == kRoot || contains(parent), "prefix cache: parent block ", parent,
               " is not cached");
  SERVAL_CHECK(block >= 0 && block < BlockId(nodes_.size()) && !contains(block),
               "prefix cache: block ", block, " cannot be inserted (out of range or cached)");
  const uint64_t parent_hash = parent == kRoot ? kRootBlockHash : nodes_[size_t(parent)].hash;
  const uint64_t h = hash_of(parent_hash, tokens);
  auto& siblings = children_of(parent);
  if (siblings.count(h)) return false;
  pool_.mark_cached(block);  // throws unless referenced
  siblings.emplace(h, block);
  Node& n = nodes_[size_t(block)];
  n.in_tree = true;
  n.parent = parent;
  n.depth = parent == kRoot ? 1 : nodes_[size_t(parent)].depth + 1;
  n.hash = h;
  n.tokens.assign(tokens.begin(), tokens.end());
  n.children.clear();
  n.last_access = ++clock_;
  ++num_nodes_;
  refresh(parent);  // no longer a leaf
  refresh(block);
  return true;
}

void PrefixTree::touch(std::span<const BlockId> blocks) {
  const uint64_t tick = ++clock_;
  for (BlockId b : blocks)
    if (contains(b)) set_last_access(b, tick);
}

void PrefixTree::on_ref_count_changed(BlockId block) {
  if (contains(block)) refresh(block);
}

int64_t PrefixTree::evict(int64_t n) {
  int64_t evicted = 0;
  while (evicted < n && !evictable_.empty()) {
    const BlockId b = evictable_.begin()->second;
    evictable_.erase(evictable_.begin());
    Node& node = nodes_[size_t(b)];
    children_of(node.parent).erase(node.hash);
    const BlockId parent = node.parent;
    node = Node{};
    --num_nodes_;
    pool_.uncache(b);
    refresh(parent);  // may be a leaf now
    ++evicted;
    ++epoch_;
  }
  num_evicted_ += evicted;
  return evicted;
}

void PrefixTree::check_invariants() const {
  int64_t in_tree = 0, evictable = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const BlockId b = BlockId(i);
    const Node& n = nodes_[i];
    SERVAL_CHECK(pool_.is_cached(b) == n.in_tree, "prefix cache: block ", b,
                 " is cached in the pool but not in the tree, or the reverse");
    if (!n.in_tree) continue;
    ++in_tree;
    SERVAL_CHECK(int64_t(n.tokens.size()) == block_size_, "prefix cache: block ", b, " holds ",
                 n.tokens.size(), " tokens");
    const uint64_t parent_hash = n.parent == kRoot ? kRootBlockHash : nodes_[size_t(n.parent)].hash;
    SERVAL_CHECK(n.parent == kRoot || contains(n.parent), "prefix cache: block ", b,
                 " has an uncached parent ", n.parent);
    SERVAL_CHECK(n.hash == hash_of(parent_hash, n.tokens), "prefix cache: block ", b,
                 " has a stale hash");
    const auto& siblings = children_of(n.parent);
    const auto it = siblings.find(n.hash);
    SERVAL_CHECK(it != siblings.end() && it->second == b, "prefix cache: block ", b,
                 " is not its parent's child");
    SERVAL_CHECK(n.depth == (n.parent == kRoot ? 1 : nodes_[size_t(n.parent)].depth + 1),
                 "prefix cache: block ", b, " has a wrong depth");
    for (const auto& [h, c] : n.children)
      SERVAL_CHECK(contains(c) && nodes_[size_t(c)].parent == b && nodes_[size_t(c)].hash == h,
                   "prefix cache: block ", b, " has a bad child link to ", c);
    SERVAL_CHECK(pool_.ref_count(b) == 0 || n.parent == kRoot || pool_.ref_count(n.parent) > 0,
                 "prefix cache: referenced block ", b, " has an unreferenced parent ", n.parent);
    const bool should = is_evictable(b);
    SERVAL_CHECK(should == (evictable_.count({n.last_access, b}) == 1), "prefix cache: block ", b,
                 should ? " is evictable but not in the eviction set"
                        : " is in the eviction set but not evictable");
    evictable += should;
  }
  for (const auto& [h, c] : root_children_)
    SERVAL_CHECK(contains(c) && nodes_[size_t(c)].parent == kRoot && nodes_[size_t(c)].hash == h,
                 "prefix cache: bad root child link to ", c);
  SERVAL_CHECK(in_tree == num_nodes_ && evictable == int64_t(evictable_.size()),
               "prefix cache: counted ", in_tree, " nodes and ", evictable,
               " evictable leaves, track ", num_nodes_, " and ", evictable_.size());
}

}  // namespace serval
