#include "runtime/step_graphs.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace serval {

namespace {
// The context bounds graphs are recorded for: 128, 1024, 8192, ... A few
// classes only, since every (size, bound) pair is a graph recorded at its
// first step.
constexpr int64_t kFirstContextBound = 128, kContextBoundStep = 8;
}  // namespace

StepGraphs::StepGraphs(Backend& backend, int32_t max_batch, int32_t max_context, int32_t block_size,
                       int32_t pad_block)
    : backend_(backend),
      max_batch_(max_batch),
      max_context_(max_context),
      block_size_(block_size),
      pad_block_(pad_block),
      stride_((max_context + block_size - 1) / block_size) {
  SERVAL_CHECK(max_batch >= 1 && max_context >= 1, "step graphs: bad limits");
  ladder_ = ladder(max_batch);
  // Offsets for the largest batch; each array starts on a 64-byte boundary.
  const int64_t B = max_batch;
  int64_t at = 0;
  auto place = [&at](int64_t bytes) {
    const int64_t o = at;
    at += (bytes + 63) / 64 * 64;
    return o;
  };
  layout_.token_ids = place(B * 4);
  layout_.token_source = place(B * 4);
  layout_.positions = place(B * 4);
  layout_.query_start = place((B + 1) * 4);
  layout_.context_len = place(B * 4);
  layout_.logits_rows = place(B * 4);
  layout_.slot_mapping = place(B * 8);
  layout_.block_table = place(B * stride_ * 4);
  meta_ = backend_.alloc(at);  // zeroed: stale table rows name block 0, a real block
  host_.assign(size_t(at / 8), 0);
}

bool StepGraphs::eligible(const Batch& b) const {
  const int32_t S = b.num_seqs();
  if (S < 1 || S > max_batch_ || b.num_tokens() != S || int32_t(b.logits_rows.size()) != S) return false;
  if (b.max_blocks_per_seq > stride_) return false;
  for (int32_t s = 0; s < S; ++s)
    if (b.logits_rows[size_t(s)] != s || b.context_len[size_t(s)] > max_context_) return false;
  return true;
}

int32_t StepGraphs::padded_size(int32_t num_seqs) const {
  return *std::lower_bound(ladder_.begin(), ladder_.end(), num_seqs);
}

BatchView StepGraphs::upload(const Batch& b, int32_t B, const int32_t* sampled) {
  const int32_t S = b.num_seqs();
  char* h = reinterpret_cast<char*>(host_.data());
  auto i32 = [h](int64_t off) { return reinterpret_cast<int32_t*>(h + off); };
  int32_t* tok = i32(layout_.token_ids);
  int32_t* source = i32(layout_.token_source);
  int32_t* pos = i32(layout_.positions);
  int32_t* qs = i32(layout_.query_start);
  int32_t* ctx = i32(layout_.context_len);
  int32_t* rows = i32(layout_.logits_rows);
  auto* slots = reinterpret_cast<int64_t*>(h + layout_.slot_mapping);
  std::memcpy(tok, b.token_ids.data(), size_t(S) * 4);
  if (b.token_source.empty())
    std::fill(source, source + S, -1);  // the padding rows below get theirs
  else
    std::memcpy(source, b.token_source.data(), size_t(S) * 4);
  std::memcpy(pos, b.positions.data(), size_t(S) * 4);
  std::memcpy(ctx, b.context_len.data(), size_t(S) * 4);
  std::memcpy(slots, b.slot_mapping.data(), size_t(S) * 8);
  for (int32_t i = 0; i <= B; ++i) qs[i] = i;
  for (int32_t i = 0; i < B; ++i) rows[i] = i;
  for (int32_t i = S; i < B; ++i) {
    tok[i] = 0;
    source[i] = -1;
    pos[i] = 0;
    ctx[i] = 1;
    slots[i] = int64_t(pad_block_) * block_size_;
  }
  // Table rows as wide as the bound needs (a graph's kernels read that
  // width), after the header: one copy of the header and the real rows. A
  // padding row reads key 0 through whatever (valid) block id its row holds,
  // and that output is never used.
  int64_t context_sum = 0;
  int32_t longest = 1;
  for (int32_t s = 0; s < S; ++s) {
    context_sum += b.context_len[size_t(s)];
    longest = std::max(longest, b.context_len[size_t(s)]);
  }
  const int32_t bound = context_bound(longest);
  const int32_t width = (bound + block_size_ - 1) / block_size_;
  const int32_t copied = std::min(width, b.max_blocks_per_seq);
  int32_t* table = i32(layout_.block_table);
  for (int32_t s = 0; s < S; ++s)
    std::memcpy(table + int64_t(s) * width, b.block_table.data() + int64_t(s) * b.max_blocks_per_seq,
                size_t(copied) * 4);
  char* dev = static_cast<char*>(meta_.data());
  backend_.copy_to_device_async(dev, h, layout_.block_table + int64_t(S) * width * 4);

  BatchView v;
  v.token_ids = reinterpret_cast<const int32_t*>(dev + layout_.token_ids);
  v.feed = TokenFeed{reinterpret_cast<const int32_t*>(dev + layout_.token_source), sampled};
  v.positions = reinterpret_cast<const int32_t*>(dev + layout_.positions);
  v.query_start = reinterpret_cast<const int32_t*>(dev + layout_.query_start);
  v.context_len = reinterpret_cast<const int32_t*>(dev + layout_.context_len);
  v.block_table = reinterpret_cast<const int32_t*>(dev + layout_.block_table);
  v.slot_mapping = reinterpret_cast<const int64_t*>(dev + layout_.slot_mapping);
  v.logits_rows = reinterpret_cast<const int32_t*>(dev + layout_.logits_rows);
  v.num_tokens = B;
  v.num_seqs = B;
  v.num_logits_rows = B;
  v.logits_rows_all = true;
  v.max_blocks_per_seq = width;
  v.max_query_len = 1;
  v.max_context_len = bound;  // an upper bound: kernels launched for it serve every step below it
  v.mean_context_len = context_sum >= int64_t(kLongDecodeContext) * S ? kLongDecodeContext : 0;
  return v;
}

std::vector<int32_t> StepGraphs::ladder(int32_t max_batch) {
  std::vector<int32_t> sizes;
  for (int32_t b : {1, 2, 4})
    if (b < max_batch) sizes.push_back(b);
  for (int32_t b = 8; b < max_batch; b += 8) sizes.push_back(b);
  sizes.push_back(max_batch);
  return sizes;
}

int32_t StepGraphs::context_bound(int32_t longest) const {
  int64_t bound = kFirstContextBound;
  while (bound < longest && bound < max_context_) bound *= kContextBoundStep;
  return int32_t(std::min<int64_t>(bound, max_context_));
}

std::vector<int32_t> StepGraphs::class_starts(int32_t max_context) {
  std::vector<int32_t> starts = {1};
  for (int64_t bound = kFirstContextBound; bound < max_context; bound *= kContextBoundStep)
    starts.push_back(int32_t(bound + 1));
  if (kLongDecodeContext < max_context) starts.push_back(kLongDecodeContext);
  std::sort(starts.begin(), starts.end());
  return starts;
}

DeviceGraph* StepGraphs::find(const BatchView& view) const {
  auto it = graphs_.find(key(view));
  return it == graphs_.end() ? nullptr : it->second.get();
}

}  // namespace serval
