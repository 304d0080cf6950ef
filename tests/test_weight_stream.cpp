// Weight streaming with host memory standing in for the GPU: the slot plan, every group's bytes
// in its slot when waited for (host and file sources, several passes, out-of-order uses), the
// expert cache's policies, and the errors for bad groups, distances and files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "ferry/error.hpp"
#include "ferry/expert_cache.hpp"
#include "ferry/weight_stream.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

// Group g of `sizes.size()` tensors; tensor t's bytes are random, seeded by (g, t).
std::vector<std::byte> tensor_bytes(std::size_t g, std::size_t t, std::uint64_t size) {
  return test::random_bytes(size, g * 1000 + t + 1);
}

struct HostGroups {
  std::vector<std::vector<std::vector<std::byte>>> bytes;  // [group][tensor]
  std::vector<StreamGroup> groups;
};

HostGroups host_groups(const std::vector<std::vector<std::uint64_t>>& layouts) {
  HostGroups out;
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    out.bytes.emplace_back();
    for (std::size_t t = 0; t < layouts[g].size(); ++t)
      out.bytes[g].push_back(tensor_bytes(g, t, layouts[g][t]));
  }
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    StreamGroup group;
    for (const auto& b : out.bytes[g]) group.tensors.push_back({b.size(), b.data()});
    out.groups.push_back(group);
  }
  return out;
}

std::vector<std::byte> at(std::uintptr_t address, std::uint64_t size) {
  std::vector<std::byte> out(size);
  if (size) std::memcpy(out.data(), reinterpret_cast<const void*>(address), size);
  return out;
}

void expect_group(const WeightStream& stream, const HostGroups& host, std::size_t g) {
  for (std::size_t t = 0; t < host.bytes[g].size(); ++t)
    EXPECT_EQ(at(stream.tensor_address(g, t), host.bytes[g][t].size()), host.bytes[g][t])
        << "group " << g << " tensor " << t;
}

TEST(WeightStream, SlotPlanGivesEachLayoutItsOwnSlots) {
  // Two layouts interleaved (attention-like and MLP-like groups), prefetch distance 2.
  auto host = host_groups({{100, 300}, {64}, {100, 300}, {64}, {100, 300}, {64}});
  const auto sizes = WeightStream::slot_sizes(host.groups, 2);
  ASSERT_EQ(sizes.size(), 4u);
  EXPECT_EQ(sizes[0], 256u + 300u);  // the second tensor starts 256-byte aligned
  EXPECT_EQ(sizes[2], 64u);
  WeightStream stream(host.groups, 2, {});
  EXPECT_EQ(stream.slot_of(0), 0u);
  EXPECT_EQ(stream.slot_of(2), 1u);
  EXPECT_EQ(stream.slot_of(4), 0u);
  EXPECT_EQ(stream.slot_of(1), 2u);
  EXPECT_EQ(stream.slot_of(3), 3u);
  EXPECT_EQ(stream.slot_of(5), 2u);
  EXPECT_EQ(stream.tensor_address(0, 1) % 256, 0u);
}

TEST(WeightStream, EveryPassSeesEachGroupsBytes) {
  for (unsigned prefetch : {1u, 2u, 3u, 4u, 6u}) {
    auto host = host_groups({{1000, 5}, {1000, 5}, {1000, 5}, {1000, 5}, {1000, 5}, {1000, 5}});
    WeightStream stream(host.groups, prefetch, {});
    stream.prime(nullptr);
    for (int pass = 0; pass < 3; ++pass)
      for (std::size_t g = 0; g < host.groups.size(); ++g) {
        stream.wait(g, nullptr);
        expect_group(stream, host, g);
        stream.release(g, nullptr);
      }
    const auto stats = stream.stats();
    EXPECT_EQ(stats.hits, 18u) << "prefetch " << prefetch;
    EXPECT_EQ(stats.demand_fills, 0u);
    // prime fills P slots; then every release refills its slot, unless its group has the slot
    // alone (with 4 slots for 6 groups, groups 2 and 3 do).
    const std::uint64_t fills = prefetch == 6 ? 6 : prefetch == 4 ? 4 + 3 * 4 : prefetch + 18;
    EXPECT_EQ(stats.fills, fills) << "prefetch " << prefetch;
    EXPECT_EQ(stats.bytes, fills * (1000 + 24 + 5));  // 1000 rounded to 1024, then 5
  }
}

TEST(WeightStream, ASlotIsReusedOnlyAfterRelease) {
  auto host = host_groups({{512}, {512}, {512}, {512}});
  WeightStream stream(host.groups, 2, {});
  stream.prime(nullptr);
  stream.wait(0, nullptr);
  expect_group(stream, host, 0);
  stream.wait(1, nullptr);
  expect_group(stream, host, 0);  // group 1's wait leaves group 0's slot alone
  stream.release(0, nullptr);
  EXPECT_EQ(at(stream.tensor_address(0, 0), 512), host.bytes[2][0]);  // now group 2's
}

TEST(WeightStream, AnOutOfOrderUseLoadsOnDemand) {
  auto host = host_groups({{300}, {300}, {300}, {300}, {300}});
  WeightStream stream(host.groups, 2, {});
  stream.prime(nullptr);
  stream.wait(3, nullptr);  // slot 1 holds group 1
  expect_group(stream, host, 3);
  EXPECT_EQ(stream.stats().demand_fills, 1u);
  stream.wait(1, nullptr);
  expect_group(stream, host, 1);
  EXPECT_EQ(stream.stats().demand_fills, 2u);
}

TEST(WeightStream, TheCallerCanFillTheArenaAfterwards) {
  auto host = host_groups({{40, 4000}, {40, 4000}, {40, 4000}});
  std::vector<StreamGroup> empty = host.groups;
  for (auto& g : empty)
    for (auto& t : g.tensors) t.host = nullptr;
  WeightStream stream(empty, 1, {});
  for (std::size_t g = 0; g < 3; ++g)
    for (std::size_t t = 0; t < 2; ++t)
      std::memcpy(stream.host_address(g, t), host.bytes[g][t].data(), host.bytes[g][t].size());
  stream.prime(nullptr);
  for (std::size_t g = 0; g < 3; ++g) {
    stream.wait(g, nullptr);
    expect_group(stream, host, g);
    stream.release(g, nullptr);
  }
}

TEST(WeightStream, CallerSlotMemoryIsUsed) {
  auto host = host_groups({{128}, {128}, {128}});
  std::vector<std::byte> a(4096), b(4096);
  const auto base_a = reinterpret_cast<std::uintptr_t>(a.data() + 256) / 256 * 256;
  const auto base_b = reinterpret_cast<std::uintptr_t>(b.data() + 256) / 256 * 256;
  WeightStream stream(host.groups, 2, {}, {base_a, base_b});
  EXPECT_EQ(stream.tensor_address(0, 0), base_a);
  EXPECT_EQ(stream.tensor_address(1, 0), base_b);
  stream.prime(nullptr);
  stream.wait(1, nullptr);
  expect_group(stream, host, 1);
  EXPECT_THROW(WeightStream(host.groups, 2, {}, {base_a}), std::invalid_argument);
  EXPECT_THROW(WeightStream(host.groups, 2, {}, {base_a + 8, base_b}), std::invalid_argument);
}

TEST(WeightStream, BadGroupsAndDistancesAreRefused) {
  auto host = host_groups({{10}, {10}, {10}});
  EXPECT_THROW(WeightStream(host.groups, 0, {}), std::invalid_argument);
  try {
    WeightStream(host.groups, 4, {});
    ADD_FAILURE() << "a distance beyond the groups was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("larger than the 3 groups"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(WeightStream({}, 1, {}), std::invalid_argument);
  EXPECT_THROW(WeightStream({StreamGroup{}}, 1, {}), std::invalid_argument);
  EXPECT_THROW(WeightStream({StreamGroup{{{0, nullptr}}}}, 1, {}), std::invalid_argument);
  WeightStream stream(host.groups, 1, {});
  EXPECT_THROW(stream.wait(3, nullptr), std::invalid_argument);
  EXPECT_THROW(stream.tensor_address(0, 1), std::invalid_argument);
  EXPECT_THROW(stream.host_address(3, 0), std::invalid_argument);
  EXPECT_THROW(stream.slot_address(1), std::invalid_argument);
}

// A file of 8 groups x 3 tensors, written in an order unlike the groups' (reversed, with gaps),
// so that reads merge, skip holes and scatter into slots out of order.
struct FileGroups {
  TempDir dir;
  std::shared_ptr<FileSet> files = FileSet::create();
  HostGroups host;
};

std::unique_ptr<FileGroups> file_groups(std::size_t count) {
  auto out = std::make_unique<FileGroups>();
  std::vector<std::vector<std::uint64_t>> layouts(count, {4096 * 3 + 7, 100, 70000});
  out->host = host_groups(layouts);
  std::string data;
  for (std::size_t g = count; g-- > 0;) {
    for (std::size_t t = 3; t-- > 0;) {
      auto& tensor = out->host.groups[g].tensors[t];
      tensor.host = nullptr;
      tensor.file = 0;
      tensor.file_offset = data.size();
      const auto& b = out->host.bytes[g][t];
      data.append(reinterpret_cast<const char*>(b.data()), b.size());
      data.append(t == 1 ? 3000 : 0, 'x');  // a gap after the middle tensor
    }
  }
  test::write_file(out->dir / "weights.bin", data);
  out->files->add(out->dir / "weights.bin");
  return out;
}

TEST(WeightStream, FilesSourceReadsEachGroupIntoItsSlot) {
  for (IoMode io : {IoMode::Buffered, IoMode::Direct}) {
    auto f = file_groups(8);
    StreamOptions options;
    options.source = StreamSource::Files;
    options.files = f->files;
    options.transfer.io = io;
    options.transfer.chunk_bytes = 64 << 10;
    WeightStream stream(f->host.groups, 3, options);
    stream.prime(nullptr);
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t g = 0; g < 8; ++g) {
        stream.wait(g, nullptr);
        expect_group(stream, f->host, g);
        stream.release(g, nullptr);
      }
    EXPECT_EQ(stream.stats().hits, 16u);
  }
}

TEST(WeightStream, FilesSourceRefusesRangesPastTheEnd) {
  auto f = file_groups(2);
  StreamOptions options;
  options.source = StreamSource::Files;
  options.files = f->files;
  auto groups = f->host.groups;
  groups[1].tensors[2].file_offset = f->files->size_at_open(0) - 10;
  try {
    WeightStream(groups, 1, options);
    ADD_FAILURE() << "a range past the end was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("weights.bin"), std::string::npos) << e.what();
  }
  groups = f->host.groups;
  groups[0].tensors[0].file = 1;
  EXPECT_THROW(WeightStream(groups, 1, options), std::invalid_argument);
  options.files = nullptr;
  EXPECT_THROW(WeightStream(f->host.groups, 1, options), std::invalid_argument);
}

TEST(WeightStream, AFailedReadIsReportedAndRetried) {
  auto f = file_groups(2);
  StreamOptions options;
  options.source = StreamSource::Files;
  options.files = f->files;
  options.transfer.io = IoMode::Buffered;
  WeightStream stream(f->host.groups, 1, options);
  std::filesystem::resize_file(f->dir / "weights.bin", 100);
  stream.prime(nullptr);
  EXPECT_ANY_THROW(stream.wait(0, nullptr));
}

// ---- the expert cache ----

HostGroups experts(std::size_t count) {
  return host_groups(std::vector<std::vector<std::uint64_t>>(count, {2000, 300}));
}

void expect_expert(const ExpertCache& cache, const HostGroups& host, std::size_t e,
                   std::size_t slot) {
  EXPECT_EQ(at(cache.slot_address(slot), 2000), host.bytes[e][0]) << "expert " << e;
  EXPECT_EQ(at(cache.slot_address(slot) + 2048, 300), host.bytes[e][1]) << "expert " << e;
}

std::size_t use(ExpertCache& cache, const HostGroups& host, std::size_t e) {
  const std::size_t one[] = {e};
  const auto slots = cache.acquire(one, nullptr);
  expect_expert(cache, host, e, slots[0]);
  cache.release(one);
  return slots[0];
}

TEST(ExpertCache, LruEvictsTheLeastRecentlyUsed) {
  auto host = experts(4);
  ExpertCache cache(host.groups, 2, {});
  use(cache, host, 0);
  use(cache, host, 1);
  use(cache, host, 0);
  use(cache, host, 2);  // evicts 1
  EXPECT_EQ(cache.resident_slot(1), -1);
  EXPECT_GE(cache.resident_slot(0), 0);
  const auto s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.bytes, 3u * (2048 + 300));
}

TEST(ExpertCache, FrequencyKeepsTheOftenUsed) {
  auto host = experts(4);
  ExpertCache lfu(host.groups, 2, {}, EvictionPolicy::Frequency);
  ExpertCache lru(host.groups, 2, {}, EvictionPolicy::Lru);
  for (ExpertCache* c : {&lfu, &lru}) {
    for (int i = 0; i < 5; ++i) use(*c, host, 0);
    use(*c, host, 1);  // 1 is the most recent, 0 the most used
    use(*c, host, 2);
  }
  EXPECT_GE(lfu.resident_slot(0), 0);
  EXPECT_EQ(lfu.resident_slot(1), -1);
  EXPECT_EQ(lru.resident_slot(0), -1);
  EXPECT_GE(lru.resident_slot(1), 0);
}

TEST(ExpertCache, PinnedExpertsStayAndSpeculationFillsTheRest) {
  auto host = experts(6);
  ExpertCache cache(host.groups, 3, {});
  const std::size_t ab[] = {0, 1};
  const std::size_t guess[] = {4, 5};
  auto slots = cache.acquire(ab, nullptr, guess);
  expect_expert(cache, host, 0, slots[0]);
  expect_expert(cache, host, 1, slots[1]);
  EXPECT_GE(cache.resident_slot(4), 0);  // the one free slot took the first guess
  EXPECT_EQ(cache.resident_slot(5), -1);
  const std::size_t two[] = {2, 3};
  EXPECT_THROW(cache.acquire(two, nullptr), std::invalid_argument);  // one unpinned slot
  const std::size_t four[] = {4};
  slots = cache.acquire(four, nullptr);
  expect_expert(cache, host, 4, slots[0]);
  EXPECT_EQ(cache.stats().hits, 1u);
  cache.release(ab);
  cache.release(four);
  const std::size_t dup[] = {2, 2};
  EXPECT_THROW(cache.acquire(dup, nullptr), std::invalid_argument);
  const std::size_t out_of_range[] = {6};
  EXPECT_THROW(cache.acquire(out_of_range, nullptr), std::invalid_argument);
  EXPECT_THROW(cache.release(four), std::invalid_argument);
}

TEST(ExpertCache, BadShapesAreRefused) {
  auto host = experts(3);
  EXPECT_THROW(ExpertCache(host.groups, 0, {}), std::invalid_argument);
  EXPECT_THROW(ExpertCache(host.groups, 4, {}), std::invalid_argument);
  auto groups = host.groups;
  groups[2].tensors[1].size = 299;
  EXPECT_THROW(ExpertCache(groups, 2, {}), std::invalid_argument);
}

TEST(ExpertCache, FilesSourceLoadsExperts) {
  auto f = file_groups(5);
  StreamOptions options;
  options.source = StreamSource::Files;
  options.files = f->files;
  ExpertCache cache(f->host.groups, 2, options);
  for (std::size_t e : {0, 3, 0, 4, 1, 3}) {
    const std::size_t one[] = {e};
    const auto slots = cache.acquire(one, nullptr);
    for (std::size_t t = 0; t < 3; ++t) {
      const auto layout = slot_layout(f->host.groups[e]);
      EXPECT_EQ(at(cache.slot_address(slots[0]) + layout.offsets[t], f->host.bytes[e][t].size()),
                f->host.bytes[e][t]);
    }
    cache.release(one);
  }
  EXPECT_EQ(cache.stats().hits, 1u);
}

}  // namespace
}  // namespace ferry
