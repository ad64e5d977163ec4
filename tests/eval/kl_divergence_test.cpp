// eval/kl_divergence: KL(base || this) per token against hand-computed values,
// top-token agreement, quantiles; the log-probabilities file written and read
// back, and refused where it is not one, is short, or gets too many rows.
#include "eval/kl_divergence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace serval {
namespace {

std::string temp_path(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

TEST(KlDivergence, AgainstHandComputedValues) {
  KlStats s;
  // Equal distributions: 0, same top token.
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f};
  const double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5));
  const std::vector<float> base = {float(1.0 - z), float(2.0 - z), float(0.5 - z)};
  s.add(base, logits);
  EXPECT_NEAR(s.mean(), 0.0, 1e-7);
  // Base (0.5, 0.5) against this (0.25, 0.75): 0.5 ln 2 + 0.5 ln(2/3); the top token differs (a tie goes to the first).
  const std::vector<float> half = {std::log(0.5f), std::log(0.5f)};
  const std::vector<float> skew = {std::log(0.25f), std::log(0.75f)};
  KlStats t;
  t.add(half, skew);
  EXPECT_NEAR(t.mean(), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-6);
  EXPECT_EQ(t.same_top1(), 0.0);
  s.add(half, skew);
  EXPECT_EQ(s.count(), 2);
  EXPECT_NEAR(s.same_top1(), 0.5, 1e-12);
  EXPECT_NEAR(s.quantile(1.0), t.mean(), 1e-6);
  EXPECT_NEAR(s.quantile(0.0), 0.0, 1e-7);
  EXPECT_THROW(s.add(half, logits), Error);  // vocabularies differ
}

TEST(KlDivergence, FileRoundTripAndRefusals) {
  const std::string path = temp_path("serval_kl_test.bin");
  const LogprobFileHeader h{8, 2, 3, 4, 16, token_hash(std::vector<int32_t>{1, 2, 3})};
  {
    LogprobWriter w(path, h);
    for (int i = 0; i < 6; ++i) w.add(std::vector<float>{float(i), 0.0f, 1.0f, 2.0f});
    EXPECT_THROW(w.add(std::vector<float>{0, 0, 0, 0}), Error);  // a seventh row
    EXPECT_THROW(w.add(std::vector<float>{0, 0}), Error);        // the wrong width
    w.finish();
  }
  LogprobReader r(path);
  EXPECT_EQ(r.header(), h);
  for (int i = 0; i < 6; ++i) {
    const std::span<const float> row = r.next();
    double sum = 0;
    for (float v : row) sum += std::exp(double(v));
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << i << " holds log-probabilities";
    EXPECT_NEAR(row[0] - row[1], float(i), 1e-5);
  }
  EXPECT_THROW(r.next(), Error);
  EXPECT_NE(token_hash(std::vector<int32_t>{1, 2, 3}), token_hash(std::vector<int32_t>{1, 2, 4}));

  {
    LogprobWriter short_file(temp_path("serval_kl_short.bin"), h);
    short_file.add(std::vector<float>{0, 0, 0, 0});
    EXPECT_THROW(short_file.finish(), Error);
  }
  std::ofstream(temp_path("serval_kl_other.bin")) << "not a log-probabilities file";
  try {
    LogprobReader bad(temp_path("serval_kl_other.bin"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a file of `serval perplexity --kl-divergence-base`"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(LogprobReader(temp_path("serval_kl_missing.bin")), Error);
  for (const char* f : {"serval_kl_test.bin", "serval_kl_short.bin", "serval_kl_other.bin"})
    std::filesystem::remove(temp_path(f));
}

}  // namespace
}  // namespace serval
