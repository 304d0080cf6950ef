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
#include "kv_bench_memory.hpp"
#include "kv_fleet_bench.hpp"
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

// A writer's pass in the fleet bench's JSON: seconds, and the writers it saw writing.
nlohmann::json pass_json(const KVPassTimes& t) {
  return {{"move", t.move},
          {"sync", t.sync},
          {"journal", t.journal},
          {"workers_io", t.workers_io},
          {"workers_copy_wait", t.workers_copy_wait},
          {"workers_span", t.workers_span},
          {"writers_active", t.writers_active}};
}

// Each round's ratio of `ours` to the rates beside it, and their median: passes a few seconds
// apart, where the disk's drift between rounds moves the ratio of the medians.
std::string round_ratios(const std::vector<double>& ours, const std::vector<double>& beside) {
  std::string out;
  char ratio[32];
  std::vector<double> each;
  for (std::size_t i = 0; i < ours.size() && i < beside.size(); ++i) {
    each.push_back(ours[i] / beside[i]);
    std::snprintf(ratio, sizeof ratio, "%s%.2f", i ? " " : "", each.back());
    out += ratio;
  }
  if (each.size() > 1) {
    std::snprintf(ratio, sizeof ratio, " (median %.2f)", kv_bench::median(each));
    out += ratio;
  }
  return out;
}

// `kv bench --writers N`: the fleet's figures, and its row as JSON where asked.
void print_fleet_bench(const KVBenchOptions& o, const std::string& json) {
  std::optional<OutputFile> json_file;  // opened first: an unwritable path fails at once
  if (!json.empty()) json_file.emplace(json);
  const KVFleetBenchRow r = run_kv_fleet_bench(o);
  std::string memory = o.device.to_string();
  for (std::size_t i = 1; i < o.writer_devices.size(); ++i)
    memory += "," + o.writer_devices[i].to_string();
  std::printf(
      "KV fleet bench on %s, %s memory%s: %u writer processes on one namespace, %llu blocks of "
      "%llu KiB each, %llu per put (durable), medians of %u rounds after one untimed pass of every "
      "writer\n",
      utf8_of(o.root).c_str(), memory.c_str(),
      o.writer_devices.size() > 1 ? " (writer w on the (w mod n)-th)" : "", r.writers,
      static_cast<unsigned long long>(r.blocks_per_writer),
      static_cast<unsigned long long>(r.block_bytes >> 10),
      static_cast<unsigned long long>(r.batch), r.rounds);
  const double raw_ratio = r.raw_fleet_gbps / r.raw_one_writer_gbps;
  std::printf("  put: one writer alone %.2f GB/s; %u at once %.2f GB/s aggregate (x%.2f of one;"
              " raw's own x%.2f); each:", r.one_writer_put_gbps, r.writers, r.fleet_put_gbps,
              r.fleet_put_gbps / r.one_writer_put_gbps, raw_ratio);
  for (double g : r.writer_put_gbps) std::printf(" %.2f", g);
  std::printf("; each round's x one: %s",
              round_ratios(r.fleet_round_gbps, r.one_writer_round_gbps).c_str());
  const double pass_seconds = double(r.blocks_per_writer) * double(r.block_bytes) / 1e9;
  std::printf(
      "\n  a writer's pass (%.3f s alone, %.3f s in the fleet): moving %.3f / %.3f s, "
      "syncing the slabs %.3f / %.3f s, the journal %.3f / %.3f s; writers sharing the storage "
      "as each saw them %u (each putting with 1 / that of one writer's writes in flight)",
      pass_seconds / r.one_writer_put_gbps, pass_seconds / kv_bench::median(r.writer_put_gbps),
      r.alone_times.move, r.fleet_times.move, r.alone_times.sync, r.fleet_times.sync,
      r.alone_times.journal, r.fleet_times.journal, r.fleet_times.writers_active);
  // Whether a GPU writer's workers kept their writes in flight, alone and in the fleet.
  const auto share = [](double part, double span) { return span > 0 ? 100 * part / span : 0.0; };
  if (r.alone_times.workers_span > 0 && r.fleet_times.workers_span > 0)
    std::printf(
        "\n  a GPU writer's workers: writing %.0f%% / %.0f%% of their time, waiting for copies out "
        "of GPU memory %.0f%% / %.0f%%",
        share(r.alone_times.workers_io, r.alone_times.workers_span),
        share(r.fleet_times.workers_io, r.fleet_times.workers_span),
        share(r.alone_times.workers_copy_wait, r.alone_times.workers_span),
        share(r.fleet_times.workers_copy_wait, r.fleet_times.workers_span));
  std::printf(
      "\n  raw O_DIRECT writes of the same bytes: one writer alone %.2f GB/s; %u at once "
      "%.2f GB/s aggregate (x%.2f of one); %u at once with 1 / %u of the threads each "
      "%.2f GB/s (x%.2f of one)",
      r.raw_one_writer_gbps, r.writers, r.raw_fleet_gbps, raw_ratio, r.writers, r.writers,
      r.raw_fleet_shared_gbps, r.raw_fleet_shared_gbps / r.raw_one_writer_gbps);
  std::printf("\n  lookup of a 16-key prefix while they write: p50 %.1f us, p99 %.1f us (%llu "
              "calls); idle: p50 %.1f us, p99 %.1f us\n",
              r.lookup_p50_us, r.lookup_p99_us, static_cast<unsigned long long>(r.lookups),
              r.idle_lookup_p50_us, r.idle_lookup_p99_us);
  std::printf("  reader: got all %llu blocks of the writers' last round, bit-exact, cold %.2f "
              "GB/s; its index holds %llu blocks\n",
              static_cast<unsigned long long>(r.blocks_read), r.reader_get_gbps,
              static_cast<unsigned long long>(r.store_blocks));
  if (json_file)
    json_file->write_and_close(nlohmann::json{{"writers", r.writers},
                                              {"memory", memory},
                                              {"block_bytes", r.block_bytes},
                                              {"blocks_per_writer", r.blocks_per_writer},
                                              {"batch", r.batch},
                                              {"rounds", r.rounds},
                                              {"one_writer_put_gbps", r.one_writer_put_gbps},
                                              {"fleet_put_gbps", r.fleet_put_gbps},
                                              {"writer_put_gbps", r.writer_put_gbps},
                                              {"one_writer_round_gbps", r.one_writer_round_gbps},
                                              {"fleet_round_gbps", r.fleet_round_gbps},
                                              {"pass_seconds_alone", pass_json(r.alone_times)},
                                              {"pass_seconds_in_fleet", pass_json(r.fleet_times)},
                                              {"raw_one_writer_gbps", r.raw_one_writer_gbps},
                                              {"raw_fleet_gbps", r.raw_fleet_gbps},
                                              {"raw_fleet_shared_gbps", r.raw_fleet_shared_gbps},
                                              {"lookups", r.lookups},
                                              {"lookup_p50_us", r.lookup_p50_us},
                                              {"lookup_p99_us", r.lookup_p99_us},
                                              {"idle_lookup_p50_us", r.idle_lookup_p50_us},
                                              {"idle_lookup_p99_us", r.idle_lookup_p99_us},
                                              {"blocks_read", r.blocks_read},
                                              {"reader_get_gbps", r.reader_get_gbps},
                                              {"store_blocks", r.store_blocks}}
                                   .dump(2) +
                               "\n");
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
      std::printf(
          "%8llu KiB x %6llu (%4llu/call) %-13s put %6.2f (raw %6.2f, x%.2f)  get cold %6.2f (raw "
          "%6.2f, x%.2f)  warm %6.2f (raw %6.2f)  put/get %.0f/%.0f blocks/s",
          static_cast<unsigned long long>(r.block_bytes >> 10),
          static_cast<unsigned long long>(r.blocks), static_cast<unsigned long long>(r.batch),
          r.path.c_str(), r.put_gbps, r.raw_write_gbps, r.put_gbps / r.raw_write_gbps,
          r.get_cold_gbps, r.raw_read_gbps, r.get_cold_gbps / r.raw_read_gbps, r.get_warm_gbps,
          r.raw_warm_read_gbps, r.put_iops, r.get_iops);
      if (r.pinned_h2d_gbps > 0)
        std::printf("  pinned D2H %.1f H2D %.1f (warm x%.2f)", r.pinned_d2h_gbps, r.pinned_h2d_gbps,
                    r.get_warm_gbps / r.pinned_h2d_gbps);
      std::printf("  XXH3 %s", r.checksum.c_str());
      if (r.gpu_checksum_gbps > 0) std::printf(", on the GPU %.1f GB/s", r.gpu_checksum_gbps);
      if (!r.gpu_checksum_note.empty())
        std::printf(" (no GPU checksum: %s)", r.gpu_checksum_note.c_str());
      std::printf("\n");
      std::printf("    per round, x raw: put %s;  get cold %s\n",
                  round_ratios(r.put_round_gbps, r.raw_write_round_gbps).c_str(),
                  round_ratios(r.get_cold_round_gbps, r.raw_read_round_gbps).c_str());
      if (r.one_piece_warm_gbps > 0)
        std::printf(
            "    warm get x one piece (this size in one piece, a store of its own, "
            "taking turns with these): %.2f GB/s; per round %s\n",
            r.one_piece_warm_gbps,
            round_ratios(r.get_warm_round_gbps, r.one_piece_warm_round_gbps).c_str());
      // Where each pass's time went (ms per pass, the mean of the rounds).
      const auto times = [&r](const char* what, const KVBenchTimes& t) {
        std::printf("%s %.1f = move %.1f + sync %.1f + journal %.1f", what, t.pass * 1e3,
                    t.move * 1e3, t.sync * 1e3, t.journal * 1e3);
        // The workers' thread-ms; idle: what the transfers' workers had and did not use.
        if (t.io > 0)
          std::printf(
              " (staged: transfers %.1f; workers: I/O %.0f, copy wait %.0f, queue %.0f, hash %.0f "
              "(in I/O for puts, queue for gets), hash wait %.0f, setup %.0f, idle %.0f of %.0f; "
              "%.0f copies of %.0f KiB)",
              t.transfer * 1e3, t.io * 1e3, t.copy_wait * 1e3, t.queue * 1e3, t.hash * 1e3,
              t.hash_wait * 1e3, t.setup * 1e3,
              (t.span - t.io - t.copy_wait - t.queue - t.setup) * 1e3, t.span * 1e3, t.copies,
              t.copies > 0 ? double(r.block_bytes * r.blocks) / 1024 / t.copies : 0.0);
        // The caller's thread around the move: a get's checks before it, a GPU batch's steps
        // before its first transfer and after its last.
        if (t.lead + t.tail + t.prepare > 0)
          std::printf(" [caller: checks %.1f, before the transfers %.1f, after %.1f]",
                      t.prepare * 1e3, t.lead * 1e3, t.tail * 1e3);
      };
      std::printf("    ms per pass:");
      times(" put", r.put_times);
      times(";  get cold", r.cold_times);
      times(";  get warm", r.warm_times);
      std::printf(";  warm slabs %.0f%% in the page cache\n", r.warm_resident * 100);
      if (o.page_cache_pin) {
        // Warm gets three ways, each beside pinned H2D (the bound): without page-cache DMA
        // (staged or cuFile), the first with it (its windows not yet registered: the usual
        // path, registering them in the background), from registered windows.
        const auto against_h2d = [&r](double gbps) {
          char text[48] = "";
          if (r.pinned_h2d_gbps > 0)
            std::snprintf(text, sizeof text, " (x%.2f pinned H2D)", gbps / r.pinned_h2d_gbps);
          return std::string(text);
        };
        std::printf(
            "    warm gets, page-cache DMA: pinned H2D %.2f; %s %.2f%s; first get %.2f%s (its "
            "windows then registered in the background in %.1f ms); registered %.2f%s (%s, "
            "%.0f%% of the bytes from registered windows)\n",
            r.pinned_h2d_gbps, r.warm_staged_path.c_str(), r.get_warm_staged_gbps,
            against_h2d(r.get_warm_staged_gbps).c_str(), r.get_warm_gbps,
            against_h2d(r.get_warm_gbps).c_str(), r.page_cache_register_seconds * 1e3,
            r.get_warm_registered_gbps, against_h2d(r.get_warm_registered_gbps).c_str(),
            r.warm_registered_path.c_str(), r.page_cache_dma_share * 100);
        std::printf(
            "      registered pass %.1f ms: device ms (two streams overlap) DMA %.1f, GPU checksum "
            "%.1f, scatter %.1f\n",
            r.registered_pass_seconds * 1e3, r.page_cache_dma_seconds * 1e3,
            r.page_cache_checksum_seconds * 1e3, r.page_cache_scatter_seconds * 1e3);
      }
      std::fflush(stdout);
      const auto times_json = [](const KVBenchTimes& t) {
        return nlohmann::json{{"pass", t.pass},
                              {"move", t.move},
                              {"sync", t.sync},
                              {"journal", t.journal},
                              {"io", t.io},
                              {"copy_wait", t.copy_wait},
                              {"queue", t.queue},
                              {"setup", t.setup},
                              {"hash", t.hash},
                              {"hash_wait", t.hash_wait},
                              {"transfer", t.transfer},
                              {"span", t.span},
                              {"copies", t.copies},
                              {"lead", t.lead},
                              {"tail", t.tail},
                              {"prepare", t.prepare}};
      };
      rows.push_back({{"block_bytes", r.block_bytes},
                      {"blocks", r.blocks},
                      {"batch", r.batch},
                      {"warm_resident", r.warm_resident},
                      {"gpu_checksum_gbps", r.gpu_checksum_gbps},
                      {"put_seconds", times_json(r.put_times)},
                      {"get_cold_seconds", times_json(r.cold_times)},
                      {"get_warm_seconds", times_json(r.warm_times)},
                      {"path", r.path},
                      {"checksum", r.checksum},
                      {"put_gbps", r.put_gbps},
                      {"get_cold_gbps", r.get_cold_gbps},
                      {"get_warm_gbps", r.get_warm_gbps},
                      {"put_iops", r.put_iops},
                      {"get_iops", r.get_iops},
                      {"raw_write_gbps", r.raw_write_gbps},
                      {"raw_read_gbps", r.raw_read_gbps},
                      {"raw_warm_read_gbps", r.raw_warm_read_gbps},
                      {"put_round_gbps", r.put_round_gbps},
                      {"raw_write_round_gbps", r.raw_write_round_gbps},
                      {"get_cold_round_gbps", r.get_cold_round_gbps},
                      {"raw_read_round_gbps", r.raw_read_round_gbps},
                      {"one_piece_warm_gbps", r.one_piece_warm_gbps},
                      {"get_warm_round_gbps", r.get_warm_round_gbps},
                      {"one_piece_warm_round_gbps", r.one_piece_warm_round_gbps},
                      {"rounds", r.rounds},
                      {"pinned_d2h_gbps", r.pinned_d2h_gbps},
                      {"pinned_h2d_gbps", r.pinned_h2d_gbps},
                      {"page_cache_pin", o.page_cache_pin},
                      {"gpu_groups",
                       {{"bytes", o.gpu_groups.bytes},
                        {"flights", o.gpu_groups.flights},
                        {"threads", o.gpu_groups.threads}}},
                      {"get_warm_registered_gbps", r.get_warm_registered_gbps},
                      {"page_cache_register_seconds", r.page_cache_register_seconds},
                      {"page_cache_dma_share", r.page_cache_dma_share},
                      {"warm_registered_path", r.warm_registered_path},
                      {"get_warm_staged_gbps", r.get_warm_staged_gbps},
                      {"warm_staged_path", r.warm_staged_path},
                      {"registered_pass_seconds", r.registered_pass_seconds},
                      {"page_cache_dma_seconds", r.page_cache_dma_seconds},
                      {"page_cache_checksum_seconds", r.page_cache_checksum_seconds},
                      {"page_cache_scatter_seconds", r.page_cache_scatter_seconds}});
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
