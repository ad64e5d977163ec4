#include "chained_decode.h"

#include <gtest/gtest.h>

#include <deque>
#include <numeric>

#include "tiny_model.h"

namespace serval::testing {

std::vector<std::vector<int32_t>> greedy_decode(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                                int32_t steps, bool chained, SamplingParams params) {
  const int n = int(prompts.size());
  const int32_t bs = runner.block_size();
  int32_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, int32_t(p.size()));
  const int32_t max_blocks = (longest + steps + bs - 1) / bs;
  std::vector<int32_t> free(static_cast<size_t>(runner.num_blocks()));
  std::iota(free.begin(), free.end(), 0);
  PagedSeqs seqs(bs, free, max_blocks);
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(seqs.add_sequence());

  EXPECT_TRUE(params.greedy());
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  std::vector<int32_t> spec_of(static_cast<size_t>(n), -1);  // in the latest started step
  std::deque<std::vector<int>> queued;  // per started step: the prompt of each spec
  std::vector<SampleResult> results;
  auto finish = [&] {
    runner.finish_sample(results);
    const std::vector<int>& owner = queued.front();
    for (size_t i = 0; i < owner.size(); ++i) out[size_t(owner[i])].push_back(results[i].token);
    queued.pop_front();
  };
  std::vector<int32_t> queued_tokens(static_cast<size_t>(n), 0);  // tokens each prompt has been given a step for
  for (int32_t step = 0;; ++step) {
    std::vector<int> active, batch_ids;
    std::vector<std::vector<int32_t>> chunks;
    std::vector<int32_t> source;
    for (int i = 0; i < n; ++i) {
      const bool joins = n > 1 && i == n - 1;
      if ((joins && step < 2) || queued_tokens[size_t(i)] >= steps) continue;
      active.push_back(i);
      batch_ids.push_back(ids[size_t(i)]);
      if (queued_tokens[size_t(i)] == 0) {
        chunks.push_back(prompts[size_t(i)]);
        source.insert(source.end(), prompts[size_t(i)].size(), -1);
      } else if (chained) {
        chunks.push_back({0});  // the id comes from the step before
        source.push_back(spec_of[size_t(i)]);
      } else {
        chunks.push_back({out[size_t(i)].back()});
        source.push_back(-1);
      }
    }
    if (active.empty()) break;
    Batch b = seqs.step(batch_ids, chunks, false);
    if (chained) b.token_source = source;
    const int R = int(active.size());
    std::vector<SampleSpec> specs(static_cast<size_t>(R));
    std::vector<int> owner(static_cast<size_t>(R));
    for (int k = 0; k < R; ++k) {
      const int row = R - 1 - k;
      const size_t i = size_t(active[size_t(row)]);
      SampleSpec& spec = specs[size_t(k)];
      spec.row = row;
      spec.params = &params;
      spec.prompt_ids = prompts[i];
      spec.output_ids = out[i];  // chained: without the token fed from the step before
      if (chained && queued_tokens[i] > 0) spec.fed_source = spec_of[i];
      owner[size_t(k)] = int(i);
      spec_of[i] = k;
      ++queued_tokens[i];
    }
    runner.start_sample(b, specs);
    queued.push_back(owner);
    if (!chained || queued.size() == 2) finish();
  }
  while (!queued.empty()) finish();
  return out;
}

}  // namespace serval::testing
