// serval random-model: a model of real shape with random weights, for benchmarks.
#include <chrono>
#include <iostream>

#include "cli/commands.h"
#include "core/dtype.h"
#include "model/random_model.h"

namespace serval::cli {

void register_random_model(CLI::App& app, Action& action) {
  struct Options { std::string like, dtype = "bf16", out; uint64_t seed = 0; };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("random-model", "Write a GGUF model of real shape with random weights");
  sub->add_option("--like", o->like, "llama-3.1-8b, llama-3.2-1b, llama-2-7b, qwen2.5-7b, or a config.json")->required();
  sub->add_option("--dtype", o->dtype, "weight type: bf16, f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k");
  sub->add_option("--seed", o->seed, "random seed");
  sub->add_option("--out,-o", o->out, "output .gguf path")->required();
  sub->callback([&action, o] {
    action = [o] {
      const auto t0 = std::chrono::steady_clock::now();
      write_random_model(o->like, parse_dtype(o->dtype), o->out, o->seed);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << "wrote " << o->out << " in " << s << " s\n";
      return 0;
    };
  });
}

}  // namespace serval::cli
