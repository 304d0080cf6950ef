#include "shim/nccl.hpp"

#ifndef _WIN32
#include <glob.h>
#endif

#include <cstdlib>
#include <vector>

#include "ferry/error.hpp"
#include "shim/dynamic_library.hpp"

namespace ferry::shim {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";

#ifndef _WIN32
// PyTorch's CUDA wheels bring NCCL as nvidia/nccl/lib/libnccl.so.2 inside site-packages.
std::vector<std::string> wheel_candidates() {
  std::vector<std::string> patterns;
  const char* suffix = "/nvidia/nccl/lib/libnccl.so.2";
  if (const char* pythonpath = std::getenv("PYTHONPATH")) {
    std::string all = pythonpath;
    for (std::size_t at = 0; at <= all.size();) {
      const std::size_t colon = all.find(':', at);
      const std::string dir =
          all.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
      if (!dir.empty()) patterns.push_back(dir + suffix);
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
  }
  if (const char* venv = std::getenv("VIRTUAL_ENV"))
    patterns.push_back(std::string(venv) + "/lib/python3*/site-packages" + suffix);
  if (const char* home = std::getenv("HOME"))
    patterns.push_back(std::string(home) + "/.local/lib/python3*/site-packages" + suffix);
  for (const char* prefix : {"/usr/local/lib/python3*/", "/usr/lib/python3*/", "/usr/lib/python3/",
                             "/opt/conda/lib/python3*/"})
    for (const char* kind : {"dist-packages", "site-packages"})
      patterns.push_back(std::string(prefix) + kind + suffix);
  std::vector<std::string> found;
  for (const auto& pattern : patterns) {
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
      for (std::size_t i = 0; i < g.gl_pathc; ++i) found.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  return found;
}
#endif

#ifdef _WIN32
// NCCL is not built for Windows: loads onto several GPUs say so instead of looking for it.
void* open_nccl(std::string&, std::string& why) {
  why = "NCCL is not available on Windows";
  return nullptr;
}
#else
void* open_nccl(std::string& path, std::string& why) {
  if (void* library = ::dlopen(kLibrary, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE)) {
    path = kLibrary;
    return library;
  }
  std::vector<std::string> candidates;
  if (const char* explicit_path = std::getenv("FERRY_NCCL_LIBRARY"))
    candidates.push_back(explicit_path);
  for (auto& c : wheel_candidates()) candidates.push_back(std::move(c));
  for (const auto& c : candidates)
    if (void* library = ::dlopen(c.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE)) {
      path = c;
      return library;
    }
  why = std::string("NCCL (") + kLibrary +
        ") was not found on the library path, in $FERRY_NCCL_LIBRARY or in a site-packages "
        "folder's nvidia/nccl/lib (PyTorch's CUDA wheels bring it)";
  return nullptr;
}
#endif

template <class Fn>
bool resolve(void* library, const char* symbol, Fn& slot, std::string& why) {
  return shim::resolve(library, kLibrary, symbol, slot, why);
}

NcclLibrary load_library() {
  NcclLibrary l;
  void* library = open_nccl(l.path, l.why_not_loaded);
  if (library == nullptr) return l;
  std::string& why = l.why_not_loaded;
  bool ok = resolve(library, "ncclGetVersion", l.ncclGetVersion, why);
  ok &= resolve(library, "ncclGetErrorString", l.ncclGetErrorString, why);
  ok &= resolve(library, "ncclCommInitAll", l.ncclCommInitAll, why);
  ok &= resolve(library, "ncclCommDestroy", l.ncclCommDestroy, why);
  ok &= resolve(library, "ncclCommAbort", l.ncclCommAbort, why);
  ok &= resolve(library, "ncclCommGetAsyncError", l.ncclCommGetAsyncError, why);
  ok &= resolve(library, "ncclAllGather", l.ncclAllGather, why);
  ok &= resolve(library, "ncclGroupStart", l.ncclGroupStart, why);
  ok &= resolve(library, "ncclGroupEnd", l.ncclGroupEnd, why);
  if (!ok) return l;
  l.ncclGetVersion(&l.version);
  l.loaded = true;
  return l;
}

}  // namespace

const NcclLibrary& NcclLibrary::get() {
  static const NcclLibrary library = load_library();
  return library;
}

std::string nccl_error_text(nccl::Result result) {
  const auto& l = NcclLibrary::get();
  const char* text = l.ncclGetErrorString ? l.ncclGetErrorString(result) : nullptr;
  return "NCCL error " + std::to_string(result) + " (" + (text ? text : "no description") + ")";
}

void nccl_check(nccl::Result result, const char* call) {
  if (result != nccl::kSuccess) [[unlikely]]
    detail::fail<CudaError>(call, " failed: ", nccl_error_text(result));
}

}  // namespace ferry::shim
