// serval quantize MODEL.gguf --to TYPE --out OUT.gguf: a float GGUF model with
// its weight matrices in a GGUF block type (model/quantize.h), loadable by
// Serval and llama.cpp. A matrix whose width the blocks do not divide keeps a
// wider type, with a warning that names it.
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "model/quantize.h"

namespace serval::cli {

void register_quantize(CLI::App& app, Action& action) {
  struct Options { std::string input, to, out; };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("quantize", "Write a GGUF model's weight matrices in a GGUF block type "
                                             "(round to nearest)");
  sub->add_option("input", o->input, "a GGUF model in f32, f16 or bf16 (serval convert writes one from a "
                                     "Hugging Face folder)")->required();
  sub->add_option("--to", o->to, "q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k or q6_k")->required();
  sub->add_option("--out,-o", o->out, "output .gguf path")->required();
  sub->callback([&action, o] {
    action = [o] {
      const auto t0 = std::chrono::steady_clock::now();
      const DType to = parse_dtype(o->to);
      int kept_wider = 0;
      for (const QuantizedTensor& t : quantize_gguf(o->input, o->out, to)) {
        if (t.note.empty()) continue;
        ++kept_wider;
        std::fprintf(stderr, "warning: %s stays %s, not %s: %s\n", t.name.c_str(),
                     std::string(dtype_name(t.to)).c_str(), std::string(dtype_name(to)).c_str(), t.note.c_str());
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "wrote %s (%s%s) in %.2f s\n", o->out.c_str(), std::string(dtype_name(to)).c_str(),
                   kept_wider > 0 ? ", some matrices wider: see the warnings" : "", s);
      return 0;
    };
  });
}

}  // namespace serval::cli
