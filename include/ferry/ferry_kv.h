/* ferry's C ABI: the KV block store. Part of ferry.h, which includes it (and which it includes:
 * the status codes, FERRY_API and the handles it shares come from there). */
#ifndef FERRY_FERRY_KV_H
#define FERRY_FERRY_KV_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The KV block store (FERRY_0.3) ----
 * Attention KV blocks on local storage, crash-safe (see ferry/kv_store.hpp). A namespace (model,
 * dtype, block layout, tensor-parallel rank and world size) is one directory under the root.
 * Keys are 64-bit; ferry_kv_key hashes a byte string into one. A block is one memory piece or a
 * list of pieces (per-layer K and V pages) gathered into one write and scattered from one read;
 * pieces are in host memory ("cpu") or GPU memory ("cuda:N"). Results are per key. */

typedef struct ferry_kv_store ferry_kv_store;
typedef struct ferry_kv_ticket ferry_kv_ticket;

typedef enum ferry_kv_status {
  FERRY_KV_OK = 0,
  FERRY_KV_ALREADY_PRESENT = 1, /* put: stored before; the stored block is kept */
  FERRY_KV_MISSING = 2,         /* get/remove: not stored (or dropped: it failed its checksum) */
  FERRY_KV_BAD_SIZE = 3,        /* the pieces' total does not fit the block / stored length */
  FERRY_KV_NO_SPACE = 4,        /* put: every slot is busy with reads or writes in flight */
  FERRY_KV_IO_ERROR = 5,
  FERRY_KV_UNSUPPORTED = 6,     /* the path asked for cannot run here */
  FERRY_KV_READ_ONLY = 7        /* a write through a reader */
} ferry_kv_status;

/* The path a block's bytes took. */
typedef enum ferry_kv_route {
  FERRY_KV_ROUTE_NONE = 0,
  FERRY_KV_ROUTE_HOST = 1,
  FERRY_KV_ROUTE_STAGED = 2,
  FERRY_KV_ROUTE_CUFILE_GDS = 3,
  FERRY_KV_ROUTE_CUFILE_COMPAT = 4,
  FERRY_KV_ROUTE_PAGE_CACHE_DMA = 5 /* GPU memory straight from registered page-cache pages */
} ferry_kv_route;

/* How blocks in GPU memory move: AUTO (cuFile only where it does true GPUDirect Storage, else
 * staged), STAGED (pinned host staging and O_DIRECT) or DIRECT (cuFile). */
typedef enum ferry_kv_path {
  FERRY_KV_PATH_AUTO = 0,
  FERRY_KV_PATH_STAGED = 1,
  FERRY_KV_PATH_DIRECT = 2
} ferry_kv_path;

typedef struct ferry_kv_options {
  size_t struct_size; /* sizeof(ferry_kv_options), set by _init (fields are added at the end) */
  const char* model;  /* the namespace: NULL is "" */
  const char* dtype;
  const char* block_layout;
  int32_t tp_rank;
  int32_t world_size;      /* _init: 1 */
  uint64_t capacity_bytes; /* required: slots = capacity / block size rounded up to 4 KiB */
  uint64_t block_bytes;    /* required */
  int32_t gpu_path;        /* a ferry_kv_path */
  int32_t allow_compat;    /* nonzero: DIRECT may run in cuFile's compatibility mode */
  int32_t read_only;       /* nonzero: a reader (no lock, follows the writer) */
  uint32_t slab_count;     /* 0: 4 */
  uint64_t checkpoint_every; /* 0: 65536 journal records */
  /* Page-cache DMA for gets into GPU memory (KVStoreOptions::page_cache_pin_bytes): bytes of
   * slab windows kept registered at once; 0: off. */
  uint64_t page_cache_pin_bytes;
  /* A fleet of writer processes on one namespace (KVStoreOptions::fleet_writers; fixed at
   * creation; 0: one writer): each writer takes a free share of the slots. Readers leave it 0. */
  uint32_t fleet_writers;
} ferry_kv_options;

typedef struct ferry_kv_piece {
  void* memory;
  uint64_t length;
  const char* device; /* "cpu", "cuda" or "cuda:N"; NULL means "cpu" */
} ferry_kv_piece;

typedef struct ferry_kv_block {
  const ferry_kv_piece* pieces;
  size_t piece_count;
} ferry_kv_block;

typedef struct ferry_kv_result {
  int32_t status; /* a ferry_kv_status */
  int32_t route;  /* a ferry_kv_route */
} ferry_kv_result;

typedef struct ferry_kv_stats {
  size_t struct_size; /* the caller sets sizeof(ferry_kv_stats) before asking */
  uint64_t block_bytes, slot_bytes, capacity_blocks, blocks;
  uint64_t puts, gets, hits, misses, evictions, corrupt_dropped;
  uint64_t index_bytes, last_sequence;
  int32_t direct_io; /* nonzero: O_DIRECT on the slabs */
  int32_t read_only;
  /* Page-cache DMA: bytes gets copied from registered windows, windows registered, the seconds
   * that took, and blocks re-read after a window was found stale. */
  uint64_t page_cache_dma_bytes, page_cache_windows_registered, page_cache_stale_rereads;
  double page_cache_register_seconds;
  /* Windows queued or being registered in the background (gets take the usual path meanwhile). */
  uint64_t page_cache_windows_pending;
  /* A fleet: the writers that wrote in the last 2 s, this one included (KVStats). */
  uint32_t writers_active;
} ferry_kv_stats;

/* Called once on a worker thread when an asynchronous batch has finished, before
 * ferry_kv_ticket_wait returns; `results` holds `count` entries, valid during the call. The
 * results are final then: inside a callback, ferry_kv_ticket_wait and ferry_kv_ticket_result on
 * its own ticket (or any other) return once the results are, and a callback may call the store
 * again, start batches and wait for them, or ferry_kv_free it. */
typedef void (*ferry_kv_callback)(void* user_data, const ferry_kv_result* results, size_t count);

FERRY_API void ferry_kv_options_init(ferry_kv_options* options);
FERRY_API void ferry_kv_options_init_sized(ferry_kv_options* options, size_t struct_size);
/* The XXH3-64 key of a byte string. */
FERRY_API uint64_t ferry_kv_key(const void* bytes, size_t length);
/* Opens (a writer creates) the namespace's store under `root`. Returns OK, INVALID_ARGUMENT (bad
 * sizes, a store created with other sizes, another writer), FORMAT_ERROR (a corrupt journal or
 * checkpoint), NOT_FOUND (a reader with no store) or IO_ERROR. */
FERRY_API ferry_status ferry_kv_open(const char* root, const ferry_kv_options* options,
                                     ferry_kv_store** out);
/* Waits for the calls in flight on other threads and its asynchronous batches (callbacks
 * included), checkpoints (a writer) and closes; NULL is ignored. From a completion callback of
 * the store, the rest is closed when its last batch has ended. No call may start after it. */
FERRY_API void ferry_kv_free(ferry_kv_store* store);
/* One batch: `count` keys and blocks; results[i] for key i (results may be NULL). Returns OK when
 * the batch ran, whatever each key's status; the message of the first key that did not succeed
 * (if any) is in ferry_last_error(). `after_event` (put only): a CUevent the GPU sources are
 * read after, or NULL. INVALID_ARGUMENT for NULL arrays or a bad device name. */
FERRY_API ferry_status ferry_kv_put(ferry_kv_store* store, const uint64_t* keys,
                                    const ferry_kv_block* blocks, size_t count, void* after_event,
                                    ferry_kv_result* results);
FERRY_API ferry_status ferry_kv_get(ferry_kv_store* store, const uint64_t* keys,
                                    const ferry_kv_block* blocks, size_t count,
                                    ferry_kv_result* results);
/* The same on the store's worker threads: the key and piece arrays are copied, the memory they
 * point to must stay valid until the ticket is ready. `callback` may be NULL. */
FERRY_API ferry_status ferry_kv_put_async(ferry_kv_store* store, const uint64_t* keys,
                                          const ferry_kv_block* blocks, size_t count,
                                          void* after_event, ferry_kv_callback callback,
                                          void* user_data, ferry_kv_ticket** out);
FERRY_API ferry_status ferry_kv_get_async(ferry_kv_store* store, const uint64_t* keys,
                                          const ferry_kv_block* blocks, size_t count,
                                          ferry_kv_callback callback, void* user_data,
                                          ferry_kv_ticket** out);
/* As ferry_ticket_wait. */
FERRY_API ferry_status ferry_kv_ticket_wait(ferry_kv_ticket* ticket, int64_t timeout_ms,
                                            int* ready);
/* After the ticket is ready: key `index`'s result and message ("" for OK; valid until the ticket
 * is freed). Either out pointer may be NULL. INVALID_ARGUMENT for an index out of range or a
 * ticket not ready. */
FERRY_API ferry_status ferry_kv_ticket_result(ferry_kv_ticket* ticket, size_t index,
                                              ferry_kv_result* result, const char** message);
/* Waits for the batch, then releases the ticket; NULL is ignored. */
FERRY_API void ferry_kv_ticket_free(ferry_kv_ticket* ticket);
/* How many leading keys are stored (the prefix hit length). */
FERRY_API ferry_status ferry_kv_lookup(ferry_kv_store* store, const uint64_t* keys, size_t count,
                                       size_t* hits);
/* present[i] = 1 when key i is stored, else 0. */
FERRY_API ferry_status ferry_kv_contains(ferry_kv_store* store, const uint64_t* keys,
                                         size_t count, uint8_t* present);
FERRY_API ferry_status ferry_kv_remove(ferry_kv_store* store, const uint64_t* keys, size_t count,
                                       ferry_kv_result* results);
/* The counters, the fields inside out->struct_size. */
FERRY_API ferry_status ferry_kv_stats_get(ferry_kv_store* store, ferry_kv_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_KV_H */
