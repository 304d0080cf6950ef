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

#if defined(__GNUC__)
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

/* Structs that grow (options and statistics) start with struct_size: the size of the struct as
 * the caller compiled it. ferry reads and writes only the fields that lie inside it, so a host
 * built against an older header keeps working when fields are added at the end. */
typedef struct ferry_load_options {
  uint32_t struct_size;      /* sizeof(ferry_load_options); ferry_load_options_init sets it */
  const char* device;        /* "cpu", "cuda" or "cuda:N"; NULL means "cpu" */
  const char* const* names;  /* tensors to load; NULL or name_count 0 loads all */
  size_t name_count;
  int32_t io_mode; /* a ferry_io_mode; an int so that any value a host passes is defined */
  uint64_t staging_bytes; /* 0: the default, 256 MiB */
  uint64_t chunk_bytes;   /* 0: chosen */
  unsigned reader_threads; /* 0: chosen */
  const char* backend;     /* "auto", "cufile" or "posix"; NULL means "auto" */
  int32_t allow_compat;    /* nonzero lets backend "cufile" run in cuFile's compatibility mode */
  unsigned slots_per_thread; /* staging slots each reader cycles through; 0: chosen */
} ferry_load_options;

typedef struct ferry_file_stats {
  const char* path;
  const char* io_path; /* "odirect" or "buffered" */
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
} ferry_load_stats;

/* The message of the calling thread's last failure; "" if none. Never NULL. */
FERRY_API const char* ferry_last_error(void);
/* The library's version, "MAJOR.MINOR.PATCH". */
FERRY_API const char* ferry_version(void);

/* Opens and validates a .safetensors file, a shard directory or an index .json.
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
/* Loads into one new allocation on options->device (defaults if options is NULL).
 * Returns OK, INVALID_ARGUMENT (also for a struct_size of 0 or larger than this library knows),
 * NOT_FOUND, IO_ERROR, FORMAT_ERROR, CUDA_ERROR or OUT_OF_MEMORY. */
FERRY_API ferry_status ferry_checkpoint_load(const ferry_checkpoint* checkpoint,
                                             const ferry_load_options* options,
                                             ferry_loaded** out);
/* Releases the loaded memory; NULL is ignored. */
FERRY_API void ferry_loaded_free(ferry_loaded* loaded);
/* Address of a loaded tensor (device address for CUDA). Returns OK or INVALID_ARGUMENT (not
 * loaded, or NULL arguments). */
FERRY_API ferry_status ferry_loaded_tensor_data(const ferry_loaded* loaded, const char* name,
                                                void** data, uint64_t* bytes);
/* XXH3-64 of a loaded tensor's bytes as they are in destination memory. Returns OK,
 * INVALID_ARGUMENT or CUDA_ERROR. */
FERRY_API ferry_status ferry_loaded_tensor_digest(const ferry_loaded* loaded, const char* name,
                                                  uint64_t* digest);
/* Statistics of the load, the fields inside out->struct_size (which the caller sets). Returns OK
 * or INVALID_ARGUMENT (NULL arguments, or struct_size 0). */
FERRY_API ferry_status ferry_loaded_stats(const ferry_loaded* loaded, ferry_load_stats* out);
/* Per-file statistics, index < file_count. Returns OK or INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_loaded_file_stats(const ferry_loaded* loaded, size_t index,
                                               ferry_file_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_H */
