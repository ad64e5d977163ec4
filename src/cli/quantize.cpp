// serval quantize MODEL.gguf --to TYPE --out OUT.gguf: a float GGUF model with
// its weight matrices in a GGUF block type (model/quantize.h), loadable by
// Serval and llama.cpp, or in one of Serval's own types (int8 per channel,
// int4 grouped, fp8 e4m3 per row; model/gguf_linear_formats.h), loadable by
// Serval. A matrix whose width the blocks or groups do not divide keeps a
// wider type, with a warning that names it. With --calibration, the float
// model first runs over a text and each layer's linears are scaled by their
// inputs' magnitudes before rounding (model/awq.h).
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "eval/calibration.h"
#include "model/gguf.h"
#include "model/model_loader.h"
#include "model/quantize.h"

namespace serval::cli {

namespace {

struct Options {
  std::string input, to, out;
  int group_size = 0;  // 0: not given (int4's default, 128)
  bool symmetric = false, asymmetric = false;
  CalibrationOptions calibration;  // file "": round to nearest only
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

// The calibrated scaling of every layer, logged per group.
FloatWeights calibrate(const Options& o, const LinearFormat& want) {
  const ModelConfig cfg = load_model(o.input).config;
  const auto t0 = std::chrono::steady_clock::now();
  const CalibrationResult cal = run_calibration(o.input, awq_input_names(cfg), o.calibration);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "calibration: %lld tokens of %s (windows of %lld), perplexity %.4f, in %.1f s\n",
               (long long)cal.tokens, o.calibration.file.c_str(), (long long)std::min(o.calibration.ctx, cal.tokens),
               cal.perplexity, run_s);
  FloatWeights w = read_layer_tensors(o.input, cfg.num_layers);
  for (const AwqChoice& c : awq_scale_model(w, cfg, cal.stats, want)) {
    const double pct = c.err_rtn > 0 ? 100.0 * (c.err_clip / c.err_rtn - 1) : 0.0;
    if (c.err_clip != c.err_awq)  // int4: scaled, then clipped
      std::fprintf(stderr, "calibration: %-16s alpha %.2f  clip %.3f  output error %.4g -> %.4g -> %.4g (%.1f%%)\n",
                   c.group.c_str(), c.alpha, c.mean_clip, c.err_rtn, c.err_awq, c.err_clip, pct);
    else
      std::fprintf(stderr, "calibration: %-16s alpha %.2f  output error %.4g -> %.4g (%.1f%%)\n", c.group.c_str(),
                   c.alpha, c.err_rtn, c.err_clip, pct);
  }
  return w;
}

int run_own(const Options& o, const LinearFormat& want) {
  int kept_wider = 0;
  FloatWeights scaled;
  if (!o.calibration.file.empty()) scaled = calibrate(o, want);
  for (const LinearQuantized& t :
       quantize_gguf_linear(o.input, o.out, want, o.calibration.file.empty() ? nullptr : &scaled)) {
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
  sub->add_option("--calibration", o->calibration.file,
                  "int8, int4, fp8: a UTF-8 text the float model runs over (on the CPU) first; each layer's linears "
                  "are then scaled by their inputs' magnitudes before rounding (activation-aware, AWQ-style), the "
                  "inverse folded into the norm or matrix before them");
  sub->add_option("--calibration-tokens", o->calibration.tokens,
                  "calibration: at most this many of the text's first tokens (default 4096)");
  sub->add_option("--ctx", o->calibration.ctx, "calibration: tokens per window (default 512)");
  sub->add_option("--threads", o->calibration.threads, "calibration: CPU threads (default: all cores)");
  sub->add_option("--out,-o", o->out, "output .gguf path")->required();
  sub->callback([&action, o] {
    action = [o] {
      const auto t0 = std::chrono::steady_clock::now();
      const std::optional<LinearFormat> own = own_format(*o);
      SERVAL_CHECK(own || o->calibration.file.empty(), "quantize: --calibration is for --to int8, int4 and fp8, not --to ",
                   o->to);
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
