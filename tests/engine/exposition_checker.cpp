#include "exposition_checker.h"

#include <cmath>
#include <limits>
#include <regex>
#include <set>
#include <string_view>

namespace serval::testing {
namespace {

const std::string kName = "[a-zA-Z_:][a-zA-Z0-9_:]*";
const std::string kLabelName = "[a-zA-Z_][a-zA-Z0-9_]*";
const std::string kLabelValue = R"((?:[^\\"\n]|\\\\|\\"|\\n)*)";
const std::string kLabel = kLabelName + "=\"" + kLabelValue + "\"";
const std::string kValue = R"((?:[+-]Inf|NaN|-?[0-9]+(?:\.[0-9]+)?(?:e[+-][0-9]+)?))";

const std::regex kHelpLine("# HELP (" + kName + R"() ((?:[^\\\n]|\\\\|\\n)*))");
const std::regex kTypeLine("# TYPE (" + kName + ") (counter|gauge|histogram|summary|untyped)");
const std::regex kSampleLine("(" + kName + ")(\\{" + kLabel + "(?:," + kLabel + ")*\\})? (" +
                             kValue + ")");
const std::regex kOneLabel("(" + kLabelName + ")=\"(" + kLabelValue + ")\"");

std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      ++i;
      out += s[i] == 'n' ? '\n' : s[i];
    } else {
      out += s[i];
    }
  }
  return out;
}

double parse_value(const std::string& s) {
  if (s == "+Inf") return std::numeric_limits<double>::infinity();
  if (s == "-Inf") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  return std::stod(s);
}

struct HistogramSeries {
  std::vector<std::pair<double, double>> buckets;  // le, count
  int sums = 0, counts = 0;
  double count = 0;
};

void check_histogram(const ParsedFamily& f, std::vector<std::string>& errors) {
  std::map<std::vector<std::pair<std::string, std::string>>, HistogramSeries> series;
  for (const ParsedSample& s : f.samples) {
    auto labels = s.labels;
    if (s.name == f.name + "_bucket") {
      if (labels.empty() || labels.back().first != "le") {
        errors.push_back(f.name + ": bucket without a trailing le label");
        continue;
      }
      double le = parse_value(labels.back().second);
      if (labels.back().second != "+Inf" && !std::isfinite(le))
        errors.push_back(f.name + ": bad le " + labels.back().second);
      labels.pop_back();
      series[labels].buckets.emplace_back(le, s.value);
    } else if (s.name == f.name + "_sum") {
      ++series[labels].sums;
    } else if (s.name == f.name + "_count") {
      ++series[labels].counts;
      series[labels].count = s.value;
    }
  }
  for (const auto& [labels, h] : series) {
    if (h.sums != 1 || h.counts != 1) errors.push_back(f.name + ": series without one _sum/_count");
    if (h.buckets.empty() || !std::isinf(h.buckets.back().first)) {
      errors.push_back(f.name + ": series without a +Inf bucket last");
      continue;
    }
    for (size_t i = 1; i < h.buckets.size(); ++i) {
      if (!(h.buckets[i - 1].first < h.buckets[i].first)) errors.push_back(f.name + ": le not increasing");
      if (h.buckets[i - 1].second > h.buckets[i].second) errors.push_back(f.name + ": counts decrease");
    }
    if (h.buckets.back().second != h.count)
      errors.push_back(f.name + ": +Inf bucket " + std::to_string(h.buckets.back().second) +
                       " != _count " + std::to_string(h.count));
  }
}

}  // namespace

std::vector<ParsedFamily> parse_exposition(const std::string& text, std::vector<std::string>& errors) {
  std::vector<ParsedFamily> families;
  if (text.empty()) return families;
  if (text.back() != '\n') errors.push_back("text does not end with a newline");
  std::set<std::string> family_names, series_keys;
  size_t line_no = 0;
  std::string pending_help_name, pending_help;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    const std::string where = "line " + std::to_string(line_no) + " '" + line + "': ";
    std::smatch m;
    if (std::regex_match(line, m, kHelpLine)) {
      if (!pending_help_name.empty()) errors.push_back(where + "HELP not followed by TYPE");
      pending_help_name = m[1];
      pending_help = unescape(m[2].str());
    } else if (std::regex_match(line, m, kTypeLine)) {
      const std::string name = m[1];
      if (pending_help_name != name) errors.push_back(where + "TYPE without HELP just before");
      if (!family_names.insert(name).second) errors.push_back(where + "family repeated");
      if (!families.empty() && families.back().name >= name)
        errors.push_back(where + "families not in name order");
      families.push_back(ParsedFamily{name, pending_help, m[2], {}});
      pending_help_name.clear();
    } else if (std::regex_match(line, m, kSampleLine)) {
      if (families.empty() || !pending_help_name.empty()) {
        errors.push_back(where + "sample outside a family");
        continue;
      }
      ParsedFamily& f = families.back();
      ParsedSample s{m[1], {}, parse_value(m[3])};
      const std::string block = m[2];
      std::set<std::string> label_names;
      for (std::sregex_iterator it(block.begin(), block.end(), kOneLabel), last; it != last; ++it) {
        s.labels.emplace_back((*it)[1], unescape((*it)[2].str()));
        if (!label_names.insert((*it)[1]).second) errors.push_back(where + "label repeated");
      }
      const bool histogram = f.type == "histogram";
      const bool name_ok = histogram ? (s.name == f.name + "_bucket" || s.name == f.name + "_sum" ||
                                        s.name == f.name + "_count")
                                     : s.name == f.name;
      if (!name_ok) errors.push_back(where + "sample does not belong to family " + f.name);
      if (label_names.contains("le") != (s.name == f.name + "_bucket" && histogram))
        errors.push_back(where + "le label misplaced");
      if (!series_keys.insert(s.name + block).second) errors.push_back(where + "duplicate series");
      f.samples.push_back(std::move(s));
    } else {
      errors.push_back(where + "does not match the exposition grammar");
    }
  }
  if (!pending_help_name.empty()) errors.push_back("trailing HELP without TYPE");
  for (const ParsedFamily& f : families)
    if (f.type == "histogram") check_histogram(f, errors);
  return families;
}

double sample_value(const std::vector<ParsedFamily>& families, const std::string& name,
                    const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const ParsedFamily& f : families)
    for (const ParsedSample& s : f.samples)
      if (s.name == name && s.labels == labels) return s.value;
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace serval::testing
