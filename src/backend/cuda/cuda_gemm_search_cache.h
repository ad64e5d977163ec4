// The results of --gemm-search kept across runs (--gemm-search-cache FILE):
// for each cuBLASLt product shape, the configuration the search picked, so a
// later run on the same GPU and cuBLASLt takes it at once instead of searching
// again (0.4-3 s per shape). Plain text, written by us and read back: a header
// line naming the device, then one line per shape, "key fields = config fields".
// (Host code only: no CUDA headers.)
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace serval::cuda {

// A cuBLASLt algorithm's configuration (cublasLtMatmulAlgoConfigAttributes_t).
struct LtConfig {
  int32_t id = 0;
  uint32_t tile = 0, stages = 0;
  int32_t split_k = 1;
  uint32_t reduction = 0, swizzle = 0, custom = 0;
  uint16_t cluster = 0, inner = 0;
  bool operator==(const LtConfig&) const = default;
};

class GemmSearchCache {
 public:
  // A product: its shape (GemmShape's 9 fields, tokens by bucket) and its
  // activation dtype (0 bf16, 1 f32).
  static constexpr int kKeyFields = 10;
  using Key = std::array<int64_t, kKeyFields>;

  // Reads `path` if it exists. A file written for another `device` (GPU, SM
  // count, cuBLASLt version) is set aside: its entries are not used, and the
  // first put() replaces it. Throws serval::Error naming the file and line
  // when a line is not one this class writes, and when `path` is a directory
  // or in one that does not exist.
  GemmSearchCache(std::string path, std::string device);

  std::optional<LtConfig> find(const Key& key) const;
  // Records key's configuration and rewrites the file (a temporary file, then
  // a rename: a reader never sees half of it). Throws if it cannot write.
  void put(const Key& key, const LtConfig& config);

  size_t size() const { return entries_.size(); }
  const std::string& path() const { return path_; }
  bool set_aside() const { return set_aside_; }  // the file was another device's

 private:
  std::string header() const;
  std::string path_, device_;
  std::map<Key, LtConfig> entries_;
  bool set_aside_ = false;
};

}  // namespace serval::cuda
