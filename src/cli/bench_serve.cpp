// serval bench --mode serve: an OpenAI-compatible server under load, as its
// clients see it (ours or any other). N completion requests arrive at
// --request-rate per second (Poisson arrivals; inf: all at once), at most
// --max-concurrency in flight, each streamed with include_usage: random
// token-id prompts of --input-len (after a --prefix-len all share) with
// --output-len tokens each (ignore_eos), or the lines of a JSONL file as they
// are (OpenAI completion requests; chat requests with --endpoint chat). A
// Serval server's own counts (prefix cache hit rate, preemptions) come from
// its /metrics before and after.
// Per request: TTFT (to its first chunk of output), the gaps between its
// chunks (ITL; chunks that arrive in one read share a time), TPOT ((last
// chunk - first chunk) / (tokens - 1)) and the end-to-end latency; overall
// the throughput and, given --slo-ttft-ms / --slo-tpot-ms, the goodput
// (requests a second that met both).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <semaphore>
#include <thread>

#include <httplib.h>

#include "cli/batch_report.h"
#include "cli/bench_options.h"
#include "cli/bench_output.h"
#include "core/error.h"
#include "server/sse_reader.h"

namespace serval::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string describe(httplib::Error e) {
  return e == httplib::Error::Connection ? "could not connect" : httplib::to_string(e);
}

// The server: where it listens and the model it serves (GET /v1/models).
struct Target {
  std::string host;
  int port = 80;
  std::string model;
  int64_t max_model_len = 0;  // 0: not reported
};

Target find_target(const std::string& url) {
  const std::string scheme = "http://";
  SERVAL_CHECK(url.rfind(scheme, 0) == 0, "bench: --url must start with http:// (https is not supported), got \"",
               url, "\"");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  SERVAL_CHECK(!rest.empty() && rest.find('/') == std::string::npos, "bench: --url must be http://HOST[:PORT], got \"",
               url, "\"");
  Target t;
  t.host = rest;
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    t.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    size_t used = 0;
    t.port = 0;
    try {
      t.port = std::stoi(port, &used);
    } catch (const std::exception&) {
    }
    SERVAL_CHECK(used == port.size() && t.port > 0 && t.port < 65536, "bench: bad port in --url \"", url, "\"");
  }
  httplib::Client cli(t.host, t.port);
  cli.set_connection_timeout(5);
  const httplib::Result r = cli.Get("/v1/models");
  SERVAL_CHECK(r, "bench: cannot reach an OpenAI-compatible server at ", url, " (GET /v1/models: ",
               describe(r.error()), ")");
  SERVAL_CHECK(r->status == 200, "bench: GET ", url, "/v1/models answered ", r->status, ": ", r->body);
  try {
    const json models = json::parse(r->body);
    const json& first = models.at("data").at(0);
    t.model = first.at("id").get<std::string>();
    if (first.contains("max_model_len") && first["max_model_len"].is_number_integer())
      t.max_model_len = first["max_model_len"].get<int64_t>();
  } catch (const json::exception& e) {
    fail("bench: GET ", url, "/v1/models gave no model (", e.what(), "): ", r->body);
  }
  return t;
}

// The server's Prometheus text, if it is Serval (its serval: metrics), else "".
std::string serval_metrics(const Target& t) {
  httplib::Client cli(t.host, t.port);
  cli.set_connection_timeout(5);
  const httplib::Result r = cli.Get("/metrics");
  return r && r->status == 200 && r->body.find("serval:") != std::string::npos ? r->body : "";
}

// The request bodies, streamed with usage: random prompts, or the JSONL lines.
std::vector<std::string> request_bodies(const BenchOptions& o, const Target& t) {
  std::vector<json> bodies;
  if (o.input.empty()) {
    const int64_t len = int64_t(o.prefix_len) + o.input_len + o.output_len;
    SERVAL_CHECK(t.max_model_len == 0 || len <= t.max_model_len, "bench: --prefix-len + --input-len + --output-len = ",
                 len, " exceeds the server's max_model_len of ", t.max_model_len, " tokens");
    // Ids 1..255: in any real vocabulary, and random enough that no two
    // prompts share a KV block past the --prefix-len they all start with.
    std::mt19937 rng(o.seed);
    std::uniform_int_distribution<int32_t> id(1, 255);
    std::vector<int32_t> prefix(static_cast<size_t>(o.prefix_len));
    for (int32_t& x : prefix) x = id(rng);
    for (int32_t i = 0; i < o.requests; ++i) {
      std::vector<int32_t> prompt = prefix;
      for (int32_t k = 0; k < o.input_len; ++k) prompt.push_back(id(rng));
      bodies.push_back({{"prompt", prompt}, {"max_tokens", o.output_len}, {"ignore_eos", true}});
    }
  } else {
    std::ifstream in(o.input);
    SERVAL_CHECK(in.good(), "cannot open --input ", o.input);
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        fail(o.input, " line ", n, ": not valid JSON (", e.what(), ")");
      }
      const bool chat = o.endpoint == "chat";
      SERVAL_CHECK(j.is_object() && j.contains(chat ? "messages" : "prompt"), o.input, " line ", n, ": expected a ",
                   chat ? "chat request (a JSON object with \"messages\")" : "completion request (a JSON object with "
                   "\"prompt\")");
      if (!j.contains("max_tokens") && !j.contains("max_completion_tokens")) j["max_tokens"] = o.output_len;
      bodies.push_back(std::move(j));
    }
    SERVAL_CHECK(!bodies.empty(), "bench: ", o.input, " holds no request");
  }
  std::vector<std::string> out;
  for (json& j : bodies) {
    if (!j.contains("model")) j["model"] = t.model;
    if (!j.contains("temperature")) j["temperature"] = o.temperature;
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
    out.push_back(j.dump());
  }
  return out;
}

// When each request is sent, from the start: a Poisson process of `rate` a
// second (exponential gaps, the first at 0), or all at 0 for an infinite rate.
std::vector<double> arrival_times(size_t n, double rate, uint32_t seed) {
  std::vector<double> at(n, 0.0);
  if (!std::isfinite(rate)) return at;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < n; ++i) at[i] = at[i - 1] + gap(rng);
  return at;
}

// What one client saw of its streamed completion, in seconds from the start.
struct Outcome {
  bool ok = false;
  std::string error;
  double sent = 0, end = 0;
  std::vector<double> chunks;  // chunks that carried output
  int64_t prompt_tokens = 0, completion_tokens = -1;  // from the usage chunk (-1: none came)
};

// Whether a streamed chunk carries output: a completion's text, or a chat
// delta's content.
bool has_output(const json& choice, bool chat) {
  const json* text = nullptr;
  if (!chat && choice.contains("text")) text = &choice["text"];
  if (chat && choice.contains("delta") && choice["delta"].contains("content")) text = &choice["delta"]["content"];
  return text != nullptr && text->is_string() && !text->get_ref<const std::string&>().empty();
}

Outcome stream_completion(const Target& t, bool chat, const std::string& body, Clock::time_point t0) {
  Outcome o;
  o.sent = seconds(Clock::now() - t0);
  httplib::Client cli(t.host, t.port);
  cli.set_read_timeout(3600);
  httplib::Request req;
  req.method = "POST";
  req.path = chat ? "/v1/chat/completions" : "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body;
  int status = 0;
  std::string error_body;
  bool done = false;
  server::SseReader sse;
  std::vector<std::string> events;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const double now = seconds(Clock::now() - t0);
    if (status != 200) {
      error_body.append(data, len);
      return true;
    }
    events.clear();
    sse.feed(std::string_view(data, len), events);
    for (const std::string& ev : events) {
      if (ev == "[DONE]") {
        done = true;
        continue;
      }
      try {
        const json j = json::parse(ev);
        if (j.contains("error")) {
          o.error = "the stream ended in an error: " + j["error"].dump();
          return false;
        }
        const json& choices = j.at("choices");
        const bool output =
            std::any_of(choices.begin(), choices.end(), [&](const json& c) { return has_output(c, chat); });
        if (output) o.chunks.push_back(now);
        if (j.contains("usage") && j["usage"].is_object()) {
          o.prompt_tokens = j["usage"].value("prompt_tokens", int64_t(0));
          o.completion_tokens = j["usage"].value("completion_tokens", int64_t(0));
        }
      } catch (const json::exception& e) {
        o.error = std::string("a chunk is not a completion chunk (") + e.what() + "): " + ev;
        return false;
      }
    }
    return true;
  };
  const httplib::Result r = cli.send(req);
  o.end = seconds(Clock::now() - t0);
  if (!o.error.empty()) return o;
  if (!r) {
    o.error = "POST " + req.path + ": " + describe(r.error());
  } else if (status != 200) {
    o.error = "POST " + req.path + " answered " + std::to_string(status) + ": " + error_body;
  } else if (!done) {
    o.error = "the stream ended without data: [DONE]";
  } else {
    o.ok = true;
    if (o.completion_tokens < 0) o.completion_tokens = int64_t(o.chunks.size());
  }
  return o;
}

// <name>_ms_mean, then its percentiles.
void add_latency_ms(const char* name, const std::vector<double>& seconds, BenchJson& j) {
  const double sum = std::accumulate(seconds.begin(), seconds.end(), 0.0);
  j[str_cat(name, "_ms_mean")] = seconds.empty() ? 0.0 : sum / double(seconds.size()) * 1e3;
  add_percentiles_ms(name, seconds, j);
}

}  // namespace

int run_bench_serve(const BenchOptions& o) {
  const Target target = find_target(o.url);
  const std::vector<std::string> bodies = request_bodies(o, target);
  const std::vector<double> arrivals = arrival_times(bodies.size(), o.request_rate, o.seed);
  const size_t n = bodies.size();
  std::vector<Outcome> outcomes(n);
  // At most --max-concurrency requests in flight (0: as many as arrive).
  const std::ptrdiff_t slots = o.max_concurrency > 0 ? o.max_concurrency : std::ptrdiff_t(n);
  std::counting_semaphore<> free_slots(std::max<std::ptrdiff_t>(slots, 1));
  std::mutex mutex;
  int64_t in_flight = 0, most_in_flight = 0;
  // A thread per request in flight; those that have finished are joined as
  // new ones start, so a long run holds no more threads than it has requests
  // in flight.
  std::vector<std::thread> clients;
  std::vector<size_t> finished;  // indices into clients, under mutex
  auto join_finished = [&] {
    std::vector<size_t> done;
    {
      std::lock_guard<std::mutex> lock(mutex);
      done.swap(finished);
    }
    for (size_t k : done) clients[k].join();
  };
  const std::string metrics_before = serval_metrics(target);
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(arrivals[i])));
    free_slots.acquire();
    join_finished();
    std::lock_guard<std::mutex> lock(mutex);
    most_in_flight = std::max(most_in_flight, ++in_flight);
    const size_t k = clients.size();
    clients.emplace_back([&, i, k] {
      outcomes[i] = stream_completion(target, o.endpoint == "chat", bodies[i], t0);
      {
        std::lock_guard<std::mutex> lock(mutex);
        --in_flight;
        finished.push_back(k);
      }
      free_slots.release();
    });
  }
  for (std::thread& c : clients)
    if (c.joinable()) c.join();

  int64_t completed = 0, prompt_tokens = 0, output_tokens = 0, good = 0;
  double last_end = 0;
  std::vector<double> ttft, tpot, itl, e2e;  // seconds
  std::string first_error;
  for (const Outcome& r : outcomes) {
    last_end = std::max(last_end, r.end);
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++completed;
    prompt_tokens += r.prompt_tokens;
    output_tokens += r.completion_tokens;
    e2e.push_back(r.end - r.sent);
    if (r.chunks.empty()) continue;
    const double first = r.chunks.front() - r.sent;
    ttft.push_back(first);
    for (size_t k = 1; k < r.chunks.size(); ++k) itl.push_back(r.chunks[k] - r.chunks[k - 1]);
    const int64_t gaps = r.completion_tokens - 1;
    const double per_token = gaps > 0 ? (r.chunks.back() - r.chunks.front()) / double(gaps) : 0.0;
    if (gaps > 0) tpot.push_back(per_token);
    const bool ttft_ok = o.slo_ttft_ms <= 0 || first * 1e3 <= o.slo_ttft_ms;
    const bool tpot_ok = o.slo_tpot_ms <= 0 || per_token * 1e3 <= o.slo_tpot_ms;
    good += ttft_ok && tpot_ok;
  }
  const double duration = std::max(last_end, 1e-9);
  BenchJson j = {{"mode", "serve"},
                 {"url", o.url},
                 {"model", target.model},
                 {"endpoint", o.endpoint},
                 {"requests", int64_t(n)},
                 {"input", o.input.empty() ? BenchJson(nullptr) : BenchJson(o.input)},
                 {"input_len", o.input.empty() ? BenchJson(o.input_len) : BenchJson(nullptr)},
                 {"output_len", o.input.empty() ? BenchJson(o.output_len) : BenchJson(nullptr)},
                 {"prefix_len", o.input.empty() ? BenchJson(o.prefix_len) : BenchJson(nullptr)},
                 {"request_rate", std::isfinite(o.request_rate) ? BenchJson(o.request_rate) : BenchJson("inf")},
                 {"max_concurrency", o.max_concurrency > 0 ? BenchJson(o.max_concurrency) : BenchJson(nullptr)},
                 {"most_in_flight", most_in_flight},
                 {"last_arrival_s", arrivals.empty() ? 0.0 : arrivals.back()},
                 {"completed", completed},
                 {"failed", int64_t(n) - completed},
                 {"duration_s", duration},
                 {"requests_per_s", double(completed) / duration},
                 {"prompt_tokens", prompt_tokens},
                 {"output_tokens", output_tokens},
                 {"output_tokens_per_s", double(output_tokens) / duration},
                 {"total_tokens_per_s", double(prompt_tokens + output_tokens) / duration}};
  add_latency_ms("ttft", ttft, j);
  add_latency_ms("tpot", tpot, j);
  add_latency_ms("itl", itl, j);
  add_latency_ms("e2e", e2e, j);
  // What a Serval server counted meanwhile (other clients' requests included).
  if (const std::string after = serval_metrics(target); !metrics_before.empty() && !after.empty()) {
    auto delta = [&](const char* name) {
      return exposition_value(after, name) - exposition_value(metrics_before, name);
    };
    const double queried = delta("serval:prefix_cache_queries_total");
    j["server_prefix_cache_hit_rate"] = queried > 0 ? delta("serval:prefix_cache_hits_total") / queried : 0.0;
    j["server_preemptions"] = int64_t(delta("serval:num_preemptions_total"));
    add_speculative_stats(metrics_before, after, "server_", j);
  }
  if (o.slo_ttft_ms > 0 || o.slo_tpot_ms > 0) {
    j["slo_ttft_ms"] = o.slo_ttft_ms > 0 ? BenchJson(o.slo_ttft_ms) : BenchJson(nullptr);
    j["slo_tpot_ms"] = o.slo_tpot_ms > 0 ? BenchJson(o.slo_tpot_ms) : BenchJson(nullptr);
    j["goodput_requests_per_s"] = double(good) / duration;
  }
  if (o.json) std::printf("%s\n", j.dump().c_str());
  else print_key_values(j);
  SERVAL_CHECK(completed == int64_t(n), int64_t(n) - completed, " of ", n, " requests failed; the first: ",
               first_error);
  return 0;
}

}  // namespace serval::cli
