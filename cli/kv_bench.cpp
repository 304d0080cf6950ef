// `ferry kv bench` (kv_bench.hpp): timings for reporting only, never for tests.
#include "kv_bench.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "ferry/error.hpp"
#include "kv/checksum.hpp"
#include "kv_bench_memory.hpp"
#include "kv_bench_probes.hpp"
#include "kv_bench_raw.hpp"
#include "shim/gds_mode.hpp"

namespace ferry {
namespace {

using kv_bench::BatchMemory;
using kv_bench::drop_cache;
using kv_bench::gpu_checksum_rate;
using kv_bench::median;
using kv_bench::piece_layout;
using kv_bench::PieceLayout;
using kv_bench::pinned_copies;
using kv_bench::RawFile;
using kv_bench::resident_share;
using kv_bench::round_up;
using kv_bench::seconds_since;
using kv_bench::slabs_of;
using kv_bench::warm;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr unsigned kWarmPasses = 3;  // warm passes a round without page-cache DMA

void accumulate(KVBenchTimes& into, const KVBenchTimes& t, double weight) {
  into.pass += t.pass * weight;
  into.move += t.move * weight;
  into.sync += t.sync * weight;
  into.journal += t.journal * weight;
  into.io += t.io * weight;
  into.copy_wait += t.copy_wait * weight;
  into.queue += t.queue * weight;
  into.setup += t.setup * weight;
  into.hash += t.hash * weight;
  into.hash_wait += t.hash_wait * weight;
  into.transfer += t.transfer * weight;
  into.span += t.span * weight;
  into.copies += t.copies * weight;
  into.lead += t.lead * weight;
  into.tail += t.tail * weight;
  into.prepare += t.prepare * weight;
}

// The bench's store for blocks of `block` bytes in `pieces` pieces laid out as `layout`.
KVNamespace bench_namespace(std::uint64_t block, unsigned pieces, const std::string& layout) {
  return {
      "kv-bench", "bytes",
      "block=" + std::to_string(block) + ",pieces=" + std::to_string(pieces) + ",layout=" + layout,
      0, 1};
}

// `n` bytes of the pattern the bench's blocks carry.
std::vector<std::byte> bench_pattern(std::uint64_t n) {
  std::vector<std::byte> pattern(n);
  for (std::size_t i = 0; i < n; ++i) pattern[i] = std::byte(i * 131 + i / 4099);
  return pattern;
}

// A batch of blocks on the bench's device laid out as `layout`: the source holding `pattern`,
// the target zeroed (its pages made before round 0's cold gets, as the raw reads' buffers are:
// else the first O_DIRECT reads fault them in, about a second per 256 MiB on a 2-core machine),
// and each block's pieces in both.
struct BatchBlocks {
  BatchBlocks(const Device& device, std::uint64_t block, const PieceLayout& layout,
              const std::vector<std::byte>& pattern);
  BatchMemory source, target;
  std::vector<std::vector<KVPiece>> in, out;
  std::vector<KVBlock> sources, targets;
};

BatchBlocks::BatchBlocks(const Device& device, std::uint64_t block, const PieceLayout& layout,
                         const std::vector<std::byte>& pattern)
    : source(device, block, pattern.size() / block, layout),
      target(device, block, pattern.size() / block, layout),
      in(pattern.size() / block),
      out(pattern.size() / block) {
  source.fill(pattern);
  target.fill(std::vector<std::byte>(pattern.size()));
  for (std::size_t b = 0; b < in.size(); ++b) {
    in[b] = source.block(b);
    out[b] = target.block(b);
  }
  sources.assign(in.begin(), in.end());
  targets.assign(out.begin(), out.end());
}

// What a pass moves: a batch's blocks between a store and the bench's memory; whether their
// route is the row's.
struct PassBlocks {
  KVStore& store;
  std::span<const KVBlock> sources, targets;
  bool row = true;
};

// One row: rounds of puts then gets (cold, then warm) of `count` blocks in batches, each beside
// the raw I/O of the same bytes (alternating which goes first); run() returns the row of medians.
class RowBench {
 public:
  RowBench(const KVBenchOptions& o, std::uint64_t block, KVPath path);
  KVBenchRow run();

 private:
  // Blocks of the row's size in one piece each, in a store of their own: their warm gets take
  // turns with a many-piece row's (KVBenchRow::one_piece_warm_gbps).
  struct OnePiece {
    explicit OnePiece(const RowBench& b);
    BatchBlocks blocks;
    KVStore store;
    std::vector<fs::path> slabs;
  };
  // What the rounds use: the store; with page-cache DMA, the same store read without it (for
  // the warm gets it is measured against; a reader follows the writer's commits); the raw file;
  // the store's slab files; for a row of several pieces without page-cache DMA, the one-piece
  // store.
  struct Open {
    explicit Open(const RowBench& b);
    KVStore store;
    std::unique_ptr<KVStore> staged;
    RawFile raw;
    std::vector<fs::path> slabs;
    std::unique_ptr<OnePiece> one_piece;
  };

  KVStoreOptions store_options(KVPath path) const;
  std::uint64_t capacity() const { return _count * round_up(_block); }
  // The row's own blocks, through `through` (the store, or the reader without page-cache DMA).
  PassBlocks row_blocks(KVStore* through = nullptr) const;
  PassBlocks one_piece_blocks() const;
  double pass(bool put, std::uint64_t round, KVBenchTimes& times, const PassBlocks& blocks,
              double share = 1);
  void check(const BatchMemory& target) const;
  void check_and_clear(const BatchMemory& target) const;
  void check() const { check(_blocks.target); }
  void check_and_clear() const { check_and_clear(_blocks.target); }
  void round(std::uint64_t r);
  void warm_gets(std::uint64_t r);
  void one_piece_warm_gets(std::uint64_t r);
  void registered_pass(std::uint64_t r, const KVStats& before);
  void finish_row();

  const KVBenchOptions& _o;
  const std::uint64_t _block, _batch, _count;
  const PieceLayout _layout;
  const KVNamespace _ns;
  const KVStoreOptions _options;
  const std::vector<std::byte> _pattern;  // a batch's bytes
  const BatchBlocks _blocks;
  const fs::path _dir;
  KVBenchRow _row;
  std::unique_ptr<Open> _open;
  std::vector<KVKey> _keys;
  std::vector<double> _put_s, _cold_s, _warm_s, _raw_write_s, _raw_cold_s, _raw_warm_s;
  std::vector<double> _registered_s, _register_s, _staged_s;
  std::vector<double> _one_warm_s;  // the one-piece store's warm passes, kWarmPasses a round
  const fs::path _one_piece_dir;
};

RowBench::OnePiece::OnePiece(const RowBench& b)
    : blocks(b._o.device, b._block, PieceLayout{}, b._pattern),
      store(KVStore::open(b._o.root, bench_namespace(b._block, 1, ""), b.capacity(), b._block,
                          b._options)),
      slabs(slabs_of(b._one_piece_dir)) {}

RowBench::Open::Open(const RowBench& b)
    // Room for one round's blocks: each round's puts evict the round before's.
    : store(KVStore::open(b._o.root, b._ns, b.capacity(), b._block, b._options)),
      raw(b._o.root / "kv-bench-raw.bin", b._block, b._count, b._batch),
      slabs(slabs_of(b._dir)) {
  if (!b._o.page_cache_pin) {
    if (b._layout.pieces > 1) one_piece = std::make_unique<OnePiece>(b);
    return;
  }
  KVStoreOptions plain = b._options;
  plain.page_cache_pin_bytes = 0;
  plain.read_only = true;
  staged =
      std::make_unique<KVStore>(KVStore::open(b._o.root, b._ns, b.capacity(), b._block, plain));
}

RowBench::RowBench(const KVBenchOptions& o, std::uint64_t block, KVPath path)
    : _o(o),
      _block(block),
      _batch(kv_bench_batch(o, block)),
      _count(std::max(_batch, o.bytes / block)),
      _layout(piece_layout(o)),
      _ns(bench_namespace(block, _layout.pieces, o.layout)),
      _options(store_options(path)),
      _pattern(bench_pattern(block * _batch)),
      _blocks(o.device, block, _layout, _pattern),
      _dir(o.root / KVStore::directory_name(_ns)),
      _keys(_batch),
      _one_piece_dir(o.root / KVStore::directory_name(bench_namespace(block, 1, ""))) {
  _row.checksum = std::string(detail::kv::checksum_kernel_name(detail::kv::checksum_kernel()));
  _row.block_bytes = block;
  _row.blocks = _count;
  _row.batch = _batch;
  _row.warm_resident = 1;
  _row.rounds = std::max(1u, o.rounds);
  _row.page_cache_dma_share = o.page_cache_pin ? 1 : 0;
}

KVStoreOptions RowBench::store_options(KVPath path) const {
  KVStoreOptions options;
  options.gpu_path = path;
  options.allow_compat = true;
  options.checkpoint_on_close = false;
  options.page_cache_pin_bytes = _o.page_cache_pin;
  options.gpu_groups = _o.gpu_groups;
  return options;
}

KVBenchRow RowBench::run() {
  fs::remove_all(_dir);
  fs::remove_all(_one_piece_dir);
  _open = std::make_unique<Open>(*this);
  for (std::uint64_t r = 0; r < _row.rounds; ++r) round(r);
  _open.reset();
  fs::remove_all(_dir);
  fs::remove_all(_one_piece_dir);
  finish_row();
  return _row;
}

PassBlocks RowBench::row_blocks(KVStore* through) const {
  return {through ? *through : _open->store, _blocks.sources, _blocks.targets};
}

PassBlocks RowBench::one_piece_blocks() const {
  OnePiece& one = *_open->one_piece;
  return {one.store, one.blocks.sources, one.blocks.targets, false};
}

// One pass over the round's `count` keys, its times added to `times` as `share` of the round's.
double RowBench::pass(bool put, std::uint64_t round, KVBenchTimes& times, const PassBlocks& blocks,
                      double share) {
  KVStore& store = blocks.store;
  const KVStats before = store.stats();
  const auto start = Clock::now();
  for (std::uint64_t i = 0; i < _count; i += _batch) {
    const std::uint64_t n = std::min(_batch, _count - i);
    for (std::uint64_t k = 0; k < n; ++k) _keys[k] = round * _count + i + k + 1;
    const auto results = put ? store.put(std::span(_keys).first(n), blocks.sources.first(n))
                             : store.get(std::span(_keys).first(n), blocks.targets.first(n));
    for (const KVResult& r : results) {
      FERRY_EXPECT(r.ok() && r.status != KVStatus::already_present, std::runtime_error, "kv bench ",
                   put ? "put" : "get", " of ", _block, "-byte blocks: ", to_string(r.status), ": ",
                   r.message);
      if (blocks.row) _row.path = to_string(r.route);
    }
  }
  const double seconds = seconds_since(start);
  accumulate(times, kv_bench_times_between(before, store.stats(), seconds), share / _row.rounds);
  return seconds;
}

// The last pass's blocks (those of its last batch, which the target holds) against the pattern.
void RowBench::check(const BatchMemory& target) const {
  const std::uint64_t last = _count - (_count - 1) / _batch * _batch;  // blocks in the last batch
  const std::vector<std::byte> got = target.read();
  FERRY_EXPECT(std::equal(got.begin(), got.begin() + last * _block, _pattern.begin()),
               std::runtime_error, "kv bench: the blocks got back differ from those put (", _block,
               "-byte blocks, ", _row.path, ")");
}

void RowBench::check_and_clear(const BatchMemory& target) const {
  check(target);
  target.fill(std::vector<std::byte>(_pattern.size()));
}

// Each pair in turn, ferry's first in even rounds.
template <class Ferry, class Raw>
void in_turn(std::uint64_t round, const Ferry& ferry, const Raw& raw) {
  if (round % 2 == 0) {
    ferry();
    raw();
  } else {
    raw();
    ferry();
  }
}

void RowBench::round(std::uint64_t r) {
  Open& open = *_open;
  in_turn(
      r, [&] { _put_s.push_back(pass(true, r, _row.put_times, row_blocks())); },
      [&] { _raw_write_s.push_back(open.raw.write()); });
  if (open.one_piece) {  // untimed: the one-piece store's blocks for this round's warm gets
    KVBenchTimes unused;
    pass(true, r, unused, one_piece_blocks());
  }
  in_turn(
      r,
      [&] {
        for (const auto& slab : open.slabs) drop_cache(slab);
        _cold_s.push_back(pass(false, r, _row.cold_times, row_blocks()));
      },
      [&] { _raw_cold_s.push_back(open.raw.read_cold()); });
  check_and_clear();
  // The one-piece store's warm gets right before or after the row's, in turn.
  const auto ferry = [&] {
    if (open.one_piece)
      in_turn(
          r, [&] { warm_gets(r); }, [&] { one_piece_warm_gets(r); });
    else
      warm_gets(r);
  };
  in_turn(r, ferry, [&] { _raw_warm_s.push_back(open.raw.read_warm()); });
  check();
}

// The round's warm gets: with page-cache DMA, the reader's staged pass, the first pass (which
// asks for its windows' registrations) and one from the registered windows; without it, several
// passes.
void RowBench::warm_gets(std::uint64_t r) {
  Open& open = *_open;
  for (const auto& slab : open.slabs) warm(slab);
  if (open.staged) {
    KVBenchTimes unused;
    _staged_s.push_back(pass(false, r, unused, row_blocks(open.staged.get())));
    _row.warm_staged_path = _row.path;
    check_and_clear();  // each pass's bytes checked
  }
  const KVStats before = open.store.stats();
  // Without page-cache DMA several passes a round: one pass of 1 GiB takes 30-70 ms, and one
  // pass a round moved by 10% between identical builds. With it, one: the next pass would find
  // its windows registered.
  const unsigned passes = _o.page_cache_pin ? 1 : kWarmPasses;
  for (unsigned p = 0; p < passes; ++p) {
    if (p > 0) check_and_clear();
    _warm_s.push_back(pass(false, r, _row.warm_times, row_blocks(), 1.0 / passes));
  }
  _row.warm_resident = std::min(_row.warm_resident, resident_share(open.slabs));
  if (_o.page_cache_pin) registered_pass(r, before);
}

// The one-piece store's warm gets of the round's blocks, as many passes as the row's.
void RowBench::one_piece_warm_gets(std::uint64_t r) {
  OnePiece& one = *_open->one_piece;
  for (const auto& slab : one.slabs) warm(slab);
  KVBenchTimes unused;
  for (unsigned p = 0; p < kWarmPasses; ++p) {
    _one_warm_s.push_back(pass(false, r, unused, one_piece_blocks()));
    check_and_clear(one.blocks.target);
  }
}

// A warm pass from the windows the first warm pass registered (in the background), and where its
// time went.
void RowBench::registered_pass(std::uint64_t r, const KVStats& before) {
  KVStore& store = _open->store;
  while (store.stats().page_cache_windows_pending > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const KVStats registered = store.stats();
  _register_s.push_back(registered.page_cache_register_seconds -
                        before.page_cache_register_seconds);
  check_and_clear();
  KVBenchTimes unused;
  _registered_s.push_back(pass(false, r, unused, row_blocks()));
  _row.warm_registered_path = _row.path;
  const KVStats after = store.stats();
  const double share = 1.0 / _row.rounds;
  _row.registered_pass_seconds += _registered_s.back() * share;
  _row.page_cache_dma_seconds +=
      (after.page_cache_dma_seconds - registered.page_cache_dma_seconds) * share;
  _row.page_cache_checksum_seconds +=
      (after.page_cache_checksum_seconds - registered.page_cache_checksum_seconds) * share;
  _row.page_cache_scatter_seconds +=
      (after.page_cache_scatter_seconds - registered.page_cache_scatter_seconds) * share;
  const double dma = double(after.page_cache_dma_bytes - registered.page_cache_dma_bytes);
  _row.page_cache_dma_share =
      std::min(_row.page_cache_dma_share, dma / (double(_count) * double(_block)));
}

// The medians and each round's rates, then what the device measures beside them.
void RowBench::finish_row() {
  KVBenchRow& row = _row;
  const double gb = double(_count) * double(_block) / 1e9;
  row.put_gbps = gb / median(_put_s);
  row.get_cold_gbps = gb / median(_cold_s);
  row.get_warm_gbps = gb / median(_warm_s);
  row.put_iops = double(_count) / median(_put_s);
  row.get_iops = double(_count) / median(_cold_s);
  row.raw_write_gbps = gb / median(_raw_write_s);
  row.raw_read_gbps = gb / median(_raw_cold_s);
  row.raw_warm_read_gbps = gb / median(_raw_warm_s);
  const auto rates = [gb](const std::vector<double>& seconds) {
    std::vector<double> out;
    for (double s : seconds) out.push_back(gb / s);
    return out;
  };
  row.put_round_gbps = rates(_put_s);
  row.raw_write_round_gbps = rates(_raw_write_s);
  row.get_cold_round_gbps = rates(_cold_s);
  row.raw_read_round_gbps = rates(_raw_cold_s);
  if (!_one_warm_s.empty()) {
    row.one_piece_warm_gbps = gb / median(_one_warm_s);
    // Each round's passes' median.
    const auto by_round = [&](const std::vector<double>& seconds) {
      std::vector<double> out;
      for (std::size_t at = 0; at + kWarmPasses <= seconds.size(); at += kWarmPasses)
        out.push_back(gb / median(std::vector<double>(seconds.begin() + at,
                                                      seconds.begin() + at + kWarmPasses)));
      return out;
    };
    row.get_warm_round_gbps = by_round(_warm_s);
    row.one_piece_warm_round_gbps = by_round(_one_warm_s);
  }
  if (_o.page_cache_pin) {
    row.get_warm_registered_gbps = gb / median(_registered_s);
    row.get_warm_staged_gbps = gb / median(_staged_s);
    row.page_cache_register_seconds = median(_register_s);
  }
  if (_o.device.is_cuda()) {
    std::tie(row.pinned_d2h_gbps, row.pinned_h2d_gbps) =
        pinned_copies(_o.device.index, _block * _batch);
    try {  // a measurement beside the store's rows: its failure is reported, not fatal
      std::tie(row.gpu_checksum_gbps, row.gpu_checksum_note) =
          gpu_checksum_rate(_o.device.index, _block, _batch);
    } catch (const std::exception& e) {
      row.gpu_checksum_note = e.what();
    }
  }
}

}  // namespace

KVBenchTimes kv_bench_times_between(const KVStats& a, const KVStats& b, double pass) {
  KVBenchTimes t;
  t.pass = pass;
  t.move = (b.put_move_seconds - a.put_move_seconds) + (b.get_move_seconds - a.get_move_seconds);
  t.sync = b.put_sync_seconds - a.put_sync_seconds;
  t.journal = b.put_journal_seconds - a.put_journal_seconds;
  t.io = b.staged_io_seconds - a.staged_io_seconds;
  t.copy_wait = b.staged_copy_wait_seconds - a.staged_copy_wait_seconds;
  t.queue = b.staged_queue_seconds - a.staged_queue_seconds;
  t.setup = b.staged_setup_seconds - a.staged_setup_seconds;
  t.hash = b.staged_hash_seconds - a.staged_hash_seconds;
  t.hash_wait = b.staged_hash_wait_seconds - a.staged_hash_wait_seconds;
  t.transfer = b.staged_transfer_seconds - a.staged_transfer_seconds;
  t.span = b.staged_thread_span_seconds - a.staged_thread_span_seconds;
  t.copies = double(b.staged_copies - a.staged_copies);
  t.lead = b.staged_lead_seconds - a.staged_lead_seconds;
  t.tail = b.staged_tail_seconds - a.staged_tail_seconds;
  t.prepare = b.get_prepare_seconds - a.get_prepare_seconds;
  return t;
}

std::uint64_t kv_bench_batch(const KVBenchOptions& o, std::uint64_t block) {
  return o.batch_bytes ? std::max<std::uint64_t>(1, o.batch_bytes / block) : o.batch;
}

std::uint64_t kv_layout_block_bytes(const KVBenchOptions& o) {
  const PieceLayout l = piece_layout(o);
  return l.name.empty() ? 0 : l.page * l.pieces;
}

std::vector<KVBenchRow> run_kv_bench(const KVBenchOptions& o,
                                     const std::function<void(const KVBenchRow&)>& on_row) {
  FERRY_EXPECT(o.batch >= 1 && o.pieces >= 1, std::invalid_argument,
               "kv bench: batch and pieces must be at least 1");
  std::vector<KVPath> paths = o.paths;
  if (!o.device.is_cuda()) {
    paths = {KVPath::Auto};  // host memory: the host path whatever is asked
  } else if (paths.empty()) {
    paths.push_back(KVPath::Staged);
    if (detail::driver_verdict(detail::probe_cufile()).mode != detail::CuFileMode::Unavailable)
      paths.push_back(KVPath::Direct);
  }
  fs::create_directories(o.root);
  std::vector<KVBenchRow> rows;
  const std::vector<std::uint64_t> sizes =
      o.layout.empty() ? o.block_sizes : std::vector<std::uint64_t>{kv_layout_block_bytes(o)};
  for (std::uint64_t block : sizes) {
    FERRY_EXPECT(block >= o.pieces, std::invalid_argument, "kv bench: ", block,
                 "-byte blocks cannot hold ", o.pieces, " pieces");
    for (KVPath path : paths) {
      rows.push_back(RowBench(o, block, path).run());
      if (on_row) on_row(rows.back());
    }
  }
  return rows;
}

}  // namespace ferry
