#pragma once
// A model against a base model, token by token, on the rows `serval
// perplexity` scores: one run with --kl-divergence-base FILE saves the base's
// log-probabilities of every scored row, a later run with --kl-divergence FILE
// (the quantized model, say) compares its own: the KL divergence KL(base ||
// this) per token (mean, median, 99th percentile, max) and how often both put
// the same token first. As llama.cpp's `perplexity --kl-divergence`.
//
// The file: the magic "SVKLDIV1", then six int64 (ctx, chunks, rows per
// chunk, vocab, the number of tokens and an FNV-1a hash of them, so a file of
// another text or tokenizer is refused), then chunks x rows x vocab float32
// log-probabilities, row after row.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace serval {

struct LogprobFileHeader {
  int64_t ctx = 0, chunks = 0, rows_per_chunk = 0, vocab = 0, tokens = 0;
  uint64_t token_hash = 0;
  bool operator==(const LogprobFileHeader&) const = default;
};

// FNV-1a over the token ids.
uint64_t token_hash(std::span<const int32_t> tokens);

class LogprobWriter {
 public:
  LogprobWriter(const std::string& path, const LogprobFileHeader& header);
  ~LogprobWriter();
  // Appends log_softmax(logits); throws serval::Error past the header's rows.
  void add(std::span<const float> logits);
  // Checks that every row the header promised was written, and closes.
  void finish();

 private:
  std::string path_;
  LogprobFileHeader header_;
  std::FILE* f_ = nullptr;
  int64_t rows_ = 0;
  std::vector<double> lp_;  // one row's log-probabilities, reused
  std::vector<float> logp_;
};

class LogprobReader {
 public:
  explicit LogprobReader(const std::string& path);
  ~LogprobReader();
  const LogprobFileHeader& header() const { return header_; }
  // The next row's log-probabilities; throws serval::Error where the file ends early.
  std::span<const float> next();

 private:
  std::string path_;
  LogprobFileHeader header_;
  std::FILE* f_ = nullptr;
  int64_t rows_ = 0;
  std::vector<float> row_;
};

// Per-token KL divergence and top-1 agreement of a model's logits against base log-probabilities.
class KlStats {
 public:
  void add(std::span<const float> base_logp, std::span<const float> logits);
  int64_t count() const { return int64_t(kl_.size()); }
  double mean() const;
  double stderr_of_mean() const;
  // q in [0, 1]: the q-quantile of the per-token divergences.
  double quantile(double q) const;
  double same_top1() const { return kl_.empty() ? 0.0 : double(same_top1_) / double(kl_.size()); }

 private:
  std::vector<double> kl_;
  int64_t same_top1_ = 0;
  std::vector<double> q_;  // one row's log-probabilities, reused
};

}  // namespace serval
