#pragma once
// The OpenAI-compatible API on an HttpServer: routes and the small endpoints
// (/v1/models, /health, /metrics, /tokenize, /detokenize); the generation
// endpoints live in completions.cpp and chat_completions.cpp. Every handler
// runs on its connection's thread, never on the engine loop, and turns any
// exception into an OpenAI-shaped error.
#include <httplib.h>

#include "server/server_context.h"

namespace serval::server {

void register_openai_routes(httplib::Server& server, ServerContext& ctx);

}  // namespace serval::server
