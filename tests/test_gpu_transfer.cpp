// The transfer core with GPU memory: staged round trips (aligned and unaligned, several devices'
// spans in one extent where there are several GPUs), cuFile round trips, and a write ordered
// after the caller's event never reads memory a GPU operation is still writing; work queued
// behind an extent's `extent_copied` event sees its bytes; per-key reads
// (TensorReader::submit) into device memory equal the host path. Skipped without
// a GPU (cuFile cases also without cuFile).
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "cuda/cuda_resources.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/tensor_reader.hpp"
#include "ferry/transfer.hpp"
#include "services/pinned_pool.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/gds_mode.hpp"
#include "staging_limit.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::StagingLimit;
using test::TempDir;

class GpuTransfer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
    context = std::make_shared<detail::PrimaryContext>(0);
    context->make_current();
  }
  std::shared_ptr<void> device_bytes(const std::vector<std::byte>& bytes) {
    auto memory = detail::allocate_device_memory(context, bytes.size());
    FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(memory.get()), bytes.data(),
             bytes.size(), nullptr);
    FERRY_CU(cuStreamSynchronize, nullptr);
    return memory;
  }
  std::shared_ptr<detail::PrimaryContext> context;
};

void round_trip(const std::shared_ptr<detail::PrimaryContext>& context, Backend backend,
                IoMode io) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "kv.bin", FileAccess::ReadWrite);
  TransferOptions options;
  options.backend = backend;
  options.allow_compat = true;
  options.io = io;
  options.chunk_bytes = 1 << 20;
  for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{4097}, std::uint64_t{(9 << 20) + 5}})
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{777}, std::uint64_t{8192}}) {
      auto bytes = test::random_bytes(size, size + offset);
      auto source = detail::allocate_device_memory(context, size);
      auto target = detail::allocate_device_memory(context, size);
      context->make_current();
      FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(source.get()), bytes.data(),
               size, nullptr);
      FERRY_CU(cuStreamSynchronize, nullptr);
      Ticket put = submit(set, Direction::MemoryToFile,
                          {{0, offset, {{Device::cuda(0), source.get(), size}}}}, options);
      put.wait();
      put.rethrow_if_failed();
      Ticket get = submit(set, Direction::FileToMemory,
                          {{0, offset, {{Device::cuda(0), target.get(), size}}}}, options);
      get.wait();
      get.rethrow_if_failed();
      ASSERT_EQ(test::read_device(target.get(), size), bytes) << size << " at " << offset;
    }
}

TEST_F(GpuTransfer, StagedRoundTripsAreExactBufferedAndDirect) {
  round_trip(context, Backend::Posix, IoMode::Buffered);
  round_trip(context, Backend::Posix, IoMode::Auto);
}

TEST_F(GpuTransfer, CufileRoundTripsAreExact) {
  if (detail::driver_verdict(detail::probe_cufile()).mode == detail::CuFileMode::Unavailable)
    GTEST_SKIP() << "no cuFile";
  round_trip(context, Backend::Cufile, IoMode::Auto);
}

TEST_F(GpuTransfer, HostAndGpuSpansInOneExtent) {
  TempDir dir;
  auto bytes = test::random_bytes(300000, 5);
  test::write_file(dir / "f.bin", std::string(reinterpret_cast<char*>(bytes.data()), bytes.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  auto gpu = detail::allocate_device_memory(context, 200000);
  std::vector<std::byte> host(100000);
  Ticket t = submit(
      set, Direction::FileToMemory,
      {{0, 0, {{Device::cuda(0), gpu.get(), 200000}, {Device::cpu(), host.data(), 100000}}}}, {});
  t.wait();
  t.rethrow_if_failed();
  auto back = test::read_device(gpu.get(), 200000);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin()));
  EXPECT_TRUE(std::equal(host.begin(), host.end(), bytes.begin() + 200000));
}

// The caller's stream fills the buffer with 0xAB after a long copy; the write waits for the
// event recorded behind the fill, so the file must hold 0xAB everywhere, never the old bytes.
TEST_F(GpuTransfer, AWriteOrderedAfterAnEventNeverReadsMemoryBeforeIt) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "out.bin", FileAccess::ReadWrite);
  const std::uint64_t size = 64 << 20;
  auto buffer = device_bytes(std::vector<std::byte>(size, std::byte{0x11}));
  auto big = detail::allocate_device_memory(context, 1ull << 30);
  detail::HostBuffer pinned(1ull << 30, context.get());
  detail::Stream stream;
  detail::Event filled;
  // A long operation first (1 GiB host -> device), then the fill the write must wait for.
  FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(big.get()), pinned.data(),
           1ull << 30, stream.get());
  FERRY_CU(cuMemsetD8Async, reinterpret_cast<shim::cu::DevicePtr>(buffer.get()), 0xAB, size,
           stream.get());
  filled.record(stream);
  TransferOptions options;
  options.backend = Backend::Posix;
  options.after_event = filled.get();
  Ticket t = submit(set, Direction::MemoryToFile, {{0, 0, {{Device::cuda(0), buffer.get(), size}}}},
                    options);
  t.wait();
  t.rethrow_if_failed();
  std::string written(size, '\0');
  std::FILE* f = std::fopen((dir / "out.bin").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fread(written.data(), 1, size, f), size);
  std::fclose(f);
  EXPECT_EQ(written.find_first_not_of('\xAB'), std::string::npos);
}

TEST_F(GpuTransfer, ACallerStreamCanWaitForTheTicketWithoutAHostSync) {
  TempDir dir;
  auto bytes = test::random_bytes(5 << 20, 6);
  test::write_file(dir / "f.bin", std::string(reinterpret_cast<char*>(bytes.data()), bytes.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  auto gpu = detail::allocate_device_memory(context, bytes.size());
  Ticket t = submit(set, Direction::FileToMemory,
                    {{0, 0, {{Device::cuda(0), gpu.get(), bytes.size()}}}}, {});
  detail::Stream compute;
  t.order_before(compute.get());
  detail::HostBuffer landing(bytes.size(), context.get());
  FERRY_CU(cuMemcpyDtoHAsync, landing.data(), reinterpret_cast<shim::cu::DevicePtr>(gpu.get()),
           bytes.size(), compute.get());
  compute.synchronize();
  EXPECT_EQ(std::memcmp(landing.data(), bytes.data(), bytes.size()), 0);
}

// TransferOptions::extent_copied: work queued behind each reported extent's event sees its bytes
// (a device copy of them out, on another stream, read back after the ticket), and every extent
// that moved whole on one worker's stream is reported (each extent is smaller than a chunk).
TEST_F(GpuTransfer, WorkQueuedBehindAnExtentsCopiedEventSeesItsBytes) {
  TempDir dir;
  constexpr std::uint64_t kExtent = 1 << 20, kExtents = 48;
  auto bytes = test::random_bytes(kExtent * kExtents, 11);
  test::write_file(dir / "f.bin", std::string(reinterpret_cast<char*>(bytes.data()), bytes.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  auto landed = detail::allocate_device_memory(context, bytes.size());
  auto copied = detail::allocate_device_memory(context, bytes.size());
  FERRY_CU(cuMemsetD8Async, reinterpret_cast<shim::cu::DevicePtr>(copied.get()), 0, bytes.size(),
           nullptr);
  FERRY_CU(cuStreamSynchronize, nullptr);
  const auto at = [](const std::shared_ptr<void>& m, std::uint64_t e) {
    return reinterpret_cast<shim::cu::DevicePtr>(m.get()) + e * kExtent;
  };
  std::vector<Extent> extents;
  for (std::uint64_t e = 0; e < kExtents; ++e)
    extents.push_back(
        {0, e * kExtent, {{Device::cuda(0), reinterpret_cast<void*>(at(landed, e)), kExtent}}});
  detail::Stream after;
  std::mutex mutex;
  std::vector<bool> reported(kExtents, false);
  TransferOptions o;
  o.backend = Backend::Posix;
  o.interleave = true;
  o.extent_copied = [&](std::size_t e, void* event) {
    std::lock_guard lock(mutex);
    context->make_current();
    FERRY_CU(cuStreamWaitEvent, after.get(), static_cast<shim::cu::Event>(event), 0);
    FERRY_CU(cuMemcpyDtoDAsync, at(copied, e), at(landed, e), kExtent, after.get());
    reported[e] = true;
  };
  submit(set, Direction::FileToMemory, extents, o).wait();
  after.synchronize();
  std::vector<std::byte> back(bytes.size());
  FERRY_CU(cuMemcpyDtoH, back.data(), at(copied, 0), bytes.size());
  for (std::uint64_t e = 0; e < kExtents; ++e) {
    EXPECT_TRUE(reported[e]) << e;
    EXPECT_EQ(std::memcmp(back.data() + e * kExtent, bytes.data() + e * kExtent, kExtent), 0) << e;
  }
}

// A lease for a GPU pins each slot as it is first made ready (one registration per slot). A later
// lease of smaller slots takes the slab's slots as they are registered (no registration again, its
// slots as far apart as the slab's); one of larger slots has the slab registered again in its own
// (never twice over one page, which the driver refuses). Copies out of every slot land exactly.
TEST_F(GpuTransfer, StagingSlotsArePinnedAsFirstUsedAndAgainOnlyForLargerSlots) {
  constexpr std::uint64_t kMiB = 1 << 20, kPage = 4096;
  detail::PinnedPool pool(5 * kMiB);  // one slab of four 1 MiB slots, no room for a second
  const auto* pin = &detail::device_context(0);
  auto gpu = detail::allocate_device_memory(context, 2 * kMiB);
  const auto copy_out = [&](std::byte* slot, std::uint64_t size, std::uint64_t seed) {
    const auto bytes = test::random_bytes(size, seed);
    std::memcpy(slot, bytes.data(), size);
    context->make_current();
    FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(gpu.get()), slot, size,
             nullptr);
    FERRY_CU(cuStreamSynchronize, nullptr);
    EXPECT_EQ(test::read_device(gpu.get(), size), bytes) << size << " bytes, seed " << seed;
  };
  struct Step {
    std::uint64_t slot_bytes;
    unsigned slots;
    std::uint64_t stride;
  };
  // A page of room per slot from the first; the 1.25 MiB lease carves the slab again (3 fit).
  for (const Step& step : {Step{kMiB, 4, kMiB + kPage}, Step{kMiB / 2, 4, kMiB + kPage},
                           Step{kMiB + kPage, 4, kMiB + kPage}, Step{5 * kMiB / 4, 3, 5 * kMiB / 4},
                           Step{kMiB, 3, 5 * kMiB / 4}}) {
    auto lease = pool.lease(step.slot_bytes, 4, 1, pin);
    ASSERT_EQ(lease.slots(), step.slots) << step.slot_bytes;
    EXPECT_EQ(lease.slot_bytes(), step.slot_bytes);
    EXPECT_TRUE(lease.pinned());
    EXPECT_EQ(static_cast<std::uint64_t>(lease.slot(1) - lease.slot(0)), step.stride);
    for (unsigned i : {0u, 2u, 1u, 0u}) {  // any order, and again
      lease.ready(i);
      copy_out(lease.slot(i), lease.slot_bytes(), step.slot_bytes + i);
    }
  }
  EXPECT_EQ(pool.stats().high_water, 4 * (kMiB + kPage));  // the one slab
}

// Many small extents of GPU memory at unaligned offsets and sizes, grouped into shared slots
// and written with their copies queued ahead of the writes, under a staging bound of a few
// slots; read back into other GPU memory through the same grouping. Bit-exact, and the pool
// never held more than the bound.
TEST_F(GpuTransfer, PipelinedWritesOfManyExtentsAreExactWithinTheStagingBound) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "many.bin", FileAccess::ReadWrite);
  const std::size_t count = 5000;
  auto bytes = test::random_bytes(count * 5000, 7);
  auto source = device_bytes(bytes);
  auto target = detail::allocate_device_memory(context, bytes.size());
  std::vector<Extent> writes, reads;
  std::uint64_t file_at = 11, memory_at = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t size = 1 + (i * 7919) % 5000;
    if (i % 13 == 12) file_at += 4096 + i % 97;  // a gap: a new group
    writes.push_back(
        {0, file_at, {{Device::cuda(0), static_cast<std::byte*>(source.get()) + memory_at, size}}});
    reads.push_back(
        {0, file_at, {{Device::cuda(0), static_cast<std::byte*>(target.get()) + memory_at, size}}});
    file_at += size;
    memory_at += size;
  }
  const std::uint64_t limit = 10 * ((1 << 20) + 8192);
  StagingLimit bound(limit);
  TransferOptions options;
  options.backend = Backend::Posix;
  options.chunk_bytes = 1 << 20;
  options.threads = 4;
  options.slots_per_thread = 4;
  Ticket put = submit(set, Direction::MemoryToFile, writes, options);
  put.wait();
  put.rethrow_if_failed();
  Ticket get = submit(set, Direction::FileToMemory, reads, options);
  get.wait();
  get.rethrow_if_failed();
  const auto pool = detail::staging_pool().stats();
  EXPECT_LE(pool.high_water, limit);
  EXPECT_TRUE(put.stats().staging_pinned);
  std::string written(file_at, '\0');
  std::FILE* f = std::fopen((dir / "many.bin").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fread(written.data(), 1, file_at, f), file_at);
  std::fclose(f);
  memory_at = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t n = writes[i].spans[0].size;
    ASSERT_EQ(std::memcmp(written.data() + writes[i].file_offset, bytes.data() + memory_at, n), 0)
        << "extent " << i;
    memory_at += n;
  }
  auto back = test::read_device(target.get(), memory_at);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin()));
}

// Back-to-back GPU extents read as one group, the last ones past the end of the file: those
// fail alone, naming the file; the others land exactly.
TEST_F(GpuTransfer, AReadPastTheEndAmongGroupedGpuExtentsFailsAlone) {
  TempDir dir;
  auto bytes = test::random_bytes(50000, 8);
  test::write_file(dir / "f.bin", std::string(reinterpret_cast<char*>(bytes.data()), bytes.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  auto gpu = detail::allocate_device_memory(context, 30 * 2000);
  std::vector<Extent> extents;
  for (std::uint64_t i = 0; i < 30; ++i)
    extents.push_back(
        {0, i * 2000, {{Device::cuda(0), static_cast<std::byte*>(gpu.get()) + i * 2000, 2000}}});
  Ticket t = submit(set, Direction::FileToMemory, extents, {});
  t.wait();
  auto back = test::read_device(gpu.get(), 25 * 2000);
  for (std::uint64_t i = 0; i < 30; ++i) {
    if ((i + 1) * 2000 <= bytes.size()) {
      EXPECT_EQ(t.status(i).state, ExtentStatus::State::Done) << i << ": " << t.status(i).error;
      EXPECT_EQ(std::memcmp(back.data() + i * 2000, bytes.data() + i * 2000, 2000), 0) << i;
    } else {
      EXPECT_EQ(t.status(i).state, ExtentStatus::State::Failed) << i;
      EXPECT_NE(t.status(i).error.find("f.bin"), std::string::npos) << t.status(i).error;
    }
  }
}

TEST_F(GpuTransfer, TensorReaderSubmissionsToTheGpuEqualTheHostPath) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(
      path, {{"big", DType::U8, {(9u << 20) + 13}}, {"w", DType::BF16, {300, 7}}}, 8);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  for (const auto& t : checkpoint->tensors()) {
    const auto plain = test::read_plain(*checkpoint, t);
    auto gpu = detail::allocate_device_memory(context, t.size);
    // After an event of another stream, as safe_open orders its reads after torch's stream.
    detail::Stream caller;
    detail::Event ready;
    ready.record(caller);
    reader.wait(reader.submit(t, 5, t.size - 5, gpu.get(), Device::cuda(0), ready.get()));
    std::vector<std::byte> back(t.size - 5);
    FERRY_CU(cuMemcpyDtoH, back.data(), reinterpret_cast<shim::cu::DevicePtr>(gpu.get()),
             back.size());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), plain.begin() + 5)) << t.name;
  }
}

}  // namespace
}  // namespace ferry
