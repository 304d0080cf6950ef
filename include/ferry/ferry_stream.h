/* ferry's C ABI: weight streaming and the expert cache. Part of ferry.h, which includes it (and which it includes:
 * the status codes, FERRY_API and the handles it shares come from there). */
#ifndef FERRY_FERRY_STREAM_H
#define FERRY_FERRY_STREAM_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_STREAM_H */
