// The C ABI of the KV block store (ferry.h, FERRY_0.3) over ferry::KVStore.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "c_api_guard.hpp"
#include "ferry/error.hpp"
#include "ferry/ferry.h"
#include "ferry/kv_store.hpp"

struct ferry_kv_store {
  ferry::KVStore store;
};

struct ferry_kv_ticket {
  ferry::KVTicket ticket;
};

namespace {

using ferry::capi::guarded;
using ferry::capi::require;
using ferry::capi::wait_ticket;

std::string text(const char* s) { return s ? s : ""; }

constexpr ferry::capi::Field kKVOptionsFields[] = {
    FERRY_FIELD(ferry_kv_options, struct_size),
    FERRY_FIELD(ferry_kv_options, model),
    FERRY_FIELD(ferry_kv_options, dtype),
    FERRY_FIELD(ferry_kv_options, block_layout),
    FERRY_FIELD(ferry_kv_options, tp_rank),
    FERRY_FIELD(ferry_kv_options, world_size),
    FERRY_FIELD(ferry_kv_options, capacity_bytes),
    FERRY_FIELD(ferry_kv_options, block_bytes),
    FERRY_FIELD(ferry_kv_options, gpu_path),
    FERRY_FIELD(ferry_kv_options, allow_compat),
    FERRY_FIELD(ferry_kv_options, read_only),
    FERRY_FIELD(ferry_kv_options, slab_count),
    FERRY_FIELD(ferry_kv_options, checkpoint_every),
    FERRY_FIELD(ferry_kv_options, page_cache_pin_bytes),
    FERRY_FIELD(ferry_kv_options, fleet_writers),
};
static_assert(ferry::capi::lists_every_field<ferry_kv_options>(kKVOptionsFields));

// The caller's blocks as owned piece lists (devices parsed once per distinct name).
ferry::KVBlockList blocks_of(const ferry_kv_block* blocks, std::size_t count) {
  FERRY_EXPECT(blocks != nullptr || count == 0, std::invalid_argument, "blocks must not be NULL");
  ferry::KVBlockList out(count);
  for (std::size_t i = 0; i < count; ++i) {
    const ferry_kv_block& b = blocks[i];
    FERRY_EXPECT(b.pieces != nullptr || b.piece_count == 0, std::invalid_argument, "block ", i,
                 ": pieces must not be NULL");
    for (std::size_t p = 0; p < b.piece_count; ++p) {
      const ferry_kv_piece& piece = b.pieces[p];
      out[i].push_back({piece.memory, piece.length,
                        piece.device ? ferry::Device::parse(piece.device) : ferry::Device::cpu()});
    }
  }
  return out;
}

std::vector<ferry::KVKey> keys_of(const uint64_t* keys, std::size_t count) {
  FERRY_EXPECT(keys != nullptr || count == 0, std::invalid_argument, "keys must not be NULL");
  return std::vector<ferry::KVKey>(keys, keys + count);
}

ferry_kv_result c_result(const ferry::KVResult& r) {
  return {static_cast<int32_t>(r.status), static_cast<int32_t>(r.route)};
}

// Fills `out` and leaves the first failure's message for ferry_last_error().
void report(const std::vector<ferry::KVResult>& results, ferry_kv_result* out) {
  for (std::size_t i = 0; i < results.size(); ++i)
    if (out) out[i] = c_result(results[i]);
  for (const auto& r : results)
    if (!r.ok() && r.status != ferry::KVStatus::already_present) {
      ferry::capi::set_last_error(std::string(ferry::to_string(r.status)) +
                                  (r.message.empty() ? "" : ": " + r.message));
      break;
    }
}

ferry::KVCallback c_callback(ferry_kv_callback callback, void* user_data) {
  if (!callback) return nullptr;
  return [callback, user_data](const std::vector<ferry::KVResult>& results) {
    std::vector<ferry_kv_result> c(results.size());
    std::transform(results.begin(), results.end(), c.begin(), c_result);
    callback(user_data, c.data(), c.size());
  };
}

}  // namespace

extern "C" {

void ferry_kv_options_init(ferry_kv_options* options) {
  if (!options) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->world_size = 1;
  options->gpu_path = FERRY_KV_PATH_AUTO;
}

void ferry_kv_options_init_sized(ferry_kv_options* options, size_t struct_size) {
  ferry::capi::init_prefix(options, struct_size, ferry_kv_options_init);
}

uint64_t ferry_kv_key(const void* bytes, size_t length) {
  return ferry::kv_key({static_cast<const std::byte*>(bytes), bytes ? length : 0});
}

ferry_status ferry_kv_open(const char* root, const ferry_kv_options* options,
                           ferry_kv_store** out) {
  return guarded([&] {
    require(root, "root");
    require(options, "options");
    require(out, "out");
    ferry_kv_options defaults;
    ferry_kv_options_init(&defaults);
    // Older, smaller structs: the fields they lack keep their defaults.
    const ferry_kv_options given =
        ferry::capi::read_sized(*options, defaults, kKVOptionsFields, "options");
    FERRY_EXPECT(given.gpu_path >= FERRY_KV_PATH_AUTO && given.gpu_path <= FERRY_KV_PATH_DIRECT,
                 std::invalid_argument, "unknown gpu_path ", given.gpu_path);
    ferry::KVNamespace ns{text(given.model), text(given.dtype), text(given.block_layout),
                          given.tp_rank, given.world_size};
    ferry::KVStoreOptions o;
    o.gpu_path = static_cast<ferry::KVPath>(given.gpu_path);
    o.allow_compat = given.allow_compat != 0;
    o.read_only = given.read_only != 0;
    if (given.slab_count) o.slab_count = given.slab_count;
    if (given.checkpoint_every) o.checkpoint_every = given.checkpoint_every;
    o.page_cache_pin_bytes = given.page_cache_pin_bytes;
    o.fleet_writers = given.fleet_writers;
    auto handle = std::make_unique<ferry_kv_store>(
        ferry_kv_store{ferry::KVStore::open(root, ns, given.capacity_bytes, given.block_bytes, o)});
    *out = handle.release();
  });
}

void ferry_kv_free(ferry_kv_store* store) { delete store; }

ferry_status ferry_kv_put(ferry_kv_store* store, const uint64_t* keys, const ferry_kv_block* blocks,
                          size_t count, void* after_event, ferry_kv_result* results) {
  return guarded([&] {
    require(store, "store");
    const auto k = keys_of(keys, count);
    const auto list = blocks_of(blocks, count);
    std::vector<ferry::KVBlock> spans(list.begin(), list.end());
    ferry::KVPutOptions o;
    o.after_event = after_event;
    report(store->store.put(k, spans, o), results);
  });
}

ferry_status ferry_kv_get(ferry_kv_store* store, const uint64_t* keys, const ferry_kv_block* blocks,
                          size_t count, ferry_kv_result* results) {
  return guarded([&] {
    require(store, "store");
    const auto k = keys_of(keys, count);
    const auto list = blocks_of(blocks, count);
    std::vector<ferry::KVBlock> spans(list.begin(), list.end());
    report(store->store.get(k, spans), results);
  });
}

ferry_status ferry_kv_put_async(ferry_kv_store* store, const uint64_t* keys,
                                const ferry_kv_block* blocks, size_t count, void* after_event,
                                ferry_kv_callback callback, void* user_data,
                                ferry_kv_ticket** out) {
  return guarded([&] {
    require(store, "store");
    require(out, "out");
    ferry::KVPutOptions o;
    o.after_event = after_event;
    auto handle = std::make_unique<ferry_kv_ticket>();
    handle->ticket = store->store.put_async(keys_of(keys, count), blocks_of(blocks, count), o,
                                            c_callback(callback, user_data));
    *out = handle.release();
  });
}

ferry_status ferry_kv_get_async(ferry_kv_store* store, const uint64_t* keys,
                                const ferry_kv_block* blocks, size_t count,
                                ferry_kv_callback callback, void* user_data,
                                ferry_kv_ticket** out) {
  return guarded([&] {
    require(store, "store");
    require(out, "out");
    auto handle = std::make_unique<ferry_kv_ticket>();
    handle->ticket = store->store.get_async(keys_of(keys, count), blocks_of(blocks, count),
                                            c_callback(callback, user_data));
    *out = handle.release();
  });
}

ferry_status ferry_kv_ticket_wait(ferry_kv_ticket* ticket, int64_t timeout_ms, int* ready) {
  return guarded([&] { wait_ticket(ticket, timeout_ms, ready); });
}

ferry_status ferry_kv_ticket_result(ferry_kv_ticket* ticket, size_t index, ferry_kv_result* result,
                                    const char** message) {
  return guarded([&] {
    require(ticket, "ticket");
    FERRY_EXPECT(ticket->ticket.ready(), std::invalid_argument,
                 "the ticket is not ready (ferry_kv_ticket_wait first)");
    const auto& results = ticket->ticket.results();
    FERRY_EXPECT(index < results.size(), std::invalid_argument, "key index ", index,
                 " is out of range (", results.size(), " keys)");
    if (result) *result = c_result(results[index]);
    if (message) *message = results[index].message.c_str();
  });
}

void ferry_kv_ticket_free(ferry_kv_ticket* ticket) {
  if (ticket) ticket->ticket.wait();
  delete ticket;
}

ferry_status ferry_kv_lookup(ferry_kv_store* store, const uint64_t* keys, size_t count,
                             size_t* hits) {
  return guarded([&] {
    require(store, "store");
    require(hits, "hits");
    *hits = store->store.lookup(keys_of(keys, count));
  });
}

ferry_status ferry_kv_contains(ferry_kv_store* store, const uint64_t* keys, size_t count,
                               uint8_t* present) {
  return guarded([&] {
    require(store, "store");
    FERRY_EXPECT(present != nullptr || count == 0, std::invalid_argument,
                 "present must not be NULL");
    const auto found = store->store.contains(keys_of(keys, count));
    for (std::size_t i = 0; i < count; ++i) present[i] = found[i] ? 1 : 0;
  });
}

ferry_status ferry_kv_remove(ferry_kv_store* store, const uint64_t* keys, size_t count,
                             ferry_kv_result* results) {
  return guarded([&] {
    require(store, "store");
    report(store->store.remove(keys_of(keys, count)), results);
  });
}

ferry_status ferry_kv_stats_get(ferry_kv_store* store, ferry_kv_stats* out) {
  return guarded([&] {
    require(store, "store");
    require(out, "out");
    ferry::capi::require_size(*out, "out");  // checked before the store is asked
    const ferry::KVStats s = store->store.stats();
    ferry_kv_stats c;
    std::memset(&c, 0, sizeof c);
    c.block_bytes = s.block_bytes;
    c.slot_bytes = s.slot_bytes;
    c.capacity_blocks = s.capacity_blocks;
    c.blocks = s.blocks;
    c.puts = s.puts;
    c.gets = s.gets;
    c.hits = s.hits;
    c.misses = s.misses;
    c.evictions = s.evictions;
    c.corrupt_dropped = s.corrupt_dropped;
    c.index_bytes = s.index_bytes;
    c.last_sequence = s.last_sequence;
    c.direct_io = s.direct_io ? 1 : 0;
    c.read_only = s.read_only ? 1 : 0;
    c.page_cache_dma_bytes = s.page_cache_dma_bytes;
    c.page_cache_windows_registered = s.page_cache_windows_registered;
    c.page_cache_stale_rereads = s.page_cache_stale_rereads;
    c.page_cache_register_seconds = s.page_cache_register_seconds;
    c.page_cache_windows_pending = s.page_cache_windows_pending;
    c.writers_active = s.writers_active;
    ferry::capi::write_sized(out, c, "out");
  });
}

}  // extern "C"
