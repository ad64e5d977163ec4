// serval convert: llama2.c checkpoints and Hugging Face folders to GGUF.
#include <chrono>
#include <iostream>

#include "cli/commands.h"
#include "model/convert.h"

namespace serval::cli {

void register_convert(CLI::App& app, Action& action) {
  struct Options { std::string input, tokenizer, out; };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("convert", "Write a GGUF file from a llama2.c checkpoint or a Hugging Face folder");
  sub->add_option("input", o->input, "llama2.c .bin checkpoint or Hugging Face folder")->required();
  sub->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer.bin (for .bin checkpoints)");
  sub->add_option("--out,-o", o->out, "output .gguf path")->required();
  sub->callback([&action, o] {
    action = [o] {
      const auto t0 = std::chrono::steady_clock::now();
      convert_to_gguf(o->input, o->tokenizer, o->out);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << "wrote " << o->out << " in " << s << " s\n";
      return 0;
    };
  });
}

}  // namespace serval::cli
