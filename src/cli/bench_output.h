#pragma once
// How serval bench prints its measured points: with --json one JSON object
// per point, one per line; otherwise a table whose header comes first. Each
// point is printed (and flushed) as soon as it is measured, so a run cut short
// keeps what it measured.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace serval::cli {

// Keys in the order a mode writes them (readable JSON lines and key: value output).
using BenchJson = nlohmann::ordered_json;

struct Column {
  std::string key;     // the point's JSON key
  std::string header;  // the table's heading
  double scale = 1;    // printed value = value * scale
  int decimals = 1;
};

class PointPrinter {
 public:
  PointPrinter(bool json, std::vector<Column> columns);
  void print(const BenchJson& point);

 private:
  bool json_;
  std::vector<Column> columns_;
  std::vector<int> widths_;
  bool header_done_ = false;
};

// A single result as "key: value" lines (engine mode's readable output).
void print_key_values(const BenchJson& result);

// <name>_ms_p50 / _p90 / _p99 of `seconds` (nearest rank; 0 when empty).
void add_percentiles_ms(const char* name, const std::vector<double>& seconds, BenchJson& j);

// Speculative decoding between two /metrics expositions (an engine's or a
// server's): <prefix>spec_drafts, _draft_tokens, _accepted_tokens,
// _acceptance_rate (accepted / draft tokens) and _mean_accepted_length
// (tokens per verified row, the bonus token included, as vLLM reports it).
void add_speculative_stats(const std::string& before, const std::string& after, const std::string& prefix,
                           BenchJson& j);

}  // namespace serval::cli
