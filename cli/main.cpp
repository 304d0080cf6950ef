// ferry: load safetensors checkpoints into GPU or host memory at the speed of the hardware.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.hpp"
#include "ferry/error.hpp"
#include "report.hpp"

namespace {

// Output that never arrived (a full disk, a closed pipe, /dev/full) is a failure: a script
// reading the digests or the JSON must not see exit 0 and nothing.
int check_stdout() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && !std::ferror(stdout)) return 0;
  std::fprintf(stderr, "ferry: error: cannot write to standard output: %s\n",
               error ? std::strerror(error) : "a write failed");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry: moves tensors between storage and GPU memory at the speed of the hardware"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ferry " FERRY_VERSION);
  ferry::cli::add_inspect(app);
  ferry::cli::add_load(app);
  ferry::cli::add_doctor(app);
  ferry::cli::add_demo(app);
  ferry::cli::add_kv(app);
  ferry::cli::add_plan(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return check_stdout() ? 1 : status;
  } catch (const ferry::Cancelled& e) {
    std::fprintf(stderr, "ferry: interrupted: %s\n", e.what());
    return 130;  // as a shell reports a command stopped by SIGINT
  } catch (const std::exception& e) {
    // Messages name tensors and paths from files: escaped like everything else shown.
    std::fprintf(stderr, "ferry: error: %s\n", ferry::cli::printable(e.what()).c_str());
    return 1;
  }
  return check_stdout();
}
