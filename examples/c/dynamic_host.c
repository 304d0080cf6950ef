/* A host that calls ferry the way Go's syscall.LoadDLL (no cgo) or any FFI does: the library is
 * opened at run time by name (LoadLibraryW on Windows, dlopen elsewhere), every entry point is
 * looked up by name (GetProcAddress, dlsym) and called through a plain C function pointer with
 * plain C types: nothing is linked. ferry.h serves only for the struct layouts and prototypes.
 *
 *   dynamic_host LIBRARY CHECKPOINT   prints "name xxh3-64" per tensor, loaded to host memory */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ferry/ferry.h"

#ifdef _WIN32
#include <windows.h>
typedef HMODULE library_t;
static library_t open_library(const char* path) {
  wchar_t wide[1024]; /* UTF-8 in, UTF-16 for Windows */
  if (!MultiByteToWideChar(CP_UTF8, 0, path, -1, wide, 1024)) return NULL;
  return LoadLibraryW(wide);
}
static void* symbol(library_t library, const char* name) {
  return (void*)GetProcAddress(library, name);
}
#else
#include <dlfcn.h>
typedef void* library_t;
static library_t open_library(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static void* symbol(library_t library, const char* name) { return dlsym(library, name); }
#endif

/* Each entry point, looked up by its exported name into a pointer of its declared type. */
#define ENTRY(name)                                                  \
  __typeof__(&name) p_##name = (__typeof__(&name))symbol(lib, #name);   \
  if (!p_##name) {                                                      \
    fprintf(stderr, "dynamic_host: %s lacks %s\n", argv[1], #name);     \
    return 1;                                                           \
  }

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIBRARY CHECKPOINT\n", argv[0]);
    return 2;
  }
  library_t lib = open_library(argv[1]);
  if (!lib) {
    fprintf(stderr, "dynamic_host: cannot open %s\n", argv[1]);
    return 1;
  }
  ENTRY(ferry_version)
  ENTRY(ferry_last_error)
  ENTRY(ferry_checkpoint_open)
  ENTRY(ferry_checkpoint_free)
  ENTRY(ferry_checkpoint_tensor_count)
  ENTRY(ferry_checkpoint_tensor_info)
  ENTRY(ferry_load_options_init_sized)
  ENTRY(ferry_checkpoint_load)
  ENTRY(ferry_loaded_tensor_digest)
  ENTRY(ferry_loaded_free)

  printf("ferry %s\n", p_ferry_version());
  ferry_checkpoint* checkpoint = NULL;
  if (p_ferry_checkpoint_open(argv[2], &checkpoint) != FERRY_STATUS_OK) {
    fprintf(stderr, "dynamic_host: %s\n", p_ferry_last_error());
    return 1;
  }
  /* The library found at run time may be newer than this header: the sized init writes no more
   * than this program's struct holds. */
  ferry_load_options options;
  p_ferry_load_options_init_sized(&options, sizeof options);
  ferry_loaded* loaded = NULL;
  if (p_ferry_checkpoint_load(checkpoint, &options, &loaded) != FERRY_STATUS_OK) {
    fprintf(stderr, "dynamic_host: %s\n", p_ferry_last_error());
    p_ferry_checkpoint_free(checkpoint);
    return 1;
  }
  int status = 0;
  const size_t count = p_ferry_checkpoint_tensor_count(checkpoint);
  for (size_t i = 0; i < count && status == 0; ++i) {
    ferry_tensor_info info;
    memset(&info, 0, sizeof info);
    uint64_t digest = 0;
    if (p_ferry_checkpoint_tensor_info(checkpoint, i, &info) != FERRY_STATUS_OK ||
        p_ferry_loaded_tensor_digest(loaded, info.name, &digest) != FERRY_STATUS_OK) {
      fprintf(stderr, "dynamic_host: %s\n", p_ferry_last_error());
      status = 1;
    } else {
      printf("%s %016" PRIx64 "\n", info.name, digest);
    }
  }
  p_ferry_loaded_free(loaded);
  p_ferry_checkpoint_free(checkpoint);
  return status;
}
