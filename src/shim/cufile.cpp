#include "shim/cufile.hpp"

#include <dlfcn.h>

namespace ferry::shim {
namespace {

template <class Fn>
bool resolve(void* library, const char* name, Fn& slot, std::string& why) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  if (slot == nullptr && why.empty()) why = std::string("libcufile lacks ") + name;
  return slot != nullptr;
}

CuFileLibrary load_library() {
  CuFileLibrary l;
  void* library = nullptr;
  for (const char* name : {"libcufile.so.0", "libcufile.so"}) {
    library = ::dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
    if (library) break;
  }
  if (library == nullptr) {
    const char* err = ::dlerror();
    l.why_not_loaded = std::string("libcufile.so.0 was not found (") + (err ? err : "dlopen failed") + ")";
    return l;
  }
  std::string& why = l.why_not_loaded;
  bool ok = resolve(library, "cuFileDriverOpen", l.cuFileDriverOpen, why);
  ok &= resolve(library, "cuFileDriverGetProperties", l.cuFileDriverGetProperties, why);
  ok &= resolve(library, "cuFileGetParameterBool", l.cuFileGetParameterBool, why);
  ok &= resolve(library, "cuFileHandleRegister", l.cuFileHandleRegister, why);
  ok &= resolve(library, "cuFileHandleDeregister", l.cuFileHandleDeregister, why);
  ok &= resolve(library, "cuFileBufRegister", l.cuFileBufRegister, why);
  ok &= resolve(library, "cuFileBufDeregister", l.cuFileBufDeregister, why);
  ok &= resolve(library, "cuFileRead", l.cuFileRead, why);
  ok &= resolve(library, "cuFileWrite", l.cuFileWrite, why);
  ok &= resolve(library, "cuFileGetVersion", l.cuFileGetVersion, why);
  l.loaded = ok;
  return l;
}

}  // namespace

const CuFileLibrary& CuFileLibrary::get() {
  static const CuFileLibrary library = load_library();
  return library;
}

std::string cufile_error_text(cufile::Error error) {
  std::string text = "cuFile error " + std::to_string(error.err);
  if (error.err == cufile::kDriverNotInitialized)
    text += " (the nvidia-fs driver is not loaded and compatibility mode is not allowed)";
  if (error.cu_err != cu::kSuccess) text += ", CUDA " + cuda_error_text(error.cu_err);
  return text;
}

}  // namespace ferry::shim
