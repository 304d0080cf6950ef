// ferry: load safetensors checkpoints into GPU or host memory at the speed of the hardware.
#include <cstdio>
#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ferry: moves tensors between storage and GPU memory at the speed of the hardware"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ferry " FERRY_VERSION);
  ferry::cli::add_inspect(app);
  ferry::cli::add_load(app);
  ferry::cli::add_doctor(app);
  ferry::cli::add_demo(app);
  ferry::cli::add_kv(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
