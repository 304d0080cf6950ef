/* ferry's C ABI: loading onto several devices of this node. Part of ferry.h, which includes it (and which it includes:
 * the status codes, FERRY_API and the handles it shares come from there). */
#ifndef FERRY_FERRY_FANOUT_H
#define FERRY_FERRY_FANOUT_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#endif /* FERRY_FERRY_FANOUT_H */
