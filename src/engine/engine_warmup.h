#pragma once
// What an engine would otherwise set up at its first steps of each shape (on
// a GPU: the decode graphs of each batch size, their matmul plans, scratch
// buffers), done before it is measured (serval bench --mode engine) or serves
// (serval serve). The plan, in phases each run after the one before:
//  1. a step of the whole token budget, which sizes the buffers that grow
//     with a step's tokens (on a GPU, growing one later drops every graph
//     recorded before it); a prompt fits the context, so when the budget does
//     not, several prompts together, the last chunked to fill it;
//  2. for each class of decode graphs (StepGraphs::class_starts) that
//     contexts up to `longest` reach: one prompt of that length alone (into
//     the prefix cache; whole blocks and one token, so that each request
//     after it computes one token and they all decode from the same step),
//     then W requests of it whose decode steps shrink
//     through the graph ladder (StepGraphs::ladder(W)) one size a step, W
//     first: every graph of that class, in as many steps as the ladder has
//     sizes.
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine.h"

namespace serval {

struct WarmupPlan {
  std::vector<std::vector<EngineRequest>> phases;
  std::vector<int64_t> prompt_lens;  // of each class's prompt
};

struct WarmupShape {
  int32_t requests = 0;  // W: the largest decode batch to see (0: no warm-up)
  int64_t longest = 0;   // the longest context to warm the classes up to
  int64_t room = 0;      // the longest context one request may have (context and pool)
  int64_t budget = 0;    // tokens per step (max_num_batched_tokens)
  int64_t max_seqs = 0;  // sequences at once
  int32_t block_size = 16;  // of the KV cache
};

// `defaults`: every request's parameters (greedy, ignore_eos); `prompt(len)`
// gives a prompt of len tokens.
WarmupPlan plan_warmup(const EngineRequest& defaults, const WarmupShape& shape,
                       const std::function<std::vector<int32_t>(int64_t)>& prompt);

// Runs the phases on `engine`, each after the one before; throws
// serval::Error naming the first request that cannot run or fails.
void run_warmup(Engine& engine, const WarmupPlan& plan);

}  // namespace serval
