#include "cli/bench_output.h"

#include <algorithm>
#include <cstdio>

#include "cli/batch_report.h"
#include "core/error.h"

namespace serval::cli {

PointPrinter::PointPrinter(bool json, std::vector<Column> columns) : json_(json), columns_(std::move(columns)) {
  for (const Column& c : columns_) widths_.push_back(std::max<int>(int(c.header.size()), 9));
}

void PointPrinter::print(const BenchJson& point) {
  if (json_) {
    std::printf("%s\n", point.dump().c_str());
    std::fflush(stdout);
    return;
  }
  if (!header_done_) {
    for (size_t i = 0; i < columns_.size(); ++i) std::printf("%*s ", widths_[i], columns_[i].header.c_str());
    std::printf("\n");
    header_done_ = true;
  }
  for (size_t i = 0; i < columns_.size(); ++i) {
    const Column& c = columns_[i];
    const auto it = point.find(c.key);
    if (it == point.end() || it->is_null()) {
      std::printf("%*s ", widths_[i], "-");
    } else if (it->is_string()) {
      std::printf("%*s ", widths_[i], it->get<std::string>().c_str());
    } else {
      std::printf("%*.*f ", widths_[i], c.decimals, it->get<double>() * c.scale);
    }
  }
  std::printf("\n");
  std::fflush(stdout);
}

void print_key_values(const BenchJson& result) {
  for (const auto& [key, value] : result.items()) {
    if (value.is_number_float()) std::printf("%-28s %.4g\n", key.c_str(), value.get<double>());
    else std::printf("%-28s %s\n", key.c_str(), value.is_string() ? value.get<std::string>().c_str() : value.dump().c_str());
  }
  std::fflush(stdout);
}

void add_percentiles_ms(const char* name, const std::vector<double>& seconds, BenchJson& j) {
  for (int p : {50, 90, 99}) j[str_cat(name, "_ms_p", p)] = percentile(seconds, p) * 1e3;
}

void add_speculative_stats(const std::string& before, const std::string& after, const std::string& prefix,
                           BenchJson& j) {
  auto delta = [&](const char* name) { return exposition_value(after, name) - exposition_value(before, name); };
  const double drafts = delta("serval:spec_decode_num_drafts_total");
  const double draft_tokens = delta("serval:spec_decode_num_draft_tokens_total");
  const double accepted = delta("serval:spec_decode_num_accepted_tokens_total");
  j[prefix + "spec_drafts"] = int64_t(drafts);
  j[prefix + "spec_draft_tokens"] = int64_t(draft_tokens);
  j[prefix + "spec_accepted_tokens"] = int64_t(accepted);
  j[prefix + "spec_acceptance_rate"] = draft_tokens > 0 ? accepted / draft_tokens : 0.0;
  j[prefix + "spec_mean_accepted_length"] = drafts > 0 ? 1.0 + accepted / drafts : 0.0;
}

}  // namespace serval::cli
