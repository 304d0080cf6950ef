/* ferry.h is C: this file is compiled as C11 and drives the ABI as a C host would. It writes a
 * two-tensor safetensors file by hand, loads it into host memory and checks the bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

static int failures = 0;

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, \
              #cond, ferry_last_error());                            \
      ++failures;                                                    \
    }                                                                \
  } while (0)

static int write_checkpoint(const char* path) {
  const char header[] =
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}";
  const unsigned char data[5] = {1, 2, 3, 250, 251};
  unsigned char length[8] = {0};
  size_t n = sizeof header - 1;
  for (int i = 0; i < 8; ++i) length[i] = (unsigned char)(n >> (8 * i));
  FILE* f = fopen(path, "wb");
  if (!f) return 0;
  int ok = fwrite(length, 1, 8, f) == 8 && fwrite(header, 1, n, f) == n &&
           fwrite(data, 1, sizeof data, f) == sizeof data;
  return fclose(f) == 0 && ok;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCRATCH_FILE\n", argv[0]);
    return 2;
  }
  CHECK(write_checkpoint(argv[1]));
  ferry_checkpoint* checkpoint = NULL;
  CHECK(ferry_checkpoint_open(argv[1], &checkpoint) == FERRY_STATUS_OK);
  if (!checkpoint) return 1;
  CHECK(ferry_checkpoint_tensor_count(checkpoint) == 2);

  ferry_load_options options;
  ferry_load_options_init(&options);
  CHECK(options.struct_size == sizeof options);
  options.backend = "posix";
  ferry_loaded* loaded = NULL;
  CHECK(ferry_checkpoint_load(checkpoint, &options, &loaded) == FERRY_STATUS_OK);
  ferry_checkpoint_free(checkpoint);
  if (!loaded) return 1;
  void* data = NULL;
  uint64_t bytes = 0;
  CHECK(ferry_loaded_tensor_data(loaded, "b", &data, &bytes) == FERRY_STATUS_OK);
  CHECK(bytes == 2 && memcmp(data, "\xfa\xfb", 2) == 0);
  ferry_load_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(ferry_loaded_stats(loaded, &stats) == FERRY_STATUS_OK);
  CHECK(stats.tensor_bytes == 5 && stats.file_count == 1);
  CHECK(ferry_loaded_tensor_data(loaded, "missing", &data, &bytes) ==
        FERRY_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "missing") != NULL);
  ferry_loaded_free(loaded);
  remove(argv[1]);
  printf("%s\n", failures ? "C host: FAILED" : "C host: ok");
  return failures ? 1 : 0;
}
