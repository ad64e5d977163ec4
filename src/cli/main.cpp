// serval: the command-line entry point. Each subcommand lives in its own file
// under src/cli/ and registers itself here.
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  try {
    return serval::cli::run(argc, argv);
  } catch (const serval::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
