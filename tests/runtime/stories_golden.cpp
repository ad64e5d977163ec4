#include "stories_golden.h"

#include <algorithm>
#include <numeric>

#include "tiny_model.h"

namespace serval::testing {

const std::vector<int32_t>& stories_prompt() {
  static const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  return ids;
}

const std::vector<int32_t>& stories_reference_ids() {
  // Copied from PROVENANCE.md (llama2.c run.c -t 0.0 -n 256 on stories260K.bin).
  static const std::vector<int32_t> ids = {
      403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
      419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
      338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310, 439, 419,
      357, 336, 432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267, 265, 282, 295, 433, 426, 436, 317, 286,
      296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442,
      391, 267, 337, 335, 364, 420, 268, 388, 432, 398, 359, 280, 303, 439, 413, 272, 417, 264, 312, 426, 436, 13,
      438, 310, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 338, 336,
      432, 313, 442, 439, 423, 262, 304, 420, 422, 432, 317, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263,
      415, 294, 267, 400, 426, 436, 13,  438, 310, 279, 292, 416, 439, 413, 391, 267, 281, 421, 427, 311, 357, 432,
      384, 358, 336, 432, 313, 442, 439, 423, 262, 304, 420, 422, 432, 357, 426, 359, 279, 292, 416, 439, 413, 409,
      416, 327, 263, 415, 294, 267, 400, 426, 436, 320, 285, 357, 336, 432, 313, 455, 289, 439, 413, 263, 304, 420,
      422, 432, 317, 426, 410, 448, 411, 280, 303, 281, 421, 427, 364, 426};
  return ids;
}

std::vector<std::vector<int32_t>> stories_greedy(ModelRunner& runner, int steps, int copies) {
  const int64_t V = runner.config().vocab_size;
  std::vector<int32_t> blocks(static_cast<size_t>(runner.num_blocks()));
  std::iota(blocks.rbegin(), blocks.rend(), 0);  // hand out blocks from the top: not contiguous with logical order
  const int32_t max_blocks = int32_t(runner.num_blocks() / copies);
  PagedSeqs seqs(runner.block_size(), blocks, max_blocks);
  std::vector<int> ids(static_cast<size_t>(copies));
  for (int& id : ids) id = seqs.add_sequence();

  const std::vector<int32_t>& prompt = stories_prompt();
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(copies));
  std::vector<float> logits;
  // Prefill: copy c splits the prompt into c + 1 chunks; a copy whose prompt is
  // done waits until the others are done too.
  std::vector<size_t> done(static_cast<size_t>(copies), 0);
  for (int round = 0;; ++round) {
    std::vector<int> active, active_ids;  // copy indices and their sequence ids
    std::vector<std::vector<int32_t>> chunks;
    for (int c = 0; c < copies; ++c) {
      if (done[c] == prompt.size()) continue;
      const size_t chunk = (prompt.size() + c) / size_t(c + 1);
      const size_t n = std::min(chunk, prompt.size() - done[c]);
      active.push_back(c);
      active_ids.push_back(ids[c]);
      chunks.emplace_back(prompt.begin() + done[c], prompt.begin() + done[c] + n);
      done[c] += n;
    }
    if (active.empty()) break;
    runner.forward(seqs.step(active_ids, chunks, false), logits);
    for (size_t a = 0; a < active.size(); ++a) {
      const int c = active[a];
      if (done[c] == prompt.size()) {
        const float* row = logits.data() + a * V;
        out[c].push_back(int32_t(std::max_element(row, row + V) - row));
      }
    }
  }
  // Decode: every copy appends its last token each step.
  for (int step = 1; step < steps; ++step) {
    std::vector<std::vector<int32_t>> chunks;
    for (int c = 0; c < copies; ++c) chunks.push_back({out[c].back()});
    runner.forward(seqs.step(ids, chunks, false), logits);
    for (int c = 0; c < copies; ++c) {
      const float* row = logits.data() + c * V;
      out[c].push_back(int32_t(std::max_element(row, row + V) - row));
    }
  }
  return out;
}

}  // namespace serval::testing
