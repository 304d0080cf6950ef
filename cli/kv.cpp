// ferry kv stats|verify ROOT: the KV block stores under a root, opened as readers (safe beside
// a running writer). verify reads every committed block and checks its checksum. bench ROOT:
// put/get throughput per block size and path beside raw O_DIRECT and pinned copies.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "ferry/error.hpp"
#include "ferry/kv_store.hpp"
#include "ferry/utf8_path.hpp"
#include "kv_bench.hpp"
#include "kv_bench_report.hpp"
#include "output_file.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

// Records failing their checksum in the middle of the journal (not a torn tail), in words.
std::string journal_damage(const KVStats& s) {
  return "journal: " + std::to_string(s.journal_corrupt_records) +
         " record(s) fail their checksum in the middle (the first at offset " +
         std::to_string(s.journal_corrupt_offset) +
         "): skipped, the later records kept; those commits are lost";
}

void print_store(const KVStoreInfo& info, const KVStats& s) {
  // Names come from a file: escaped, so that they cannot drive the terminal.
  std::printf("%s\n  namespace: model=%s dtype=%s layout=%s rank %d of %d\n",
              printable(utf8_of(info.directory)).c_str(), printable(info.ns.model).c_str(),
              printable(info.ns.dtype).c_str(), printable(info.ns.block_layout).c_str(),
              info.ns.tp_rank, info.ns.world_size);
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
  if (s.journal_corrupt_records)
    std::printf("  %s\n", journal_damage(s).c_str());
}

// A namespace that cannot be opened, said on stdout beside the others (the command then fails).
void print_damaged(const std::filesystem::path& directory, const std::string& problem) {
  std::printf("%s\n  DAMAGED: %s\n", printable(utf8_of(directory)).c_str(),
              printable(problem).c_str());
}

KVStore open_reader(const std::filesystem::path& root, const KVStoreInfo& info) {
  KVStoreOptions options;
  options.read_only = true;
  return KVStore::open(root, info.ns, info.capacity_bytes, info.block_bytes, options);
}

// "4096", "256K", "1M", "2G" (binary units).
std::uint64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const int shift = unit.empty()                   ? 0
                    : unit == "K" || unit == "KiB" ? 10
                    : unit == "M" || unit == "MiB" ? 20
                    : unit == "G" || unit == "GiB" ? 30
                                                   : -1;
  FERRY_EXPECT(used > 0 && shift >= 0 && n > 0 && n < (1ull << (63 - shift)), std::invalid_argument,
               "\"", text, "\" is not a size (e.g. 4096, 256K, 1M, 2G)");
  return n << shift;
}

// "a,b,c" -> {"a", "b", "c"} (empty items kept: their parser names them).
std::vector<std::string> comma_separated(const std::string& text) {
  std::vector<std::string> items;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    items.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

void add_bench(CLI::App& kv) {
  static std::string root, device = "cpu", sizes = "256K,1M,4M,16M", bytes = "1G", json,
                           batch_bytes, page_cache_pin, layout, dtype = "bf16", group_bytes;
  static unsigned layers = 32, block_tokens = 16, kv_heads = 8, head_dim = 128;
  static std::vector<std::string> paths;
  static std::uint64_t batch = 16;
  static unsigned pieces = 1, rounds = 3, writers = 0, group_flights = 0, group_threads = 0;
  auto* bench = kv.add_subcommand(
      "bench", "Put/get throughput per block size beside raw O_DIRECT and pinned copies");
  bench->add_option("root", root, "a scratch directory on the storage to measure")->required();
  bench->add_option("--device", device,
                    "cpu or cuda:N (default cpu); with --writers also a list (cuda:0,cuda:1): "
                    "writer w's memory on the (w mod n)-th");
  bench->add_option("--sizes", sizes, "block sizes, comma-separated (default 256K,1M,4M,16M)");
  bench->add_option("--bytes", bytes, "bytes moved per size and path (default 1G)");
  bench->add_option("--batch", batch, "blocks per put/get call (default 16)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{65536}));
  bench->add_option("--batch-bytes", batch_bytes,
                    "bytes per put/get call instead (blocks per call = this / block size, e.g. "
                    "256M: a prefix of many blocks)");
  bench->add_option("--pieces", pieces, "pieces per block, as vLLM's per-layer K/V (default 1)")
      ->check(CLI::Range(1u, 4096u));
  bench
      ->add_option("--layout", layout,
                   "an engine's paged KV layout for the pieces (the block size follows from "
                   "it): vllm (per layer [2, blocks, tokens, heads, head_dim]: K and V pages), "
                   "vllm-canonical (per layer (blocks, page) int8), mla (per layer [blocks, "
                   "tokens, 576]), sglang (per layer K and V buffers)")
      ->check(CLI::IsMember({"vllm", "vllm-canonical", "mla", "sglang"}));
  bench->add_option("--layers", layers, "layers of the layout (default 32)")
      ->check(CLI::Range(1u, 1024u));
  bench->add_option("--block-tokens", block_tokens, "tokens per block of the layout (default 16)")
      ->check(CLI::Range(1u, 65536u));
  bench->add_option("--kv-heads", kv_heads, "KV heads of the layout (default 8)")
      ->check(CLI::Range(1u, 1024u));
  bench->add_option("--head-dim", head_dim, "head size of the layout (default 128)")
      ->check(CLI::Range(1u, 4096u));
  bench->add_option("--dtype", dtype, "the layout's element type: bf16 or fp8 (default bf16)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8"}));
  bench->add_option("--path", paths,
                    "GPU paths: staged, direct, auto (default: staged, and "
                    "direct where cuFile runs)");
  bench->add_option("--rounds", rounds,
                    "rounds per size and path, alternating with the raw I/O; medians (default 3)")
      ->check(CLI::Range(1u, 100u));
  bench->add_option("--page-cache-pin", page_cache_pin,
                    "page-cache DMA for warm gets into GPU memory: bytes of slab windows kept "
                    "registered (e.g. 4G; default off); adds a second warm pass from the "
                    "windows registered after the first");
  bench
      ->add_option("--writers", writers,
                   "a fleet of N writer processes on one namespace instead: their aggregate "
                   "put rate beside one writer's (and raw O_DIRECT writes of the same bytes, one "
                   "writer and all at once), prefix lookups while they write, a reader's gets "
                   "of their blocks (one block size; --bytes per writer)")
      ->check(CLI::Range(1u, 64u));
  // KVGpuGroups: how GPU blocks in pieces move through the device bounce buffer.
  bench->add_option("--group-bytes", group_bytes,
                    "GPU blocks in pieces: bytes per group through the device bounce buffer "
                    "(default 128M)");
  bench->add_option("--group-flights", group_flights, "groups moving at once (default 3)")
      ->check(CLI::Range(1u, 16u));
  bench
      ->add_option("--group-threads", group_threads,
                   "the transfer core's workers per group (default: half of them where a batch "
                   "has several groups)")
      ->check(CLI::Range(1u, 256u));
  bench->add_option("--json", json, "also write the rows to this file");
  bench->callback([] {
    KVBenchOptions o;
    o.root = path_from_utf8(root);
    for (const std::string& d : comma_separated(device))
      o.writer_devices.push_back(Device::parse(d));
    o.device = o.writer_devices.front();
    FERRY_EXPECT(o.writer_devices.size() == 1 || writers > 0, std::invalid_argument, "--device ",
                 device, ": a list of devices is for a fleet's writers (--writers N)");
    if (o.writer_devices.size() == 1) o.writer_devices.clear();
    o.block_sizes.clear();
    for (const std::string& size : comma_separated(sizes))
      o.block_sizes.push_back(parse_size(size));
    o.bytes = parse_size(bytes);
    o.batch = batch;
    if (!batch_bytes.empty()) o.batch_bytes = parse_size(batch_bytes);
    o.pieces = pieces;
    o.layout = layout;
    o.layers = layers;
    o.block_tokens = block_tokens;
    o.kv_heads = kv_heads;
    o.head_dim = head_dim;
    o.element_bytes = dtype == "fp8" ? 1 : 2;
    o.rounds = rounds;
    const unsigned shown_pieces =
        layout.empty() ? pieces : layers * (layout == "vllm" || layout == "sglang" ? 2 : 1);
    if (!layout.empty())
      std::printf("layout %s: %u layers, %u tokens x %u heads x %u, %s: blocks of %llu bytes\n",
                  layout.c_str(), layers, block_tokens, kv_heads, head_dim, dtype.c_str(),
                  static_cast<unsigned long long>(kv_layout_block_bytes(o)));
    if (!page_cache_pin.empty()) o.page_cache_pin = parse_size(page_cache_pin);
    if (!group_bytes.empty()) o.gpu_groups.bytes = parse_size(group_bytes);  // 0 is refused
    o.gpu_groups.flights = group_flights;
    o.gpu_groups.threads = group_threads;
    for (const auto& p : paths) o.paths.push_back(parse_kv_path(p));
    o.writers = writers;
    if (writers > 0) return print_fleet_bench(o, json);
    std::printf(
        "KV bench on %s, %s memory, batches of %s, %u piece%s per block (GB/s, medians of %u "
        "rounds alternating with the raw I/O; put is durable; raw = the same bytes, a batch's "
        "blocks on 16 threads, O_DIRECT and fdatasync per batch; cold = page cache dropped; "
        "warm = slabs in the page cache, 3 passes a round without page-cache DMA, raw warm = "
        "buffered reads of them)\n",
        root.c_str(), device.c_str(),
        batch_bytes.empty() ? (std::to_string(batch) + " blocks").c_str()
                            : (batch_bytes + " bytes").c_str(),
        shown_pieces, shown_pieces == 1 ? "" : "s", rounds);
    std::optional<OutputFile> json_file;  // opened first: an unwritable path fails at once
    if (!json.empty()) json_file.emplace(json);
    nlohmann::json rows = nlohmann::json::array();
    run_kv_bench(o, [&](const KVBenchRow& r) {
      print_bench_row(r, o);
      rows.push_back(bench_row_json(r, o));
    });
    if (json_file) json_file->write_and_close(rows.dump(2) + "\n");
  });
}

}  // namespace

void add_kv(CLI::App& app) {
  auto* kv = app.add_subcommand("kv", "Inspect and measure KV-cache block stores");
  kv->require_subcommand(1);
  add_bench(*kv);
  static std::string root;
  auto* stats = kv->add_subcommand("stats", "Print each store under ROOT");
  stats->add_option("root", root, "the KV store root")->required();
  stats->callback([] {
    const auto stores = KVStore::list(path_from_utf8(root));
    if (stores.empty()) std::printf("no KV stores under %s\n", printable(root).c_str());
    std::size_t damaged = 0;
    for (const KVStoreInfo& info : stores) {
      try {
        if (!info.problem.empty()) throw std::runtime_error(info.problem);
        print_store(info, open_reader(path_from_utf8(root), info).stats());
      } catch (const std::exception& e) {
        print_damaged(info.directory, e.what());
        ++damaged;
      }
    }
    FERRY_EXPECT(damaged == 0, std::runtime_error, damaged, " of ", stores.size(),
                 " KV stores under ", root, " cannot be opened (see DAMAGED above)");
  });
  auto* verify = kv->add_subcommand("verify", "Read every committed block and check its checksum");
  verify->add_option("root", root, "the KV store root")->required();
  verify->callback([] {
    std::uint64_t bad = 0, good = 0;
    std::size_t damaged = 0;
    for (const KVStoreInfo& info : KVStore::list(path_from_utf8(root))) {
      if (!info.problem.empty()) {
        print_damaged(info.directory, info.problem);
        ++damaged;
        continue;
      }
      std::optional<KVStore> opened;
      try {
        opened.emplace(open_reader(path_from_utf8(root), info));
      } catch (const std::exception& e) {
        print_damaged(info.directory, e.what());
        ++damaged;
        continue;
      }
      KVStore& store = *opened;
      if (const KVStats s = store.stats(); s.journal_corrupt_records) {
        bad += s.journal_corrupt_records;
        std::printf("%s: %s\n", printable(utf8_of(info.directory)).c_str(),
                    journal_damage(s).c_str());
      }
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
          std::printf("%s: key %llu: %s: %s\n", printable(utf8_of(info.directory)).c_str(),
                      static_cast<unsigned long long>(key), to_string(r.status),
                      printable(r.message).c_str());
        }
      }
    }
    std::printf("verified %llu blocks, %llu bad%s\n", static_cast<unsigned long long>(good + bad),
                static_cast<unsigned long long>(bad),
                damaged ? (", " + std::to_string(damaged) + " namespaces DAMAGED").c_str() : "");
    FERRY_EXPECT(bad == 0 && damaged == 0, std::runtime_error, bad,
                 " blocks failed verification; ", damaged,
                 " namespaces cannot be opened (see DAMAGED above)");
  });
}

}  // namespace ferry::cli
