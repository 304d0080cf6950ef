// ferry: load safetensors checkpoints into GPU or host memory at the speed of the hardware.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// windows.h first: shellapi.h needs its types.
#include <shellapi.h>
#endif

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

#ifdef _WIN32
// The arguments as UTF-8, ferry's one encoding for names: main's argv is in the ANSI code page,
// which cannot spell most non-ASCII file names.
std::vector<std::string> utf8_arguments() {
  int count = 0;
  wchar_t** wide = ::CommandLineToArgvW(::GetCommandLineW(), &count);
  std::vector<std::string> out;
  for (int i = 0; wide && i < count; ++i) {
    const int n = ::WideCharToMultiByte(CP_UTF8, 0, wide[i], -1, nullptr, 0, nullptr, nullptr);
    std::string arg(n > 0 ? static_cast<std::size_t>(n) : 1, '\0');
    if (n > 0) ::WideCharToMultiByte(CP_UTF8, 0, wide[i], -1, arg.data(), n, nullptr, nullptr);
    arg.resize(arg.size() - 1);  // the terminator WideCharToMultiByte counted
    out.push_back(std::move(arg));
  }
  if (wide) ::LocalFree(wide);
  return out;
}
#endif

}  // namespace

int main(int argc, char** argv) {
#ifdef _WIN32
  std::vector<std::string> arguments = utf8_arguments();
  std::vector<char*> utf8_argv;
  for (auto& a : arguments) utf8_argv.push_back(a.data());
  utf8_argv.push_back(nullptr);
  if (!arguments.empty()) {
    argc = static_cast<int>(arguments.size());
    argv = utf8_argv.data();
  }
  // Names and messages are printed as UTF-8; the console shows them so.
  ::SetConsoleOutputCP(CP_UTF8);
#endif
  CLI::App app{"ferry: moves tensors between storage and GPU memory at the speed of the hardware"};
  app.require_subcommand(1);
  // CLI11 reads "/name" as an option on Windows by default: paths such as /data/m.gguf (valid on
  // Windows too, and what Wine passes) must stay paths. Subcommands inherit this.
  app.allow_windows_style_options(false);
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
  } catch (const ferry::OutOfMemory& e) {
    // It names the file whose sizes asked for the memory.
    std::fprintf(stderr, "ferry: error: %s\n", ferry::cli::printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "ferry: error: out of memory: the sizes or counts given need more host memory "
                 "than this machine can give; try smaller ones\n");
    return 1;
  } catch (const std::exception& e) {
    // Messages name tensors and paths from files: escaped like everything else shown.
    std::fprintf(stderr, "ferry: error: %s\n", ferry::cli::printable(e.what()).c_str());
    return 1;
  }
  return check_stdout();
}
