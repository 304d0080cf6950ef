// The DirectStorage backend (Windows), file -> memory. One job per submission: DirectStorage
// runs its own I/O in parallel, so ferry only feeds it. Extents are cut into pieces of at most
// 32 MiB (dstorage/request_split.hpp) and gathered into batches that fill a host staging buffer
// (pinned for a GPU destination); each batch is ONE submit and ONE wait (a status-array entry
// behind its requests), its error record read and reported per extent on failure, then copied
// out with the same copier as the staged path. Queues run without a D3D12 device (memory
// destinations): reading straight into D3D12 buffers shared with CUDA (external memory and a
// shared fence) is not built yet, so the path is reported as "directstorage" into host staging.
#include <algorithm>
#include <memory>
#include <thread>

#include "dstorage/availability.hpp"
#include "dstorage/request_split.hpp"
#include "ferry/error.hpp"
#include "platform/windows/win32.hpp"
#include "shim/dstorage.hpp"
#include "transfer/backend.hpp"
#include "transfer/copier.hpp"
#include "transfer/ticket_state.hpp"
#include "transfer/worker_pool.hpp"

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

void work(Run& run) {
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
      std::uint64_t used = 0;
      for (; next < run.pieces.size() && used + run.pieces[next].size <= staging.size(); ++next) {
        const Piece& p = run.pieces[next];
        const Extent& x = t.extents[p.extent];
        if (!files[x.file]) {
          out = nullptr;
          files[x.file] = create<dstorage::IDStorageFile>(
              ds.factory->OpenFile(t.files->path(x.file).c_str(), dstorage::kIidFile, &out), out,
              t.files->path(x.file).string() + ": IDStorageFactory::OpenFile");
        }
        for (const auto& r :
             dstorage::split_requests(x.file_offset + p.extent_offset, p.size, used)) {
          dstorage::Request request{};
          request.Options.SourceType = dstorage::kSourceFile;
          request.Options.DestinationType = dstorage::kDestinationMemory;
          request.Source.File = {files[x.file].get(), r.file_offset, r.size};
          request.Destination.Memory = {staging.data() + r.destination_offset, r.size};
          request.UncompressedSize = r.size;
          queue->EnqueueRequest(&request);
        }
        used += p.size;
      }
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

void finish(Run& run) {
  TicketState& t = *run.ticket;
  TransferStats stats;
  stats.backend = "directstorage";
  stats.threads = 1;
  stats.chunk_bytes = dstorage::kMaxRequestBytes;
  stats.staging_bytes = kBatchBytes;
  for (std::uint32_t f = 0; f < t.files->size(); ++f) {
    stats.files.push_back({t.files->path(f), IoPath::DirectStorage,
                           "DirectStorage requests of at most 32 MiB, one submit and one wait per "
                           "64 MiB batch, into host staging",
                           run.file_bytes[f]});
    stats.bytes_moved += run.file_bytes[f];
  }
  std::lock_guard lock(t.mutex);
  stats.note = t.stats.note;
  t.stats = std::move(stats);
}

class DirectStorageBackend final : public TransferBackend {
 public:
  std::string_view name() const override { return "directstorage"; }

  Verdict probe(const FileSet&, const Device&, const TransferOptions&) const override {
    const auto& a = dstorage::availability();
    return {a.usable, "directstorage", a.reason, !a.usable};
  }

  void start(const std::shared_ptr<TicketState>& ticket) const override {
    TicketState& t = *ticket;
    auto run = std::make_shared<Run>();
    run->ticket = ticket;
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
      work(*run);
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
