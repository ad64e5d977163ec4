#include "cli/batch_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace serval::cli {

BatchProgress::BatchProgress(int64_t total, bool enabled)
    : total_(total),
      enabled_(enabled),
      tty_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void BatchProgress::update(int64_t done, int64_t output_tokens, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (!force && since_last < (tty_ ? 0.1 : 10.0)) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double tps = elapsed > 0 ? double(output_tokens) / elapsed : 0.0;
  const double eta = done > 0 ? elapsed * double(total_ - done) / double(done) : 0.0;
  char eta_text[32];
  if (done > 0) std::snprintf(eta_text, sizeof eta_text, "%.0fs", eta);
  else std::snprintf(eta_text, sizeof eta_text, "?");
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? int(kWidth * done / total_) : kWidth;
    std::string bar(size_t(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(size_t(kWidth - filled - 1), ' ');
    std::fprintf(stderr, "\r[%s] %lld/%lld | %.1f tok/s | ETA %s \x1b[K", bar.c_str(),
                 (long long)done, (long long)total_, tps, eta_text);
    drawn_ = true;
  } else {
    std::fprintf(stderr, "progress: %lld/%lld requests | %.1f output tokens/s | ETA %s\n",
                 (long long)done, (long long)total_, tps, eta_text);
  }
  std::fflush(stderr);
}

void BatchProgress::finish() {
  if (enabled_ && tty_ && drawn_) std::fputc('\n', stderr);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(p / 100.0 * double(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string format_summary(const BatchSummary& s) {
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "requests: %lld (%lld samples, %lld failed) in %.2f s | prompt tokens: %lld | "
                "output tokens: %lld, %.1f tokens/s\n",
                (long long)s.requests, (long long)s.samples, (long long)s.failed, s.total_s,
                (long long)s.prompt_tokens, (long long)s.output_tokens,
                s.total_s > 0 ? double(s.output_tokens) / s.total_s : 0.0);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "TTFT ms p50/p90/p99: %.1f / %.1f / %.1f | TPOT ms p50/p90/p99: %.2f / %.2f / %.2f\n",
                percentile(s.ttft_s, 50) * 1e3, percentile(s.ttft_s, 90) * 1e3,
                percentile(s.ttft_s, 99) * 1e3, percentile(s.tpot_s, 50) * 1e3,
                percentile(s.tpot_s, 90) * 1e3, percentile(s.tpot_s, 99) * 1e3);
  out += buf;
  std::snprintf(buf, sizeof buf, "prefix cache hit rate: %.1f%% | preemptions: %lld\n",
                s.prefix_cache_hit_rate * 100.0, (long long)s.preemptions);
  out += buf;
  return out;
}

double exposition_value(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    try {
      return std::stod(line.substr(space + 1));
    } catch (...) {
      return 0.0;
    }
  }
  return 0.0;
}

}  // namespace serval::cli
