// The C ABI of weight streaming and the expert cache (ferry_weight_stream_*,
// ferry_expert_cache_*; node FERRY_0.3 of ferry.map).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "c_api_guard.hpp"
#include "c_api_handles.hpp"
#include "ferry/error.hpp"
#include "ferry/expert_cache.hpp"
#include "ferry/ferry.h"
#include "ferry/weight_stream.hpp"

struct ferry_weight_stream {
  std::unique_ptr<ferry::WeightStream> stream;
};

struct ferry_expert_cache {
  std::unique_ptr<ferry::ExpertCache> cache;
};

namespace {

using ferry::capi::guarded;
using ferry::capi::require;

std::vector<ferry::StreamGroup> stream_groups(const ferry_stream_tensor* tensors,
                                              const size_t* counts, size_t group_count) {
  require(counts, "tensor_counts");
  std::vector<ferry::StreamGroup> groups(group_count);
  size_t next = 0;
  for (size_t g = 0; g < group_count; ++g) {
    FERRY_EXPECT(tensors != nullptr || counts[g] == 0, std::invalid_argument,
                 "tensors must not be NULL");
    for (size_t t = 0; t < counts[g]; ++t, ++next) {
      const ferry_stream_tensor& in = tensors[next];
      groups[g].tensors.push_back({in.size, in.host, in.file, in.file_offset});
    }
  }
  return groups;
}

constexpr ferry::capi::Field kStreamOptionsFields[] = {
    FERRY_FIELD(ferry_stream_options, struct_size),
    FERRY_FIELD(ferry_stream_options, device),
    FERRY_FIELD(ferry_stream_options, files),
    FERRY_FIELD(ferry_stream_options, io_mode),
    FERRY_FIELD(ferry_stream_options, slot_memory),
    FERRY_FIELD(ferry_stream_options, slot_memory_count),
};
static_assert(ferry::capi::lists_every_field<ferry_stream_options>(kStreamOptionsFields));

ferry::StreamOptions stream_options(const ferry_stream_options* options,
                                    std::vector<std::uintptr_t>& slot_memory) {
  ferry_stream_options defaults;
  ferry_stream_options_init(&defaults);
  const ferry_stream_options given =
      options ? ferry::capi::read_sized(*options, defaults, kStreamOptionsFields, "options")
              : defaults;
  ferry::StreamOptions o;
  o.device = given.device ? ferry::Device::parse(given.device) : ferry::Device::cpu();
  if (given.files) {
    o.source = ferry::StreamSource::Files;
    o.files = given.files->set;
  }
  FERRY_EXPECT(given.io_mode >= FERRY_IO_MODE_AUTO && given.io_mode <= FERRY_IO_MODE_BUFFERED,
               std::invalid_argument, "unknown io_mode ", given.io_mode);
  o.transfer.io = static_cast<ferry::IoMode>(given.io_mode);
  FERRY_EXPECT(given.slot_memory != nullptr || given.slot_memory_count == 0, std::invalid_argument,
               "slot_memory must not be NULL");
  for (size_t i = 0; i < given.slot_memory_count; ++i)
    slot_memory.push_back(reinterpret_cast<std::uintptr_t>(given.slot_memory[i]));
  return o;
}

void stream_stats(const ferry::StreamStats& s, ferry_stream_stats* out) {
  const ferry_stream_stats all{sizeof(ferry_stream_stats),
                               s.fills,
                               s.bytes,
                               s.demand_fills,
                               s.hits,
                               s.misses,
                               s.evictions,
                               s.skipped_waits};
  ferry::capi::write_sized(out, all, "out");
}

}  // namespace

extern "C" {

void ferry_stream_options_init(ferry_stream_options* options) {
  if (options == nullptr) return;
  *options = ferry_stream_options{};
  options->struct_size = sizeof(ferry_stream_options);
  options->io_mode = FERRY_IO_MODE_AUTO;
}

void ferry_stream_options_init_sized(ferry_stream_options* options, size_t struct_size) {
  ferry::capi::init_prefix(options, struct_size, ferry_stream_options_init);
}

ferry_status ferry_weight_stream_create(const ferry_stream_tensor* tensors,
                                        const size_t* tensor_counts, size_t group_count,
                                        unsigned prefetch, const ferry_stream_options* options,
                                        ferry_weight_stream** out) {
  return guarded([&] {
    require(out, "out");
    std::vector<std::uintptr_t> slots;
    auto o = stream_options(options, slots);
    auto handle = std::make_unique<ferry_weight_stream>();
    handle->stream =
        std::make_unique<ferry::WeightStream>(stream_groups(tensors, tensor_counts, group_count),
                                              prefetch, std::move(o), std::move(slots));
    *out = handle.release();
  });
}

void ferry_weight_stream_free(ferry_weight_stream* stream) { delete stream; }

ferry_status ferry_weight_stream_slots(const ferry_weight_stream* stream, size_t* count,
                                       uint64_t* bytes, size_t bytes_capacity) {
  return guarded([&] {
    require(stream, "stream");
    const size_t n = stream->stream->slot_count();
    if (count) *count = n;
    FERRY_EXPECT(bytes != nullptr || bytes_capacity == 0, std::invalid_argument,
                 "bytes must not be NULL");
    for (size_t i = 0; i < std::min(n, bytes_capacity); ++i)
      bytes[i] = stream->stream->slot_bytes(i);
  });
}

ferry_status ferry_weight_stream_tensor_address(const ferry_weight_stream* stream, size_t group,
                                                size_t tensor, void** address) {
  return guarded([&] {
    require(stream, "stream");
    require(address, "address");
    *address = reinterpret_cast<void*>(stream->stream->tensor_address(group, tensor));
  });
}

ferry_status ferry_weight_stream_host_address(const ferry_weight_stream* stream, size_t group,
                                              size_t tensor, void** address) {
  return guarded([&] {
    require(stream, "stream");
    require(address, "address");
    *address = stream->stream->host_address(group, tensor);
  });
}

ferry_status ferry_weight_stream_prime(ferry_weight_stream* stream, void* cu_stream) {
  return guarded([&] {
    require(stream, "stream");
    stream->stream->prime(cu_stream);
  });
}

ferry_status ferry_weight_stream_wait(ferry_weight_stream* stream, size_t group, void* cu_stream) {
  return guarded([&] {
    require(stream, "stream");
    stream->stream->wait(group, cu_stream);
  });
}

ferry_status ferry_weight_stream_release(ferry_weight_stream* stream, size_t group,
                                         void* cu_stream) {
  return guarded([&] {
    require(stream, "stream");
    stream->stream->release(group, cu_stream);
  });
}

ferry_status ferry_weight_stream_join(ferry_weight_stream* stream, void* cu_stream) {
  return guarded([&] {
    require(stream, "stream");
    stream->stream->join(cu_stream);
  });
}

ferry_status ferry_weight_stream_stats(const ferry_weight_stream* stream, ferry_stream_stats* out) {
  return guarded([&] {
    require(stream, "stream");
    stream_stats(stream->stream->stats(), out);
  });
}

ferry_status ferry_expert_cache_create(const ferry_stream_tensor* tensors,
                                       const size_t* tensor_counts, size_t expert_count,
                                       unsigned slots, ferry_eviction_policy policy,
                                       const ferry_stream_options* options,
                                       ferry_expert_cache** out) {
  return guarded([&] {
    require(out, "out");
    FERRY_EXPECT(policy == FERRY_EVICTION_LRU || policy == FERRY_EVICTION_FREQUENCY,
                 std::invalid_argument, "unknown eviction policy ", static_cast<int>(policy));
    std::vector<std::uintptr_t> memory;
    auto o = stream_options(options, memory);
    auto handle = std::make_unique<ferry_expert_cache>();
    handle->cache = std::make_unique<ferry::ExpertCache>(
        stream_groups(tensors, tensor_counts, expert_count), slots, std::move(o),
        policy == FERRY_EVICTION_LRU ? ferry::EvictionPolicy::Lru
                                     : ferry::EvictionPolicy::Frequency,
        std::move(memory));
    *out = handle.release();
  });
}

void ferry_expert_cache_free(ferry_expert_cache* cache) { delete cache; }

ferry_status ferry_expert_cache_acquire(ferry_expert_cache* cache, const size_t* experts,
                                        size_t count, const size_t* speculative,
                                        size_t speculative_count, void* cu_stream,
                                        size_t* slots_out) {
  return guarded([&] {
    require(cache, "cache");
    FERRY_EXPECT((experts != nullptr && slots_out != nullptr) || count == 0, std::invalid_argument,
                 "experts and slots_out must not be NULL");
    FERRY_EXPECT(speculative != nullptr || speculative_count == 0, std::invalid_argument,
                 "speculative must not be NULL");
    const auto slots =
        cache->cache->acquire({experts, count}, cu_stream, {speculative, speculative_count});
    std::copy(slots.begin(), slots.end(), slots_out);
  });
}

ferry_status ferry_expert_cache_release(ferry_expert_cache* cache, const size_t* experts,
                                        size_t count) {
  return guarded([&] {
    require(cache, "cache");
    FERRY_EXPECT(experts != nullptr || count == 0, std::invalid_argument,
                 "experts must not be NULL");
    cache->cache->release({experts, count});
  });
}

ferry_status ferry_expert_cache_slot_address(const ferry_expert_cache* cache, size_t slot,
                                             void** address) {
  return guarded([&] {
    require(cache, "cache");
    require(address, "address");
    *address = reinterpret_cast<void*>(cache->cache->slot_address(slot));
  });
}

ferry_status ferry_expert_cache_stats(const ferry_expert_cache* cache, ferry_stream_stats* out) {
  return guarded([&] {
    require(cache, "cache");
    stream_stats(cache->cache->stats(), out);
  });
}

}  // extern "C"
