// POST /v1/completions: prompts (text or token ids, one or many) -> text.
#include "server/completions.h"

#include "server/access_log.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/json_fields.h"
#include "server/request_fields.h"
#include "server/sse_stream.h"
#include "tokenizer/fim.h"

namespace serval::server {
namespace {

using nlohmann::json;

constexpr int32_t kDefaultMaxTokens = 16;  // OpenAI's default for completions

struct Prepared {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> echo_text;  // the prompt as text, for echo
  std::vector<int32_t> max_tokens;
};

// The prompt's tokens: as given or encoded, or with a suffix the
// fill-in-the-middle prompt around them (tokenizer/fim.h).
std::vector<int32_t> prompt_ids(const ServerContext& ctx, const CompletionRequest& r, const PromptInput& in,
                                const std::optional<FimTokens>& fim) {
  const Tokenizer& tok = ctx.tokenizer;
  if (!fim) return in.is_text ? tok.encode(in.text, r.add_special_tokens) : in.ids;
  return in.is_text ? fim_prompt(tok, *fim, in.text, r.suffix, r.add_special_tokens) : fim_prompt(tok, *fim, in.ids, r.suffix);
}

Prepared prepare(const ServerContext& ctx, const CompletionRequest& r) {
  Prepared p;
  std::optional<FimTokens> fim;
  if (!r.suffix.empty()) {
    fim = find_fim_tokens(ctx.tokenizer);
    if (!fim)
      throw ApiError(400,
                     "'suffix' is not supported for this model: the model has no fill-in-the-middle tokens (such as "
                     "<|fim_prefix|>, <fim_prefix> or <PRE>)",
                     "suffix");
  }
  for (const PromptInput& in : r.prompts) {
    std::vector<int32_t> ids = prompt_ids(ctx, r, in, fim);
    const bool truncated = truncate_prompt(ids, r.gen, ctx.max_model_len);
    if (ids.empty())
      throw ApiError(400,
                     "'prompt' has no tokens (an empty text gets none where the model has no BOS token or "
                     "add_special_tokens is false): give at least one token",
                     "prompt");
    ctx.check_token_ids(ids, "prompt");
    p.max_tokens.push_back(
        resolve_max_tokens(r.gen.max_tokens, kDefaultMaxTokens, int64_t(ids.size()), ctx.engine.fit_limits()));
    p.echo_text.push_back(!r.echo ? "" : in.is_text && !truncated ? in.text : ctx.tokenizer.decode(ids, false));
    p.ids.push_back(std::move(ids));
  }
  return p;
}

json choice_json(size_t index, std::string text, json logprobs, json finish, json stop_reason = nullptr) {
  return {{"index", index},
          {"text", std::move(text)},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", finish},
          {"stop_reason", std::move(stop_reason)}};
}

// vLLM's return_token_ids: the prompt's ids (first chunk of a stream) and the generated ones.
void add_token_ids(json& choice, const std::vector<int32_t>* prompt_ids, const std::vector<int32_t>& ids) {
  if (prompt_ids) choice["prompt_token_ids"] = *prompt_ids;
  choice["token_ids"] = ids;
}

}  // namespace

void handle_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_object(req.body);
  check_request_fields(body, Endpoint::kCompletions);
  const CompletionRequest r = parse_completion_request(body);
  ctx.check_model(r.gen.model);
  Prepared p = prepare(ctx, r);

  auto gen = std::make_shared<Generation>(
      ctx.engine, engine_requests(p.ids, p.max_tokens, r.gen, ctx.tokenizer, ctx.grammar_of(r.gen)), r.gen);
  const ResponseMeta meta{response_id("cmpl-", r.gen), unix_now(), ctx.model_name};
  AccessRecord& record = current_access_record();
  record.id = meta.id;
  res.set_header("X-Request-Id", meta.id);
  const bool want_logprobs = r.gen.params.logprobs >= 0;
  const int32_t n = gen->n();

  if (!r.gen.stream) {
    const bool connected = gen->collect();
    const UsageCounts u = gen->usage();
    record.prompt_tokens = u.prompt_tokens;
    record.completion_tokens = u.completion_tokens;
    if (!connected) return;  // nobody to answer
    if (const std::string error = gen->error(); !error.empty()) throw ApiError(500, error);
    json choices = json::array();
    for (size_t c = 0; c < gen->choices().size(); ++c) {
      const ChoiceState& s = gen->choices()[c];
      const std::string& prefix = p.echo_text[c / size_t(n)];
      const std::vector<int32_t>& prompt_ids = p.ids[c / size_t(n)];
      json lps = nullptr;
      if (want_logprobs && r.echo) {
        int64_t offset = 0;
        lps = echoed_completion_logprobs(ctx.tokenizer, prompt_ids, s.prompt_logprobs, s.token_ids, s.logprobs, offset);
      } else if (want_logprobs) {
        int64_t offset = int64_t(prefix.size());
        lps = completion_logprobs(ctx.tokenizer, s.token_ids, s.logprobs, offset);
      }
      json choice =
          choice_json(c, prefix + s.text, std::move(lps), finish_json(s.finish), stop_reason_json(s.stop_string, s.stop_token));
      if (r.gen.prompt_logprobs) choice["prompt_logprobs"] = vllm_prompt_logprobs(ctx.tokenizer, prompt_ids, s.prompt_logprobs);
      if (r.gen.return_token_ids) add_token_ids(choice, &prompt_ids, s.token_ids);
      choices.push_back(std::move(choice));
    }
    res.set_content(dump_json(completion_object(meta, std::move(choices), u)), "application/json");
    return;
  }

  const bool usage_null = r.gen.include_usage;
  auto offsets = std::make_shared<std::vector<int64_t>>(gen->choices().size(), 0);
  // With logprobs the echo waits for the prompt's scores (the first event).
  const bool echo_first = r.echo && !want_logprobs;
  auto echo_sent = std::make_shared<std::vector<bool>>(gen->choices().size(), echo_first || !r.echo);
  // return_token_ids: the prompt's ids go with each choice's first chunk.
  auto ids_sent = std::make_shared<std::vector<bool>>(gen->choices().size(), !r.gen.return_token_ids);
  StreamFormat f;
  f.continuous_usage = r.gen.continuous_usage;
  f.start = [=, echo = p.echo_text, ids = p.ids](std::vector<json>& out) {
    if (!echo_first) return;
    for (size_t c = 0; c < offsets->size(); ++c) {
      (*offsets)[c] = int64_t(echo[c / size_t(n)].size());
      json choice = choice_json(c, echo[c / size_t(n)], nullptr, nullptr);
      if (!(*ids_sent)[c]) {
        (*ids_sent)[c] = true;
        add_token_ids(choice, &ids[c / size_t(n)], {});
      }
      out.push_back(completion_chunk(meta, std::move(choice), usage_null));
    }
  };
  f.event = [=, &tok = ctx.tokenizer, echo = p.echo_text, ids = p.ids](const ChoiceEvent& ev, std::vector<json>& out) {
    const RequestEvent& e = ev.event;
    if (e.text.empty() && e.token_ids.empty() && !e.finished()) return;
    if (e.finish == FinishReason::kError) return;  // reported at the end
    const std::vector<int32_t>& prompt_ids = ids[ev.choice / size_t(n)];
    if (!(*echo_sent)[ev.choice]) {
      (*echo_sent)[ev.choice] = true;
      json lps = echoed_completion_logprobs(tok, prompt_ids, e.prompt_logprobs, {}, {}, (*offsets)[ev.choice]);
      json choice = choice_json(ev.choice, echo[ev.choice / size_t(n)], std::move(lps), nullptr);
      if (!(*ids_sent)[ev.choice]) {
        (*ids_sent)[ev.choice] = true;
        add_token_ids(choice, &prompt_ids, {});
      }
      out.push_back(completion_chunk(meta, std::move(choice), usage_null));
    }
    json lps = want_logprobs ? completion_logprobs(tok, e.token_ids, e.logprobs, (*offsets)[ev.choice]) : json(nullptr);
    json choice = choice_json(ev.choice, e.text, std::move(lps), finish_json(e.finish),
                              stop_reason_json(e.stop_string, e.stop_token));
    if (r.gen.prompt_logprobs && !e.prompt_logprobs.empty())
      choice["prompt_logprobs"] = vllm_prompt_logprobs(tok, prompt_ids, e.prompt_logprobs);
    if (r.gen.return_token_ids) {
      add_token_ids(choice, (*ids_sent)[ev.choice] ? nullptr : &prompt_ids, e.token_ids);
      (*ids_sent)[ev.choice] = true;
    }
    out.push_back(completion_chunk(meta, std::move(choice), usage_null));
  };
  f.end = [=, g = gen.get()](std::vector<json>& out) {
    if (usage_null) out.push_back(usage_chunk(meta, "text_completion", g->usage()));
  };
  stream_generation(res, gen, std::move(f));
}

}  // namespace serval::server
