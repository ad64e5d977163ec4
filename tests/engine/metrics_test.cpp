#include "engine/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "core/error.h"
#include "exposition_checker.h"

namespace serval::metrics {
namespace {

using serval::testing::parse_exposition;
using serval::testing::sample_value;

TEST(Metrics, ExpositionOfASmallRegistryIsExact) {
  Registry r;
  Counter& requests = r.counter("test_requests_total", "Requests \\ handled.\nSecond line.");
  requests.inc();
  requests.inc(2.5);
  r.gauge("a_gauge", "A gauge.").set(-0.25);
  HistogramFamily& latency = r.histogram_family("latency_seconds", "Latency.", {"path"}, {0.1, 1, 10});
  Histogram& odd = latency.labels({"/v1/\"x\"\n\\"});
  odd.observe(0.1);  // le is inclusive
  odd.observe(0.5);
  odd.observe(5.0);
  odd.observe(100.0);
  latency.labels({"/a"}).observe(1.0);
  r.counter_family("zz_empty_total", "No children yet.", {"k"});

  // Written by hand from the text format 0.0.4 specification. Cross-checked
  // once against Python prometheus_client 0.26 for the same registry: same
  // lines, except that it puts le first and _count before _sum (both valid).
  const std::string expected =
      "# HELP a_gauge A gauge.\n"
      "# TYPE a_gauge gauge\n"
      "a_gauge -0.25\n"
      "# HELP latency_seconds Latency.\n"
      "# TYPE latency_seconds histogram\n"
      "latency_seconds_bucket{path=\"/a\",le=\"0.1\"} 0.0\n"
      "latency_seconds_bucket{path=\"/a\",le=\"1.0\"} 1.0\n"
      "latency_seconds_bucket{path=\"/a\",le=\"10.0\"} 1.0\n"
      "latency_seconds_bucket{path=\"/a\",le=\"+Inf\"} 1.0\n"
      "latency_seconds_sum{path=\"/a\"} 1.0\n"
      "latency_seconds_count{path=\"/a\"} 1.0\n"
      "latency_seconds_bucket{path=\"/v1/\\\"x\\\"\\n\\\\\",le=\"0.1\"} 1.0\n"
      "latency_seconds_bucket{path=\"/v1/\\\"x\\\"\\n\\\\\",le=\"1.0\"} 2.0\n"
      "latency_seconds_bucket{path=\"/v1/\\\"x\\\"\\n\\\\\",le=\"10.0\"} 3.0\n"
      "latency_seconds_bucket{path=\"/v1/\\\"x\\\"\\n\\\\\",le=\"+Inf\"} 4.0\n"
      "latency_seconds_sum{path=\"/v1/\\\"x\\\"\\n\\\\\"} 105.6\n"
      "latency_seconds_count{path=\"/v1/\\\"x\\\"\\n\\\\\"} 4.0\n"
      "# HELP test_requests_total Requests \\\\ handled.\\nSecond line.\n"
      "# TYPE test_requests_total counter\n"
      "test_requests_total 3.5\n"
      "# HELP zz_empty_total No children yet.\n"
      "# TYPE zz_empty_total counter\n";
  const std::string text = r.expose();
  EXPECT_EQ(text, expected);

  std::vector<std::string> errors;
  auto families = parse_exposition(text, errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  ASSERT_EQ(families.size(), 4u);
  EXPECT_EQ(families[3].help, "No children yet.");
  EXPECT_EQ(families[2].help, "Requests \\ handled.\nSecond line.");
  EXPECT_EQ(sample_value(families, "latency_seconds_count", {{"path", "/v1/\"x\"\n\\"}}), 4.0);
}

TEST(Metrics, ConstantLabelsComeFirst) {
  Registry r(Labels{{"model_name", "llama \"3\""}});
  r.counter_family("done_total", "Done.", {"finished_reason"}).labels({"stop"}).inc();
  r.gauge("up", "Up.").set(1);
  EXPECT_EQ(r.expose(),
            "# HELP done_total Done.\n"
            "# TYPE done_total counter\n"
            "done_total{model_name=\"llama \\\"3\\\"\",finished_reason=\"stop\"} 1.0\n"
            "# HELP up Up.\n"
            "# TYPE up gauge\n"
            "up{model_name=\"llama \\\"3\\\"\"} 1.0\n");
}

TEST(Metrics, LabelledChildrenAreStableAndSorted) {
  Registry r;
  CounterFamily& f = r.counter_family("req_total", "Requests.", {"code", "method"});
  Counter& a = f.labels({"500", "GET"});
  Counter& b = f.labels({"200", "POST"});
  EXPECT_EQ(&a, &f.labels({"500", "GET"}));
  a.inc(3);
  b.inc();
  f.labels({"200", "GET"});
  EXPECT_EQ(r.expose(),
            "# HELP req_total Requests.\n"
            "# TYPE req_total counter\n"
            "req_total{code=\"200\",method=\"GET\"} 0.0\n"
            "req_total{code=\"200\",method=\"POST\"} 1.0\n"
            "req_total{code=\"500\",method=\"GET\"} 3.0\n");
  EXPECT_THROW(f.labels({"200"}), Error);
}

TEST(Metrics, HistogramBucketMath) {
  Histogram h({1, 2, 5});
  for (double v : {-3.0, 0.0, 1.0, 1.0000001, 2.0, 4.9, 5.0, 5.1, 1e9}) h.observe(v);
  h.observe(std::numeric_limits<double>::quiet_NaN());  // ignored
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{3, 5, 7, 9}));
  EXPECT_EQ(s.count, 9u);
  EXPECT_DOUBLE_EQ(s.sum, -3.0 + 0 + 1 + 1.0000001 + 2 + 4.9 + 5 + 5.1 + 1e9);
  h.observe(std::numeric_limits<double>::infinity());
  s = h.snapshot();
  EXPECT_EQ(s.cumulative_counts.back(), 10u);
  EXPECT_TRUE(std::isinf(s.sum));

  Histogram no_buckets({});
  no_buckets.observe(7);
  EXPECT_EQ(no_buckets.snapshot().cumulative_counts, (std::vector<uint64_t>{1}));
}

TEST(Metrics, Buckets125) {
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(buckets_1_2_5(4096), (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}));
  EXPECT_EQ(buckets_1_2_5(1), (std::vector<double>{1}));
  EXPECT_TRUE(buckets_1_2_5(0.5).empty());
}

TEST(Metrics, ValuesArePrintedLikePythonFloatRepr) {
  // Python: repr(float(x)), which is what prometheus_client (and vLLM) emit.
  EXPECT_EQ(format_value(0), "0.0");
  EXPECT_EQ(format_value(-0.0), "-0.0");
  EXPECT_EQ(format_value(1), "1.0");
  EXPECT_EQ(format_value(2560), "2560.0");
  EXPECT_EQ(format_value(0.001), "0.001");
  EXPECT_EQ(format_value(0.0001), "0.0001");
  EXPECT_EQ(format_value(1e-5), "1e-05");
  EXPECT_EQ(format_value(1e15), "1000000000000000.0");
  EXPECT_EQ(format_value(1e16), "1e+16");
  EXPECT_EQ(format_value(1.5e300), "1.5e+300");
  EXPECT_EQ(format_value(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_value(123456.789), "123456.789");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(Metrics, AnAliasExposesTheSameFamilyUnderAnotherName) {
  Registry r(Labels{{"model_name", "m"}});
  r.counter("serval:tokens_total", "Tokens.").inc(3);
  r.histogram("serval:latency_seconds", "Latency.", {0.5}).observe(0.25);
  r.gauge("serval:other", "Not aliased.").set(1);
  r.add_alias("serval:tokens_total", "vllm:tokens_total");
  r.add_alias("serval:latency_seconds", "vllm:latency_seconds");
  const std::string text = r.expose();
  const std::string latency = "# HELP vllm:latency_seconds Latency.\n# TYPE vllm:latency_seconds histogram\n"
                              "vllm:latency_seconds_bucket{model_name=\"m\",le=\"0.5\"} 1.0\n";
  const std::string tokens = "# TYPE vllm:tokens_total counter\nvllm:tokens_total{model_name=\"m\"} 3.0\n";
  // In name order with the families.
  ASSERT_NE(text.find(latency), std::string::npos) << text;
  ASSERT_NE(text.find(tokens), std::string::npos) << text;
  EXPECT_LT(text.find("serval:tokens_total{"), text.find(latency));
  EXPECT_LT(text.find(latency), text.find(tokens));
  EXPECT_EQ(text.find("vllm:other"), std::string::npos);
  std::vector<std::string> errors;
  parse_exposition(text, errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_THROW(r.add_alias("serval:nothing", "vllm:nothing"), Error);
  EXPECT_THROW(r.add_alias("serval:other", "vllm:tokens_total"), Error);  // alias taken
  EXPECT_THROW(r.add_alias("serval:other", "serval:tokens_total"), Error);  // a family's name
  EXPECT_THROW(r.gauge("vllm:tokens_total", "a family on an alias's name"), Error);
  EXPECT_THROW(r.add_alias("serval:other", "bad name"), Error);
}

TEST(Metrics, RejectsBadRegistrations) {
  Registry r;
  r.counter("ok_total", "ok");
  EXPECT_THROW(r.counter("ok_total", "again"), Error);
  EXPECT_THROW(r.gauge("ok_total", "other type"), Error);
  EXPECT_THROW(r.gauge("9lives", "bad name"), Error);
  EXPECT_THROW(r.gauge("has-dash", "bad name"), Error);
  EXPECT_THROW(r.gauge("", "empty"), Error);
  EXPECT_THROW(r.counter_family("a_total", "bad label", {"__reserved"}), Error);
  EXPECT_THROW(r.counter_family("b_total", "bad label", {"a:b"}), Error);
  EXPECT_THROW(r.counter_family("c_total", "dup label", {"x", "x"}), Error);
  EXPECT_THROW(r.histogram_family("h", "le label", {"le"}, {1}), Error);
  EXPECT_THROW(r.histogram("h2", "unsorted", {1, 1}), Error);
  EXPECT_THROW(r.histogram("h3", "inf", {1, std::numeric_limits<double>::infinity()}), Error);
  r.histogram("lat", "ok", {1});
  EXPECT_THROW(r.counter("lat_count", "clashes with the histogram"), Error);
  r.gauge("g_sum", "a gauge");
  EXPECT_THROW(r.histogram("g", "clashes with g_sum", {1}), Error);
  EXPECT_THROW(Registry(Labels{{"x", "1"}, {"x", "2"}}), Error);
  Registry with_const(Labels{{"model_name", "m"}});
  EXPECT_THROW(with_const.counter_family("d_total", "reuses a constant label", {"model_name"}), Error);
  Counter& c = r.counter("e_total", "e");
  EXPECT_THROW(c.inc(-1), Error);
  EXPECT_THROW(c.inc(std::numeric_limits<double>::quiet_NaN()), Error);
  EXPECT_EQ(c.value(), 0.0);
  // Nothing half-registered: the exposition is still well-formed.
  std::vector<std::string> errors;
  parse_exposition(r.expose(), errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
}

TEST(Metrics, CheckerRejectsMalformedText) {
  // The checker must be able to fail, or the grammar tests prove nothing.
  const std::vector<std::string> bad = {
      "# HELP x X.\n# TYPE x counter\nx{a=\"b\"c=\"d\"} 1.0\n",      // missing comma
      "# HELP x X.\n# TYPE x counter\nx{a=\"b\"\"} 1.0\n",            // unescaped quote
      "# HELP x X.\n# TYPE x counter\nx 1.0 \n",                      // trailing space
      "# HELP x X.\n# TYPE x counter\nx inf\n",                       // bad value
      "# HELP x X.\n# TYPE x counter\ny 1.0\n",                       // wrong family
      "# HELP x X.\n# TYPE x gauge\nx 1.0",                           // no final newline
      "# HELP b B.\n# TYPE b gauge\n# HELP a A.\n# TYPE a gauge\n",   // order
      "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1.0\"} 2.0\nh_bucket{le=\"+Inf\"} 1.0\n"
      "h_sum 1.0\nh_count 1.0\n",                                     // counts decrease
      "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2.0\nh_sum 1.0\nh_count 1.0\n",
      "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1.0\"} 1.0\nh_sum 1.0\nh_count 1.0\n",
      "# HELP x X\\q.\n# TYPE x gauge\n",                              // bad help escape
  };
  for (const std::string& text : bad) {
    std::vector<std::string> errors;
    parse_exposition(text, errors);
    EXPECT_FALSE(errors.empty()) << text;
  }
}

TEST(Metrics, ConcurrentUpdatesAndScrapesNeverTear) {
  Registry r;
  Counter& counter = r.counter("events_total", "Events.");
  Gauge& gauge = r.gauge("level", "Level.");
  Histogram& hist = r.histogram("work_seconds", "Work.", {1, 2});
  CounterFamily& family = r.counter_family("by_kind_total", "By kind.", {"kind"});
  // The writer runs until the reader has scraped many times mid-update.
  constexpr int kScrapes = 300;
  std::atomic<bool> stop{false};
  std::atomic<int> updates{0};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      hist.observe(1.5);  // sum stays exactly 1.5 * count
      counter.inc();
      gauge.set(i);
      if (i % 1000 == 0 && i < 200000) family.labels({"k" + std::to_string(i / 1000)}).inc();
      updates = i + 1;
    }
  });
  struct JoinOnExit {  // also when an ASSERT returns early
    std::atomic<bool>& stop;
    std::thread& thread;
    ~JoinOnExit() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } join_on_exit{stop, writer};
  // On a loaded 2-core machine the writer may not have run yet; scraping only zeros would test
  // nothing (and CI once failed on exactly that).
  while (updates == 0) std::this_thread::yield();
  double last_counter = 0, last_count = 0;
  for (int scrape = 0; scrape < kScrapes; ++scrape) {
    const std::string text = r.expose();
    std::vector<std::string> errors;
    auto families = parse_exposition(text, errors);
    ASSERT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
    const double count = sample_value(families, "work_seconds_count", {});
    EXPECT_EQ(sample_value(families, "work_seconds_sum", {}), 1.5 * count);
    EXPECT_EQ(sample_value(families, "work_seconds_bucket", {{"le", "2.0"}}), count);
    EXPECT_EQ(sample_value(families, "work_seconds_bucket", {{"le", "1.0"}}), 0.0);
    const double c = sample_value(families, "events_total", {});
    EXPECT_GE(c, last_counter);
    EXPECT_GE(count, last_count);
    last_counter = c;
    last_count = count;
  }
  while (updates < 200000) std::this_thread::yield();
  stop = true;
  writer.join();
  EXPECT_GT(last_count, 0);
  EXPECT_EQ(counter.value(), updates.load());
  EXPECT_EQ(hist.snapshot().count, static_cast<uint64_t>(updates.load()));
  std::vector<std::string> errors;
  auto families = parse_exposition(r.expose(), errors);
  EXPECT_EQ(families[0].samples.size(), 200u);  // by_kind_total: k0..k199
}

}  // namespace
}  // namespace serval::metrics
