// serval quantize MODEL.gguf --to TYPE --out OUT.gguf: a float GGUF model with
// its weight matrices in a GGUF block type (model/quantize.h), loadable by
// Serval and llama.cpp, or in one of Serval's own types (int8 per channel,
// int4 grouped, fp8 e4m3 per row; model/gguf_linear_formats.h), loadable by
// Serval. A matrix whose width the blocks or groups do not divide keeps a
// wider type, with a warning that names it.
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "model/quantize.h"

namespace serval::cli {

namespace {

struct Options {
  std::string input, to, out;
  int group_size = 0;  // 0: not given (int4's default, 128)
  bool symmetric = false, asymmetric = false;
};

// Serval's own formats for --to int8|int4|fp8; nullopt for a GGUF block type.
std::optional<LinearFormat> own_format(const Options& o) {
  using Kind = LinearFormat::Kind;
  const bool int4 = o.to == "int4";
  SERVAL_CHECK(int4 || (o.group_size == 0 && !o.symmetric && !o.asymmetric),
               "quantize: --group-size, --symmetric and --asymmetric are for --to int4, not --to ", o.to);
  SERVAL_CHECK(!(o.symmetric && o.asymmetric), "quantize: --symmetric and --asymmetric exclude each other");
  if (o.to == "int8") return LinearFormat{Kind::Int8PerChannel, DType::I8, 0, true};
  if (o.to == "fp8") return LinearFormat{Kind::Fp8, DType::FP8_E4M3, 0, true};
  if (!int4) {
    try {
      parse_dtype(o.to);
    } catch (const Error&) {
      fail("quantize: --to \"", o.to, "\" is not a type quantize writes (int8, int4, fp8, q8_0, q4_0, q4_1, ",
           "q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k)");
    }
    return std::nullopt;
  }
  const int g = o.group_size == 0 ? 128 : o.group_size;
  SERVAL_CHECK(g >= 2 && g % 2 == 0 && g <= 4096, "quantize: --group-size ", g,
               " must be even, from 2 to 4096 (32, 64 and 128 are usual)");
  return LinearFormat{Kind::Int4Grouped, DType::I8, g, o.symmetric};
}

int run_own(const Options& o, const LinearFormat& want) {
  int kept_wider = 0;
  for (const LinearQuantized& t : quantize_gguf_linear(o.input, o.out, want)) {
    if (t.note.empty()) continue;
    kept_wider += t.fallback ? 1 : 0;
    std::fprintf(stderr, "%s: %s is %s%s: %s\n", t.fallback ? "warning" : "note", t.name.c_str(),
                 t.format.describe().c_str(), t.fallback ? str_cat(", not ", want.describe()).c_str() : "",
                 t.note.c_str());
  }
  return kept_wider;
}

int run_block(const Options& o, DType to) {
  int kept_wider = 0;
  for (const QuantizedTensor& t : quantize_gguf(o.input, o.out, to)) {
    if (t.note.empty()) continue;
    ++kept_wider;
    std::fprintf(stderr, "warning: %s stays %s, not %s: %s\n", t.name.c_str(), std::string(dtype_name(t.to)).c_str(),
                 std::string(dtype_name(to)).c_str(), t.note.c_str());
  }
  return kept_wider;
}

}  // namespace

void register_quantize(CLI::App& app, Action& action) {
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("quantize", "Write a GGUF model's weight matrices in a GGUF block type or in "
                                             "Serval's int8, int4 or fp8 (round to nearest)");
  sub->add_option("input", o->input, "a GGUF model in f32, f16 or bf16 (serval convert writes one from a "
                                     "Hugging Face folder)")->required();
  sub->add_option("--to", o->to, "int8 (per output channel), int4 (grouped), fp8 (e4m3 per output channel): "
                                 "Serval's own types (docs/QUANTIZED_CHECKPOINTS.md); or a GGUF block type: q8_0, "
                                 "q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k")->required();
  sub->add_option("--group-size", o->group_size, "int4: inputs per scale (default 128; 32, 64, 128 are usual)");
  sub->add_flag("--symmetric", o->symmetric, "int4: no zero points (zero 8)");
  sub->add_flag("--asymmetric", o->asymmetric, "int4: a zero point per group (the default)");
  sub->add_option("--out,-o", o->out, "output .gguf path")->required();
  sub->callback([&action, o] {
    action = [o] {
      const auto t0 = std::chrono::steady_clock::now();
      const std::optional<LinearFormat> own = own_format(*o);
      const std::string what = own ? own->describe() : std::string(dtype_name(parse_dtype(o->to)));
      const int kept_wider = own ? run_own(*o, *own) : run_block(*o, parse_dtype(o->to));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "wrote %s (%s%s) in %.2f s\n", o->out.c_str(), what.c_str(),
                   kept_wider > 0 ? ", some matrices wider: see the warnings" : "", s);
      return 0;
    };
  });
}

}  // namespace serval::cli
