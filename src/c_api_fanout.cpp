// The C ABI of loads onto several devices (ferry.h, version node FERRY_0.4) over load_fanout.
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "c_api_guard.hpp"
#include "c_api_handles.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout_load.hpp"
#include "ferry/ferry.h"
#include "ferry/tensor_digest.hpp"

struct ferry_fanout {
  ferry::FanoutLoad load;
};

namespace {

using ferry::capi::guarded;
using ferry::capi::require;

constexpr ferry::capi::Field kFanoutOptionsFields[] = {
    FERRY_FIELD(ferry_fanout_options, struct_size),  FERRY_FIELD(ferry_fanout_options, devices),
    FERRY_FIELD(ferry_fanout_options, device_count), FERRY_FIELD(ferry_fanout_options, shard_mode),
    FERRY_FIELD(ferry_fanout_options, specs),        FERRY_FIELD(ferry_fanout_options, spec_count),
    FERRY_FIELD(ferry_fanout_options, round_bytes),  FERRY_FIELD(ferry_fanout_options, load),
};
static_assert(ferry::capi::lists_every_field<ferry_fanout_options>(kFanoutOptionsFields));

// The mode's rule, with the caller's per-tensor specs in front of it.
ferry::ShardRule shard_rule(const ferry_fanout_options& o, const ferry::Checkpoint& checkpoint) {
  FERRY_EXPECT(
      o.shard_mode == FERRY_SHARD_MODE_REPLICAS || o.shard_mode == FERRY_SHARD_MODE_TENSOR_PARALLEL,
      std::invalid_argument, "unknown shard_mode ", o.shard_mode);
  ferry::ShardRule base = o.shard_mode == FERRY_SHARD_MODE_TENSOR_PARALLEL
                              ? ferry::ShardRule(ferry::llama_tensor_parallel)
                              : ferry::ShardRule(ferry::replicate_all);
  FERRY_EXPECT(o.specs != nullptr || o.spec_count == 0, std::invalid_argument,
               "specs must not be NULL");
  if (o.spec_count == 0) return base;
  auto specs = std::make_shared<std::unordered_map<std::string, ferry::ShardSpec>>();
  for (size_t i = 0; i < o.spec_count; ++i) {
    const ferry_shard_spec& s = o.specs[i];
    FERRY_EXPECT(s.name != nullptr, std::invalid_argument, "specs[", i, "].name is NULL");
    FERRY_EXPECT(checkpoint.find(s.name) != nullptr, std::invalid_argument, "specs[", i,
                 "]: no tensor named \"", s.name, "\"");
    FERRY_EXPECT(s.dim >= -1, std::invalid_argument, "specs[", i, "] (\"", s.name, "\"): dim ",
                 s.dim, " (-1 replicates, 0 and up split)");
    FERRY_EXPECT(s.sizes != nullptr || s.size_count == 0, std::invalid_argument, "specs[", i,
                 "].sizes is NULL");
    ferry::ShardSpec spec =
        s.dim < 0 ? ferry::ShardSpec::replicate()
                  : ferry::ShardSpec::split(
                        s.dim, std::vector<std::uint64_t>(s.sizes, s.sizes + s.size_count));
    FERRY_EXPECT(specs->emplace(s.name, std::move(spec)).second, std::invalid_argument, "specs[", i,
                 "]: \"", s.name, "\" has a spec already");
  }
  return [specs, base](const ferry::TensorInfo& t) {
    auto it = specs->find(t.name);
    return it != specs->end() ? it->second : base(t);
  };
}

const ferry::LoadedRank& rank_of(const ferry_fanout* fanout, size_t device) {
  require(fanout, "fanout");
  const auto& ranks = fanout->load.ranks();
  FERRY_EXPECT(device < ranks.size(), std::invalid_argument, "device index ", device,
               " is out of range (", ranks.size(), " devices)");
  return ranks[device];
}

const ferry::LoadedShard& shard_of(const ferry_fanout* fanout, size_t device, const char* name) {
  const ferry::LoadedRank& rank = rank_of(fanout, device);
  require(name, "name");
  const ferry::LoadedShard* shard = rank.find(name);
  FERRY_EXPECT(shard != nullptr, std::invalid_argument, "tensor \"", name, "\" was not loaded");
  return *shard;
}

}  // namespace

extern "C" {

void ferry_fanout_options_init(ferry_fanout_options* options) {
  if (!options) return;
  *options = ferry_fanout_options{};
  options->struct_size = sizeof(ferry_fanout_options);
  options->shard_mode = FERRY_SHARD_MODE_REPLICAS;
}

void ferry_fanout_options_init_sized(ferry_fanout_options* options, size_t struct_size) {
  ferry::capi::init_prefix(options, struct_size, ferry_fanout_options_init);
}

ferry_status ferry_checkpoint_load_fanout(const ferry_checkpoint* checkpoint,
                                          const ferry_fanout_options* options, ferry_fanout** out) {
  return guarded([&] {
    require(checkpoint, "checkpoint");
    require(options, "options");
    require(out, "out");
    // Fields a caller's older, smaller struct lacks keep their defaults.
    ferry_fanout_options fanout_defaults;
    ferry_fanout_options_init(&fanout_defaults);
    const ferry_fanout_options o =
        ferry::capi::read_sized(*options, fanout_defaults, kFanoutOptionsFields, "options");
    FERRY_EXPECT(o.devices != nullptr || o.device_count == 0, std::invalid_argument,
                 "devices must not be NULL");
    ferry::FanoutOptions cpp;
    ferry_load_options defaults;
    ferry_load_options_init(&defaults);
    cpp.load = ferry::capi::load_options(o.load ? *o.load : defaults);
    for (size_t i = 0; i < o.device_count; ++i) {
      FERRY_EXPECT(o.devices[i] != nullptr, std::invalid_argument, "devices[", i, "] is NULL");
      cpp.devices.push_back(ferry::Device::parse(o.devices[i]));
    }
    cpp.rule = shard_rule(o, *checkpoint->checkpoint);
    cpp.round_bytes = o.round_bytes;
    auto handle = std::make_unique<ferry_fanout>(
        ferry_fanout{ferry::load_fanout(checkpoint->checkpoint, cpp)});
    *out = handle.release();
  });
}

void ferry_fanout_free(ferry_fanout* fanout) { delete fanout; }

size_t ferry_fanout_device_count(const ferry_fanout* fanout) {
  return fanout ? fanout->load.ranks().size() : 0;
}

ferry_status ferry_fanout_tensor(const ferry_fanout* fanout, size_t device, const char* name,
                                 ferry_shard_info* out) {
  return guarded([&] {
    require(out, "out");
    const ferry::LoadedShard& s = shard_of(fanout, device, name);
    const ferry::ShardPiece& p = *s.piece;
    *out = ferry_shard_info{s.data, p.bytes, p.dim, p.begin, p.end, p.shape.data(), p.shape.size()};
  });
}

ferry_status ferry_fanout_tensor_digest(const ferry_fanout* fanout, size_t device, const char* name,
                                        uint64_t* digest) {
  return guarded([&] {
    require(digest, "digest");
    const ferry::LoadedShard& s = shard_of(fanout, device, name);
    *digest = ferry::memory_digest(rank_of(fanout, device).device(), s.data, s.piece->bytes);
  });
}

ferry_status ferry_fanout_stats_get(const ferry_fanout* fanout, ferry_fanout_stats* out) {
  return guarded([&] {
    require(fanout, "fanout");
    const ferry::FanoutStats& s = fanout->load.stats();
    ferry_fanout_stats all{};
    all.seconds = s.seconds;
    all.gigabytes_per_second = s.gigabytes_per_second();
    all.bytes_read = s.bytes_read;
    all.checkpoint_bytes = s.checkpoint_bytes;
    all.tensor_bytes = s.tensor_bytes;
    all.collective_seconds = s.collective_seconds;
    all.rounds = s.rounds;
    all.reader_threads = s.reader_threads;
    all.device_count = s.ranks.size();
    all.collective = s.collective.c_str();
    ferry::capi::write_sized(out, all, "out");
  });
}

ferry_status ferry_fanout_device_stats_get(const ferry_fanout* fanout, size_t device,
                                           ferry_fanout_device_stats* out) {
  return guarded([&] {
    require(out, "out");
    rank_of(fanout, device);  // checks the index
    const ferry::RankLoadStats& r = fanout->load.stats().ranks[device];
    *out = ferry_fanout_device_stats{r.device.c_str(), r.tensor_bytes, r.link_bytes, r.peer_bytes};
  });
}

}  // extern "C"
