#include "runtime/cuda_tuning.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "core/error.h"

namespace serval {

namespace {

using AttnStream = CudaTuning::AttnStream;
using RopeInAttn = CudaTuning::RopeInAttn;
using PackedBlocks = CudaTuning::PackedBlocks;

struct IntRange {
  int CudaTuning::*field;
  int min, max;
};

struct Key {
  const char* name;
  std::variant<bool CudaTuning::*, IntRange, AttnStream CudaTuning::*, RopeInAttn CudaTuning::*,
               PackedBlocks CudaTuning::*>
      field;
};

const Key kKeys[] = {
    {"pdl", &CudaTuning::pdl},
    {"cutlass_gemm", &CudaTuning::cutlass_gemm},
    {"cutlass_rope_rows", IntRange{&CudaTuning::cutlass_rope_rows, 0, 64}},
    {"cutlass_swap", &CudaTuning::cutlass_swap},
    {"cutlass_swap_gated", &CudaTuning::cutlass_swap_gated},
    {"cutlass_two_ctas", &CudaTuning::cutlass_two_ctas},
    {"cutlass_w_prefetch", IntRange{&CudaTuning::cutlass_w_prefetch, 0, 64}},
    {"gate_up_interleaved", &CudaTuning::gate_up_interleaved},
    {"gemv_rope", &CudaTuning::gemv_rope},
    {"stacked_qkv", &CudaTuning::stacked_qkv},
    {"split_k", &CudaTuning::split_k},
    {"norm_fold", &CudaTuning::norm_fold},
    {"norm_elision", &CudaTuning::norm_elision},
    {"packed_blocks", &CudaTuning::packed_blocks},
    {"packed_int8_x", &CudaTuning::packed_int8_x},
    {"gemv_sms", IntRange{&CudaTuning::gemv_sms, 0, 1024}},
    {"attn_stream", &CudaTuning::attn_stream},
    {"rope_in_attn", &CudaTuning::rope_in_attn},
    {"attn_direct_split", &CudaTuning::attn_direct_split},
    {"attn_trigger", &CudaTuning::attn_trigger},
    {"fed_penalties", &CudaTuning::fed_penalties},
};

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char* expected) {
  fail("--cuda-tuning: bad value \"", value, "\" for ", key, " (expected ", expected, ")");
}

bool parse_bool(std::string_view key, std::string_view v) {
  if (v == "1" || v == "on" || v == "true") return true;
  if (v == "0" || v == "off" || v == "false") return false;
  bad_value(key, v, "1/0, on/off or true/false");
}

int parse_int(std::string_view key, std::string_view v, int min, int max) {
  const std::string expected = str_cat("an integer in [", min, ", ", max, "]");
  if (v.empty() || v.size() > 9) bad_value(key, v, expected.c_str());
  int n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') bad_value(key, v, expected.c_str());
    n = n * 10 + (c - '0');
  }
  if (n < min || n > max) bad_value(key, v, expected.c_str());
  return n;
}

void set(CudaTuning& t, const Key& k, std::string_view v) {
  std::visit(
      [&](auto field) {
        using F = decltype(field);
        if constexpr (std::is_same_v<F, bool CudaTuning::*>) {
          t.*field = parse_bool(k.name, v);
        } else if constexpr (std::is_same_v<F, IntRange>) {
          t.*field.field = parse_int(k.name, v, field.min, field.max);
        } else if constexpr (std::is_same_v<F, AttnStream CudaTuning::*>) {
          if (v == "auto") t.*field = AttnStream::kAuto;
          else if (v == "off" || v == "0") t.*field = AttnStream::kOff;
          else if (v == "always") t.*field = AttnStream::kAlways;
          else bad_value(k.name, v, "auto, off or always");
        } else {  // auto / on / off
          using E = std::remove_reference_t<decltype(t.*field)>;
          if (v == "auto") t.*field = E::kAuto;
          else if (v == "on" || v == "1") t.*field = E::kOn;
          else if (v == "off" || v == "0") t.*field = E::kOff;
          else bad_value(k.name, v, "auto, on or off");
        }
      },
      k.field);
}

}  // namespace

std::string cuda_tuning_keys() {
  std::string keys;
  for (const Key& k : kKeys) keys += (keys.empty() ? "" : ", ") + std::string(k.name);
  return keys;
}

CudaTuning parse_cuda_tuning(std::string_view spec) {
  CudaTuning t;
  if (spec.empty()) return t;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t end = std::min(spec.find(',', start), spec.size());
    const std::string_view entry = spec.substr(start, end - start);
    const size_t eq = entry.find('=');
    SERVAL_CHECK(eq != std::string_view::npos && eq > 0, "--cuda-tuning: \"", entry,
                 "\" is not key=value (keys: ", cuda_tuning_keys(), ")");
    const std::string_view key = entry.substr(0, eq), value = entry.substr(eq + 1);
    const Key* found = nullptr;
    for (const Key& k : kKeys)
      if (key == k.name) found = &k;
    SERVAL_CHECK(found != nullptr, "--cuda-tuning: unknown key \"", key, "\" (keys: ", cuda_tuning_keys(), ")");
    set(t, *found, value);
    start = end + 1;
  }
  return t;
}

}  // namespace serval
