#pragma once
// A small Prometheus metrics registry: counters, gauges and histograms, with
// optional labels, exposed in the text format 0.0.4.
//
// Threads: the engine thread updates while the HTTP thread scrapes. Counter and
// gauge updates are single atomic operations. A histogram observation takes the
// histogram's own mutex for a few increments, so a scrape never sees a bucket
// count that disagrees with _count or _sum; the scrape holds it only to copy
// those numbers. Creating a labelled child takes its family's mutex: look
// children up once and keep the reference (references stay valid for the
// registry's lifetime).
//
// Exposition order is deterministic: families by name, children by label
// values; within a histogram series, as the Go reference client: buckets with
// le as the last label, then _sum, then _count. Values are printed as Python's
// prometheus_client (and so vLLM) prints them: "1.0", "0.25", "1e-05", "+Inf".
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serval::metrics {

// Label name/value pairs, in the family's label-name order.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  // Adds `amount` (>= 0 and finite; throws serval::Error otherwise).
  void inc(double amount = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `upper_bounds`: finite, strictly increasing; +Inf is implicit (throws
  // serval::Error otherwise).
  explicit Histogram(std::vector<double> upper_bounds);

  // NaN is ignored (it fits no bucket and would poison _sum).
  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;          // without +Inf
    std::vector<uint64_t> cumulative_counts;   // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;  // consistent: last cumulative count == count

  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Buckets 1, 2, 5, 10, 20, 50, ... up to and including max_value (vLLM's
// build_1_2_5_buckets). Empty if max_value < 1.
std::vector<double> buckets_1_2_5(double max_value);

enum class MetricType { kCounter, kGauge, kHistogram };
const char* metric_type_name(MetricType type);

// All children of one metric name, one per distinct label-value tuple.
template <typename Metric>
class Family {
 public:
  // The child with these label values (one per label name, in order), created
  // on first use. Throws serval::Error on the wrong number of values.
  Metric& labels(const std::vector<std::string>& values);

  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> buckets)
      : name_(std::move(name)), help_(std::move(help)),
        label_names_(std::move(label_names)), buckets_(std::move(buckets)) {}

  const std::string name_, help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> buckets_;  // histograms only
  mutable std::mutex mutex_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  // `const_labels` are added first to every sample (e.g. model_name), like a
  // target label; their names may not be reused by a family.
  explicit Registry(Labels const_labels = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // Registration throws serval::Error on an invalid or already registered
  // name, invalid or duplicate label names, or (histograms) a label named
  // "le" or invalid buckets.
  CounterFamily& counter_family(std::string name, std::string help,
                                std::vector<std::string> label_names);
  GaugeFamily& gauge_family(std::string name, std::string help,
                            std::vector<std::string> label_names);
  HistogramFamily& histogram_family(std::string name, std::string help,
                                    std::vector<std::string> label_names,
                                    std::vector<double> buckets);

  // Unlabelled metrics: a family with its single child.
  Counter& counter(std::string name, std::string help);
  Gauge& gauge(std::string name, std::string help);
  Histogram& histogram(std::string name, std::string help, std::vector<double> buckets);

  // Exposes the registered family `name` a second time as `alias` (same
  // type, help and values; in name order with the families): compatibility
  // names for the same numbers (vLLM's). Throws serval::Error on an unknown
  // family or a name already in use.
  void add_alias(const std::string& name, std::string alias);

  // The text exposition format 0.0.4 (Content-Type below), ending in "\n".
  std::string expose() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Entry;
  void check_new(const std::string& name, const std::vector<std::string>& label_names,
                 MetricType type) const;
  void expose_family(std::string& out, const std::string& name, const Entry& entry) const;

  const Labels const_labels_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Entry>> families_;  // by name
  std::map<std::string, const Entry*> aliases_;              // by alias name
};

// Formatting helpers (exposed for tests and other exporters).
std::string format_value(double value);        // "1.0", "0.25", "+Inf", "NaN"
std::string escape_label_value(std::string_view value);  // \\, \", \n
std::string escape_help(std::string_view help);          // \\, \n
bool is_valid_metric_name(std::string_view name);        // [a-zA-Z_:][a-zA-Z0-9_:]*
bool is_valid_label_name(std::string_view name);         // [a-zA-Z_][a-zA-Z0-9_]*, no "__" prefix

}  // namespace serval::metrics
