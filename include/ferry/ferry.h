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

#ifdef __cplusplus
}
#endif

/* The other parts of the ABI, one concept each. */
#include "ferry/ferry_fanout.h"
#include "ferry/ferry_kv.h"
#include "ferry/ferry_stream.h"

#endif /* FERRY_FERRY_H */
