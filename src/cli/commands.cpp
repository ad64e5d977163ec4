#include "cli/commands.h"

namespace serval::cli {

int run(int argc, char** argv) {
  CLI::App app{"serval: LLM inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  Action action;
  register_generate(app, action);
  register_tokenize(app, action);
  register_info(app, action);
  register_convert(app, action);
  register_random_model(app, action);
  register_serve(app, action);
  register_chat_template(app, action);
  register_bench(app, action);
  register_perplexity(app, action);
  register_quantize(app, action);
  register_grammar_sample(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return action ? action() : 0;
}

}  // namespace serval::cli
