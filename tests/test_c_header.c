/* ferry.h is C: this file is compiled as C11 and drives the ABI as a C host would. It writes a
 * two-tensor safetensors file by hand, loads it into host memory and checks the bytes; then it
 * drives the KV store (FERRY_0.3) in host memory: sync and async puts and gets, per-layer pieces,
 * lookup, contains, remove and statistics; then streams three groups through two host slots and
 * an expert cache of two slots. */
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

static int callbacks = 0;
static size_t callback_ok = 0;

static void on_done(void* user_data, const ferry_kv_result* results, size_t count) {
  size_t i;
  callbacks += *(int*)user_data;
  for (i = 0; i < count; ++i) callback_ok += results[i].status == FERRY_KV_OK;
}

static void kv_store_from_c(const char* scratch) {
  char root[4096];
  unsigned char bytes[3][8192], back[3][8192];
  uint64_t keys[3];
  ferry_kv_piece in_pieces[4], out_pieces[3];
  ferry_kv_block in_blocks[3], out_blocks[3];
  ferry_kv_result results[3];
  ferry_kv_options options;
  ferry_kv_store* store = NULL;
  ferry_kv_ticket* ticket = NULL;
  ferry_kv_stats stats;
  uint8_t present[4];
  size_t hits = 0, i, j;
  int one = 1, ready = 0;
  const char* message = NULL;

  snprintf(root, sizeof root, "%s.kv", scratch);
  ferry_kv_options_init(&options);
  CHECK(options.struct_size == sizeof options && options.world_size == 1);
  options.model = "c-host";
  options.dtype = "u8";
  options.capacity_bytes = 16 * 8192;
  options.block_bytes = 8192;
  CHECK(ferry_kv_open(root, &options, &store) == FERRY_STATUS_OK);
  if (!store) return;
  for (i = 0; i < 3; ++i) {
    keys[i] = ferry_kv_key(&i, sizeof i);
    for (j = 0; j < 8192; ++j) bytes[i][j] = (unsigned char)(i * 31 + j * 7);
    memset(back[i], 0, sizeof back[i]);
    out_pieces[i].memory = back[i];
    out_pieces[i].length = 8192;
    out_pieces[i].device = "cpu";
    out_blocks[i].pieces = &out_pieces[i];
    out_blocks[i].piece_count = 1;
  }
  /* Block 0 in two pieces (two "layers"), gathered into one write. */
  in_pieces[0].memory = bytes[0];
  in_pieces[0].length = 4096;
  in_pieces[0].device = NULL;
  in_pieces[1].memory = bytes[0] + 4096;
  in_pieces[1].length = 4096;
  in_pieces[1].device = "cpu";
  in_blocks[0].pieces = in_pieces;
  in_blocks[0].piece_count = 2;
  for (i = 1; i < 3; ++i) {
    in_pieces[i + 1].memory = bytes[i];
    in_pieces[i + 1].length = 8192;
    in_pieces[i + 1].device = NULL;
    in_blocks[i].pieces = &in_pieces[i + 1];
    in_blocks[i].piece_count = 1;
  }
  /* Sync put of two blocks, async put of the third with a callback. */
  CHECK(ferry_kv_put(store, keys, in_blocks, 2, NULL, results) == FERRY_STATUS_OK);
  CHECK(results[0].status == FERRY_KV_OK || results[0].status == FERRY_KV_ALREADY_PRESENT);
  CHECK(results[0].route == FERRY_KV_ROUTE_HOST || results[0].status != FERRY_KV_OK);
  CHECK(ferry_kv_put_async(store, keys + 2, in_blocks + 2, 1, NULL, on_done, &one, &ticket) ==
        FERRY_STATUS_OK);
  CHECK(ferry_kv_ticket_wait(ticket, -1, &ready) == FERRY_STATUS_OK && ready == 1);
  CHECK(callbacks == 1);
  CHECK(ferry_kv_ticket_result(ticket, 0, &results[2], &message) == FERRY_STATUS_OK);
  CHECK(message != NULL);
  CHECK(ferry_kv_ticket_result(ticket, 1, NULL, NULL) == FERRY_STATUS_INVALID_ARGUMENT);
  ferry_kv_ticket_free(ticket);
  CHECK(ferry_kv_lookup(store, keys, 3, &hits) == FERRY_STATUS_OK && hits == 3);
  /* Async get of all three: bit-exact. */
  CHECK(ferry_kv_get_async(store, keys, out_blocks, 3, on_done, &one, &ticket) == FERRY_STATUS_OK);
  CHECK(ferry_kv_ticket_wait(ticket, 60000, &ready) == FERRY_STATUS_OK && ready == 1);
  CHECK(callbacks == 2 && callback_ok >= 3);
  ferry_kv_ticket_free(ticket);
  for (i = 0; i < 3; ++i) CHECK(memcmp(back[i], bytes[i], 8192) == 0);
  /* A wrong size is that key's status, with the message in ferry_last_error. */
  out_pieces[0].length = 100;
  CHECK(ferry_kv_get(store, keys, out_blocks, 1, results) == FERRY_STATUS_OK);
  CHECK(results[0].status == FERRY_KV_BAD_SIZE);
  CHECK(strstr(ferry_last_error(), "100") != NULL);
  CHECK(ferry_kv_remove(store, keys + 1, 1, results) == FERRY_STATUS_OK);
  CHECK(results[0].status == FERRY_KV_OK);
  CHECK(ferry_kv_contains(store, keys, 3, present) == FERRY_STATUS_OK);
  CHECK(present[0] == 1 && present[1] == 0 && present[2] == 1);
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(ferry_kv_stats_get(store, &stats) == FERRY_STATUS_OK);
  CHECK(stats.blocks == 2 && stats.block_bytes == 8192 && stats.capacity_blocks == 16);
  CHECK(ferry_kv_put(store, NULL, in_blocks, 1, NULL, results) == FERRY_STATUS_INVALID_ARGUMENT);
  ferry_kv_free(store);
  /* Reopened with another block size: a clear error. */
  options.block_bytes = 4096;
  CHECK(ferry_kv_open(root, &options, &store) == FERRY_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "block size") != NULL);
}

/* Three groups of two tensors (group g's bytes are g+1 and 10+g), prefetch 2, two passes. */
static void weight_stream(void) {
  unsigned char bytes[3][2][300];
  ferry_stream_tensor tensors[6];
  size_t counts[3] = {2, 2, 2};
  for (int g = 0; g < 3; ++g)
    for (int t = 0; t < 2; ++t) {
      memset(bytes[g][t], t ? 10 + g : g + 1, sizeof bytes[g][t]);
      ferry_stream_tensor* x = &tensors[2 * g + t];
      memset(x, 0, sizeof *x);
      x->size = t ? 300 : 100;
      x->host = bytes[g][t];
    }
  ferry_stream_options options;
  ferry_stream_options_init(&options);
  CHECK(options.struct_size == sizeof options);
  ferry_weight_stream* stream = NULL;
  CHECK(ferry_weight_stream_create(tensors, counts, 3, 4, &options, &stream) ==
        FERRY_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "prefetch") != NULL);
  CHECK(ferry_weight_stream_create(tensors, counts, 3, 2, &options, &stream) == FERRY_STATUS_OK);
  if (!stream) return;
  size_t slots = 0;
  uint64_t slot_bytes[4] = {0};
  CHECK(ferry_weight_stream_slots(stream, &slots, slot_bytes, 4) == FERRY_STATUS_OK);
  CHECK(slots == 2 && slot_bytes[0] == 256 + 300);
  CHECK(ferry_weight_stream_prime(stream, NULL) == FERRY_STATUS_OK);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t g = 0; g < 3; ++g) {
      void* a = NULL;
      void* b = NULL;
      CHECK(ferry_weight_stream_wait(stream, g, NULL) == FERRY_STATUS_OK);
      CHECK(ferry_weight_stream_tensor_address(stream, g, 0, &a) == FERRY_STATUS_OK);
      CHECK(ferry_weight_stream_tensor_address(stream, g, 1, &b) == FERRY_STATUS_OK);
      CHECK(a && memcmp(a, bytes[g][0], 100) == 0);
      CHECK(b && memcmp(b, bytes[g][1], 300) == 0);
      CHECK(ferry_weight_stream_release(stream, g, NULL) == FERRY_STATUS_OK);
    }
  void* none = NULL;
  CHECK(ferry_weight_stream_tensor_address(stream, 3, 0, &none) == FERRY_STATUS_INVALID_ARGUMENT);
  ferry_stream_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(ferry_weight_stream_stats(stream, &stats) == FERRY_STATUS_OK);
  /* slot 0 alternates groups 0 and 2 (a fill per release); group 1 keeps slot 1 */
  CHECK(stats.hits == 6 && stats.demand_fills == 0 && stats.fills == 2 + 2 * 2);
  ferry_weight_stream_free(stream);

  ferry_expert_cache* cache = NULL;
  CHECK(ferry_expert_cache_create(tensors, counts, 3, 2, FERRY_EVICTION_LRU, &options, &cache) ==
        FERRY_STATUS_OK);
  if (!cache) return;
  const size_t trace[] = {2, 0, 2, 1};
  for (int i = 0; i < 4; ++i) {
    size_t slot = 99;
    void* at = NULL;
    CHECK(ferry_expert_cache_acquire(cache, &trace[i], 1, NULL, 0, NULL, &slot) ==
          FERRY_STATUS_OK);
    CHECK(ferry_expert_cache_slot_address(cache, slot, &at) == FERRY_STATUS_OK);
    CHECK(at && memcmp(at, bytes[trace[i]][0], 100) == 0);
    CHECK(ferry_expert_cache_release(cache, &trace[i], 1) == FERRY_STATUS_OK);
  }
  CHECK(ferry_expert_cache_stats(cache, &stats) == FERRY_STATUS_OK);
  CHECK(stats.hits == 1 && stats.misses == 3 && stats.evictions == 1);
  ferry_expert_cache_free(cache);
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
  kv_store_from_c(argv[1]);
  weight_stream();
  printf("%s\n", failures ? "C host: FAILED" : "C host: ok");
  return failures ? 1 : 0;
}
