#include "fanout/collective.hpp"

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "shim/nccl.hpp"

namespace ferry::detail {
namespace {

using Clock = std::chrono::steady_clock;

class HostCollective final : public Collective {
 public:
  explicit HostCollective(unsigned ranks) : _ranks(ranks) {}
  void all_gather(std::span<void* const> bases, std::uint64_t offset,
                  std::uint64_t bytes_per_rank) override {
    const auto started = Clock::now();
    for (unsigned from = 0; from < _ranks; ++from)
      for (unsigned to = 0; to < _ranks; ++to) {
        if (to == from || bytes_per_rank == 0) continue;
        const std::uint64_t at = offset + from * bytes_per_rank;
        std::memcpy(static_cast<std::byte*>(bases[to]) + at,
                    static_cast<const std::byte*>(bases[from]) + at, bytes_per_rank);
      }
    _busy += std::chrono::duration<double>(Clock::now() - started).count();
  }
  void scatter(unsigned, const void* src, std::uint64_t rows, std::uint64_t row_bytes,
               std::span<const Slice> slices) override {
    const auto started = Clock::now();
    for (const Slice& s : slices)
      for (std::uint64_t row = 0; row < rows; ++row)
        std::memcpy(static_cast<std::byte*>(s.dst) + row * s.width,
                    static_cast<const std::byte*>(src) + row * row_bytes + s.row_begin, s.width);
    _busy += std::chrono::duration<double>(Clock::now() - started).count();
  }
  void after(unsigned, void*) override {}
  void* mark(unsigned) override { return nullptr; }
  void wait() override {}
  double busy_seconds() const override { return _busy; }
  std::string name() const override { return "host memcpy"; }

 private:
  unsigned _ranks;
  double _busy = 0;
};

// One device's communicator and the stream its collectives run on. Kept for the process: NCCL
// must not be torn down from a static destructor, and a server's next load reuses it.
struct RankComm {
  const PrimaryContext* context = nullptr;
  shim::nccl::Comm comm = nullptr;
  Stream* stream = nullptr;
};

struct CommSet {
  std::vector<RankComm> ranks;
  std::mutex in_use;  // one load at a time on these streams
  std::string note;   // pairs without peer access, if any
};

std::mutex comm_mutex;
double setup_seconds = 0;

// NCCL (2.22 on) connects a communicator's ring on the first collective that runs on it, not in
// ncclCommInitAll, and CUDA loads a kernel at its first launch: one all-gather here, in the
// set-up, large enough (16 MiB per rank) to take the protocol and channels of a load's gathers,
// so that a load's first gather pays for neither while its reads wait behind it.
void connect_ring(CommSet& set) {
  constexpr std::size_t kPerRank = 16 << 20;
  const std::size_t n = set.ranks.size();
  struct Buffers {
    CommSet& set;
    std::vector<shim::cu::DevicePtr> ptrs;
    ~Buffers() {
      for (std::size_t r = 0; r < ptrs.size(); ++r) {
        if (!ptrs[r]) continue;
        set.ranks[r].context->make_current();
        shim::CudaDriver::get().cuMemFree(ptrs[r]);  // a failure here can only leak
      }
    }
  } buffers{set, std::vector<shim::cu::DevicePtr>(n, 0)};
  for (std::size_t r = 0; r < n; ++r) {
    set.ranks[r].context->make_current();
    FERRY_CU(cuMemAlloc, &buffers.ptrs[r], n * kPerRank);
    FERRY_CU(cuMemsetD8Async, buffers.ptrs[r], 0, n * kPerRank, set.ranks[r].stream->get());
  }
  FERRY_NCCL(ncclGroupStart);
  for (std::size_t r = 0; r < n; ++r) {
    auto* recv = reinterpret_cast<std::byte*>(buffers.ptrs[r]);
    const shim::nccl::Result result = shim::NcclLibrary::get().ncclAllGather(
        recv + r * kPerRank, recv, kPerRank, shim::nccl::kUint8, set.ranks[r].comm,
        set.ranks[r].stream->get());
    if (result != shim::nccl::kSuccess) {
      shim::NcclLibrary::get().ncclGroupEnd();
      shim::nccl_check(result, "ncclAllGather");
    }
  }
  FERRY_NCCL(ncclGroupEnd);
  for (const RankComm& rc : set.ranks) {
    rc.context->make_current();
    rc.stream->synchronize();
  }
}

// Leaked on purpose (see RankComm).
CommSet& comm_set(std::span<const Device> devices) {
  static auto& sets = *new std::map<std::vector<int>, CommSet*>();
  std::vector<int> ordinals;
  for (const Device& d : devices) ordinals.push_back(d.index);
  setup_seconds = 0;
  if (auto it = sets.find(ordinals); it != sets.end()) return *it->second;
  const auto& nccl = shim::NcclLibrary::get();
  FERRY_EXPECT(nccl.loaded, CudaError, "multi-GPU load: ", nccl.why_not_loaded);
  const auto started = Clock::now();
  auto* set = new CommSet;
  set->ranks.resize(devices.size());
  std::vector<shim::nccl::Comm> comms(devices.size(), nullptr);
  for (std::size_t r = 0; r < devices.size(); ++r) device_context(ordinals[r]).make_current();
  FERRY_NCCL(ncclCommInitAll, comms.data(), static_cast<int>(comms.size()), ordinals.data());
  for (std::size_t r = 0; r < devices.size(); ++r) {
    RankComm& rc = set->ranks[r];
    rc.context = &device_context(ordinals[r]);
    rc.context->make_current();
    rc.comm = comms[r];
    rc.stream = new Stream();
  }
  // Scatters copy between GPUs directly (NVLink) only where peer access is on; where the
  // hardware refuses it the driver still copies, through host memory.
  const auto& driver = shim::CudaDriver::get();
  for (const RankComm& from : set->ranks)
    for (const RankComm& to : set->ranks) {
      if (&from == &to) continue;
      from.context->make_current();
      const shim::cu::Result r = driver.cuCtxEnablePeerAccess(to.context->get(), 0);
      if (r != shim::cu::kSuccess && r != shim::cu::kErrorPeerAccessAlreadyEnabled)
        set->note += "; no peer access cuda:" + std::to_string(from.context->ordinal()) +
                     " -> cuda:" + std::to_string(to.context->ordinal()) + " (" +
                     shim::cuda_error_text(r) + "): its scatters go through host memory";
    }
  connect_ring(*set);
  setup_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  sets.emplace(ordinals, set);
  return *set;
}

class NcclCollective final : public Collective {
 public:
  explicit NcclCollective(std::span<const Device> devices) {
    {
      std::lock_guard lock(comm_mutex);
      _set = &comm_set(devices);
      _setup = setup_seconds;
    }
    _in_use = std::unique_lock(_set->in_use);
  }
  ~NcclCollective() override {
    try {
      wait();
    } catch (...) {
      // A failed collective was reported by the wait that saw it; the destructor only drains.
    }
  }

  void all_gather(std::span<void* const> bases, std::uint64_t offset,
                  std::uint64_t bytes_per_rank) override {
    const std::size_t n = _set->ranks.size();
    Timing& t = _timings.emplace_back();
    for (std::size_t r = 0; r < n; ++r) {
      _set->ranks[r].context->make_current();
      t.start.emplace_back(true).record(*_set->ranks[r].stream);
    }
    FERRY_NCCL(ncclGroupStart);
    for (std::size_t r = 0; r < n; ++r) {
      auto* recv = static_cast<std::byte*>(bases[r]) + offset;
      const auto* send = recv + r * bytes_per_rank;  // in place: NCCL's rule for all-gather
      const RankComm& rc = _set->ranks[r];
      shim::nccl::Result result = shim::NcclLibrary::get().ncclAllGather(
          send, recv, bytes_per_rank, shim::nccl::kUint8, rc.comm, rc.stream->get());
      if (result != shim::nccl::kSuccess) {
        shim::NcclLibrary::get().ncclGroupEnd();
        shim::nccl_check(result, "ncclAllGather");
      }
    }
    FERRY_NCCL(ncclGroupEnd);
    for (std::size_t r = 0; r < n; ++r) {
      _set->ranks[r].context->make_current();
      t.end.emplace_back(true).record(*_set->ranks[r].stream);
    }
  }

  void scatter(unsigned reader, const void* src, std::uint64_t rows, std::uint64_t row_bytes,
               std::span<const Slice> slices) override {
    const RankComm& from = _set->ranks[reader];
    from.context->make_current();
    Timing& t = _timings.emplace_back();
    t.start.emplace_back(true).record(*from.stream);
    for (const Slice& s : slices) {
      if (s.width == 0 || rows == 0) continue;
      shim::cu::Memcpy3DPeer copy;
      copy.srcMemoryType = shim::cu::kMemoryTypeDevice;
      copy.srcDevice = reinterpret_cast<shim::cu::DevicePtr>(src) + s.row_begin;
      copy.srcContext = from.context->get();
      copy.srcPitch = row_bytes;
      copy.dstMemoryType = shim::cu::kMemoryTypeDevice;
      copy.dstDevice = reinterpret_cast<shim::cu::DevicePtr>(s.dst);
      copy.dstContext = _set->ranks[s.rank].context->get();
      copy.dstPitch = s.width;
      copy.WidthInBytes = s.width;
      copy.Height = rows;
      copy.Depth = 1;
      FERRY_CU(cuMemcpy3DPeerAsync, &copy, from.stream->get());
    }
    t.end.emplace_back(true).record(*from.stream);
  }

  void after(unsigned rank, void* cu_event) override {
    if (!cu_event) return;
    const RankComm& rc = _set->ranks[rank];
    rc.context->make_current();
    FERRY_CU(cuStreamWaitEvent, rc.stream->get(), static_cast<shim::cu::Event>(cu_event), 0);
  }

  void* mark(unsigned rank) override {
    const RankComm& rc = _set->ranks[rank];
    rc.context->make_current();
    Event& e = _marks.emplace_back();
    e.record(*rc.stream);
    return e.get();
  }

  void wait() override {
    for (const RankComm& rc : _set->ranks) {
      rc.context->make_current();
      rc.stream->synchronize();
      shim::nccl::Result async = shim::nccl::kSuccess;
      FERRY_NCCL(ncclCommGetAsyncError, rc.comm, &async);
      shim::nccl_check(async, "an all-gather (ncclCommGetAsyncError)");
    }
    // Each gather's device time: from its first rank's start to its last rank's end.
    for (Timing& t : _timings) {
      double longest = 0;
      for (std::size_t r = 0; r < t.start.size(); ++r)
        longest = std::max(longest, Event::elapsed_seconds(t.start[r], t.end[r]));
      _busy += longest;
    }
    _timings.clear();
  }
  double busy_seconds() const override { return _busy; }
  std::string name() const override {
    const auto& nccl = shim::NcclLibrary::get();
    const int v = nccl.version;
    return "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100) + " (" + nccl.path + ")" + _set->note;
  }
  double setup() const { return _setup; }

 private:
  struct Timing {
    std::vector<Event> start, end;
  };
  CommSet* _set = nullptr;
  std::unique_lock<std::mutex> _in_use;
  std::vector<Timing> _timings;  // std::vector<Event> moves its events: handles stay valid
  std::deque<Event> _marks;      // for the collective's life: copy streams may still wait on them
  double _busy = 0;
  double _setup = 0;
};

double last_setup = 0;

}  // namespace

std::unique_ptr<Collective> host_collective(unsigned ranks) {
  return std::make_unique<HostCollective>(ranks);
}

std::unique_ptr<Collective> nccl_collective(std::span<const Device> devices) {
  auto c = std::make_unique<NcclCollective>(devices);
  last_setup = c->setup();
  return c;
}

double last_collective_setup_seconds() { return last_setup; }

}  // namespace ferry::detail
