// ggml tensor type ids, names and block layouts, as llama.cpp's ggml.h defines
// them. The reader needs the block size of every type, supported or not, so it
// can bounds-check a file's tensors before anyone asks for their data.
#include <array>
#include <optional>

#include "core/error.h"
#include "model/gguf.h"

namespace serval {

namespace {

struct Entry { uint32_t id; GgmlTypeTraits traits; };

// {id, {name, elements per block, bytes per block}}. Ids 4, 5 and 31..33, 36..38
// were removed from ggml and are not valid in GGUF files.
constexpr std::array<Entry, 32> kTypes = {{
    {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},      {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 36}},      {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},   {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},   {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}},  {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}},  {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},         {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},        {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},   {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},
}};

// The tensor types dtype_from_ggml maps, for its error message.
constexpr const char* kSupportedTypes = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t type) {
  for (const Entry& e : kTypes)
    if (e.id == type) return &e.traits;
  return nullptr;
}

std::string ggml_type_name(uint32_t type) {
  if (const GgmlTypeTraits* t = ggml_type_traits(type)) return t->name;
  return str_cat("type ", type);
}

std::optional<DType> supported_dtype_of_ggml(uint32_t type) {
  switch (type) {
    case uint32_t(GgmlType::F32): return DType::F32;
    case uint32_t(GgmlType::F16): return DType::F16;
    case uint32_t(GgmlType::BF16): return DType::BF16;
    case uint32_t(GgmlType::Q8_0): return DType::Q8_0;
    case uint32_t(GgmlType::Q4_0): return DType::Q4_0;
    case uint32_t(GgmlType::Q4_1): return DType::Q4_1;
    case uint32_t(GgmlType::Q5_0): return DType::Q5_0;
    case uint32_t(GgmlType::Q5_1): return DType::Q5_1;
    case uint32_t(GgmlType::Q2_K): return DType::Q2_K;
    case uint32_t(GgmlType::Q3_K): return DType::Q3_K;
    case uint32_t(GgmlType::Q4_K): return DType::Q4_K;
    case uint32_t(GgmlType::Q5_K): return DType::Q5_K;
    case uint32_t(GgmlType::Q6_K): return DType::Q6_K;
    default: return std::nullopt;
  }
}

DType dtype_from_ggml(uint32_t type, const std::string& tensor_name) {
  if (const std::optional<DType> t = supported_dtype_of_ggml(type)) return *t;
  fail("tensor \"", tensor_name, "\" has type ", ggml_type_name(type), ", which Serval does not support (supported: ",
       kSupportedTypes, ")");
}

uint32_t ggml_from_dtype(DType t) {
  switch (t) {
    case DType::F32: return uint32_t(GgmlType::F32);
    case DType::F16: return uint32_t(GgmlType::F16);
    case DType::BF16: return uint32_t(GgmlType::BF16);
    case DType::Q8_0: return uint32_t(GgmlType::Q8_0);
    case DType::Q4_0: return uint32_t(GgmlType::Q4_0);
    case DType::Q4_1: return uint32_t(GgmlType::Q4_1);
    case DType::Q5_0: return uint32_t(GgmlType::Q5_0);
    case DType::Q5_1: return uint32_t(GgmlType::Q5_1);
    case DType::Q2_K: return uint32_t(GgmlType::Q2_K);
    case DType::Q3_K: return uint32_t(GgmlType::Q3_K);
    case DType::Q4_K: return uint32_t(GgmlType::Q4_K);
    case DType::Q5_K: return uint32_t(GgmlType::Q5_K);
    case DType::Q6_K: return uint32_t(GgmlType::Q6_K);
    case DType::I8: return uint32_t(GgmlType::I8);
    case DType::I32: return uint32_t(GgmlType::I32);
    case DType::FP8_E4M3: break;
  }
  fail("dtype ", dtype_name(t), " cannot be stored in GGUF");
}

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "UINT8";
    case GgufType::INT8: return "INT8";
    case GgufType::UINT16: return "UINT16";
    case GgufType::INT16: return "INT16";
    case GgufType::UINT32: return "UINT32";
    case GgufType::INT32: return "INT32";
    case GgufType::FLOAT32: return "FLOAT32";
    case GgufType::BOOL: return "BOOL";
    case GgufType::STRING: return "STRING";
    case GgufType::ARRAY: return "ARRAY";
    case GgufType::UINT64: return "UINT64";
    case GgufType::INT64: return "INT64";
    case GgufType::FLOAT64: return "FLOAT64";
  }
  return "UNKNOWN";
}

}  // namespace serval
