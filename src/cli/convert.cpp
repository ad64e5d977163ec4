// PLACEHOLDER during bring-up: replaced by the real subcommand in this change.
#include <iostream>

#include "cli/commands.h"

namespace serval::cli {

void register_convert(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("convert", "(not built yet)");
  sub->callback([&action] { action = [] { std::cerr << "convert: not built yet\n"; return 2; }; });
}

}  // namespace serval::cli
