#pragma once
// StepGraphs: decode steps replayed from CUDA graphs (issue 5). A decode step
// (every sequence has one new token and needs logits) of S sequences is padded
// up to the next size B of a ladder (1, 2, 4, 8, then multiples of 8) and run
// from a graph recorded for B: one launch instead of hundreds, and no launch
// gaps between the small kernels.
//
// A graph replays the addresses it was recorded with, so decode metadata goes
// to one fixed device buffer laid out for the largest B, in one copy that
// does not wait; block table rows as wide as the step's context bound (below)
// needs, so short steps send short rows. Padding rows
// are sequences of one token at position 0 whose K/V go to a spare block of
// the pool that no request owns; their logits are computed and ignored.
// Steps whose real sequences average kLongDecodeContext tokens of context or
// more get graphs of their own (BatchView::mean_context_len says which), so a
// backend may record other kernels for them. So do steps by the bound on their
// contexts (BatchView::max_context_len): the first of 128, 1024, 8192, ...
// (at most max_context) that holds the longest one. Kernels recorded for a
// tighter bound launch less: the CUDA backend's decode attention splits no
// context of 128 tokens, and launches no merge then.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "runtime/backend.h"
#include "runtime/batch.h"

namespace serval {

class StepGraphs {
 public:
  // `max_batch`: largest S replayed; `max_context`: longest context a
  // sequence may have; `pad_block`: the spare KV block.
  StepGraphs(Backend& backend, int32_t max_batch, int32_t max_context, int32_t block_size, int32_t pad_block);

  // Whether `batch` is a decode step this can run (graphs or not yet).
  bool eligible(const Batch& batch) const;
  // The ladder size a step of `num_seqs` sequences is padded to.
  int32_t padded_size(int32_t num_seqs) const;
  // Copies the padded metadata of `batch` to the fixed buffer and returns its
  // view (B tokens, B sequences, B logits rows; max_context_len is the bound,
  // mean_context_len the class: kLongDecodeContext or 0). Every view has a
  // token feed (all -1 when the batch has none) from `sampled`
  // (Backend::sampled_tokens), so one graph serves chained and plain steps.
  BatchView upload(const Batch& batch, int32_t padded, const int32_t* sampled);
  // The bound recorded for steps whose longest context is `longest`.
  int32_t context_bound(int32_t longest) const;
  // Where decode steps start to need graphs of another class, in order: 1,
  // then one past each bound (129, 1025, 8193, ...) and kLongDecodeContext,
  // below `max_context`. A warm-up whose steps run at each of these contexts
  // records the graphs later steps of those lengths replay.
  static std::vector<int32_t> class_starts(int32_t max_context);
  // The batch sizes graphs are recorded for, up to max_batch: 1, 2, 4, then
  // multiples of 8, and max_batch itself.
  static std::vector<int32_t> ladder(int32_t max_batch);

  // The graph recorded for steps like `view` (an upload()'s): its size, class
  // and bound.
  DeviceGraph* find(const BatchView& view) const;
  void store(const BatchView& view, std::unique_ptr<DeviceGraph> graph) { graphs_[key(view)] = std::move(graph); }
  // Forgets every graph (the buffers they read were reallocated).
  void clear() { graphs_.clear(); }
  int64_t size() const { return int64_t(graphs_.size()); }

 private:
  struct Layout {
    int64_t token_ids, token_source, positions, query_start, context_len, logits_rows, slot_mapping, block_table;
  };

  static int64_t key(const BatchView& v) {
    return (int64_t(v.num_seqs) << 33) | (int64_t(v.max_context_len) << 1) | (v.mean_context_len > 0 ? 1 : 0);
  }

  Backend& backend_;
  int32_t max_batch_, max_context_, block_size_, pad_block_, stride_;
  std::vector<int32_t> ladder_;
  Layout layout_{};
  DeviceBuffer meta_;
  std::vector<int64_t> host_;  // the buffer's host image, 8-byte aligned
  std::map<int64_t, std::unique_ptr<DeviceGraph>> graphs_;
};

}  // namespace serval
