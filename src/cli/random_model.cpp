// PLACEHOLDER during bring-up: replaced by the real subcommand in this change.
#include <iostream>

#include "cli/commands.h"

namespace serval::cli {

void register_random_model(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("random-model", "(not built yet)");
  sub->callback([&action] { action = [] { std::cerr << "random-model: not built yet\n"; return 2; }; });
}

}  // namespace serval::cli
