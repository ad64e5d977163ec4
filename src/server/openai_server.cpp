#include "server/openai_server.h"

#include "core/error.h"
#include "server/access_log.h"
#include "server/api_error.h"
#include "server/completions.h"
#include "server/json_fields.h"
#include "server/response_builder.h"

namespace serval::server {
namespace {

using nlohmann::json;
using Handler = void (*)(ServerContext&, const httplib::Request&, httplib::Response&);

// Runs `h`, answering any exception with an OpenAI error.
httplib::Server::Handler guarded(ServerContext& ctx, Handler h) {
  return [&ctx, h](const httplib::Request& req, httplib::Response& res) {
    try {
      h(ctx, req, res);
    } catch (const std::exception& e) {
      write_error(res, to_api_error(e));
    }
  };
}

void handle_models(ServerContext& ctx, const httplib::Request&, httplib::Response& res) {
  json model = {{"id", ctx.model_name},      {"object", "model"},           {"created", ctx.created},
                {"owned_by", "serval"},      {"root", ctx.model_name},      {"parent", nullptr},
                {"max_model_len", ctx.max_model_len}};
  res.set_content(dump_json({{"object", "list"}, {"data", json::array({model})}}), "application/json");
}

void handle_health(ServerContext& ctx, const httplib::Request&, httplib::Response& res) {
  if (!ctx.engine_alive) throw ApiError(503, "the engine is not running", "", "engine_stopped");
  res.set_content("", "text/plain");
}

void handle_metrics(ServerContext& ctx, const httplib::Request&, httplib::Response& res) {
  res.set_content(ctx.engine.metrics_registry().expose(), metrics::Registry::kContentType);
}

// {"prompt": text | ids, "add_special_tokens"} or {"messages": [...], ...}
// -> {"count", "max_model_len", "tokens"}, as vLLM's /tokenize.
void handle_tokenize(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const nlohmann::ordered_json ordered = parse_ordered_json_object(req.body);
  const json body = ordered;
  if (auto m = get_string(body, "model")) ctx.check_model(*m);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    nlohmann::ordered_json chat_body = ordered;
    chat_body.erase("stream");
    chat_body.erase("stream_options");
    const ChatRequest r = parse_chat_request(chat_body);
    ids = ctx.tokenizer.encode(ctx.chat.render(r), /*add_special=*/false);
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) throw ApiError(400, "'prompt' or 'messages' is required", "prompt");
    const std::vector<PromptInput> prompts = parse_prompts(*prompt);
    if (prompts.size() != 1) throw ApiError(400, "'prompt' must be a single prompt", "prompt");
    const bool add_special = get_bool(body, "add_special_tokens").value_or(true);
    ids = prompts[0].is_text ? ctx.tokenizer.encode(prompts[0].text, add_special) : prompts[0].ids;
  }
  json tokens = ids;
  res.set_content(dump_json({{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", tokens}}),
                  "application/json");
}

// {"tokens": [ids]} -> {"prompt": text}.
void handle_detokenize(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_object(req.body);
  if (auto m = get_string(body, "model")) ctx.check_model(*m);
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    if (!t.is_number_integer() && !t.is_number_unsigned())
      throw ApiError(400, "'tokens' must be a list of token ids (integers)", "tokens");
    const int64_t id = t.is_number_unsigned() ? int64_t(std::min<uint64_t>(t.get<uint64_t>(), 1ull << 40)) : t.get<int64_t>();
    if (id < 0 || id >= ctx.tokenizer.vocab_size())
      throw ApiError(400, str_cat("'tokens' holds ", t.dump(), ", outside the vocabulary [0, ", ctx.tokenizer.vocab_size(), ")"),
                     "tokens");
    ids.push_back(int32_t(id));
  }
  res.set_content(dump_json({{"prompt", ctx.tokenizer.decode(ids, false)}}), "application/json");
}

}  // namespace

std::shared_ptr<const grammar::TokenMasker> ServerContext::grammar_of(const GenerationOptions& gen) const {
  if (gen.constraint.empty()) return nullptr;
  SERVAL_CHECK(grammars != nullptr, "structured output: the server has no grammar cache");
  return grammars->get(gen.constraint);
}

void ServerContext::check_model(const std::string& requested) const {
  if (!requested.empty() && requested != model_name)
    throw ApiError(404, str_cat("the model '", requested, "' does not exist; this server serves '", model_name, "'"),
                   "model", "model_not_found");
}

void ServerContext::check_token_ids(const std::vector<int32_t>& ids, const char* param) const {
  const int64_t vocab = engine_vocab_size > 0 ? engine_vocab_size : tokenizer.vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw ApiError(400, str_cat("'", param, "' holds token id ", id, ", outside the vocabulary [0, ", vocab, ")"),
                     param);
}

void register_openai_routes(httplib::Server& server, ServerContext& ctx) {
  server.Post("/v1/completions", guarded(ctx, handle_completions));
  server.Post("/v1/chat/completions", guarded(ctx, handle_chat_completions));
  server.Get("/v1/models", guarded(ctx, handle_models));
  server.Get("/health", guarded(ctx, handle_health));
  server.Get("/metrics", guarded(ctx, handle_metrics));
  server.Post("/tokenize", guarded(ctx, handle_tokenize));
  server.Post("/detokenize", guarded(ctx, handle_detokenize));
}

}  // namespace serval::server
