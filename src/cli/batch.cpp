// serval generate --input/--output: every request of a JSONL file through the
// Engine at once (its queue bound sized to the input), results in input order.
#include "cli/batch.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/batch_input.h"
#include "cli/batch_report.h"
#include "core/error.h"

namespace serval::cli {
namespace {

using nlohmann::json;

struct SampleResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<Logprobs> logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  std::optional<EngineClock::time_point> first_token, finish_time;
};

struct Pending {
  const BatchItem* item = nullptr;
  std::optional<RequestHandle> handle;
  EngineClock::time_point arrival;
  std::vector<SampleResult> samples;
  int32_t finals = 0;
  int32_t cached_tokens = 0;
  bool done() const { return finals == int32_t(samples.size()); }
};

// OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset.
json logprobs_json(const SampleResult& s, const Tokenizer& tok) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < s.tokens.size() && i < s.logprobs.size(); ++i) {
    const std::string piece = tok.token_bytes(s.tokens[i]);
    tokens.push_back(piece);
    lps.push_back(s.logprobs[i].chosen);
    json top = json::object();
    for (const TokenLogprob& t : s.logprobs[i].top) top[tok.token_bytes(t.token)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json result_json(const Pending& p, const Tokenizer& tok) {
  const EngineRequest& r = p.item->request;
  json choices = json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < p.samples.size(); ++i) {
    const SampleResult& s = p.samples[i];
    json c = {{"index", i},
              {"text", s.text},
              {"token_ids", s.tokens},
              {"finish_reason", finish_reason_name(s.finish)}};
    if (r.params.logprobs >= 0) c["logprobs"] = logprobs_json(s, tok);
    if (!s.error.empty()) c["error"] = s.error;
    choices.push_back(std::move(c));
    completion += int64_t(s.tokens.size());
  }
  const int64_t prompt = int64_t(r.prompt_ids.size());
  return {{"index", p.item->line},
          {"prompt_token_ids", r.prompt_ids},
          {"choices", choices},
          {"usage",
           {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", p.cached_tokens}}}}}};
}

void apply(Pending& p, RequestEvent& ev) {
  SampleResult& s = p.samples.at(size_t(ev.index));
  s.tokens.insert(s.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
  s.text += ev.text;
  s.logprobs.insert(s.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  if (ev.timings.first_token) s.first_token = ev.timings.first_token;
  p.cached_tokens = std::max(p.cached_tokens, ev.num_cached_tokens);
  if (ev.finished()) {
    s.finish = ev.finish;
    s.error = ev.error;
    s.finish_time = ev.timings.finish;
    ++p.finals;
  }
}

void add_to_summary(const Pending& p, BatchSummary& sum) {
  sum.prompt_tokens += int64_t(p.item->request.prompt_ids.size());
  for (const SampleResult& s : p.samples) {
    ++sum.samples;
    sum.failed += s.finish == FinishReason::kError ? 1 : 0;
    sum.output_tokens += int64_t(s.tokens.size());
    if (!s.first_token) continue;
    sum.ttft_s.push_back(std::chrono::duration<double>(*s.first_token - p.arrival).count());
    if (s.tokens.size() >= 2 && s.finish_time)
      sum.tpot_s.push_back(std::chrono::duration<double>(*s.finish_time - *s.first_token).count() /
                           double(s.tokens.size() - 1));
  }
}

}  // namespace

int run_batch(const GenerateOptions& o, const std::string& model_path) {
  std::ifstream in(o.input);
  SERVAL_CHECK(in.good(), "cannot open --input ", o.input);
  LoadedEngineModel m = load_engine_model(model_path, o.engine);
  EngineRequest defaults = o.request(*m.tokenizer);
  defaults.params.seed = o.sampling.seed;  // unseeded lines draw their own
  const std::vector<BatchItem> items =
      read_batch_input(in, *m.tokenizer, defaults, !o.no_special);

  EngineOptions eo = engine_options(o.engine);
  // Every request is submitted at once: the queue bound must hold them all.
  eo.scheduler.max_queued_requests = std::max<int64_t>(eo.scheduler.max_queued_requests,
                                                       int64_t(items.size()));
  Engine engine(*m.runner, *m.tokenizer, eo);
  {
    std::string errors;
    size_t bad = 0;
    for (const BatchItem& item : items) {
      try {
        engine.check(item.request);
      } catch (const Error& e) {
        if (++bad <= 20) errors += str_cat("\n  line ", item.line + 1, ": ", e.what());
      }
    }
    if (bad > 0)
      fail(bad, " request", bad > 1 ? "s" : "", " cannot run (nothing was run):", errors,
           bad > 20 ? str_cat("\n  ... and ", bad - 20, " more") : std::string());
  }
  std::ofstream out(o.output);
  SERVAL_CHECK(out.good(), "cannot write --output ", o.output);

  const auto start = EngineClock::now();
  std::vector<Pending> pending(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    pending[i].item = &items[i];
    pending[i].samples.resize(size_t(items[i].request.n));
    pending[i].arrival = EngineClock::now();
    pending[i].handle.emplace(engine.submit(items[i].request));
  }

  BatchProgress progress(int64_t(items.size()), !o.no_progress);
  BatchSummary sum;
  sum.requests = int64_t(items.size());
  std::vector<size_t> open(items.size());
  for (size_t i = 0; i < open.size(); ++i) open[i] = i;
  size_t next_to_write = 0;
  int64_t done = 0, output_tokens = 0;
  while (next_to_write < pending.size()) {
    bool progressed = false;
    size_t kept = 0;
    for (size_t i : open) {
      Pending& p = pending[i];
      while (!p.done()) {
        std::optional<RequestEvent> ev = p.handle->next(std::chrono::milliseconds(0));
        if (!ev) break;
        output_tokens += int64_t(ev->token_ids.size());
        apply(p, *ev);
        progressed = true;
      }
      if (p.done()) ++done;
      else open[kept++] = i;
    }
    open.resize(kept);
    // Results go out in input order, as soon as the next one is complete.
    for (; next_to_write < pending.size() && pending[next_to_write].done(); ++next_to_write) {
      Pending& p = pending[next_to_write];
      out << result_json(p, *m.tokenizer).dump(-1, ' ', false, json::error_handler_t::replace)
          << "\n";
      add_to_summary(p, sum);
      p.samples.clear();  // written: free the text
      p.samples.shrink_to_fit();
      p.finals = 0;
    }
    progress.update(done, output_tokens);
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  out.flush();
  SERVAL_CHECK(out.good(), "writing --output ", o.output, " failed");
  sum.total_s = std::chrono::duration<double>(EngineClock::now() - start).count();
  progress.update(done, output_tokens, /*force=*/true);
  progress.finish();

  const std::string metrics = engine.metrics_registry().expose();
  const double queries = exposition_value(metrics, "serval:prefix_cache_queries_total");
  const double hits = exposition_value(metrics, "serval:prefix_cache_hits_total");
  sum.prefix_cache_hit_rate = queries > 0 ? hits / queries : 0.0;
  sum.preemptions = int64_t(exposition_value(metrics, "serval:num_preemptions_total"));
  std::fputs(format_summary(sum).c_str(), stderr);
  return sum.failed > 0 ? 1 : 0;
}

}  // namespace serval::cli
