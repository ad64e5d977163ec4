// serval serve: the OpenAI-compatible HTTP server over one Engine.
// Before it listens, a warm-up (--warmup; by default where decode steps run
// from CUDA graphs) runs decode steps of every graph size up to
// --max-num-seqs at contexts up to 1,024 tokens through an engine of its
// own, so that their graphs and matmul plans exist before the first request
// and its counts stay out of /metrics.
// SIGTERM/SIGINT drain: stop accepting, let requests in flight finish for up
// to --shutdown-timeout seconds, abort the rest (their clients get a final
// event), exit 0.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "engine/engine_warmup.h"
#include "model/model_loader.h"
#include "server/http_server.h"
#include "server/openai_server.h"
#include "server/response_builder.h"

namespace serval::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  std::string api_key;
  std::string chat_template;
  std::string tool_call_parser = "auto";
  size_t max_body_bytes = 8u << 20;
  double shutdown_timeout = 30.0;
  size_t max_connections = 2048;
  double request_read_timeout = 10.0;
  std::string warmup = "auto";  // auto (where steps run from graphs), on or off
  std::string metrics_compat = "gateway";  // vLLM names on /metrics: gateway (the routers' gauges) or vllm (all)
  EngineFlags engine;
};

// The warm-up (engine/engine_warmup.h) of the graph classes of contexts up
// to 1,024 tokens (longer ones, whose steps read far more K/V, set theirs
// up at first use). Returns its seconds.
double warm_up(ModelRunner& runner, const Tokenizer& tok, const EngineOptions& eo) {
  const auto t0 = std::chrono::steady_clock::now();
  Engine engine(runner, tok, eo);  // its own: its counts are not the server's
  EngineRequest defaults;
  defaults.params.temperature = 0;
  defaults.stop.ignore_eos = true;
  WarmupShape shape;
  shape.requests = int32_t(std::min<int64_t>(eo.scheduler.max_num_seqs, INT32_MAX));
  shape.longest = std::min<int64_t>(eo.scheduler.max_model_len, 1024);
  shape.room = std::min<int64_t>(eo.scheduler.max_model_len, (runner.num_blocks() - 1) * runner.block_size());
  shape.budget = eo.scheduler.max_num_batched_tokens;
  shape.max_seqs = eo.scheduler.max_num_seqs;
  shape.block_size = runner.block_size();
  const int64_t vocab = runner.config().vocab_size;
  run_warmup(engine, plan_warmup(defaults, shape, [&](int64_t len) {
               std::vector<int32_t> p(static_cast<size_t>(len));
               for (int64_t i = 0; i < len; ++i) p[size_t(i)] = int32_t((3 + 7 * i) % vocab);
               return p;
             }));
  engine.shutdown();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The signal received (0: none). Set by a handler rather than taken with
// sigwait: OpenBLAS/OpenMP start threads before main, so a process-directed
// signal can land on a thread that never blocked it.
std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) { g_signal.store(sig); }

// Waits for SIGTERM/SIGINT until `stop`; on a signal runs `on_signal` once.
void wait_for_signals(const std::atomic<bool>& stop, const std::function<void(int)>& on_signal) {
  while (!stop) {
    if (const int sig = g_signal.load()) {
      on_signal(sig);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int run_serve(const ServeOptions& o) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away must not kill us

  server::HttpLimits limits;
  limits.max_body_bytes = o.max_body_bytes;
  limits.max_connections = o.max_connections;
  limits.request_read_timeout = std::chrono::milliseconds(int64_t(o.request_read_timeout * 1000));
  server::HttpServer http(limits, o.api_key);
  // Bound first, so that a port in use fails now rather than after the load
  // and warm-up; connections made meanwhile wait in the backlog.
  const int port = http.bind(o.host, o.port);

  LoadedEngineModel loaded = load_engine_model(o.model, o.engine);
  Tokenizer* tok = loaded.tokenizer.get();
  ModelRunner* runner = loaded.runner.get();
  const std::string name = o.served_model_name.empty() ? o.model : o.served_model_name;

  std::unique_ptr<server::ChatPrompt> chat;
  try {
    chat = std::make_unique<server::ChatPrompt>(server::chat_template_source(o.chat_template, o.model, false),
                                                server::chat_template_source(o.chat_template, o.model, true), *tok);
  } catch (const Error& e) {
    if (!o.chat_template.empty()) throw;  // the user's own template must work
    std::fprintf(stderr, "serval: warning: the model's chat template cannot be used (%s); chat requests will be "
                 "refused\n", e.what());
    chat = std::make_unique<server::ChatPrompt>("", "", *tok);
  }

  EngineOptions eo = engine_options(o.engine);
  eo.model_name = name;
  if (eo.scheduler.max_model_len == 0) eo.scheduler.max_model_len = runner->config().max_position;
  if (o.warmup == "on" || (o.warmup == "auto" && runner->uses_graphs())) {
    const int64_t graphs = runner->graphs_captured();
    try {
      const double s = warm_up(*runner, *tok, eo);
      std::fprintf(stderr, "serval: warm-up: decode steps of 1..%lld sequences in %.1f s (%lld graphs recorded)\n",
                   (long long)eo.scheduler.max_num_seqs, s, (long long)(runner->graphs_captured() - graphs));
    } catch (const Error& e) {
      if (o.warmup == "on") throw;
      std::fprintf(stderr, "serval: warning: the warm-up failed (%s); serving without it\n", e.what());
    }
  }
  Engine engine(*runner, *tok, eo);
  EngineMetrics::add_vllm_aliases(engine.metrics_registry(), o.metrics_compat == "vllm"
                                                                 ? EngineMetrics::VllmNames::kAll
                                                                 : EngineMetrics::VllmNames::kGateway);
  server::ServerContext ctx{engine, *tok, *chat, name};
  server::GrammarCache grammars(*tok);
  ctx.grammars = &grammars;
  if (const auto named = server::tool_format_named(o.tool_call_parser)) {
    ctx.tool_format = *named;
  } else {
    try {
      ctx.tool_format = server::detect_tool_format(server::chat_template_source(o.chat_template, o.model, true));
    } catch (const Error&) {
      ctx.tool_format = server::ToolFormat::kNone;  // no template: no tool calls to parse
    }
  }
  ctx.max_model_len = eo.scheduler.max_model_len;
  ctx.engine_vocab_size = runner->config().vocab_size;
  ctx.created = server::unix_now();

  server::register_openai_routes(http, ctx);
  std::fprintf(stderr,
               "serval: serving '%s' (context %lld tokens, KV pool %lld blocks of %d, chat template: %s, tool calls: "
               "%s, async scheduling: %s%s) on http://%s:%d\n",
               name.c_str(), (long long)ctx.max_model_len, (long long)runner->num_blocks(), runner->block_size(),
               chat->available() ? "yes" : "no", server::tool_format_name(ctx.tool_format),
               engine.async_scheduling() ? "on" : "off",
               eo.speculative.enabled() ? str_cat(" (off for speculative decoding: ", eo.speculative.method, ", k ",
                                                  eo.speculative.num_tokens, ")").c_str() : "",
               o.host.c_str(), port);

  std::atomic<bool> stop{false};
  std::thread signals([&] {
    wait_for_signals(stop, [&](int sig) {
      std::fprintf(stderr, "serval: %s: draining (%lld requests in flight, up to %.1f s)\n",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", (long long)engine.num_unfinished(), o.shutdown_timeout);
      http.begin_drain();
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(int64_t(o.shutdown_timeout * 1000));
      while (engine.num_unfinished() > 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int64_t left = engine.num_unfinished();
      if (left > 0) std::fprintf(stderr, "serval: shutdown timeout: aborting %lld requests\n", (long long)left);
      ctx.engine_alive = false;
      engine.shutdown();
    });
  });
  http.serve();  // returns once drained and every connection is closed
  stop = true;
  signals.join();
  ctx.engine_alive = false;
  engine.shutdown();
  std::fprintf(stderr, "serval: stopped\n");
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, Action& action) {
  auto o = std::make_shared<ServeOptions>();
  auto* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  sub->add_option("--model,-m", o->model, "GGUF file or Hugging Face folder")->required();
  sub->add_option("--host", o->host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o->port, "port to listen on (0: any free port)")->capture_default_str();
  sub->add_option("--served-model-name", o->served_model_name, "the model name clients use (default: --model)");
  sub->add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize");
  sub->add_option("--chat-template", o->chat_template, "Jinja chat template file (default: the model's own)");
  sub->add_option("--tool-call-parser", o->tool_call_parser,
                  "how the model writes tool calls: auto (from the chat template), hermes, llama3_json, mistral");
  sub->add_option("--max-body-bytes", o->max_body_bytes, "largest request body; larger gets HTTP 413")
      ->capture_default_str();
  sub->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "seconds SIGTERM waits for requests in flight before aborting them")->capture_default_str();
  sub->add_option("--max-connections", o->max_connections, "connections served at once")->capture_default_str();
  sub->add_option("--request-read-timeout", o->request_read_timeout,
                  "seconds a client has to send a whole request")->capture_default_str();
  sub->add_option("--warmup", o->warmup,
                  "before serving, run decode steps of every batch size up to --max-num-seqs, so that their CUDA "
                  "graphs and matmul plans exist before the first request: auto (default: where steps run from "
                  "graphs), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->add_option("--metrics-compat", o->metrics_compat,
                  "vLLM's names on /metrics besides serval's: gateway (default: vllm:num_requests_running, "
                  "vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:cache_config_info, which routers read) "
                  "or vllm (every metric with a vLLM equivalent, for vLLM's dashboards)")
      ->check(CLI::IsMember({"gateway", "vllm"}));
  add_engine_flags(*sub, o->engine);
  sub->callback([&action, o] { action = [o] { return run_serve(*o); }; });
}

}  // namespace serval::cli
