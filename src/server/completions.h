#pragma once
// POST /v1/completions and POST /v1/chat/completions.
#include <httplib.h>

#include "server/server_context.h"

namespace serval::server {

void handle_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

}  // namespace serval::server
