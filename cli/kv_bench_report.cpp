// kv_bench_report.hpp: `ferry kv bench`'s rows and the fleet's figures, printed and as JSON.
#include "kv_bench_report.hpp"

#include <cstdio>
#include <optional>

#include "ferry/utf8_path.hpp"
#include "kv_bench_memory.hpp"
#include "output_file.hpp"

namespace ferry::cli {
namespace {

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

}  // namespace

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
  std::printf(
      "  put: one writer alone %.2f GB/s; %u at once %.2f GB/s aggregate (x%.2f of one;"
      " raw's own x%.2f); each:",
      r.one_writer_put_gbps, r.writers, r.fleet_put_gbps, r.fleet_put_gbps / r.one_writer_put_gbps,
      raw_ratio);
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
  std::printf(
      "\n  lookup of a 16-key prefix while they write: p50 %.1f us, p99 %.1f us (%llu "
      "calls); idle: p50 %.1f us, p99 %.1f us\n",
      r.lookup_p50_us, r.lookup_p99_us, static_cast<unsigned long long>(r.lookups),
      r.idle_lookup_p50_us, r.idle_lookup_p99_us);
  std::printf(
      "  reader: got all %llu blocks of the writers' last round, bit-exact, cold %.2f "
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

void print_bench_row(const KVBenchRow& r, const KVBenchOptions& o) {
  std::printf(
      "%8llu KiB x %6llu (%4llu/call) %-13s put %6.2f (raw %6.2f, x%.2f)  get cold %6.2f (raw "
      "%6.2f, x%.2f)  warm %6.2f (raw %6.2f)  put/get %.0f/%.0f blocks/s",
      static_cast<unsigned long long>(r.block_bytes >> 10),
      static_cast<unsigned long long>(r.blocks), static_cast<unsigned long long>(r.batch),
      r.path.c_str(), r.put_gbps, r.raw_write_gbps, r.put_gbps / r.raw_write_gbps, r.get_cold_gbps,
      r.raw_read_gbps, r.get_cold_gbps / r.raw_read_gbps, r.get_warm_gbps, r.raw_warm_read_gbps,
      r.put_iops, r.get_iops);
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
    std::printf("%s %.1f = move %.1f + sync %.1f + journal %.1f", what, t.pass * 1e3, t.move * 1e3,
                t.sync * 1e3, t.journal * 1e3);
    // The workers' thread-ms; idle: what the transfers' workers had and did not use.
    if (t.io > 0)
      std::printf(
          " (staged: transfers %.1f; workers: I/O %.0f, copy wait %.0f, queue %.0f, hash %.0f "
          "(in I/O for puts, queue for gets), hash wait %.0f, setup %.0f, idle %.0f of %.0f; "
          "%.0f copies of %.0f KiB)",
          t.transfer * 1e3, t.io * 1e3, t.copy_wait * 1e3, t.queue * 1e3, t.hash * 1e3,
          t.hash_wait * 1e3, t.setup * 1e3, (t.span - t.io - t.copy_wait - t.queue - t.setup) * 1e3,
          t.span * 1e3, t.copies,
          t.copies > 0 ? double(r.block_bytes * r.blocks) / 1024 / t.copies : 0.0);
    // The caller's thread around the move: a get's checks before it, a GPU batch's steps
    // before its first transfer and after its last.
    if (t.lead + t.tail + t.prepare > 0)
      std::printf(" [caller: checks %.1f, before the transfers %.1f, after %.1f]", t.prepare * 1e3,
                  t.lead * 1e3, t.tail * 1e3);
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
}

nlohmann::json bench_row_json(const KVBenchRow& r, const KVBenchOptions& o) {
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
  return nlohmann::json{{"block_bytes", r.block_bytes},
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
                        {"page_cache_scatter_seconds", r.page_cache_scatter_seconds}};
}

}  // namespace ferry::cli
