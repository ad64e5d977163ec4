#include "engine/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "core/error.h"

namespace serval::metrics {

// ---- metric types ---------------------------------------------------------

void Counter::inc(double amount) {
  SERVAL_CHECK(amount >= 0 && std::isfinite(amount),
               "a counter can only grow by a finite amount >= 0, got ", amount);
  value_.fetch_add(amount, std::memory_order_relaxed);
}

namespace {
void check_buckets(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    SERVAL_CHECK(std::isfinite(bounds[i]), "histogram bucket ", i, " is not finite (",
                 bounds[i], "); +Inf is implicit");
    SERVAL_CHECK(i == 0 || bounds[i - 1] < bounds[i], "histogram buckets must increase: ",
                 bounds[i - 1], " then ", bounds[i]);
  }
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_((check_buckets(upper_bounds), std::move(upper_bounds))),
      counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  if (std::isnan(value)) return;
  // Bucket i counts values <= bounds_[i] (Prometheus "le").
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.cumulative_counts = counts_;
    s.sum = sum_;
    s.count = count_;
  }
  for (size_t i = 1; i < s.cumulative_counts.size(); ++i)
    s.cumulative_counts[i] += s.cumulative_counts[i - 1];
  return s;
}

std::vector<double> buckets_1_2_5(double max_value) {
  std::vector<double> buckets;
  for (double scale = 1;; scale *= 10) {
    for (double mantissa : {1.0, 2.0, 5.0}) {
      if (mantissa * scale > max_value) return buckets;
      buckets.push_back(mantissa * scale);
    }
  }
}

const char* metric_type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

// ---- families ---------------------------------------------------------------

namespace {
template <typename Metric>
std::unique_ptr<Metric> make_child(const std::vector<double>&) {
  return std::make_unique<Metric>();
}
template <>
std::unique_ptr<Histogram> make_child<Histogram>(const std::vector<double>& buckets) {
  return std::make_unique<Histogram>(buckets);
}
}  // namespace

template <typename Metric>
Metric& Family<Metric>::labels(const std::vector<std::string>& values) {
  SERVAL_CHECK(values.size() == label_names_.size(), "metric ", name_, " has ",
               label_names_.size(), " labels, got ", values.size(), " values");
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<Metric>& child = children_[values];
  if (!child) child = make_child<Metric>(buckets_);
  return *child;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ---------------------------------------------------------------

struct Registry::Entry {
  MetricType type;
  std::unique_ptr<CounterFamily> counter;
  std::unique_ptr<GaugeFamily> gauge;
  std::unique_ptr<HistogramFamily> histogram;
};

Registry::Registry(Labels const_labels) : const_labels_(std::move(const_labels)) {
  std::set<std::string> seen;
  for (const auto& [name, value] : const_labels_) {
    SERVAL_CHECK(is_valid_label_name(name), "invalid constant label name '", name, "'");
    SERVAL_CHECK(seen.insert(name).second, "constant label '", name, "' given twice");
  }
}

Registry::~Registry() = default;

void Registry::check_new(const std::string& name, const std::vector<std::string>& label_names,
                         MetricType type) const {
  SERVAL_CHECK(is_valid_metric_name(name), "invalid metric name '", name, "'");
  SERVAL_CHECK(!families_.contains(name) && !aliases_.contains(name), "metric ", name, " is registered twice");
  // A histogram's series names must not clash with other families.
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (type == MetricType::kHistogram)
      SERVAL_CHECK(!families_.contains(name + suffix), "histogram ", name, " clashes with ",
                   name, suffix);
    std::string_view n = name;
    if (n.ends_with(suffix)) {
      auto it = families_.find(std::string(n.substr(0, n.size() - std::string_view(suffix).size())));
      SERVAL_CHECK(it == families_.end() || it->second->type != MetricType::kHistogram,
                   "metric ", name, " clashes with histogram ", it->first);
    }
  }
  std::set<std::string> seen;
  for (const auto& [const_name, value] : const_labels_) seen.insert(const_name);
  for (const std::string& label : label_names) {
    SERVAL_CHECK(is_valid_label_name(label), "metric ", name, ": invalid label name '", label, "'");
    SERVAL_CHECK(type != MetricType::kHistogram || label != "le", "histogram ", name,
                 " may not have a label named 'le'");
    SERVAL_CHECK(seen.insert(label).second, "metric ", name, ": label '", label,
                 "' given twice (or is a constant label)");
  }
}

CounterFamily& Registry::counter_family(std::string name, std::string help,
                                        std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_new(name, label_names, MetricType::kCounter);
  auto entry = std::make_unique<Entry>(Entry{MetricType::kCounter, {}, {}, {}});
  entry->counter.reset(new CounterFamily(name, std::move(help), std::move(label_names), {}));
  CounterFamily& family = *entry->counter;
  families_.emplace(std::move(name), std::move(entry));
  return family;
}

GaugeFamily& Registry::gauge_family(std::string name, std::string help,
                                    std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_new(name, label_names, MetricType::kGauge);
  auto entry = std::make_unique<Entry>(Entry{MetricType::kGauge, {}, {}, {}});
  entry->gauge.reset(new GaugeFamily(name, std::move(help), std::move(label_names), {}));
  GaugeFamily& family = *entry->gauge;
  families_.emplace(std::move(name), std::move(entry));
  return family;
}

HistogramFamily& Registry::histogram_family(std::string name, std::string help,
                                            std::vector<std::string> label_names,
                                            std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_new(name, label_names, MetricType::kHistogram);
  check_buckets(buckets);
  auto entry = std::make_unique<Entry>(Entry{MetricType::kHistogram, {}, {}, {}});
  entry->histogram.reset(
      new HistogramFamily(name, std::move(help), std::move(label_names), std::move(buckets)));
  HistogramFamily& family = *entry->histogram;
  families_.emplace(std::move(name), std::move(entry));
  return family;
}

Counter& Registry::counter(std::string name, std::string help) {
  return counter_family(std::move(name), std::move(help), {}).labels({});
}

Gauge& Registry::gauge(std::string name, std::string help) {
  return gauge_family(std::move(name), std::move(help), {}).labels({});
}

Histogram& Registry::histogram(std::string name, std::string help, std::vector<double> buckets) {
  return histogram_family(std::move(name), std::move(help), {}, std::move(buckets)).labels({});
}

void Registry::add_alias(const std::string& name, std::string alias) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = families_.find(name);
  SERVAL_CHECK(it != families_.end(), "metric alias ", alias, ": no metric named ", name);
  SERVAL_CHECK(is_valid_metric_name(alias), "invalid metric name '", alias, "'");
  SERVAL_CHECK(!families_.contains(alias) && !aliases_.contains(alias), "metric ", alias, " is registered twice");
  aliases_.emplace(std::move(alias), it->second.get());
}

// ---- exposition -------------------------------------------------------------

namespace {

// `{a="x",b="y"}` for the constant labels, the child's labels and an optional
// extra one (le); "" when there are none.
std::string label_block(const Labels& const_labels, const std::vector<std::string>& names,
                        const std::vector<std::string>& values, const char* extra_name = nullptr,
                        const std::string& extra_value = {}) {
  std::string out;
  auto add = [&out](std::string_view name, std::string_view value) {
    out += out.empty() ? "{" : ",";
    out += name;
    out += "=\"";
    out += escape_label_value(value);
    out += '"';
  };
  for (const auto& [name, value] : const_labels) add(name, value);
  for (size_t i = 0; i < names.size(); ++i) add(names[i], values[i]);
  if (extra_name) add(extra_name, extra_value);
  if (!out.empty()) out += '}';
  return out;
}

void sample(std::string& out, std::string_view name, const std::string& labels, double value) {
  out += name;
  out += labels;
  out += ' ';
  out += format_value(value);
  out += '\n';
}

}  // namespace

std::string Registry::expose() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mutex_);
  // Families and aliases together, in name order.
  std::vector<std::pair<const std::string*, const Entry*>> all;
  for (const auto& [name, entry] : families_) all.emplace_back(&name, entry.get());
  for (const auto& [alias, entry] : aliases_) all.emplace_back(&alias, entry);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
  for (const auto& [name, entry] : all) expose_family(out, *name, *entry);
  return out;
}

void Registry::expose_family(std::string& out, const std::string& name, const Entry& entry) const {
  auto header = [&](const std::string& help, MetricType type) {
    out += "# HELP " + name + " " + escape_help(help) + "\n";
    out += "# TYPE " + name + " " + metric_type_name(type) + "\n";
  };
  // Counters and gauges: one sample per child.
  auto single_values = [&](const auto& f) {
    header(f.help_, entry.type);
    std::lock_guard<std::mutex> family_lock(f.mutex_);
    for (const auto& [values, child] : f.children_)
      sample(out, name, label_block(const_labels_, f.label_names_, values), child->value());
  };
  switch (entry.type) {
    case MetricType::kCounter:
      single_values(*entry.counter);
      break;
    case MetricType::kGauge:
      single_values(*entry.gauge);
      break;
    case MetricType::kHistogram: {
      const HistogramFamily& f = *entry.histogram;
      header(f.help_, entry.type);
      std::lock_guard<std::mutex> family_lock(f.mutex_);
      for (const auto& [values, child] : f.children_) {
        const Histogram::Snapshot s = child->snapshot();
        const std::string bucket_name = name + "_bucket";
        for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
          const std::string le = i < s.upper_bounds.size() ? format_value(s.upper_bounds[i]) : "+Inf";
          sample(out, bucket_name, label_block(const_labels_, f.label_names_, values, "le", le),
                 static_cast<double>(s.cumulative_counts[i]));
        }
        const std::string labels = label_block(const_labels_, f.label_names_, values);
        sample(out, name + "_sum", labels, s.sum);
        sample(out, name + "_count", labels, static_cast<double>(s.count));
      }
      break;
    }
  }
}

// ---- formatting -------------------------------------------------------------

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Python's float repr: shortest round-trip digits, fixed notation for
  // decimal exponents in [-4, 16), scientific otherwise, ".0" on integers.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string_view sci(buf, end - buf);
  const std::string_view exp_text = sci.substr(sci.find('e') + 1);  // "+15", "-05"
  int exponent = 0;
  std::from_chars(exp_text.data() + (exp_text[0] == '+'), exp_text.data() + exp_text.size(), exponent);
  if (exponent < -4 || exponent >= 16) return std::string(sci);
  auto [fixed_end, fixed_ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed);
  std::string out(buf, fixed_end - buf);
  if (out.find('.') == std::string::npos) out += ".0";
  return out;
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {
bool is_alpha_(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

bool is_valid_metric_name(std::string_view name) {
  if (name.empty() || !(is_alpha_(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_alpha_(c) || is_digit(c) || c == ':'; });
}

bool is_valid_label_name(std::string_view name) {
  if (name.empty() || !is_alpha_(name[0]) || name.starts_with("__")) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return is_alpha_(c) || is_digit(c); });
}

}  // namespace serval::metrics
