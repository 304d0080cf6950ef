// Multi-device loads executed on the host (ranks in host memory, the memcpy collective): the same
// route as on GPUs, checked against slices cut on the host from the plain read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <thread>

#include "fanout/direct_reads.hpp"
#include "fanout/machine_readers.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout_load.hpp"
#include "platform/file_mapping.hpp"
#include "services/page_cache_registry.hpp"
#include "shard_reference.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

std::vector<TensorSpec> model_specs() {
  return {{"model.embed_tokens.weight", DType::BF16, {37, 24}},
          {"model.layers.0.self_attn.q_proj.weight", DType::BF16, {24, 24}},
          {"model.layers.0.self_attn.o_proj.weight", DType::BF16, {24, 24}},
          {"model.layers.0.mlp.down_proj.weight", DType::F32, {24, 53}},
          {"model.layers.0.mlp.up_proj.weight", DType::F32, {53, 24}},
          {"model.layers.0.input_layernorm.weight", DType::F32, {24}},
          {"model.tiny.q_proj.weight", DType::U8, {3}},
          {"lm_head.weight", DType::BF16, {37, 24}}};
}

void expect_ranks_match_host(const FanoutLoad& loaded,
                             const std::map<std::string, std::vector<std::byte>>& written) {
  for (const LoadedRank& rank : loaded.ranks()) {
    ASSERT_EQ(rank.tensors().size(), written.size());
    for (const LoadedShard& t : rank.tensors()) {
      const auto want = test::host_slice(written.at(t.piece->info->name), *t.piece);
      ASSERT_EQ(t.piece->bytes, want.size());
      EXPECT_TRUE(want.empty() || std::memcmp(t.data, want.data(), want.size()) == 0)
          << t.piece->info->name;
    }
  }
}

TEST(FanoutLoad, ReplicasOnThreeHostRanks) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 7);
  auto ckpt = Checkpoint::open_shared(file);
  FanoutOptions o;
  o.devices = {Device::cpu(), Device::cpu(), Device::cpu()};
  o.round_bytes = 1024;  // many rounds
  o.load.chunk_bytes = 4096;
  o.load.io = IoMode::Buffered;  // O_DIRECT would count its 4 KiB alignment as read
  o.next_round = FanoutOptions::NextRound::AtTail;
  expect_ranks_match_host(load_fanout(ckpt, o), written);
  o.submissions = FanoutOptions::Submissions::PerDevice;
  const FanoutLoad per_device = load_fanout(ckpt, o);
  expect_ranks_match_host(per_device, written);
  EXPECT_EQ(per_device.stats().submissions, "per-device");
  EXPECT_EQ(per_device.stats().bytes_read, per_device.stats().checkpoint_bytes);
  o.submissions = FanoutOptions::Submissions::PerRound;
  o.next_round = FanoutOptions::NextRound::Eager;
  const FanoutLoad loaded = load_fanout(ckpt, o);
  expect_ranks_match_host(loaded, written);
  const FanoutStats& s = loaded.stats();
  EXPECT_EQ(s.next_round, "eager");
  EXPECT_GT(s.phases.reads_seconds, 0.0);
  EXPECT_GT(s.phases.read_thread_seconds, 0.0);
  EXPECT_GE(s.phases.pool_threads, 1u);
  EXPECT_EQ(s.checkpoint_bytes, ckpt->files()[0].size - ckpt->files()[0].data_start);
  EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);  // once, not three times
  EXPECT_EQ(s.tensor_bytes, 3 * s.checkpoint_bytes);
  EXPECT_GT(s.rounds, 1u);
  // When each phase was reached, in order, from planning to the end.
  ASSERT_GE(s.timeline.size(), 6u);
  EXPECT_EQ(s.timeline[0].first, "planned");
  EXPECT_EQ(s.timeline[1].first, "allocated");
  EXPECT_EQ(s.timeline.back().first, "done");
  EXPECT_DOUBLE_EQ(s.timeline.back().second, s.seconds);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < s.timeline.size(); ++i) {
    names.push_back(s.timeline[i].first);
    if (i > 0) {
      EXPECT_LE(s.timeline[i - 1].second, s.timeline[i].second) << names.back();
    }
  }
  for (const std::string want : {"round 0 submitted", "round 0 read", "round 0 exchanges queued",
                                 "round 1 read", "round 0 first_read", "round 0 staging_ready",
                                 "reads_done"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_NE(to_json(s).find("\"timeline\":[[\"planned\","), std::string::npos);
  ASSERT_EQ(s.ranks.size(), 3u);
  std::uint64_t links = 0;
  for (const auto& r : s.ranks) links += r.link_bytes;
  EXPECT_EQ(links, s.checkpoint_bytes);
  EXPECT_EQ(s.collective, "host memcpy");
}

TEST(FanoutLoad, TensorParallelOnHostRanks) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 8);
  auto ckpt = Checkpoint::open_shared(file);
  for (unsigned n : {1u, 2u, 4u}) {
    FanoutOptions o;
    o.devices.assign(n, Device::cpu());
    o.rule = llama_tensor_parallel;
    o.round_bytes = 512;
    o.load.chunk_bytes = 1000;
    o.load.io = IoMode::Buffered;
    if (n == 2) o.next_round = FanoutOptions::NextRound::AtTail;
    if (n == 4) o.submissions = FanoutOptions::Submissions::PerDevice;
    const FanoutLoad loaded = load_fanout(ckpt, o);
    expect_ranks_match_host(loaded, written);
    EXPECT_EQ(loaded.stats().bytes_read, loaded.stats().checkpoint_bytes);
    const LoadedShard* o_proj =
        loaded.ranks().back().find("model.layers.0.self_attn.o_proj.weight");
    ASSERT_NE(o_proj, nullptr);
    EXPECT_EQ(o_proj->piece->shape, (std::vector<std::uint64_t>{24, 24 / n}));
  }
}

// Stands in for registered page-cache mappings: the files named in `mapped` held whole in host
// memory, the others staged with a refusal of their own.
detail::MapSources host_copies_of(std::vector<bool> mapped, std::uint64_t cut = 0) {
  return [mapped, cut](const Checkpoint& ckpt, const std::vector<bool>& used,
                       std::span<const Device>, const LoadOptions&) {
    std::vector<detail::MappedSource> out(ckpt.files().size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(used[i]) << "file " << i << " is read by the plan";
      if (!mapped[i]) {
        out[i].reason = "test: refused";
        continue;
      }
      auto bytes = std::make_shared<std::vector<std::byte>>(
          std::filesystem::file_size(ckpt.files()[i].path) - cut);
      std::ifstream in(ckpt.files()[i].path, std::ios::binary);
      in.read(reinterpret_cast<char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
      out[i] = {bytes->data(), bytes->size(), bytes, "test: held in host memory"};
    }
    return out;
  };
}

TEST(FanoutLoad, DirectCopiesFromMappedFilesMatchTheHostPath) {
  TempDir dir;
  auto specs = model_specs();
  const std::vector<TensorSpec> first(specs.begin(), specs.begin() + 4);
  const std::vector<TensorSpec> second(specs.begin() + 4, specs.end());
  auto written = test::write_random_checkpoint(dir / "model-00001-of-00002.safetensors", first, 30);
  written.merge(
      test::write_random_checkpoint(dir / "model-00002-of-00002.safetensors", second, 31));
  auto ckpt = Checkpoint::open_shared(dir.path());
  ASSERT_EQ(ckpt->files().size(), 2u);
  std::uint64_t first_bytes = 0;
  for (const TensorInfo& t : ckpt->tensors())
    if (t.file_index == 0) first_bytes += t.size;
  for (const std::vector<bool>& mapped : {std::vector<bool>{true, true}, {true, false}})
    for (unsigned n : {1u, 2u, 3u})
      for (ShardRule rule : {ShardRule(replicate_all), ShardRule(llama_tensor_parallel)}) {
        FanoutOptions o;
        o.devices.assign(n, Device::cpu());
        o.rule = rule;
        o.round_bytes = 700;  // many rounds: scratch banks reused
        o.load.chunk_bytes = 1000;
        o.load.io = IoMode::Buffered;
        const detail::MapSources map = host_copies_of(mapped);
        for (int repeat = 0; repeat < 2; ++repeat) {
          const FanoutLoad loaded = detail::load_fanout(ckpt, o, map);
          expect_ranks_match_host(loaded, written);
          const FanoutStats& s = loaded.stats();
          EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);
          EXPECT_EQ(s.bytes_from_registered_page_cache,
                    mapped[1] ? s.checkpoint_bytes : first_bytes);
          bool saw_direct = false, saw_staged = false;
          for (const FileLoadStats& f : s.files) {
            if (f.io_path == IoPath::PageCacheDma) {
              saw_direct = true;
              EXPECT_EQ(f.reason, "test: held in host memory");
            } else {
              saw_staged = true;
              EXPECT_NE(f.reason.find("test: refused"), std::string::npos) << f.reason;
            }
          }
          EXPECT_TRUE(saw_direct);
          EXPECT_EQ(saw_staged, !mapped[1]);
        }
      }
}

// The process's page-cache registry over a host stand-in for the driver (it serves cpu ranks):
// the option registers each shard once, later loads copy from the kept registrations; a budget
// that holds one shard leaves the other staged, saying why; the option off registers nothing.
TEST(FanoutLoad, RegisteredPageCacheOnHostRanks) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  int registered = 0;
  detail::PageCacheRegistrar stand_in;
  stand_in.name = "host stand-in";
  stand_in.serves = [](const Device& d) { return !d.is_cuda(); };
  stand_in.register_range = [&](const std::byte*, std::uint64_t) { ++registered; };
  stand_in.unregister_range = [](const std::byte*) {};
  detail::ScopedPageCacheRegistry scoped(stand_in);
  TempDir dir;
  auto specs = model_specs();
  const std::vector<TensorSpec> first(specs.begin(), specs.begin() + 4);
  const std::vector<TensorSpec> second(specs.begin() + 4, specs.end());
  auto written = test::write_random_checkpoint(dir / "model-00001-of-00002.safetensors", first, 33);
  written.merge(
      test::write_random_checkpoint(dir / "model-00002-of-00002.safetensors", second, 34));
  auto ckpt = Checkpoint::open_shared(dir.path());
  FanoutOptions o;
  o.devices = {Device::cpu(), Device::cpu()};
  o.rule = llama_tensor_parallel;
  o.round_bytes = 700;
  o.load.chunk_bytes = 1000;
  o.load.io = IoMode::Buffered;
  expect_ranks_match_host(load_fanout(ckpt, o), written);
  EXPECT_EQ(registered, 0) << "the option is off";
  o.load.page_cache_pin_bytes = 1 << 30;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const FanoutLoad loaded = load_fanout(ckpt, o);
    expect_ranks_match_host(loaded, written);
    const FanoutStats& s = loaded.stats();
    EXPECT_EQ(registered, 2) << "each shard registered once, by the first load";
    EXPECT_EQ(s.bytes_from_registered_page_cache, s.checkpoint_bytes);
    EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);
    ASSERT_EQ(s.files.size(), 2u);
    for (const FileLoadStats& f : s.files) {
      EXPECT_EQ(f.io_path, IoPath::PageCacheDma);
      EXPECT_NE(f.reason.find(repeat ? "an earlier load" : "this load"), std::string::npos)
          << f.reason;
    }
  }
  scoped.registry().release_idle();
  o.load.page_cache_pin_bytes = ckpt->files()[0].size;
  const FanoutLoad loaded = load_fanout(ckpt, o);
  expect_ranks_match_host(loaded, written);
  const FanoutStats& s = loaded.stats();
  EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);
  EXPECT_GT(s.bytes_from_registered_page_cache, 0u);
  EXPECT_LT(s.bytes_from_registered_page_cache, s.checkpoint_bytes);
  for (const FileLoadStats& f : s.files)
    if (f.path == ckpt->files()[1].path) {
      EXPECT_EQ(f.io_path, IoPath::Buffered);
      EXPECT_NE(f.reason.find("no page-cache DMA"), std::string::npos) << f.reason;
    }
}

// A rank's copies of a round are cut into one contiguous part per stream (at least the minimum
// part each), across copy boundaries; every byte lands once, where it belongs.
TEST(FanoutLoad, DirectCopiesShareARoundAmongStreams) {
  const auto source = test::random_bytes(1000, 35);
  for (unsigned streams : {1u, 2u, 3u, 7u})
    for (std::uint64_t min_part : {1u, 100u, 400u, 5000u}) {
      std::vector<std::byte> a(1200, std::byte{0}), b(1200, std::byte{0});
      const auto at = [](std::vector<std::byte>& v, std::size_t i) {
        return reinterpret_cast<std::uintptr_t>(v.data() + i);
      };
      // Three copies into rank 0 (one of them out of source order), one into rank 1.
      const std::vector<detail::DirectCopy> to_a = {{at(a, 0), source.data(), 333},
                                                    {at(a, 700), source.data() + 600, 400},
                                                    {at(a, 400), source.data() + 333, 267}};
      const std::vector<detail::DirectCopy> to_b = {{at(b, 5), source.data(), 1000}};
      const std::vector<Device> devices = {Device::cpu(), Device::cpu()};
      detail::DirectCopies copies(devices, streams, min_part);
      EXPECT_TRUE(copies.queue(0, to_a).empty()) << "host copies ran at once";
      EXPECT_TRUE(copies.queue(1, to_b).empty());
      copies.drain();
      EXPECT_EQ(std::memcmp(a.data(), source.data(), 333), 0);
      EXPECT_EQ(std::memcmp(a.data() + 400, source.data() + 333, 267), 0);
      EXPECT_EQ(std::memcmp(a.data() + 700, source.data() + 600, 400), 0);
      EXPECT_EQ(a[333], std::byte{0});
      EXPECT_EQ(a[1100], std::byte{0});
      EXPECT_EQ(std::memcmp(b.data() + 5, source.data(), 1000), 0);
      EXPECT_EQ(b[4], std::byte{0});
    }
}

TEST(FanoutLoad, AReadOutsideItsMappingIsAClearError) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, model_specs(), 32);
  auto ckpt = Checkpoint::open_shared(file);
  FanoutOptions o;
  o.devices = {Device::cpu(), Device::cpu()};
  try {
    detail::load_fanout(ckpt, o, host_copies_of({true}, 100));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("outside its mapping"), std::string::npos) << e.what();
  }
}

TEST(FanoutLoad, SelectedNamesOnly) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, model_specs(), 9);
  auto ckpt = Checkpoint::open_shared(file);
  FanoutOptions o;
  o.devices = {Device::cpu(), Device::cpu()};
  o.load.names = {"lm_head.weight", "model.layers.0.mlp.down_proj.weight"};
  o.rule = llama_tensor_parallel;
  o.load.io = IoMode::Buffered;
  const FanoutLoad loaded = load_fanout(ckpt, o);
  std::erase_if(written, [&](const auto& kv) {
    return std::find(o.load.names.begin(), o.load.names.end(), kv.first) == o.load.names.end();
  });
  expect_ranks_match_host(loaded, written);
  EXPECT_EQ(loaded.stats().bytes_read,
            written.at("lm_head.weight").size() +
                written.at("model.layers.0.mlp.down_proj.weight").size());
}

// One process per rank, played by one thread: each rank reads its own share of each round
// (read_fanout_round), then the test moves bytes between ranks as torch.distributed would.
// Returns what the ranks' reads counted: bytes read, of which from registered page cache.
std::pair<std::uint64_t, std::uint64_t> load_rank_by_rank(
    const Checkpoint& ckpt, unsigned n, const LoadOptions& o,
    const std::map<std::string, std::vector<std::byte>>& written, const MachineShare& share = {}) {
  FanoutPlanOptions po;
  po.round_bytes = 700;
  po.chunk_bytes = 1500;
  const FanoutPlan plan = plan_fanout(ckpt, n, llama_tensor_parallel, {}, po);
  std::vector<std::vector<std::byte>> memory(n), scratch(n);
  for (unsigned r = 0; r < n; ++r) {
    memory[r].resize(plan.layouts[r].dest_bytes);
    scratch[r].resize(2 * plan.scratch_bank_bytes[r] + 1);
  }
  std::uint64_t read = 0, registered = 0;
  for (std::size_t k = 0; k < plan.rounds.size(); ++k) {
    for (unsigned r = 0; r < n; ++r) {
      const LoadStats s = read_fanout_round(ckpt, plan, k, r, Device::cpu(), memory[r].data(),
                                            scratch[r].data(), o, share);
      read += s.bytes_read;
      registered += s.bytes_from_registered_page_cache;
    }
    const FanoutRound& round = plan.rounds[k];
    for (const FanoutScatter& sc : round.scatters)
      for (const ScatterPart& part : sc.parts)
        for (std::uint64_t row = 0; row < sc.rows; ++row)
          std::memcpy(
              memory[part.rank].data() + part.dest_offset + row * part.width,
              scratch[sc.reader].data() + sc.scratch_offset + row * sc.row_bytes + part.row_begin,
              part.width);
    for (unsigned from = 0; from < n; ++from)
      for (unsigned to = 0; to < n; ++to)
        if (to != from && round.gather_bytes_per_rank > 0)
          std::memcpy(
              memory[to].data() + round.gather_offset + from * round.gather_bytes_per_rank,
              memory[from].data() + round.gather_offset + from * round.gather_bytes_per_rank,
              round.gather_bytes_per_rank);
  }
  EXPECT_EQ(read, plan.read_bytes);
  for (unsigned r = 0; r < n; ++r)
    for (const ShardPiece& p : plan.layouts[r].pieces) {
      const auto want = test::host_slice(written.at(p.info->name), p);
      EXPECT_TRUE(want.empty() ||
                  std::memcmp(memory[r].data() + p.dest_offset, want.data(), want.size()) == 0)
          << p.info->name << " on rank " << r;
    }
  return {read, registered};
}

TEST(FanoutLoad, OneProcessPerRankReadsItsShare) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 12);
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions o;
  o.io = IoMode::Buffered;
  for (unsigned n : {2u, 3u}) EXPECT_EQ(load_rank_by_rank(*ckpt, n, o, written).second, 0u);
  EXPECT_THROW(read_fanout_round(*ckpt, plan_fanout(*ckpt, 2, replicate_all), 99, 0, Device::cpu(),
                                 nullptr, nullptr, {}),
               std::invalid_argument);
}

// A machine's readers: from storage a fixed depth, from the page cache one load's per rank, at
// most the cores; split between the processes and their rounds in flight; never none.
TEST(MachineReaders, StorageIsSharedThePageCacheScalesToTheCores) {
  using detail::kStorageReaders;
  const auto share = [](unsigned one, unsigned ranks, unsigned processes, unsigned rounds,
                        bool cached, unsigned cores) {
    const detail::ReaderShare s =
        detail::share_readers(one, ranks, processes, rounds, cached, cores);
    return std::pair{s.machine, s.per_submission};
  };
  EXPECT_EQ(share(16, 4, 4, 2, false, 64), std::pair(kStorageReaders, kStorageReaders / 8));
  EXPECT_EQ(share(2, 4, 4, 1, false, 2), std::pair(kStorageReaders, kStorageReaders / 4));
  EXPECT_EQ(share(16, 4, 1, 2, false, 64), std::pair(kStorageReaders, kStorageReaders / 2));
  EXPECT_EQ(share(16, 64, 64, 1, false, 64), std::pair(kStorageReaders, 1u));
  EXPECT_EQ(share(16, 4, 4, 1, true, 64), std::pair(64u, 16u));
  EXPECT_EQ(share(16, 4, 4, 2, true, 64), std::pair(64u, 8u));
  EXPECT_EQ(share(16, 4, 1, 2, true, 32), std::pair(32u, 16u));  // one process, 4 GPUs
  EXPECT_EQ(share(16, 8, 8, 1, true, 256), std::pair(64u, 8u));  // the worker pool's cap
  EXPECT_EQ(share(2, 4, 4, 2, true, 2), std::pair(4u, 1u));      // at least one a rank
  EXPECT_EQ(share(16, 1, 1, 2, true, 64), std::pair(16u, 8u));
  EXPECT_EQ(share(0, 0, 0, 0, true, 1), std::pair(1u, 1u));
}

// One process per rank: a rank's round reads with its share of the machine's readers, chosen by
// where the bytes come from, and says so; given threads stay as given. Loads stay bit-exact.
TEST(FanoutLoad, OneProcessPerRankSharesTheMachinesReaders) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 15);
  auto ckpt = Checkpoint::open_shared(file);
  // Reads of 4 KiB, more than any thread count here, so a round runs every thread it is given.
  FanoutPlanOptions po;
  po.chunk_bytes = 4096;
  std::vector<TensorSpec> big = {{"model.embed_tokens.weight", DType::BF16, {1024, 1024}}};
  const auto big_file = dir / "big.safetensors";
  test::write_random_checkpoint(big_file, big, 17);
  auto big_ckpt = Checkpoint::open_shared(big_file);
  const FanoutPlan plan = plan_fanout(*big_ckpt, 2, llama_tensor_parallel, {}, po);
  std::vector<std::byte> memory(plan.layouts[0].dest_bytes);
  std::vector<std::byte> scratch(2 * plan.scratch_bank_bytes[0] + 1);
  LoadOptions o;
  o.chunk_bytes = 4096;
  const auto threads = [&](const LoadOptions& with, const MachineShare& share, std::string& why) {
    const LoadStats s = read_fanout_round(*big_ckpt, plan, 0, 0, Device::cpu(), memory.data(),
                                          scratch.data(), with, share);
    why = s.settings_source;
    return s.reader_threads;
  };
  std::string why;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned one_load = std::min(cores, 16u);  // the engine's choice for a single load
  EXPECT_EQ(threads(o, {}, why), one_load);        // just written: in the page cache
  EXPECT_EQ(threads(o, {4, 2}, why),
            std::max(1u, std::min({64u, one_load * 4, std::max(cores, 4u)}) / 8));
  EXPECT_NE(why.find("4 ranks, 2 rounds each reading at once; reading the page cache"),
            std::string::npos)
      << why;
  o.io = IoMode::Direct;  // O_DIRECT reads come from storage, wherever the pages are
  EXPECT_EQ(threads(o, {4, 1}, why), detail::kStorageReaders / 4);
  EXPECT_NE(why.find("reading storage"), std::string::npos) << why;
  o.reader_threads = 3;  // given: as given
  EXPECT_EQ(threads(o, {4, 2}, why), 3u);
  EXPECT_EQ(why.find("this rank's share"), std::string::npos) << why;
  LoadOptions buffered;
  buffered.io = IoMode::Buffered;
  for (unsigned n : {2u, 3u}) load_rank_by_rank(*ckpt, n, buffered, written, {n, 2});
}

// Auto reads: a checkpoint out of the page cache is read from storage, and the ranks share it.
TEST(FanoutLoad, OneProcessPerRankFromStorageSharesOneLoadsReaders) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 16);
  auto ckpt = Checkpoint::open_shared(file);  // its header read brings the small file in
  {
    const int fd = ::open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  }
  if (detail::reads_from_page_cache(ckpt->file_set(), std::vector<std::uint32_t>{0}))
    GTEST_SKIP() << "this file system keeps pages in memory after POSIX_FADV_DONTNEED";
  const FanoutPlan plan = plan_fanout(*ckpt, 4, llama_tensor_parallel);
  std::vector<std::byte> memory(plan.layouts[0].dest_bytes);
  std::vector<std::byte> scratch(2 * plan.scratch_bank_bytes[0] + 1);
  LoadOptions o;
  o.io = IoMode::Buffered;  // the pages' residency decides, not the read path
  const LoadStats s =
      read_fanout_round(*ckpt, plan, 0, 0, Device::cpu(), memory.data(), scratch.data(), o, {4, 1});
  EXPECT_NE(s.settings_source.find("this rank's share of"), std::string::npos);
  EXPECT_NE(s.settings_source.find("reading storage"), std::string::npos) << s.settings_source;
  load_rank_by_rank(*ckpt, 4, o, written, {4, 1});  // bit-exact
}

// With page-cache DMA on, each rank's reads come straight from the registered mapping (the
// staged backend's page-cache path; a host stand-in registrar serves cpu ranks).
TEST(FanoutLoad, OneProcessPerRankFromTheRegisteredPageCache) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  detail::PageCacheRegistrar stand_in;
  stand_in.name = "host stand-in";
  stand_in.serves = [](const Device& d) { return !d.is_cuda(); };
  stand_in.register_range = [](const std::byte*, std::uint64_t) {};
  stand_in.unregister_range = [](const std::byte*) {};
  detail::ScopedPageCacheRegistry scoped(stand_in);
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 14);
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions o;
  o.io = IoMode::Buffered;
  o.page_cache_pin_bytes = 1 << 30;
  for (unsigned n : {2u, 3u}) {
    const auto [read, registered] = load_rank_by_rank(*ckpt, n, o, written);
    EXPECT_EQ(registered, read);
  }
}

TEST(FanoutLoad, PlanDigestsDifferWhereRanksWouldDisagree) {
  TempDir dir;
  test::write_random_checkpoint(dir / "a.safetensors", model_specs(), 13);
  auto specs = model_specs();
  specs.back().shape = {36, 24};  // one tensor of another size
  test::write_random_checkpoint(dir / "b.safetensors", specs, 13);
  auto a = Checkpoint::open_shared(dir / "a.safetensors");
  auto b = Checkpoint::open_shared(dir / "b.safetensors");
  const auto same = fanout_plan_digest(plan_fanout(*a, 2, llama_tensor_parallel));
  EXPECT_EQ(same, fanout_plan_digest(plan_fanout(*a, 2, llama_tensor_parallel)));
  EXPECT_NE(same, fanout_plan_digest(plan_fanout(*a, 2, replicate_all)));
  EXPECT_NE(same, fanout_plan_digest(plan_fanout(*a, 3, llama_tensor_parallel)));
  EXPECT_NE(same, fanout_plan_digest(plan_fanout(*b, 2, llama_tensor_parallel)));
  const ShardRule uneven = [](const TensorInfo& t) {
    return t.name == "lm_head.weight" ? ShardSpec::split(0, {30, 7}) : llama_tensor_parallel(t);
  };
  EXPECT_NE(same, fanout_plan_digest(plan_fanout(*a, 2, uneven)));
}

TEST(FanoutLoad, BadRequestsAreClearErrors) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, model_specs(), 10);
  auto ckpt = Checkpoint::open_shared(file);
  auto message = [&](FanoutOptions o) -> std::string {
    try {
      load_fanout(ckpt, o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  FanoutOptions none;
  EXPECT_NE(message(none).find("no device"), std::string::npos);
  FanoutOptions twice;
  twice.devices = {Device::cuda(0), Device::cuda(0)};
  EXPECT_NE(message(twice).find("cuda:0 is listed twice"), std::string::npos);
  FanoutOptions mixed;
  mixed.devices = {Device::cpu(), Device::cuda(0)};
  EXPECT_NE(message(mixed).find("cannot be mixed"), std::string::npos);
  FanoutOptions cufile;
  cufile.devices = {Device::cpu(), Device::cpu()};
  cufile.load.backend = Backend::Cufile;
  EXPECT_NE(message(cufile).find("staged path"), std::string::npos);
  FanoutOptions bad_split;
  bad_split.devices = {Device::cpu(), Device::cpu()};
  bad_split.rule = [](const TensorInfo&) { return ShardSpec::split(3); };
  const std::string m = message(bad_split);
  EXPECT_NE(m.find(file.string()), std::string::npos) << m;
  EXPECT_NE(m.find("cannot split dimension 3"), std::string::npos) << m;
}

TEST(FanoutLoad, AFileCutShortFailsTheLoad) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, model_specs(), 11);
  auto ckpt = Checkpoint::open_shared(file);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  FanoutOptions o;
  o.devices = {Device::cpu(), Device::cpu()};
  EXPECT_ANY_THROW(load_fanout(ckpt, o));
}

}  // namespace
}  // namespace ferry
