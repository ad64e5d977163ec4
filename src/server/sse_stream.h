#pragma once
// Server-sent events for streaming responses: "data: <json>\n\n" per chunk,
// "data: [DONE]\n\n" at the end. stream_generation() hands httplib a chunked
// content provider that writes a Generation's chunks as they come; a failed
// write or a closed connection aborts the generation.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/generation.h"

namespace serval::server {

std::string sse_data(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// Endpoint formatting. `start`: chunks before any output (chat: the role
// delta); `event`: chunks for one event; `end`: chunks after the last event
// (usage). Each appends payloads to `out`.
struct StreamFormat {
  std::function<void(std::vector<nlohmann::json>& out)> start;
  std::function<void(const ChoiceEvent& ev, std::vector<nlohmann::json>& out)> event;
  std::function<void(std::vector<nlohmann::json>& out)> end;
  // vLLM's stream_options.continuous_usage_stats: every chunk with choices
  // carries the usage so far.
  bool continuous_usage = false;
};

void stream_generation(httplib::Response& res, std::shared_ptr<Generation> gen, StreamFormat format);

}  // namespace serval::server
