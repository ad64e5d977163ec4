#pragma once
// The serval subcommands. Each file cli/<name>.cpp defines register_<name>(),
// which adds its CLI11 subcommand and, when chosen, sets `action` to run it.
#include <CLI/CLI.hpp>
#include <functional>

namespace serval::cli {

using Action = std::function<int()>;

int run(int argc, char** argv);

void register_generate(CLI::App& app, Action& action);
void register_tokenize(CLI::App& app, Action& action);
void register_info(CLI::App& app, Action& action);
void register_convert(CLI::App& app, Action& action);
void register_random_model(CLI::App& app, Action& action);
void register_serve(CLI::App& app, Action& action);
void register_chat_template(CLI::App& app, Action& action);
void register_bench(CLI::App& app, Action& action);
void register_perplexity(CLI::App& app, Action& action);
void register_quantize(CLI::App& app, Action& action);
void register_grammar_sample(CLI::App& app, Action& action);

}  // namespace serval::cli
