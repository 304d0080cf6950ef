// ferry kv stats|verify ROOT: the KV block stores under a root, opened as readers (safe beside
// a running writer). verify reads every committed block and checks its checksum.
#include <cstdio>
#include <vector>

#include "commands.hpp"
#include "ferry/error.hpp"
#include "ferry/kv_store.hpp"

namespace ferry::cli {
namespace {

void print_store(const KVStoreInfo& info, const KVStats& s) {
  std::printf("%s\n  namespace: model=%s dtype=%s layout=%s rank %d of %d\n",
              info.directory.c_str(), info.ns.model.c_str(), info.ns.dtype.c_str(),
              info.ns.block_layout.c_str(), info.ns.tp_rank, info.ns.world_size);
  std::printf("  blocks: %llu of %llu (block %llu bytes, slot %llu); index %.1f MiB; "
              "journal %llu records since %s; slab I/O %s\n",
              static_cast<unsigned long long>(s.blocks),
              static_cast<unsigned long long>(s.capacity_blocks),
              static_cast<unsigned long long>(s.block_bytes),
              static_cast<unsigned long long>(s.slot_bytes), double(s.index_bytes) / (1 << 20),
              static_cast<unsigned long long>(s.journal_records),
              s.last_sequence == s.journal_records ? "creation" : "the last checkpoint",
              s.direct_io ? "O_DIRECT" : "buffered (O_DIRECT refused)");
  if (s.journal_tail_dropped)
    std::printf("  a torn journal tail of %llu bytes is ignored (the writer cuts it)\n",
                static_cast<unsigned long long>(s.journal_tail_dropped));
}

KVStore open_reader(const std::filesystem::path& root, const KVStoreInfo& info) {
  KVStoreOptions options;
  options.read_only = true;
  return KVStore::open(root, info.ns, info.capacity_bytes, info.block_bytes, options);
}

}  // namespace

void add_kv(CLI::App& app) {
  auto* kv = app.add_subcommand("kv", "Inspect KV-cache block stores");
  kv->require_subcommand(1);
  static std::string root;
  auto* stats = kv->add_subcommand("stats", "Print each store under ROOT");
  stats->add_option("root", root, "the KV store root")->required();
  stats->callback([] {
    const auto stores = KVStore::list(root);
    if (stores.empty()) std::printf("no KV stores under %s\n", root.c_str());
    for (const KVStoreInfo& info : stores) print_store(info, open_reader(root, info).stats());
  });
  auto* verify = kv->add_subcommand("verify", "Read every committed block and check its checksum");
  verify->add_option("root", root, "the KV store root")->required();
  verify->callback([] {
    std::uint64_t bad = 0, good = 0;
    for (const KVStoreInfo& info : KVStore::list(root)) {
      KVStore store = open_reader(root, info);
      std::vector<std::byte> buffer(info.block_bytes);
      for (KVKey key : store.keys()) {
        const std::uint64_t length = store.stored_length(key);
        if (length == 0) continue;  // removed by the writer meanwhile
        KVPiece piece{buffer.data(), length};
        KVBlock block(&piece, 1);
        const KVResult r = store.get(std::span(&key, 1), std::span(&block, 1))[0];
        if (r.ok()) {
          ++good;
        } else if (!r.message.empty()) {  // a checksum failure or an I/O error says where
          ++bad;
          std::printf("%s: key %llu: %s: %s\n", info.directory.c_str(),
                      static_cast<unsigned long long>(key), to_string(r.status), r.message.c_str());
        }
      }
    }
    std::printf("verified %llu blocks, %llu bad\n", static_cast<unsigned long long>(good + bad),
                static_cast<unsigned long long>(bad));
    FERRY_EXPECT(bad == 0, std::runtime_error, bad, " blocks failed verification");
  });
}

}  // namespace ferry::cli
