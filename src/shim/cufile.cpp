#include "shim/cufile.hpp"

#include "shim/dynamic_library.hpp"

namespace ferry::shim {
namespace {

template <class Fn>
bool resolve(void* library, const char* symbol, Fn& slot, std::string& why) {
  return shim::resolve(library, "libcufile", symbol, slot, why);
}

CuFileLibrary load_library() {
  CuFileLibrary l;
#ifdef _WIN32
  l.why_not_loaded = "cuFile is not available on Windows (NVIDIA ships it for Linux only)";
  return l;
#else
  void* library = open_vendor_library({"libcufile.so.0", "libcufile.so"}, l.why_not_loaded);
  if (library == nullptr) return l;
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
#endif
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
