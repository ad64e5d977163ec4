#pragma once
// What batch mode tells the user on stderr: a progress bar while it runs (on
// a terminal; a plain line every 10 s otherwise) and a summary at the end.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace serval::cli {

class BatchProgress {
 public:
  BatchProgress(int64_t total, bool enabled);
  // Redraws at most every 100 ms (terminal) or 10 s (not a terminal).
  void update(int64_t done, int64_t output_tokens, bool force = false);
  // Ends the bar's line.
  void finish();

 private:
  int64_t total_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point start_, last_;
  bool drawn_ = false;
};

struct BatchSummary {
  int64_t requests = 0, samples = 0, failed = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double total_s = 0;
  std::vector<double> ttft_s, tpot_s;  // per sample
  double prefix_cache_hit_rate = 0;    // of prompt tokens looked up
  int64_t preemptions = 0;
};

// Nearest-rank percentile of `values` (0 when empty); p in [0, 100].
double percentile(std::vector<double> values, double p);

// The summary lines, each ending in "\n".
std::string format_summary(const BatchSummary& s);

// The value of an unlabelled-but-for-model_name sample `name` in a Prometheus
// exposition text, or 0 when absent.
double exposition_value(const std::string& exposition, const std::string& name);

}  // namespace serval::cli
