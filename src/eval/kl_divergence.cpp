#include "eval/kl_divergence.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace serval {

namespace {

constexpr char kMagic[8] = {'S', 'V', 'K', 'L', 'D', 'I', 'V', '1'};

// log_softmax(logits) into out, computed in double.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  double max = -INFINITY;
  for (float v : logits) max = std::max(max, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - max);
  const double log_z = std::log(sum) + max;
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - log_z;
}

}  // namespace

uint64_t token_hash(std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) {
    const auto u = uint32_t(t);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

LogprobWriter::LogprobWriter(const std::string& path, const LogprobFileHeader& header)
    : path_(path), header_(header) {
  f_ = std::fopen(path.c_str(), "wb");
  SERVAL_CHECK(f_ != nullptr, "cannot write the log-probabilities file \"", path, "\": ", std::strerror(errno));
  const int64_t fields[6] = {header.ctx,    header.chunks, header.rows_per_chunk,
                             header.vocab,  header.tokens, int64_t(header.token_hash)};
  SERVAL_CHECK(std::fwrite(kMagic, 1, 8, f_) == 8 && std::fwrite(fields, sizeof(int64_t), 6, f_) == 6,
               "cannot write \"", path, "\": ", std::strerror(errno));
}

LogprobWriter::~LogprobWriter() {
  if (f_) std::fclose(f_);
}

void LogprobWriter::add(std::span<const float> logits) {
  SERVAL_CHECK(int64_t(logits.size()) == header_.vocab, "a row of ", logits.size(), " logits for a vocabulary of ",
               header_.vocab);
  SERVAL_CHECK(rows_ < header_.chunks * header_.rows_per_chunk, "more rows than the header of \"", path_,
               "\" promises");
  log_softmax(logits, lp_);
  logp_.assign(lp_.begin(), lp_.end());
  SERVAL_CHECK(std::fwrite(logp_.data(), sizeof(float), logp_.size(), f_) == logp_.size(), "cannot write \"", path_,
               "\": ", std::strerror(errno));
  ++rows_;
}

void LogprobWriter::finish() {
  SERVAL_CHECK(rows_ == header_.chunks * header_.rows_per_chunk, "\"", path_, "\" got ", rows_, " rows of ",
               header_.chunks * header_.rows_per_chunk);
  const int rc = std::fclose(f_);
  f_ = nullptr;
  SERVAL_CHECK(rc == 0, "cannot write \"", path_, "\": ", std::strerror(errno));
}

LogprobReader::LogprobReader(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "rb");
  SERVAL_CHECK(f_ != nullptr, "cannot read the log-probabilities file \"", path, "\": ", std::strerror(errno));
  char magic[8] = {};
  int64_t fields[6] = {};
  SERVAL_CHECK(std::fread(magic, 1, 8, f_) == 8 && std::memcmp(magic, kMagic, 8) == 0 &&
                   std::fread(fields, sizeof(int64_t), 6, f_) == 6,
               "\"", path, "\" is not a file of `serval perplexity --kl-divergence-base`");
  header_ = {fields[0], fields[1], fields[2], fields[3], fields[4], uint64_t(fields[5])};
  SERVAL_CHECK(header_.ctx > 0 && header_.chunks > 0 && header_.rows_per_chunk > 0 && header_.vocab > 0 &&
                   header_.vocab <= (int64_t(1) << 24),
               "\"", path, "\" has a broken header");
  row_.resize(size_t(header_.vocab));
}

LogprobReader::~LogprobReader() {
  if (f_) std::fclose(f_);
}

std::span<const float> LogprobReader::next() {
  SERVAL_CHECK(rows_ < header_.chunks * header_.rows_per_chunk &&
                   std::fread(row_.data(), sizeof(float), row_.size(), f_) == row_.size(),
               "\"", path_, "\" ends after ", rows_, " rows of ", header_.chunks * header_.rows_per_chunk);
  ++rows_;
  return row_;
}

void KlStats::add(std::span<const float> base_logp, std::span<const float> logits) {
  SERVAL_CHECK(base_logp.size() == logits.size(), "the base has ", base_logp.size(), " log-probabilities a row, ",
               "this model ", logits.size(), " logits: not the same vocabulary");
  std::vector<double>& q = q_;
  log_softmax(logits, q);
  double kl = 0;
  size_t top_base = 0, top_this = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    const double p = double(base_logp[i]);
    kl += std::exp(p) * (p - q[i]);
    if (base_logp[i] > base_logp[top_base]) top_base = i;
    if (logits[i] > logits[top_this]) top_this = i;
  }
  kl_.push_back(std::max(kl, 0.0));  // (rounding can leave a tiny negative sum for equal distributions)
  same_top1_ += top_base == top_this;
}

double KlStats::mean() const {
  double s = 0;
  for (double v : kl_) s += v;
  return kl_.empty() ? 0.0 : s / double(kl_.size());
}

double KlStats::stderr_of_mean() const {
  if (kl_.size() < 2) return 0.0;
  const double m = mean();
  double ss = 0;
  for (double v : kl_) ss += (v - m) * (v - m);
  return std::sqrt(ss / double(kl_.size() - 1) / double(kl_.size()));
}

double KlStats::quantile(double q) const {
  if (kl_.empty()) return 0.0;
  std::vector<double> s = kl_;
  const size_t k = std::min(s.size() - 1, size_t(std::clamp(q, 0.0, 1.0) * double(s.size() - 1) + 0.5));
  std::nth_element(s.begin(), s.begin() + std::ptrdiff_t(k), s.end());
  return s[k];
}

}  // namespace serval
