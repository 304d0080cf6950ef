// Opening a KVStore: the namespace's directory, its manifest (written once, checked on every
// open), listing the namespaces under a root, and the store's files set up for open().
#include "ferry/kv_store.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "ferry/error.hpp"
#include "platform/file_descriptor.hpp"
#include "kv/durable_file.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"
#include "kv/kv_store_impl.hpp"
#include "kv/slab_files.hpp"
#include "kv/transfer_block_io.hpp"
#include "platform/file_ops.hpp"
#include "platform/system.hpp"
#include "kv/kv_format_error.hpp"  // last: redefines FERRY_FORMAT_EXPECT


namespace ferry {

namespace {

constexpr std::uint64_t kAlign = 4096;
constexpr int kManifestVersion = 1;

nlohmann::json namespace_json(const KVNamespace& ns) {
  return {{"model", ns.model},       {"dtype", ns.dtype},       {"block_layout", ns.block_layout},
          {"tp_rank", ns.tp_rank},   {"world_size", ns.world_size}};
}

std::string hex16(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

std::string KVStore::directory_name(const KVNamespace& ns) {
  const std::string canonical = namespace_json(ns).dump();  // keys sorted: a stable text
  return "ns-" + hex16(XXH3_64bits(canonical.data(), canonical.size()));
}


namespace {

nlohmann::json read_manifest(const fs::path& path, const std::vector<std::byte>& bytes) {
  nlohmann::json found;
  try {
    found = nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                                  reinterpret_cast<const char*>(bytes.data() + bytes.size()));
  } catch (const nlohmann::json::exception& e) {
    throw KVFormatError(path.string() + ": not JSON: " + e.what());
  }
  FERRY_FORMAT_EXPECT(found.is_object() && found.value("format", "") == "ferry-kv-store" &&
                          found.value("version", 0) == kManifestVersion,
                      path.string(), ": not a version ", kManifestVersion,
                      " ferry KV store manifest");
  try {
    for (const char* field : {"block_bytes", "slot_bytes", "slot_count", "slab_count",
                              "slots_per_slab"})
      FERRY_FORMAT_EXPECT(found.at(field).is_number_unsigned(), path.string(), ": ", field,
                          " is not a count");
    const auto& ns = found.at("namespace");
    (void)ns.at("model").get<std::string>(), (void)ns.at("dtype").get<std::string>();
    (void)ns.at("block_layout").get<std::string>(), (void)ns.at("tp_rank").get<int>();
    (void)ns.at("world_size").get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw KVFormatError(path.string() + ": " + e.what());
  }
  return found;
}

}  // namespace

nlohmann::json KVStore::Impl::manifest_json() const {
  return {{"format", "ferry-kv-store"},
          {"version", kManifestVersion},
          {"namespace", namespace_json(ns)},
          {"block_bytes", block_bytes},
          {"slot_bytes", slot_bytes},
          {"slot_count", slot_count},
          {"slab_count", slab_count},
          {"slots_per_slab", slots_per_slab}};
}

nlohmann::json KVStore::Impl::manifest_json_now() const {
  nlohmann::json m = manifest_json();
  if (fleet > 0) m["fleet_writers"] = fleet;  // absent: a single-writer store, as before
  return m;
}

void KVStore::Impl::check_manifest(bool writable) {
  nlohmann::json wanted = manifest_json_now();
  const fs::path path = dir / "manifest.json";
  auto bytes = read_if_exists(path);
  if (!bytes) {
    FERRY_EXPECT(writable, std::invalid_argument, path.string(),
                 ": no KV store here (a writer creates it)");
    const std::string text = wanted.dump(2) + "\n";
    write_atomically(path, std::as_bytes(std::span(text)));
    return;
  }
  const nlohmann::json found = read_manifest(path, *bytes);
  if (!writable && found.contains("fleet_writers")) {  // a reader takes the store's kind
    const auto& count = found["fleet_writers"];
    FERRY_FORMAT_EXPECT(count.is_number_unsigned() && count.get<std::uint64_t>() >= 2 &&
                            count.get<std::uint64_t>() <= std::min<std::uint64_t>(256, slot_count),
                        path.string(), ": fleet_writers ", count.dump(), " does not fit ",
                        slot_count, " slots");
    fleet = count.get<unsigned>();
    wanted["fleet_writers"] = count;
  }
  FERRY_EXPECT(found["namespace"] == wanted["namespace"], std::invalid_argument, path.string(),
               ": belongs to namespace ", found["namespace"].dump(), ", not ",
               wanted["namespace"].dump());
  // Block size and capacity must be what was asked; the slab split is the creator's choice.
  for (const char* field : {"block_bytes", "slot_bytes", "slot_count"})
    FERRY_EXPECT(found[field] == wanted[field], std::invalid_argument, path.string(),
                 ": the store was created with ", field, " ", found[field].dump(), "; opened with ",
                 wanted[field].dump(), " (block size and capacity are fixed at creation)");
  const auto found_slabs = found["slab_count"].get<std::uint64_t>();
  const auto found_per_slab = found["slots_per_slab"].get<std::uint64_t>();
  FERRY_FORMAT_EXPECT(found_slabs >= 1 && found_slabs <= 256 &&
                          found_per_slab == (slot_count + found_slabs - 1) / found_slabs,
                      path.string(), ": slab_count ", found_slabs, " and slots_per_slab ",
                      found_per_slab, " do not fit ", slot_count, " slots");
  wanted["slab_count"] = found_slabs;
  wanted["slots_per_slab"] = found_per_slab;
  FERRY_EXPECT(found == wanted, std::invalid_argument, path.string(), ": the store was created as ",
               found.dump(), "; opened as ", wanted.dump(),
               " (block size and capacity are fixed at creation)");
  slab_count = static_cast<unsigned>(found_slabs);
  slots_per_slab = found_per_slab;
}

namespace {

// A namespace directory without a manifest: a store being created has no other file of the
// store yet (the manifest is written first); one holding a journal, checkpoint or slab lost it.
bool holds_store_files(const fs::path& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "journal" || name == "checkpoint" || name.rfind("slab-", 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::vector<KVStoreInfo> KVStore::list(const fs::path& root) {
  std::vector<KVStoreInfo> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const fs::path path = entry.path() / "manifest.json";
    if (entry.path().filename().string().rfind("ns-", 0) != 0) continue;
    KVStoreInfo info;
    info.directory = entry.path();
    try {
      auto bytes = read_if_exists(path);
      if (!bytes) {
        if (!holds_store_files(entry.path())) continue;  // a store being created
        info.problem = path.string() + " is missing: the namespace's journal, checkpoint or "
                                       "slabs are there, but it cannot be opened without it";
        out.push_back(std::move(info));
        continue;
      }
      const nlohmann::json m = read_manifest(path, *bytes);
      const auto& ns = m["namespace"];
      info.ns = {ns["model"].get<std::string>(), ns["dtype"].get<std::string>(),
                 ns["block_layout"].get<std::string>(), ns["tp_rank"].get<int>(),
                 ns["world_size"].get<int>()};
      info.block_bytes = m["block_bytes"].get<std::uint64_t>();
      info.capacity_bytes =
          m["slot_count"].get<std::uint64_t>() * m["slot_bytes"].get<std::uint64_t>();
    } catch (const std::exception& e) {  // not a regular file, unreadable, not a manifest
      info = KVStoreInfo{entry.path(), {}, 0, 0, e.what()};
    }
    out.push_back(std::move(info));
  }
  if (error) detail::fail_errno(error.value(), root.string(), ": cannot list the KV root");
  std::sort(out.begin(), out.end(),
            [](const KVStoreInfo& a, const KVStoreInfo& b) { return a.directory < b.directory; });
  return out;
}

KVStore KVStore::open(const fs::path& root, const KVNamespace& ns, std::uint64_t capacity_bytes,
                      std::uint64_t block_bytes, const KVStoreOptions& options) {
  FERRY_EXPECT(block_bytes > 0 && block_bytes <= (std::uint64_t{1} << 31), std::invalid_argument,
               "KV store at ", root.string(), ": block size ", block_bytes,
               " must be 1 byte to 2 GiB");
  FERRY_EXPECT(ns.world_size >= 1 && ns.tp_rank >= 0 && ns.tp_rank < ns.world_size,
               std::invalid_argument, "KV store at ", root.string(), ": tensor-parallel rank ",
               ns.tp_rank, " of world size ", ns.world_size);
  FERRY_EXPECT(options.slab_count >= 1 && options.slab_count <= 256, std::invalid_argument,
               "KV store at ", root.string(), ": slab count ", options.slab_count,
               " must be 1 to 256");
  FERRY_EXPECT(options.checkpoint_every >= 1, std::invalid_argument, "KV store at ",
               root.string(), ": checkpoint_every must be at least 1");
  FERRY_EXPECT(options.fleet_writers != 1 && options.fleet_writers <= 256, std::invalid_argument,
               "KV store at ", root.string(), ": fleet_writers ", options.fleet_writers,
               " must be 0 (one writer) or 2 to 256");
  FERRY_EXPECT(options.gpu_groups.flights <= 16 && options.gpu_groups.threads <= 256,
               std::invalid_argument, "KV store at ", root.string(), ": gpu_groups flights ",
               options.gpu_groups.flights, " and threads ", options.gpu_groups.threads,
               " must be at most 16 and 256 (0: ferry's choice)");
  auto impl = std::make_unique<Impl>();
  impl->ns = ns;
  impl->options = options;
  impl->opened_by = detail::process_id();
  impl->block_bytes = block_bytes;
  impl->slot_bytes = (block_bytes + kAlign - 1) / kAlign * kAlign;
  impl->slot_count = capacity_bytes / impl->slot_bytes;
  FERRY_EXPECT(impl->slot_count >= 1 && impl->slot_count < kNoSlot, std::invalid_argument,
               "KV store at ", root.string(), ": capacity ", capacity_bytes, " bytes holds ",
               impl->slot_count, " blocks of ", impl->slot_bytes, " (need 1 to 2^32-2)");
  impl->slab_count =
      static_cast<unsigned>(std::min<std::uint64_t>(options.slab_count, impl->slot_count));
  impl->slots_per_slab = (impl->slot_count + impl->slab_count - 1) / impl->slab_count;
  impl->limits = {impl->slot_count, block_bytes};
  if (!options.read_only) impl->fleet = options.fleet_writers;
  FERRY_EXPECT(impl->fleet <= impl->slot_count, std::invalid_argument, "KV store at ",
               root.string(), ": ", impl->fleet, " writer shares of ", impl->slot_count,
               " slots");
  impl->dir = root / directory_name(ns);
  impl->journal_path = impl->dir / "journal";
  impl->checkpoint_path = impl->dir / "checkpoint";
  const bool writable = !options.read_only;

  if (writable) {
    std::error_code error;
    fs::create_directories(root, error);
    if (error) detail::fail_errno(error.value(), root.string(), ": cannot create the KV root");
    impl->create_directory_whole(root);
    if (impl->fleet > 0) {
      impl->take_share();
    } else {
      const fs::path lock_path = impl->dir / "writer.lock";
      impl->lock_fd = detail::open_or_create(lock_path, 0600);
      if (!impl->lock_fd) FERRY_SYSCALL_FAIL(lock_path.string(), ": cannot open");
      require_regular(impl->lock_fd, lock_path);
      if (!detail::lock_exclusive(impl->lock_fd.get())) {
        if (errno == EWOULDBLOCK)
          FERRY_SYSCALL_FAIL(lock_path.string(),
                             ": another process writes this namespace (open read_only to share)");
        FERRY_SYSCALL_FAIL(lock_path.string(), ": cannot lock");
      }
    }
    impl->clear_unfinished_creation();
  } else {
    std::error_code error;
    if (!fs::exists(impl->dir, error))
      detail::fail_errno(error ? error.value() : ENOENT, impl->dir.string(),
                         ": no KV store for this namespace (a writer creates it)");
  }
  impl->check_manifest(writable);
  if (impl->fleet > 0) impl->set_up_followers();
  impl->slabs = std::make_unique<SlabFiles>(impl->dir, impl->slab_count,
                                            impl->slots_per_slab * impl->slot_bytes, writable);
  auto io = std::make_unique<TransferBlockIo>(*impl->slabs, impl->slot_bytes, writable,
                                              options.gpu_path, options.allow_compat);
  io->set_groups(options.gpu_groups);
  if (options.page_cache_pin_bytes > 0)
    io->enable_page_cache(options.page_cache_pin_bytes, impl->slot_bytes,
                          impl->slots_per_slab * impl->slot_bytes);
  impl->io = std::move(io);
  impl->load_state(writable);
  return KVStore(std::move(impl));
}

}  // namespace ferry
