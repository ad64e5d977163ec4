#include "server/sse_stream.h"

#include "server/access_log.h"
#include "server/api_error.h"

namespace serval::server {

std::string sse_data(const nlohmann::json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

namespace {

struct StreamState {
  std::shared_ptr<Generation> gen;
  StreamFormat format;
  bool started = false;
  bool finished = false;
};

bool write_all(httplib::DataSink& sink, const std::vector<nlohmann::json>& chunks) {
  std::string data;
  for (const auto& c : chunks) data += sse_data(c);
  return data.empty() || sink.write(data.data(), data.size());
}

void record_usage(const Generation& gen) {
  const UsageCounts u = gen.usage();
  AccessRecord& r = current_access_record();
  r.prompt_tokens = u.prompt_tokens;
  r.completion_tokens = u.completion_tokens;
}

}  // namespace

void stream_generation(httplib::Response& res, std::shared_ptr<Generation> gen, StreamFormat format) {
  auto state = std::make_shared<StreamState>();
  state->gen = std::move(gen);
  state->format = std::move(format);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) {
        Generation& g = *state->gen;
        std::vector<nlohmann::json> chunks;
        if (!state->started) {
          state->started = true;
          if (state->format.start) state->format.start(chunks);
        }
        std::optional<ChoiceEvent> ev = g.next(std::chrono::milliseconds(50));
        if (g.disconnected()) return false;
        if (ev) state->format.event(*ev, chunks);
        if (state->format.continuous_usage)
          for (nlohmann::json& c : chunks)
            if (c.contains("choices") && !c["choices"].empty()) c["usage"] = usage_json(g.usage());
        if (g.done()) {
          const std::string error = g.error();
          if (!error.empty()) chunks.push_back(ApiError(500, error).body());
          if (state->format.end) state->format.end(chunks);
        }
        if (!write_all(sink, chunks)) {
          g.abort();
          current_access_record().status = 499;
          return false;
        }
        if (g.done()) {
          state->finished = true;
          sink.write(kSseDone, std::char_traits<char>::length(kSseDone));
          sink.done();
        }
        return true;
      },
      [state](bool) {
        if (!state->finished) state->gen->abort();
        record_usage(*state->gen);
      });
}

}  // namespace serval::server
