#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace serval {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Generator::Generator(ModelRunner& runner)
    : runner_(runner),
      kv_(runner.num_blocks(), runner.block_size()),
      batch_builder_(runner.block_size()),
      vocab_size_(runner.config().vocab_size),
      max_model_len_(runner.config().max_position) {
  SERVAL_CHECK(vocab_size_ > 0, "model config has vocab_size ", vocab_size_);
}

// Blocks for the longest the sequence can get: every token but the last one
// it generates goes through the model.
int64_t Generator::blocks_reserved_for(const Sequence& seq) const {
  int64_t max_len = seq.num_prompt_tokens() + seq.stop().max_tokens;
  if (max_model_len_ > 0) max_len = std::min(max_len, max_model_len_);
  const int64_t bs = kv_.block_size();
  return (max_len - 1 + bs - 1) / bs;
}

void Generator::check_request(const GenerationRequest& request, size_t index) const {
  request.params.validate();
  request.stop.validate();
  const int64_t prompt_len = int64_t(request.prompt_ids.size());
  SERVAL_CHECK(prompt_len > 0, "request ", index, ": the prompt is empty (no tokens)");
  for (int32_t id : request.prompt_ids)
    SERVAL_CHECK(id >= 0 && id < vocab_size_, "request ", index, ": prompt token id ", id,
                 " is outside the vocabulary [0, ", vocab_size_, ")");
  SERVAL_CHECK(max_model_len_ == 0 || prompt_len < max_model_len_, "request ", index,
               ": the prompt has ", prompt_len, " tokens but the model's context is ",
               max_model_len_, " tokens (the prompt must leave room for one generated token)");
  int64_t max_len = prompt_len + request.stop.max_tokens;
  if (max_model_len_ > 0) max_len = std::min(max_len, max_model_len_);
  const int64_t bs = kv_.block_size();
  const int64_t need = (max_len - 1 + bs - 1) / bs;
  SERVAL_CHECK(need <= kv_.num_blocks(), "request ", index, ": ", prompt_len,
               " prompt tokens + max_tokens ", request.stop.max_tokens, " need ", need,
               " KV blocks of ", bs, " tokens but the cache has ", kv_.num_blocks(),
               "; lower max_tokens or give the KV cache more memory");
}

GenerationResult Generator::generate(const std::vector<GenerationRequest>& requests,
                                     const TokenCallback& on_token) {
  for (size_t i = 0; i < requests.size(); ++i) check_request(requests[i], i);
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<Sequence> seqs;
  seqs.reserve(requests.size());
  GenerationResult result;
  result.sequences.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    seqs.emplace_back(int64_t(i), r.prompt_ids, r.params, r.stop, kv_.new_table());
    result.sequences[i].prompt_ids = r.prompt_ids;
    result.sequences[i].seed = seqs.back().seed();
    result.stats.prompt_tokens += int64_t(r.prompt_ids.size());
  }

  try {
    run(seqs, result, on_token, t0);
  } catch (...) {
    // Leave the cache as we found it, so the Generator stays usable.
    for (Sequence& seq : seqs)
      if (seq.block_table().num_blocks() > 0) kv_.free(seq.block_table());
    throw;
  }

  result.stats.total_s = seconds_since(t0);
  result.stats.time_to_first_token_s = result.sequences.empty() ? 0.0 : 1e300;
  for (const SequenceOutput& out : result.sequences) {
    result.stats.generated_tokens += int64_t(out.token_ids.size());
    result.stats.time_to_first_token_s =
        std::min(result.stats.time_to_first_token_s, out.time_to_first_token_s);
  }
  return result;
}

void Generator::run(std::vector<Sequence>& seqs, GenerationResult& result,
                    const TokenCallback& on_token, std::chrono::steady_clock::time_point t0) {
  std::vector<Sequence*> running;
  size_t next = 0;
  int64_t reserved = 0;
  while (next < seqs.size() || !running.empty()) {
    // Admit in request order while the worst case of each still fits.
    while (next < seqs.size()) {
      const int64_t need = blocks_reserved_for(seqs[next]);
      if (reserved + need > kv_.num_blocks()) break;
      reserved += need;
      running.push_back(&seqs[next++]);
    }
    SERVAL_CHECK(!running.empty(), "internal error: no sequence fits in the KV cache");

    const auto step_start = std::chrono::steady_clock::now();
    const int64_t prompt_tokens = step(running, result, on_token, t0);
    const double step_s = seconds_since(step_start);
    ++result.stats.steps;
    if (prompt_tokens > 0) {
      result.stats.prefill_s += step_s;
    } else {
      result.stats.decode_s += step_s;
      result.stats.decode_tokens += int64_t(running.size());
    }

    for (Sequence* seq : running) {
      if (!seq->finished()) continue;
      reserved -= blocks_reserved_for(*seq);
      kv_.free(seq->block_table());
      SequenceOutput& out = result.sequences[size_t(seq->id())];
      out.token_ids = seq->output_ids();
      out.logprobs = seq->output_logprobs();
      out.finish_reason = seq->finish_reason();
      out.stop_token = seq->stop_token();
    }
    std::erase_if(running, [](const Sequence* seq) { return seq->finished(); });
  }
}

int64_t Generator::step(std::vector<Sequence*>& running, GenerationResult& result,
                        const TokenCallback& on_token,
                        std::chrono::steady_clock::time_point t0) {
  scheduled_.clear();
  int64_t prompt_tokens = 0;
  for (Sequence* seq : running) {
    const int64_t n = seq->num_uncomputed_tokens();
    prompt_tokens += std::max<int64_t>(0, seq->num_prompt_tokens() - seq->num_computed_tokens());
    const int64_t missing = seq->num_tokens() - seq->block_table().num_tokens();
    SERVAL_CHECK(kv_.allocate_slots(seq->block_table(), missing).has_value(),
                 "internal error: KV cache exhausted for sequence ", seq->id(),
                 " despite its reservation");
    scheduled_.push_back(ScheduledChunk{seq, int32_t(n)});
  }
  batch_builder_.build(scheduled_, batch_);
  SERVAL_CHECK(batch_.logits_rows.size() == scheduled_.size(),
               "internal error: every sequence of a generation step needs logits");

  runner_.forward(batch_, logits_);
  SERVAL_CHECK(int64_t(logits_.size()) == int64_t(batch_.logits_rows.size()) * vocab_size_,
               "model runner returned ", logits_.size(), " logits for ",
               batch_.logits_rows.size(), " rows of vocabulary ", vocab_size_);

  for (size_t row = 0; row < scheduled_.size(); ++row) {
    Sequence& seq = *running[row];
    seq.advance_computed(scheduled_[row].num_new_tokens);
    const std::span<const float> logits(logits_.data() + row * size_t(vocab_size_),
                                        size_t(vocab_size_));
    SampleResult sampled =
        sampler_.sample(logits, seq.params(), seq.prompt_ids(), seq.output_ids(), seq.rng());
    const FinishReason finish =
        seq.append_output(sampled.token, std::move(sampled.logprobs), max_model_len_);
    SequenceOutput& out = result.sequences[size_t(seq.id())];
    if (seq.output_ids().size() == 1) out.time_to_first_token_s = seconds_since(t0);
    if (on_token) {
      TokenEvent event;
      event.seq_index = int32_t(seq.id());
      event.token = sampled.token;
      event.logprobs = seq.params().logprobs >= 0 ? &seq.output_logprobs().back() : nullptr;
      event.finish = finish;
      event.logits = logits;
      on_token(event);
    }
  }
  return prompt_tokens;
}

}  // namespace serval
