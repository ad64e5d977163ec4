// POST /v1/chat/completions: messages -> chat template -> prompt -> an
// assistant message. Streams deltas in OpenAI's order: the role (with
// refusal: null, as OpenAI's first delta), then content, then finish_reason,
// then (with include_usage) usage.
#include "server/access_log.h"
#include "server/api_error.h"
#include "server/completions.h"
#include "server/generation.h"
#include "server/json_fields.h"
#include "server/request_fields.h"
#include "server/sse_stream.h"

namespace serval::server {
namespace {

using nlohmann::json;

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index = false) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

json chat_choice(size_t index, json message_or_delta, const char* key, json logprobs, json finish,
                 json stop_reason = nullptr) {
  return {{"index", index},
          {key, std::move(message_or_delta)},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", std::move(finish)},
          {"stop_reason", std::move(stop_reason)}};
}

// vLLM's chat echo: the reply starts with the last message's content when
// that message has the reply's role (assistant, or with no generation prompt
// the last message's own role: continue_final_message).
std::string echo_prefix(const ChatRequest& r) {
  if (!r.echo) return "";
  const auto& last = r.messages.back();
  const std::string role = r.add_generation_prompt ? "assistant" : last["role"].get<std::string>();
  if (last["role"] != role || !last["content"].is_string()) return "";
  return last["content"].get<std::string>();
}

}  // namespace

void handle_chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const nlohmann::ordered_json body = parse_ordered_json_object(req.body);
  check_request_fields(json(body), Endpoint::kChat);
  const ChatRequest r = parse_chat_request(body);
  ctx.check_model(r.gen.model);
  const std::string prompt = ctx.chat.render(r);
  std::vector<int32_t> ids = ctx.tokenizer.encode(prompt, r.add_special_tokens);
  truncate_prompt(ids, r.gen, ctx.max_model_len);
  if (ids.empty()) throw ApiError(400, "the rendered chat prompt is empty", "messages");
  const int32_t max_tokens = resolve_max_tokens(r.gen.max_tokens, 0, int64_t(ids.size()), ctx.engine.fit_limits());
  const std::string echo = echo_prefix(r);

  // Tool calls: parsed from the text in the model's format; required or a
  // named function: constrained to be one (or, parallel, several).
  using Mode = ToolChoice::Mode;
  const bool tools_on = !r.tools.is_null() && r.tool_choice.mode != Mode::kNone;
  const ToolFormat format = tools_on ? ctx.tool_format : ToolFormat::kNone;
  GenerationOptions opts = r.gen;
  if (tools_on && (r.tool_choice.mode == Mode::kRequired || r.tool_choice.mode == Mode::kNamed)) {
    if (!opts.constraint.empty())
      throw ApiError(400, str_cat("'", opts.constraint.field, "' and tool_choice \"required\" or a named function both "
                                  "constrain the output: give one"),
                     "tool_choice");
    opts.constraint = tool_call_constraint(ctx.tool_format, r.tools, r.tool_choice, r.parallel_tool_calls);
  }
  if (format == ToolFormat::kMistral) opts.skip_special_tokens = false;  // its calls start with [TOOL_CALLS]

  auto gen = std::make_shared<Generation>(
      ctx.engine, engine_requests({ids}, {max_tokens}, opts, ctx.tokenizer, ctx.grammar_of(opts)), opts);
  const ResponseMeta meta{response_id("chatcmpl-", r.gen), unix_now(), ctx.model_name};
  AccessRecord& record = current_access_record();
  record.id = meta.id;
  res.set_header("X-Request-Id", meta.id);
  const bool want_logprobs = r.logprobs;

  if (!r.gen.stream) {
    const bool connected = gen->collect();
    const UsageCounts u = gen->usage();
    record.prompt_tokens = u.prompt_tokens;
    record.completion_tokens = u.completion_tokens;
    if (!connected) return;
    if (const std::string error = gen->error(); !error.empty()) throw ApiError(500, error);
    json choices = json::array();
    for (size_t c = 0; c < gen->choices().size(); ++c) {
      const ChoiceState& s = gen->choices()[c];
      json lps = want_logprobs ? chat_logprobs(ctx.tokenizer, s.token_ids, s.logprobs) : json(nullptr);
      // refusal: required (nullable) in OpenAI's ChatCompletionMessage.
      json message = {{"role", "assistant"}, {"content", echo + s.text}, {"refusal", nullptr}};
      json finish = finish_json(s.finish);
      if (format != ToolFormat::kNone) {
        const ParsedToolOutput parsed = parse_tool_calls(format, s.text);
        if (!parsed.calls.empty()) {
          const std::string content = echo + parsed.content;
          message["content"] = content.empty() ? json(nullptr) : json(content);
          message["tool_calls"] = tool_calls_json(parsed.calls);
          finish = "tool_calls";
        }
      }
      json choice = chat_choice(c, std::move(message), "message", std::move(lps), std::move(finish),
                                stop_reason_json(s.stop_string, s.stop_token));
      if (r.gen.return_token_ids) choice["token_ids"] = s.token_ids;
      choices.push_back(std::move(choice));
    }
    json body = chat_object(meta, std::move(choices), u);
    if (r.gen.return_token_ids) body["prompt_token_ids"] = ids;
    // vLLM's extra field: once per response (the prompt is the choices').
    if (r.gen.prompt_logprobs)
      body["prompt_logprobs"] = vllm_prompt_logprobs(ctx.tokenizer, ids, gen->choices().front().prompt_logprobs);
    res.set_content(dump_json(body), "application/json");
    return;
  }

  const bool usage_null = r.gen.include_usage;
  const size_t num_choices = gen->choices().size();
  StreamFormat f;
  f.continuous_usage = r.gen.continuous_usage;
  f.start = [=](std::vector<json>& out) {
    for (size_t c = 0; c < num_choices; ++c) {
      json chunk = chat_chunk(
          meta, chat_choice(c, {{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}}, "delta", nullptr, nullptr),
          usage_null);
      if (r.gen.return_token_ids && c == 0) chunk["prompt_token_ids"] = ids;
      out.push_back(std::move(chunk));
      if (!echo.empty())
        out.push_back(chat_chunk(meta, chat_choice(c, {{"content", echo}}, "delta", nullptr, nullptr), usage_null));
    }
  };
  // Tool calls: text that may be a call is held back and parsed at the end.
  auto streams = std::make_shared<std::vector<ToolCallStream>>(num_choices, ToolCallStream(format));
  f.event = [=, &tok = ctx.tokenizer](const ChoiceEvent& ev, std::vector<json>& out) {
    const RequestEvent& e = ev.event;
    ToolCallStream& calls = (*streams)[ev.choice];
    const std::string text = calls.feed(e.text);
    const bool has_logprobs = want_logprobs && !e.logprobs.empty();
    const bool has_prompt_logprobs = r.gen.prompt_logprobs && !e.prompt_logprobs.empty() && ev.choice == 0;
    const bool has_ids = r.gen.return_token_ids && !e.token_ids.empty();
    if (!text.empty() || has_logprobs || has_prompt_logprobs || has_ids) {
      json lps = has_logprobs ? chat_logprobs(tok, e.token_ids, e.logprobs) : json(nullptr);
      json choice = chat_choice(ev.choice, {{"content", text}}, "delta", std::move(lps), nullptr);
      if (r.gen.return_token_ids) choice["token_ids"] = e.token_ids;
      json chunk = chat_chunk(meta, std::move(choice), usage_null);
      if (has_prompt_logprobs) chunk["prompt_logprobs"] = vllm_prompt_logprobs(tok, ids, e.prompt_logprobs);
      out.push_back(std::move(chunk));
    }
    if (!e.finished() || e.finish == FinishReason::kError) return;
    json finish = finish_json(e.finish);
    const ParsedToolOutput parsed = calls.finish();
    if (!parsed.content.empty())
      out.push_back(chat_chunk(meta, chat_choice(ev.choice, {{"content", parsed.content}}, "delta", nullptr, nullptr),
                               usage_null));
    if (!parsed.calls.empty()) {
      out.push_back(chat_chunk(
          meta, chat_choice(ev.choice, {{"tool_calls", tool_calls_json(parsed.calls, true)}}, "delta", nullptr, nullptr),
          usage_null));
      finish = "tool_calls";
    }
    out.push_back(chat_chunk(meta,
                             chat_choice(ev.choice, json::object(), "delta", nullptr, std::move(finish),
                                         stop_reason_json(e.stop_string, e.stop_token)),
                             usage_null));
  };
  f.end = [=, g = gen.get()](std::vector<json>& out) {
    if (usage_null) out.push_back(usage_chunk(meta, "chat.completion.chunk", g->usage()));
  };
  stream_generation(res, gen, std::move(f));
}

}  // namespace serval::server
