// PLACEHOLDER during bring-up: replaced by the real subcommand in this change.
#include <iostream>

#include "cli/commands.h"

namespace serval::cli {

void register_info(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("info", "(not built yet)");
  sub->callback([&action] { action = [] { std::cerr << "info: not built yet\n"; return 2; }; });
}

}  // namespace serval::cli
