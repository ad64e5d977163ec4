#pragma once
// A strict checker for the Prometheus text exposition format 0.0.4, as
// produced by serval::metrics::Registry (no timestamps, HELP and TYPE for
// every family). Written from the format specification, independent of the
// exporter code.
#include <map>
#include <string>
#include <vector>

namespace serval::testing {

struct ParsedSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // unescaped, in order
  double value = 0;
};

struct ParsedFamily {
  std::string name, help, type;  // help unescaped
  std::vector<ParsedSample> samples;
};

// Parses `text`; every violation is appended to `errors` (line number and
// reason). Checks the line grammar (names, label escaping, values), HELP then
// TYPE once per family, families in name order, samples belonging to the
// family of the preceding TYPE, no duplicate series or label names, and for
// histograms: le labels increasing and ending in +Inf, cumulative counts not
// decreasing, +Inf bucket == _count, one _sum and _count per series.
std::vector<ParsedFamily> parse_exposition(const std::string& text, std::vector<std::string>& errors);

// Value of the sample with this name and exactly these labels; NaN if absent.
double sample_value(const std::vector<ParsedFamily>& families, const std::string& name,
                    const std::vector<std::pair<std::string, std::string>>& labels);

}  // namespace serval::testing
