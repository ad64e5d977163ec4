// The wide search for a cuBLASLt product's algorithm (--gemm-search): a
// coordinate descent from the heuristic's two fastest candidates over each
// configuration field (tile, stages, split-K with its reduction, CTA
// swizzle, custom option, cluster shape), one field at a time, every
// configuration cuBLASLt accepts timed once; the fastest few are timed again.
//
// Why: decode GEMMs are skinny (tens to hundreds of token rows against
// thousands of outputs) and bound by the weight stream, a corner the
// heuristic's ranking serves unevenly: the search finds much faster
// configurations for some shapes. Its cost is the time to load and run each
// kernel once: 0.4-3 s per shape.
#include <algorithm>
#include <array>
#include <cfloat>
#include <iterator>
#include <map>
#include <vector>

#include "backend/cuda/cuda_matmul_search.h"

namespace serval::cuda {

namespace {

constexpr int kStarts = 2;      // descents, from the fastest distinct seeds
constexpr int kRounds = 3;      // passes over the fields per descent
constexpr int kFinalists = 8;   // timed again with more runs at the end
constexpr int kMaxCustom = 15;  // custom options tried per algorithm (the H200's offer up to 7)

using Key = std::array<uint64_t, sizeof(cublasLtMatmulAlgo_t::data) / sizeof(uint64_t)>;
Key key_of(const cublasLtMatmulAlgo_t& a) {
  Key k;
  std::copy(std::begin(a.data), std::end(a.data), k.begin());
  return k;
}

template <typename T>
T config_get(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written);
  return v;
}

template <typename T>
bool config_set(cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr, T v) {
  return cublasLtMatmulAlgoConfigSetAttribute(&a, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
}

template <typename T>
T cap_get(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoCapGetAttribute(&a, attr, &v, sizeof(v), &written);
  return v;
}

std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {};
  std::vector<uint32_t> v(bytes / sizeof(uint32_t));
  size_t written = 0;
  cublasLtMatmulAlgoCapGetAttribute(&a, attr, v.data(), bytes, &written);
  return v;
}

// The variants of `base` that change one configuration field, for every value
// its algorithm's capabilities allow (cublasLtMatmulAlgoCheck then says which
// of them fit the operands).
std::vector<LtAlgo> neighbours(const cublasLtMatmulAlgo_t& base) {
  std::vector<LtAlgo> out;
  auto vary = [&](auto attr, auto value) {
    cublasLtMatmulAlgo_t a = base;
    if (config_set(a, attr, value)) out.push_back({a});
  };
  for (uint32_t tile : cap_list(base, CUBLASLT_ALGO_CAP_TILE_IDS)) vary(CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
  for (uint32_t stages : cap_list(base, CUBLASLT_ALGO_CAP_STAGES_IDS)) vary(CUBLASLT_ALGO_CONFIG_STAGES_ID, stages);
  if (cap_get<int32_t>(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0) {
    const uint32_t schemes = cap_get<uint32_t>(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
    for (int32_t split : {1, 2, 3, 4, 6, 8, 12, 16}) {
      for (uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE), uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE),
                              uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                              uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
        // No split, no reduction; a split, one of the schemes the algorithm has.
        if ((split == 1) != (scheme == 0) || (scheme != 0 && (schemes & scheme) == 0)) continue;
        cublasLtMatmulAlgo_t a = base;
        if (config_set(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, split) &&
            config_set(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme))
          out.push_back({a});
      }
    }
  }
  if (cap_get<uint32_t>(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0)
    for (uint32_t s : {0u, 1u}) vary(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, s);
  const int32_t custom_max = std::min(cap_get<int32_t>(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX), kMaxCustom);
  for (int32_t c = 0; c <= custom_max; ++c) vary(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, uint32_t(c));
  for (int c = CUBLASLT_CLUSTER_SHAPE_AUTO; c < CUBLASLT_CLUSTER_SHAPE_END; ++c)
    if (c != 1) vary(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t(c));  // 1 is no shape
  return out;
}

}  // namespace

LtSearchResult search_lt_algo(const LtOperands& o, const std::vector<LtAlgo>& seeds, LtTimer& timer,
                              int final_runs) {
  LtSearchResult r;
  std::map<Key, float> timed;  // one cold run each (FLT_MAX: refused)
  std::vector<std::pair<float, LtAlgo>> ranked;
  auto try_algo = [&](const cublasLtMatmulAlgo_t& a) -> float {
    const Key k = key_of(a);
    if (auto it = timed.find(k); it != timed.end()) return it->second;
    cublasLtMatmulHeuristicResult_t check{};
    float ms = FLT_MAX;
    if (cublasLtMatmulAlgoCheck(o.lt, o.op, o.a, o.b, o.c, o.c, &a, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= o.ws_bytes) {
      ms = timer.time(a, 1);
      ++r.tried;
      if (ms < FLT_MAX) ranked.push_back({ms, LtAlgo{a}});
    }
    timed.emplace(k, ms);
    return ms;
  };
  auto by_time = [](const auto& x, const auto& y) { return x.first < y.first; };

  for (const LtAlgo& a : seeds) try_algo(a.algo);
  std::sort(ranked.begin(), ranked.end(), by_time);
  std::vector<LtAlgo> starts;
  for (size_t i = 0; i < ranked.size() && int(i) < kStarts; ++i) starts.push_back(ranked[i].second);
  for (const LtAlgo& start : starts) {
    cublasLtMatmulAlgo_t base = start.algo;
    float base_ms = try_algo(base);
    for (int round = 0; round < kRounds; ++round) {
      bool moved = false;
      for (const LtAlgo& a : neighbours(base)) {
        const float ms = try_algo(a.algo);
        if (ms < base_ms) {
          base_ms = ms;
          base = a.algo;
          moved = true;
        }
      }
      if (!moved) break;
    }
  }

  // One cold run ranks; the finalists' longer timing picks.
  std::sort(ranked.begin(), ranked.end(), by_time);
  for (size_t i = 0; i < ranked.size() && int(i) < kFinalists; ++i) {
    const float ms = timer.time(ranked[i].second.algo, final_runs);
    if (ms < r.best_ms) {
      r.best_ms = ms;
      r.algo = ranked[i].second.algo;
    }
  }
  return r;
}

LtConfig lt_config_of(const cublasLtMatmulAlgo_t& a) {
  LtConfig c;
  c.id = config_get<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID);
  c.tile = config_get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID);
  c.stages = config_get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID);
  c.split_k = config_get<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  c.reduction = config_get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  c.swizzle = config_get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
  c.custom = config_get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
  c.cluster = config_get<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  c.inner = config_get<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID);
  return c;
}

bool lt_algo_from_config(cublasLtHandle_t lt, cudaDataType_t ab, cudaDataType_t cd, const LtConfig& c,
                         cublasLtMatmulAlgo_t& a) {
  return cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, cd, cd, c.id, &a) ==
             CUBLAS_STATUS_SUCCESS &&
         config_set(a, CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile) && config_set(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages) &&
         config_set(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c.split_k) &&
         config_set(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c.reduction) &&
         config_set(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle) &&
         config_set(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom) &&
         config_set(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, c.cluster) &&
         config_set(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, c.inner);
}

std::string describe_lt_algo(const cublasLtMatmulAlgo_t& a) {
  const LtConfig c = lt_config_of(a);
  return "id " + std::to_string(c.id) + " tile " + std::to_string(c.tile) + " stages " + std::to_string(c.stages) +
         " split-k " + std::to_string(c.split_k) + " reduction " + std::to_string(c.reduction) + " swizzle " +
         std::to_string(c.swizzle) + " custom " + std::to_string(c.custom) + " cluster " + std::to_string(c.cluster);
}

}  // namespace serval::cuda
