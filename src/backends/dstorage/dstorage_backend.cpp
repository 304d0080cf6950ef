// The DirectStorage backend (Windows), file -> memory. One job per submission: DirectStorage
// runs its own I/O in parallel, so ferry only feeds it. Extents are cut into pieces of at most
// 32 MiB (backends/dstorage/request_split.hpp) and gathered into 64 MiB batches, each ONE submit, its
// error record read and reported per extent on failure. Two ways in:
// - a GPU destination (cuda:N): straight into a D3D12 buffer shared with CUDA
//   (backends/dstorage/dstorage_bridge.hpp), two halves in turn; each batch ends with a signal of the
//   shared fence, and the copy stream waits on that value (cuWaitExternalSemaphoresAsync) before
//   copying the batch device to device into the destination. The host checks each batch's status
//   before the half is filled again, and signals the fence itself after a failed batch, so the
//   stream never waits for a value DirectStorage will not signal.
// - host memory, or a GPU whose bridge cannot be made when allow_compat permits it (said per
//   file): into a host staging buffer (pinned for a GPU), one wait on a status-array entry per
//   batch, then the staged path's copier scatters it.
#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "shim/dstorage_availability.hpp"
#include "backends/dstorage/request_split.hpp"
#include "ferry/error.hpp"
#include "platform/windows/win32.hpp"
#include "shim/dstorage.hpp"
#include "transfer/backend.hpp"
#include "transfer/staged/copier.hpp"
#include "backends/dstorage/dstorage_bridge.hpp"
#include "transfer/ticket_state.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail {
namespace {

// Two full requests per batch: one submit and one wait move 64 MiB.
constexpr std::uint64_t kBatchBytes = 2ull * dstorage::kMaxRequestBytes;

struct ReleaseCom {
  void operator()(IUnknown* p) const noexcept {
    if (p) p->Release();
  }
};
template <class T>
using Com = std::unique_ptr<T, ReleaseCom>;

// `out` by reference: it is read here, after the call that filled it (argument order is
// unspecified).
template <class T>
Com<T> create(HRESULT hr, void* const& out, const std::string& what) {
  if (FAILED(hr) || out == nullptr)
    fail<std::runtime_error>(what, " failed (", shim::hresult_text(hr), ")");
  return Com<T>(static_cast<T*>(out));
}

struct Piece {
  std::uint32_t extent = 0;
  std::uint64_t extent_offset = 0;
  std::uint64_t size = 0;
};

struct Run {
  std::shared_ptr<TicketState> ticket;
  std::vector<Piece> pieces;
  std::vector<std::uint64_t> file_bytes;
  DirectStorageBridge* bridge = nullptr;  // a GPU destination's way in; null: host staging
  std::string staging_reason;             // why host staging serves a GPU destination
};

// The first failure DirectStorage recorded for the queue, in words.
std::string error_record(dstorage::IDStorageQueue& queue) {
  auto record = std::make_unique<dstorage::ErrorRecord>();
  queue.RetrieveErrorRecord(record.get());
  if (record->FailureCount == 0) return "DirectStorage reported a failure but recorded none";
  std::string text = std::to_string(record->FailureCount) + " failed request(s); the first: " +
                     shim::hresult_text(record->FirstFailure.HResult);
  if (record->FirstFailure.CommandType == dstorage::kCommandRequest) {
    const auto& r = record->FirstFailure.Request;
    text += " reading " + win32::narrow(r.Filename) + " at offset " +
            std::to_string(r.Request.Source.File.Offset) + " (" +
            std::to_string(r.Request.Source.File.Size) + " bytes)";
  }
  return text;
}

Device device_of(const TicketState& t) {
  for (const Extent& x : t.extents)
    for (const MemorySpan& s : x.spans)
      if (s.device.is_cuda() && s.data) return s.device;
  return Device::cpu();
}

// Copies staging bytes [0, piece.size) to the spans of the piece's extent that it covers.
void scatter(const TicketState& t, const Piece& p, const std::byte* staging, Copier& copier) {
  std::uint64_t at = 0;  // extent offset of the current span
  for (const MemorySpan& s : t.extents[p.extent].spans) {
    const std::uint64_t begin = std::max(at, p.extent_offset);
    const std::uint64_t end = std::min(at + s.size, p.extent_offset + p.size);
    if (s.data && begin < end)
      copier.put(reinterpret_cast<std::uintptr_t>(s.data) + (begin - at),
                 staging + (begin - p.extent_offset), end - begin);
    at += s.size;
    if (at >= p.extent_offset + p.size) break;
  }
}

// Enqueues one batch: the pieces from `next` that fit `capacity` bytes end to end, as requests
// of at most 32 MiB (files opened at their first request); `place(request, batch offset, size)`
// says where each lands. Returns the end of the batch.
template <class Place>
std::size_t enqueue_batch(const Run& run, std::size_t next, std::uint64_t capacity,
                          std::vector<Com<dstorage::IDStorageFile>>& files,
                          dstorage::IDStorageQueue& queue, Place&& place) {
  const TicketState& t = *run.ticket;
  const auto& ds = shim::DirectStorageLibrary::get();
  std::uint64_t used = 0;
  for (; next < run.pieces.size() && used + run.pieces[next].size <= capacity; ++next) {
    const Piece& p = run.pieces[next];
    const Extent& x = t.extents[p.extent];
    if (!files[x.file]) {
      void* out = nullptr;
      files[x.file] = create<dstorage::IDStorageFile>(
          ds.factory->OpenFile(t.files->path(x.file).c_str(), dstorage::kIidFile, &out), out,
          t.files->path(x.file).string() + ": IDStorageFactory::OpenFile");
    }
    for (const auto& r : dstorage::split_requests(x.file_offset + p.extent_offset, p.size, used)) {
      dstorage::Request request{};
      request.Options.SourceType = dstorage::kSourceFile;
      request.Source.File = {files[x.file].get(), r.file_offset, r.size};
      request.UncompressedSize = r.size;
      place(request, r.destination_offset, r.size);
      queue.EnqueueRequest(&request);
    }
    used += p.size;
  }
  return next;
}

void work_staged(Run& run) {
  TicketState& t = *run.ticket;
  const auto& ds = shim::DirectStorageLibrary::get();
  std::size_t next = 0;
  std::size_t settled = 0;  // pieces before this one have landed or failed
  try {
    FERRY_EXPECT(t.direction == Direction::FileToMemory, std::invalid_argument,
                 "the directstorage backend reads files only; writes take the staged path");
    const Device device = device_of(t);
    const PrimaryContext* pin = device.is_cuda() ? &device_context(device.index) : nullptr;
    if (pin) pin->make_current();
    auto copier = make_copier(device, 1);
    if (t.options.after_event) copier->after(t.options.after_event);
    std::uint64_t largest = 0;
    for (const Piece& p : run.pieces) largest = std::max(largest, p.size);
    HostBuffer staging(std::min(kBatchBytes, std::max<std::uint64_t>(largest, 1)), pin);

    const dstorage::QueueDesc desc{dstorage::kSourceFile, dstorage::kMaxQueueCapacity,
                                   dstorage::kPriorityNormal, "ferry", nullptr};
    void* out = nullptr;
    auto queue =
        create<dstorage::IDStorageQueue>(ds.factory->CreateQueue(&desc, dstorage::kIidQueue, &out),
                                         out, "IDStorageFactory::CreateQueue");
    out = nullptr;
    auto status = create<dstorage::IDStorageStatusArray>(
        ds.factory->CreateStatusArray(1, "ferry", dstorage::kIidStatusArray, &out), out,
        "IDStorageFactory::CreateStatusArray");
    std::vector<Com<dstorage::IDStorageFile>> files(t.files->size());

    while (next < run.pieces.size() && !t.cancel) {
      // One batch: the pieces that fit the staging buffer, end to end.
      const std::size_t first = next;
      settled = first;
      next = enqueue_batch(run, next, staging.size(), files, *queue,
                           [&](dstorage::Request& request, std::uint64_t at, std::uint32_t size) {
                             request.Options.DestinationType = dstorage::kDestinationMemory;
                             request.Destination.Memory = {staging.data() + at, size};
                           });
      queue->EnqueueStatus(status.get(), 0);
      queue->Submit();
      while (!status->IsComplete(0)) std::this_thread::yield();
      if (const HRESULT hr = status->GetHResult(0); FAILED(hr)) {
        const std::string why = error_record(*queue);
        for (std::size_t i = first; i < next; ++i) {
          const Piece& p = run.pieces[i];
          t.fail(p.extent, std::make_exception_ptr(
                               std::runtime_error(t.files->path(t.extents[p.extent].file).string() +
                                                  ": DirectStorage read failed: " + why)));
        }
        settled = next;
        continue;
      }
      std::uint64_t offset = 0;
      for (std::size_t i = first; i < next; ++i) {
        scatter(t, run.pieces[i], staging.data() + offset, *copier);
        offset += run.pieces[i].size;
      }
      copier->fence(0);
      copier->wait(0);  // the staging buffer is refilled by the next batch
      for (std::size_t i = first; i < next; ++i) {
        const Piece& p = run.pieces[i];
        run.file_bytes[t.extents[p.extent].file] += p.size;
        t.landed(p.extent, p.size);
      }
      settled = next;
    }
  } catch (...) {
    const auto error = std::current_exception();
    for (std::size_t i = settled; i < run.pieces.size(); ++i) t.fail(run.pieces[i].extent, error);
  }
}

// The GPU way in: see the comment at the top. Batches alternate between the bridge's halves.
void work_bridge(Run& run) {
  namespace cu = shim::cu;
  TicketState& t = *run.ticket;
  DirectStorageBridge& bridge = *run.bridge;
  const auto& ds = shim::DirectStorageLibrary::get();
  const auto& driver = shim::CudaDriver::get();
  std::lock_guard bridge_lock(bridge.mutex);
  std::size_t next = 0;
  std::size_t settled = 0;  // pieces before this one have landed or failed
  struct Batch {
    std::size_t first = 0, last = 0;
    std::uint64_t fence_value = 0;
    bool active = false;
  };
  Batch batches[2];
  Com<dstorage::IDStorageQueue> queue;
  Com<dstorage::IDStorageStatusArray> status;
  std::optional<Stream> stream;
  std::optional<Event> copied[2];
  // Waits for half `h`'s batch: its reads (status entry h), then its copies (event h).
  const auto settle = [&](unsigned h) {
    Batch& b = batches[h];
    if (!b.active) return;
    b.active = false;
    while (!status->IsComplete(h)) std::this_thread::yield();
    const HRESULT hr = status->GetHResult(h);
    std::string why;
    if (FAILED(hr)) {
      why = error_record(*queue);
      // What the stream then copies is never reported as landed.
      release_fence(bridge, b.fence_value);
    }
    copied[h]->synchronize();
    for (std::size_t i = b.first; i < b.last; ++i) {
      const Piece& p = run.pieces[i];
      if (FAILED(hr)) {
        t.fail(p.extent, std::make_exception_ptr(
                             std::runtime_error(t.files->path(t.extents[p.extent].file).string() +
                                                ": DirectStorage read failed: " + why)));
      } else {
        run.file_bytes[t.extents[p.extent].file] += p.size;
        t.landed(p.extent, p.size);
      }
    }
    settled = b.last;
  };
  try {
    FERRY_EXPECT(t.direction == Direction::FileToMemory, std::invalid_argument,
                 "the directstorage backend reads files only; writes take the staged path");
    device_context(bridge.ordinal).make_current();
    stream.emplace();
    copied[0].emplace();
    copied[1].emplace();
    if (t.options.after_event)
      FERRY_CU(cuStreamWaitEvent, stream->get(), static_cast<cu::Event>(t.options.after_event), 0);
    const dstorage::QueueDesc desc{dstorage::kSourceFile, dstorage::kMaxQueueCapacity,
                                   dstorage::kPriorityNormal, "ferry", bridge.device};
    void* out = nullptr;
    queue = create<dstorage::IDStorageQueue>(
        ds.factory->CreateQueue(&desc, dstorage::kIidQueue, &out), out,
        "IDStorageFactory::CreateQueue (with the D3D12 device of cuda:" +
            std::to_string(bridge.ordinal) + ")");
    out = nullptr;
    status = create<dstorage::IDStorageStatusArray>(
        ds.factory->CreateStatusArray(2, "ferry", dstorage::kIidStatusArray, &out), out,
        "IDStorageFactory::CreateStatusArray");
    std::vector<Com<dstorage::IDStorageFile>> files(t.files->size());

    for (unsigned batch = 0; next < run.pieces.size() && !t.cancel; ++batch) {
      const unsigned h = batch % 2;
      settle(h);  // the half's last batch has been copied out
      const std::uint64_t base = h * kBridgeHalfBytes;
      Batch& b = batches[h];
      b.first = next;
      next = enqueue_batch(run, next, kBridgeHalfBytes, files, *queue,
                           [&](dstorage::Request& request, std::uint64_t at, std::uint32_t size) {
                             request.Options.DestinationType = dstorage::kDestinationBuffer;
                             request.Destination.Buffer = {bridge.buffer, base + at, size};
                           });
      b.last = next;
      b.fence_value = ++bridge.fence_value;
      b.active = true;
      queue->EnqueueStatus(status.get(), h);
      queue->EnqueueSignal(bridge.fence, b.fence_value);
      queue->Submit();
      // The copies wait on the GPU for DirectStorage's signal: no host round trip.
      cu::ExternalSemaphoreWaitParams wait{};
      wait.params.fence.value = b.fence_value;
      FERRY_CU(cuWaitExternalSemaphoresAsync, &bridge.semaphore, &wait, 1, stream->get());
      std::uint64_t offset = base;
      for (std::size_t i = b.first; i < b.last; ++i) {
        const Piece& p = run.pieces[i];
        std::uint64_t at = 0;  // extent offset of the current span
        for (const MemorySpan& span : t.extents[p.extent].spans) {
          const std::uint64_t begin = std::max(at, p.extent_offset);
          const std::uint64_t end = std::min(at + span.size, p.extent_offset + p.size);
          if (span.data && begin < end) {
            const cu::DevicePtr from = bridge.mapped + offset + (begin - p.extent_offset);
            if (span.device.is_cuda())
              FERRY_CU(cuMemcpyDtoDAsync, reinterpret_cast<cu::DevicePtr>(span.data) + (begin - at),
                       from, end - begin, stream->get());
            else
              FERRY_CU(cuMemcpyDtoHAsync, static_cast<std::byte*>(span.data) + (begin - at), from,
                       end - begin, stream->get());
          }
          at += span.size;
          if (at >= p.extent_offset + p.size) break;
        }
        offset += p.size;
      }
      copied[h]->record(*stream);
    }
    const unsigned older = batches[1].active && batches[1].first < batches[0].first ? 1 : 0;
    settle(older);
    settle(1 - older);
  } catch (...) {
    const auto error = std::current_exception();
    // Nothing may still write the bridge's buffer or wait on its fence when the next job starts.
    for (Batch& b : batches)
      if (b.active && status) {
        while (!status->IsComplete(static_cast<std::uint32_t>(&b - batches)))
          std::this_thread::yield();
        release_fence(bridge, b.fence_value);
      }
    if (stream) driver.cuStreamSynchronize(stream->get());
    for (std::size_t i = settled; i < run.pieces.size(); ++i) t.fail(run.pieces[i].extent, error);
  }
}

void finish(Run& run) {
  TicketState& t = *run.ticket;
  TransferStats stats;
  stats.backend = "directstorage";
  stats.threads = 1;
  stats.chunk_bytes = dstorage::kMaxRequestBytes;
  stats.staging_bytes = run.bridge ? 0 : kBatchBytes;  // the bridge's buffer is GPU memory
  const std::string reason =
      run.bridge
          ? "DirectStorage requests of at most 32 MiB, one submit per 64 MiB batch, into a D3D12 "
            "buffer shared with CUDA (" +
                run.bridge->adapter +
                "), the copy stream waiting on a shared fence before its device-to-device copies"
          : "DirectStorage requests of at most 32 MiB, one submit and one wait per 64 MiB batch, "
            "into host staging" +
                (run.staging_reason.empty() ? std::string() : " (" + run.staging_reason + ")");
  for (std::uint32_t f = 0; f < t.files->size(); ++f) {
    stats.files.push_back({t.files->path(f), IoPath::DirectStorage, reason, run.file_bytes[f]});
    stats.bytes_moved += run.file_bytes[f];
  }
  std::lock_guard lock(t.mutex);
  stats.note = t.stats.note;
  t.stats = std::move(stats);
}

class DirectStorageBackend final : public TransferBackend {
 public:
  std::string_view name() const override { return "directstorage"; }

  Verdict probe(const FileSet&, const Device& device,
                const TransferOptions& options) const override {
    const auto& a = dstorage::availability();
    if (!a.usable || !device.is_cuda()) return {a.usable, "directstorage", a.reason, !a.usable};
    std::string error;
    if (directstorage_bridge(device.index, error)) return {true, "directstorage", a.reason};
    // Host staging stands in for the bridge only where the caller allowed a compatible path.
    if (options.allow_compat)
      return {true, "directstorage", a.reason + "; into host staging: " + error};
    return {false, "directstorage", error};
  }

  void start(const std::shared_ptr<TicketState>& ticket) const override {
    TicketState& t = *ticket;
    auto run = std::make_shared<Run>();
    run->ticket = ticket;
    if (const Device device = device_of(t); device.is_cuda()) {
      run->bridge = directstorage_bridge(device.index, run->staging_reason);
      if (!run->bridge) run->staging_reason = "allowed by allow_compat: " + run->staging_reason;
    }
    run->file_bytes.assign(t.files->size(), 0);
    for (std::uint32_t e = 0; e < t.extents.size(); ++e) {
      std::uint64_t total = 0;
      for (const MemorySpan& s : t.extents[e].spans) total += s.size;
      std::uint32_t pieces = 0;
      for (std::uint64_t at = 0; at < total; at += dstorage::kMaxRequestBytes, ++pieces)
        run->pieces.push_back(
            {e, at, std::min<std::uint64_t>(dstorage::kMaxRequestBytes, total - at)});
      t.records[e].pieces_left = pieces;
    }
    WorkerPool& pool = transfer_workers();
    if (pool.reserve(1) == 0)
      t.stats.note += std::string(t.stats.note.empty() ? "" : "; ") +
                      "no worker thread could start: " + pool.last_failure();
    {
      std::lock_guard lock(t.mutex);
      t.jobs_running = 1;
      t.jobs_queuing = 1;
    }
    pool.post([run] {
      if (run->bridge)
        work_bridge(*run);
      else
        work_staged(*run);
      run->ticket->job_queued({});  // every batch's copies were waited for
      finish(*run);
      run->ticket->job_finished();
    });
  }
};

}  // namespace

const TransferBackend& dstorage_backend() {
  static const DirectStorageBackend backend;
  return backend;
}

}  // namespace ferry::detail
