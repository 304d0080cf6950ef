/* ferry's C ABI: load safetensors checkpoints into GPU or host memory.
 *
 * Objects are opaque handles made by *_open / *_load and released by the matching *_free.
 * Every function that can fail returns a ferry_status; on failure ferry_last_error() gives a
 * message naming the file and the problem, valid in the calling thread until its next ferry
 * call. No C++ exception crosses this boundary. */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// On Windows ferry.dll exports what ferry.def lists (made from src/ferry.map at build time); on
// ELF systems the version script picks from the symbols marked visible here. Every entry point
// uses the platform's one C calling convention (x64: the Microsoft x64 ABI), plain C types only,
// so a host without a C compiler (Go's syscall.LoadDLL) can call it.
#if defined(_WIN32)
#define FERRY_API
#elif defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

typedef enum ferry_status {
  FERRY_STATUS_OK = 0,
  FERRY_STATUS_INVALID_ARGUMENT = 1, /* a bad argument: null pointer, unknown name, bad option */
  FERRY_STATUS_FORMAT_ERROR = 2,     /* a malformed checkpoint file */
  FERRY_STATUS_IO_ERROR = 3,         /* the operating system refused a read or an open */
  FERRY_STATUS_NOT_FOUND = 4,        /* no such file or directory */
  FERRY_STATUS_CUDA_ERROR = 5,       /* no usable GPU, or the CUDA driver failed */
  FERRY_STATUS_OUT_OF_MEMORY = 6,
  FERRY_STATUS_INTERNAL_ERROR = 7
} ferry_status;

typedef enum ferry_io_mode {
  FERRY_IO_MODE_AUTO = 0,
  FERRY_IO_MODE_DIRECT = 1,
  FERRY_IO_MODE_BUFFERED = 2
} ferry_io_mode;

typedef struct ferry_checkpoint ferry_checkpoint;
typedef struct ferry_loaded ferry_loaded;

typedef struct ferry_tensor_info {
  const char* name;     /* valid while the checkpoint lives */
  const char* dtype;    /* safetensors spelling: "BF16", "F8_E4M3", ... */
  const uint64_t* shape;
  size_t rank;
  uint64_t bytes;
  const char* file;     /* path of the file holding the tensor */
  uint64_t file_offset; /* absolute offset of its first byte in that file */
  /* GGUF tensors only (NULL / 0 otherwise): the ggml type ("Q4_K") and the dimensions as GGUF
   * states them, ne[0] first. dtype and shape then describe the bytes (U8 rows if quantized). */
  const char* ggml_type;
  const uint64_t* ggml_dims;
  size_t ggml_rank;
} ferry_tensor_info;

/* Options and statistics start with struct_size, the size of the struct as the caller compiled
 * it: ferry reads and writes only the fields inside it (a cut field keeps its default), so hosts
 * built against an older header keep working. A host that may meet a newer library calls
 * ferry_X_options_init_sized(&o, sizeof o) (node FERRY_0.6). A struct_size of 0, smaller than the
 * field itself or larger than this library's struct is INVALID_ARGUMENT. It is a uint32_t in the
 * load and fanout structs (hosts write four bytes there) and a size_t elsewhere. */
typedef struct ferry_load_options {
  uint32_t struct_size;      /* sizeof(ferry_load_options); ferry_load_options_init sets it */
  const char* device;        /* "cpu", "cuda" or "cuda:N"; NULL means "cpu" */
  const char* const* names;  /* tensors to load; NULL or name_count 0 loads all */
  size_t name_count;
  int32_t io_mode; /* a ferry_io_mode; an int so that any value a host passes is defined */
  uint64_t staging_bytes; /* 0: the default, 256 MiB */
  uint64_t chunk_bytes;   /* 0: chosen */
  unsigned reader_threads; /* 0: chosen */
  const char* backend; /* "auto", "cufile", "posix" or "directstorage"; NULL means "auto" */
  int32_t allow_compat; /* nonzero: cuFile's compat mode; DirectStorage's staged fallback */
  unsigned slots_per_thread; /* staging slots each reader cycles through; 0: chosen */
  /* Page-cache DMA (Linux, GPU destinations): the most bytes of files wholly in the page cache kept
   * registered with the GPU driver and copied straight from there; 0: off (the default). The
   * option "page_cache_pin" of the CLI and Python. Each file's stats say which path it took. */
  uint64_t page_cache_pin_bytes;
  /* Nonzero (GPU destinations): the load's memory comes from a process-wide per-device cache that
   * keeps what loads free for later loads (the driver's work after freeing a large allocation
   * slows the next load's copies). Off by default: it holds freed memory from other allocators
   * until ferry_release_cached_device_memory. The option "cache_device_memory" of the CLI and
   * Python. */
  int32_t cache_device_memory;
} ferry_load_options;

typedef struct ferry_file_stats {
  const char* path;
  const char* io_path; /* odirect buffered cufile-gds cufile-compat directstorage page-cache-dma */
  const char* reason;
  uint64_t bytes_read;
} ferry_file_stats;

typedef struct ferry_load_stats {
  uint32_t struct_size; /* the caller sets sizeof(ferry_load_stats) before asking */
  uint64_t tensor_bytes;
  uint64_t bytes_read;
  double seconds;
  double gigabytes_per_second;
  unsigned reader_threads;
  uint64_t chunk_bytes;
  uint64_t staging_bytes;
  size_t file_count;
  unsigned slots_per_thread;
  const char* settings_source; /* where threads, read size and slots came from; valid while the
                                  loaded result lives */
  uint64_t bytes_from_registered_page_cache; /* page-cache DMA: bytes copied from registrations */
  double page_cache_register_seconds;        /* page-cache DMA: this load's registering */
} ferry_load_stats;

/* The message of the calling thread's last failure; "" if none. Never NULL. */
FERRY_API const char* ferry_last_error(void);
/* The library's version, "MAJOR.MINOR.PATCH". */
FERRY_API const char* ferry_version(void);

/* Opens and validates a .safetensors file, a shard directory or an index .json. Paths, here and
 * everywhere in this API, are UTF-8 on every system (Windows included), and so are the names
 * ferry returns.
 * Returns OK, INVALID_ARGUMENT, NOT_FOUND, IO_ERROR or FORMAT_ERROR. */
FERRY_API ferry_status ferry_checkpoint_open(const char* path, ferry_checkpoint** out);
/* Releases a checkpoint; NULL is ignored. Loaded results keep what they need. */
FERRY_API void ferry_checkpoint_free(ferry_checkpoint* checkpoint);
/* Number of tensors; 0 for NULL. */
FERRY_API size_t ferry_checkpoint_tensor_count(const ferry_checkpoint* checkpoint);
/* Tensor `index` in read order. Returns OK or INVALID_ARGUMENT (bad index or NULL). */
FERRY_API ferry_status ferry_checkpoint_tensor_info(const ferry_checkpoint* checkpoint,
                                                    size_t index, ferry_tensor_info* out);

/* Fills `options` with the defaults (all tensors to "cpu", automatic tuning) and struct_size. */
FERRY_API void ferry_load_options_init(ferry_load_options* options);
FERRY_API void ferry_load_options_init_sized(ferry_load_options* options, size_t struct_size);
/* Loads into one new allocation on options->device (defaults if options is NULL).
 * Returns OK, INVALID_ARGUMENT (also for a struct_size of 0 or larger than this library knows),
 * NOT_FOUND, IO_ERROR, FORMAT_ERROR, CUDA_ERROR or OUT_OF_MEMORY. */
FERRY_API ferry_status ferry_checkpoint_load(const ferry_checkpoint* checkpoint,
                                             const ferry_load_options* options,
                                             ferry_loaded** out);
/* Releases the loaded memory; NULL is ignored. */
FERRY_API void ferry_loaded_free(ferry_loaded* loaded);
/* A first load's set-up made ahead (node FERRY_0.7): each reader's staging (pinned for a GPU),
 * the reader threads and the copy streams that the process's first load with `options` (NULL:
 * defaults) would make while it reads, made on a thread of its own, so that a server that starts
 * it while it builds its model loads at the speed of a later load. Returns at once: OK, or
 * INVALID_ARGUMENT for options no load could run with. A load need not wait for it (it takes
 * what is ready). */
typedef struct ferry_load_preparation ferry_load_preparation;
FERRY_API ferry_status ferry_load_prepare(const ferry_load_options* options,
                                          ferry_load_preparation** out);
/* Waits for it: OK, or what it failed with (CUDA_ERROR where the GPU cannot be used);
 * `staging_bytes` (may be NULL) gets the staging it made. */
FERRY_API ferry_status ferry_load_preparation_wait(ferry_load_preparation* preparation,
                                                   uint64_t* staging_bytes);
/* Waits for its thread and releases it (what it made stays with the process); NULL is ignored. */
FERRY_API void ferry_load_preparation_free(ferry_load_preparation* preparation);
/* Hands back to the driver the device memory the cache of options->cache_device_memory keeps for
 * later loads (that of loads still alive stays); `still_held` (may be NULL) gets the bytes the
 * cache still holds. Returns OK or CUDA_ERROR. */
FERRY_API ferry_status ferry_release_cached_device_memory(uint64_t* still_held);
/* Address of a loaded tensor (device address for CUDA). Returns OK or INVALID_ARGUMENT (not
 * loaded, or NULL arguments). */
FERRY_API ferry_status ferry_loaded_tensor_data(const ferry_loaded* loaded, const char* name,
                                                void** data, uint64_t* bytes);
/* XXH3-64 of a loaded tensor's bytes as they are in destination memory. Returns OK,
 * INVALID_ARGUMENT or CUDA_ERROR. */
FERRY_API ferry_status ferry_loaded_tensor_digest(const ferry_loaded* loaded, const char* name,
                                                  uint64_t* digest);
/* Statistics of the load, the fields inside out->struct_size (which the caller sets). Returns OK
 * or INVALID_ARGUMENT (NULL arguments, or a struct_size ferry cannot honour, see above). */
FERRY_API ferry_status ferry_loaded_stats(const ferry_loaded* loaded, ferry_load_stats* out);
/* Per-file statistics, index < file_count. Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_loaded_file_stats(const ferry_loaded* loaded, size_t index,
                                               ferry_file_stats* out);

/* ---- The transfer core (version node FERRY_0.2) -------------------------------------------
 * Batches of moves between files and memory (host or GPU), in either direction, finished
 * asynchronously. A file set keeps its files open (at most max_open at once; a file closed to
 * stay under that bound is checked for the same identity when reopened). A submission returns a
 * ticket at once; each transfer of the batch has its own status, so one bad transfer (a range
 * past the end of its file, a file that vanished) fails alone while the others land. */

typedef struct ferry_file_set ferry_file_set;
typedef struct ferry_ticket ferry_ticket;

typedef enum ferry_direction {
  FERRY_DIRECTION_FILE_TO_MEMORY = 0,
  FERRY_DIRECTION_MEMORY_TO_FILE = 1
} ferry_direction;

typedef enum ferry_transfer_state {
  FERRY_TRANSFER_PENDING = 0,
  FERRY_TRANSFER_DONE = 1,
  FERRY_TRANSFER_FAILED = 2,
  FERRY_TRANSFER_CANCELLED = 3
} ferry_transfer_state;

/* `length` bytes at `file_offset` of file `file` (an index from ferry_file_set_add) and the
 * same number of bytes at `memory` on `device` ("cpu", "cuda" or "cuda:N"; NULL means "cpu").
 * No alignment is needed anywhere. */
typedef struct ferry_transfer {
  uint32_t file;
  uint64_t file_offset;
  uint64_t length;
  const char* device;
  void* memory;
} ferry_transfer;

typedef struct ferry_transfer_options {
  size_t struct_size;     /* sizeof(ferry_transfer_options), set by _init: later versions add
                           * fields at the end and read only what the caller's size holds */
  int32_t io_mode;        /* a ferry_io_mode */
  unsigned threads;       /* 0: chosen */
  uint64_t chunk_bytes;   /* 0: chosen */
  uint64_t staging_bytes; /* 0: the default, 256 MiB */
  void* after_event;      /* a CUevent: memory is touched only after it fires; NULL: none */
  int32_t durable;        /* memory -> file: nonzero makes the data durable (fdatasync) first */
} ferry_transfer_options;

/* Fills `options` with the defaults. */
FERRY_API void ferry_transfer_options_init(ferry_transfer_options* options);
FERRY_API void ferry_transfer_options_init_sized(ferry_transfer_options* options,
                                                 size_t struct_size);
/* A new, empty file set; max_open 0 chooses (a quarter of ulimit -n). Returns OK or
 * INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_file_set_create(size_t max_open, ferry_file_set** out);
/* Opens `path` (created when `writable` and missing) and adds it; its index goes to *index.
 * Returns OK, INVALID_ARGUMENT, NOT_FOUND or IO_ERROR ("too many open files" where the
 * process's descriptor limit is reached). */
FERRY_API ferry_status ferry_file_set_add(ferry_file_set* set, const char* path, int writable,
                                          uint32_t* index);
/* Releases the caller's reference; tickets in flight keep what they need. NULL is ignored. */
FERRY_API void ferry_file_set_free(ferry_file_set* set);
/* Submits `count` transfers in one direction. Returns OK (the ticket in *out), or
 * INVALID_ARGUMENT (a file index out of the set, a NULL memory, a bad device) or CUDA_ERROR;
 * failures while moving bytes are reported per transfer by ferry_ticket_status. */
FERRY_API ferry_status ferry_transfer_submit(ferry_file_set* set, ferry_direction direction,
                                             const ferry_transfer* transfers, size_t count,
                                             const ferry_transfer_options* options,
                                             ferry_ticket** out);
/* Waits until every transfer has finished, failed or was cancelled, or `timeout_ms` passed
 * (negative: no limit); *ready (may be NULL) says which. Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_ticket_wait(ferry_ticket* ticket, int64_t timeout_ms, int* ready);
/* Nonzero once everything has finished; nonzero for NULL. */
FERRY_API int ferry_ticket_ready(const ferry_ticket* ticket);
/* Workers stop before their next chunk; unfinished transfers become CANCELLED. */
FERRY_API void ferry_ticket_cancel(ferry_ticket* ticket);
/* Transfer `index`'s state, bytes moved, and for FAILED its error (valid until the ticket is
 * freed; "" otherwise). Any out pointer may be NULL. Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_ticket_status(ferry_ticket* ticket, size_t index,
                                           ferry_transfer_state* state, uint64_t* bytes_done,
                                           const char** error);
/* Waits for work in flight, then releases the ticket; NULL is ignored. */
FERRY_API void ferry_ticket_free(ferry_ticket* ticket);

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

/* ---- Weight streaming (FERRY_0.3) ----
 * Groups of tensors (a layer, an expert) live off the GPU (in ferry's host arena, pinned for a
 * GPU, or in files of a file set) and are copied into static slots just before they are used.
 * A weight stream gives each byte layout `prefetch` slots (group k uses slot k mod prefetch of
 * its layout); an expert cache keeps `slots` experts of one layout resident (LRU or frequency).
 * Ordering stays on the device: fills wait for the caller's compute stream (a CUstream, cast to
 * void*; NULL: the legacy default stream) and the compute stream waits for fills. With device
 * "cpu" slots are host memory and copies are synchronous. */

typedef struct ferry_weight_stream ferry_weight_stream;
typedef struct ferry_expert_cache ferry_expert_cache;

/* One tensor of a group: `size` bytes from `host` (copied when the stream is made; NULL: written
 * by the caller at ferry_weight_stream_host_address before first use) or, with a file set, from
 * `file_offset` of file `file`. */
typedef struct ferry_stream_tensor {
  uint64_t size;
  const void* host;
  uint32_t file;
  uint64_t file_offset;
} ferry_stream_tensor;

typedef struct ferry_stream_options {
  size_t struct_size;        /* sizeof(ferry_stream_options), set by _init */
  const char* device;        /* "cpu", "cuda" or "cuda:N"; NULL: "cpu" */
  ferry_file_set* files;     /* non-NULL: the groups are read from these files at every fill */
  int32_t io_mode;           /* a ferry_io_mode, for the files */
  void* const* slot_memory;  /* NULL: ferry allocates; else one address per slot, 256-aligned */
  size_t slot_memory_count;
} ferry_stream_options;

typedef struct ferry_stream_stats {
  size_t struct_size; /* the caller sets sizeof(ferry_stream_stats) before asking */
  uint64_t fills, bytes, demand_fills, hits, misses, evictions, skipped_waits;
} ferry_stream_stats;

typedef enum ferry_eviction_policy {
  FERRY_EVICTION_LRU = 0,
  FERRY_EVICTION_FREQUENCY = 1
} ferry_eviction_policy;

FERRY_API void ferry_stream_options_init(ferry_stream_options* options);
FERRY_API void ferry_stream_options_init_sized(ferry_stream_options* options, size_t struct_size);
/* `group_count` groups; group i holds tensor_counts[i] tensors, all groups' tensors back to back
 * in `tensors`. Returns OK (the stream in *out), INVALID_ARGUMENT (no groups, an empty group, a
 * prefetch of 0 or beyond the group count, a file range outside its file, bad options),
 * CUDA_ERROR or OUT_OF_MEMORY. */
FERRY_API ferry_status ferry_weight_stream_create(const ferry_stream_tensor* tensors,
                                                  const size_t* tensor_counts, size_t group_count,
                                                  unsigned prefetch,
                                                  const ferry_stream_options* options,
                                                  ferry_weight_stream** out);
/* Waits for copies in flight, then frees the stream; NULL is ignored. */
FERRY_API void ferry_weight_stream_free(ferry_weight_stream* stream);
/* The number of slots and each one's bytes (to give slot_memory). Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_weight_stream_slots(const ferry_weight_stream* stream, size_t* count,
                                                 uint64_t* bytes, size_t bytes_capacity);
/* Where tensor `tensor` of `group` is while the group is in its slot. */
FERRY_API ferry_status ferry_weight_stream_tensor_address(const ferry_weight_stream* stream,
                                                          size_t group, size_t tensor,
                                                          void** address);
/* Host arena only: where the tensor's bytes are kept (to write them). */
FERRY_API ferry_status ferry_weight_stream_host_address(const ferry_weight_stream* stream,
                                                        size_t group, size_t tensor,
                                                        void** address);
/* Starts the first group of every slot. */
FERRY_API ferry_status ferry_weight_stream_prime(ferry_weight_stream* stream, void* cu_stream);
/* The compute stream waits until `group` is in its slot (loading it now where it is not on its
 * way). Returns OK, INVALID_ARGUMENT, IO_ERROR (a failed read) or CUDA_ERROR. */
FERRY_API ferry_status ferry_weight_stream_wait(ferry_weight_stream* stream, size_t group,
                                                void* cu_stream);
/* The compute stream's queued work is the last use of `group`: its slot takes the next group. */
FERRY_API ferry_status ferry_weight_stream_release(ferry_weight_stream* stream, size_t group,
                                                   void* cu_stream);
/* Inside a CUDA graph capture: the compute stream joins every copy issued during it. */
FERRY_API ferry_status ferry_weight_stream_join(ferry_weight_stream* stream, void* cu_stream);
FERRY_API ferry_status ferry_weight_stream_stats(const ferry_weight_stream* stream,
                                                 ferry_stream_stats* out);

/* `expert_count` experts of one byte layout (laid out as for ferry_weight_stream_create) and
 * `slots` slots of it. Returns OK, INVALID_ARGUMENT (layouts differ, 0 slots or more slots than
 * experts), CUDA_ERROR or OUT_OF_MEMORY. */
FERRY_API ferry_status ferry_expert_cache_create(const ferry_stream_tensor* tensors,
                                                 const size_t* tensor_counts, size_t expert_count,
                                                 unsigned slots, ferry_eviction_policy policy,
                                                 const ferry_stream_options* options,
                                                 ferry_expert_cache** out);
FERRY_API void ferry_expert_cache_free(ferry_expert_cache* cache);
/* Makes `count` distinct experts resident, pins them until ferry_expert_cache_release, makes the
 * compute stream wait for them and writes their slots to slots_out; then loads `speculative`
 * experts into unpinned slots while there are any. */
FERRY_API ferry_status ferry_expert_cache_acquire(ferry_expert_cache* cache, const size_t* experts,
                                                  size_t count, const size_t* speculative,
                                                  size_t speculative_count, void* cu_stream,
                                                  size_t* slots_out);
FERRY_API ferry_status ferry_expert_cache_release(ferry_expert_cache* cache, const size_t* experts,
                                                  size_t count);
FERRY_API ferry_status ferry_expert_cache_slot_address(const ferry_expert_cache* cache,
                                                       size_t slot, void** address);
FERRY_API ferry_status ferry_expert_cache_stats(const ferry_expert_cache* cache,
                                                ferry_stream_stats* out);

/* ---- Loading onto several devices of this node (version node FERRY_0.4) --------------------
 * One process loads a checkpoint onto several GPUs at once: every byte is read from storage
 * once, each GPU's host link carries its share, and NCCL (found at run time, libnccl.so.2) moves
 * the rest over NVLink. Each device holds a whole replica, or its tensor-parallel slices. Only
 * the staged path runs. On hosts with NVLink multicast keep NCCL_NVLS_ENABLE=0 in the
 * environment (ferry never changes it). All devices "cpu" runs the same route in host memory. */
typedef struct ferry_fanout ferry_fanout;

typedef enum ferry_shard_mode {
  FERRY_SHARD_MODE_REPLICAS = 0,        /* every device holds every tensor */
  FERRY_SHARD_MODE_TENSOR_PARALLEL = 1  /* as vLLM shards Llama, Qwen and Mistral: q/k/v/gate/up
                                           by rows, o/down by columns, embeddings and lm_head by
                                           vocabulary rows, the rest replicated */
} ferry_shard_mode;

/* How the devices share one named tensor, overriding the mode's rule for it: dim -1 replicates
 * it; otherwise device r holds the r-th range of dimension dim (outermost first), sizes[r] long
 * (size_count == device_count, adding up to the dimension), or split as evenly as possible
 * (the first ones one longer) when sizes is NULL. */
typedef struct ferry_shard_spec {
  const char* name;
  int32_t dim;
  const uint64_t* sizes;
  size_t size_count;
} ferry_shard_spec;

typedef struct ferry_fanout_options {
  uint32_t struct_size;        /* sizeof(ferry_fanout_options); ferry_fanout_options_init sets it */
  const char* const* devices;  /* distinct "cuda:N" in rank order, or all "cpu" */
  size_t device_count;
  int32_t shard_mode;          /* a ferry_shard_mode */
  const ferry_shard_spec* specs; /* per-tensor overrides of the mode's rule; NULL: none */
  size_t spec_count;
  uint64_t round_bytes;        /* each device's share of one exchange round; 0: chosen */
  /* Engine settings (threads, read size, slots, staging, io mode) and the tensors to load, as for
   * one device, per device; its device is ignored. NULL: the defaults, every tensor. */
  const ferry_load_options* load;
} ferry_fanout_options;

/* What one device holds of one tensor. */
typedef struct ferry_shard_info {
  void* data;            /* a device address (host address for "cpu") */
  uint64_t bytes;
  int32_t dim;           /* the split dimension; -1: the whole tensor */
  uint64_t begin, end;   /* the range of dim this device holds (0, 0 for a whole tensor) */
  const uint64_t* shape; /* of what the device holds; valid while the result lives */
  size_t rank;
} ferry_shard_info;

typedef struct ferry_fanout_stats {
  uint32_t struct_size; /* the caller sets sizeof(ferry_fanout_stats) before asking */
  double seconds;       /* until every device holds its bytes */
  double gigabytes_per_second; /* bytes landed on all devices over seconds */
  uint64_t bytes_read;         /* from storage: the selected tensors once */
  uint64_t checkpoint_bytes;   /* the selected tensors */
  uint64_t tensor_bytes;       /* landed, summed over the devices */
  double collective_seconds;   /* device time in exchanges (overlapping the reads) */
  size_t rounds;
  unsigned reader_threads;
  size_t device_count;
  const char* collective; /* "nccl 2.28.3 (libnccl.so.2)" or "host memcpy"; valid while the
                             result lives */
} ferry_fanout_stats;

typedef struct ferry_fanout_device_stats {
  const char* device;    /* "cuda:1"; valid while the result lives */
  uint64_t tensor_bytes; /* what the device holds */
  uint64_t link_bytes;   /* copied into it from host memory */
  uint64_t peer_bytes;   /* received from the other devices */
} ferry_fanout_device_stats;

/* Fills `options` with the defaults (replicas, no devices) and struct_size. */
FERRY_API void ferry_fanout_options_init(ferry_fanout_options* options);
FERRY_API void ferry_fanout_options_init_sized(ferry_fanout_options* options, size_t struct_size);
/* Loads the checkpoint onto every listed device. Returns OK, INVALID_ARGUMENT (no device, one
 * listed twice, cpu mixed with cuda, an unknown shard_mode, a spec naming no tensor or a split
 * the tensor cannot take, a struct_size of 0 or larger than this library knows), NOT_FOUND,
 * IO_ERROR, FORMAT_ERROR, CUDA_ERROR (no GPU, no NCCL for several GPUs) or OUT_OF_MEMORY. */
FERRY_API ferry_status ferry_checkpoint_load_fanout(const ferry_checkpoint* checkpoint,
                                                    const ferry_fanout_options* options,
                                                    ferry_fanout** out);
/* Releases every device's memory; NULL is ignored. */
FERRY_API void ferry_fanout_free(ferry_fanout* fanout);
/* The number of devices; 0 for NULL. */
FERRY_API size_t ferry_fanout_device_count(const ferry_fanout* fanout);
/* What device `device` (its index in options->devices) holds of tensor `name`. Returns OK or
 * INVALID_ARGUMENT (not loaded, a bad index, NULL arguments). */
FERRY_API ferry_status ferry_fanout_tensor(const ferry_fanout* fanout, size_t device,
                                           const char* name, ferry_shard_info* out);
/* XXH3-64 of the bytes device `device` holds of tensor `name`. Returns OK, INVALID_ARGUMENT or
 * CUDA_ERROR. */
FERRY_API ferry_status ferry_fanout_tensor_digest(const ferry_fanout* fanout, size_t device,
                                                  const char* name, uint64_t* digest);
/* The load's statistics, the fields inside out->struct_size. Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_fanout_stats_get(const ferry_fanout* fanout, ferry_fanout_stats* out);
/* One device's statistics. Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_fanout_device_stats_get(const ferry_fanout* fanout, size_t device,
                                                 ferry_fanout_device_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_H */
