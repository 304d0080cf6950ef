// The transfer core: batches of file <-> memory moves, submitted to one persistent engine and
// finished asynchronously. An extent is one contiguous range of one file of a FileSet and the
// memory spans (host or any cuda:N, per span) gathered into it or scattered from it, in order.
// Submitting returns a Ticket at once; each extent reports its own status, so one bad extent
// (a range past the end of its file, a file that vanished) fails alone while the others land.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/file_set.hpp"
#include "ferry/io_types.hpp"

namespace ferry {

enum class Direction { FileToMemory, MemoryToFile };

// `size` bytes at `data`: a host pointer for cpu, a device address for cuda:N. A cpu span with
// null data is a hole: file bytes read and dropped (file -> memory only).
struct MemorySpan {
  Device device;
  void* data = nullptr;
  std::uint64_t size = 0;
};

struct Extent {
  std::uint32_t file = 0;  // index in the file set
  std::uint64_t file_offset = 0;
  std::vector<MemorySpan> spans;  // in file order, back to back from file_offset
};

struct TransferOptions {
  Backend backend = Backend::Auto;  // Auto: cuFile only where it does true GPUDirect Storage
  bool allow_compat = false;        // cuFile's compatibility mode; DirectStorage's staged fallback
                                    // (and host staging where its D3D12 -> CUDA bridge fails)
  IoMode io = IoMode::Auto;         // the staged path: per file, O_DIRECT or buffered
  unsigned threads = 0;             // workers; 0: 16 (at most kMaxWorkerThreads, 64)
  std::uint64_t chunk_bytes = 0;    // a slot's largest read or write (O_DIRECT: 1 MiB calls)
  unsigned slots_per_thread = 0;    // staging slots a worker cycles through; 0: 2
  // CUDA streams per device that the workers' copies share; 0: one per worker.
  unsigned copy_streams = 0;
  std::uint64_t staging_bytes = kDefaultStagingBytes;  // this submission's staging, at most
  // A CUevent of the caller (cast to void*): memory is read or written only after it fires,
  // waited on the copy streams (no host sync). A memory -> file write of what a kernel still
  // writes stays correct.
  void* after_event = nullptr;
  // The staged path, for batches of many extents (the KV store's blocks): each extent's pieces
  // taken in rounds across the extents (the first of each, then the second...), so workers that
  // observe different extents in order never wait on one another, and a submission smaller than
  // four chunks per worker cut finer (down to 256 KiB for page-cache reads, 1 MiB otherwise), so
  // every worker has pieces from the start and its reads overlap its copies.
  bool interleave = false;
  bool durable = false;              // memory -> file: fdatasync each file before completing
  bool stop_at_first_error = false;  // cancel what is left once one extent fails
  // Time each read's copies on the GPU (staged path, file -> GPU memory) for the statistics'
  // copy_busy: a diagnostic, it costs two timed events per read.
  bool profile_copies = false;
  // Page-cache DMA (staged path, file -> GPU memory, Linux): files wholly in the page cache are
  // mapped read-only, registered with the driver and copied to the GPU straight from the page
  // cache (no read, no staging), the registrations kept across submissions in one process-wide
  // cache of at most this many bytes (least recently used ones unregistered beyond it). 0: off.
  // A file that cannot (not resident, over the budget, refused) takes the staged path, and its
  // statistics say why.
  std::uint64_t page_cache_pin_bytes = 0;
  // Memory the caller allocated for this submission's destinations (a load's own allocation):
  // where the cuFile backend serves the submission it is registered with cuFile until the
  // caller's wait returns, so its reads need no bounce. Its device is the route's device where no
  // span names a GPU (an empty submission). Default: none.
  MemorySpan destination;
  // Called from workers, one call at a time, as bytes land.
  std::function<void(std::uint64_t bytes_done, std::uint64_t bytes_total)> progress;
  // The staged path only (others never call it): sees each extent's bytes while they sit in host
  // memory, on the worker thread: file -> memory after the read (beside the copies out), memory
  // -> file after the copies into staging, before the write. Per extent in order, each byte once
  // (a worker whose bytes are not next waits for the earlier ones); bytes of a failed or
  // cancelled extent may go unseen. Calls for different extents run at once. Must not throw.
  // A checksum taken on the way (the KV store's) costs no second pass over the bytes.
  std::function<void(std::size_t extent, std::uint64_t extent_offset, const std::byte* data,
                     std::uint64_t size)>
      observer;
  // The staged path only, file -> GPU memory: called on the worker once the copies of an
  // extent's bytes are all queued, where they all went on that worker's stream of one GPU, with
  // a CUDA event (CUevent) recorded behind them, valid during the call: work queued behind it
  // (cuStreamWaitEvent) sees the extent's bytes in GPU memory. After the extent's observer
  // calls. Not called for an extent whose copies went on several streams or none: wait() orders
  // those. Lets a caller use each extent as it lands (the KV store scatters a verified block
  // while later ones are still read). Must not throw.
  std::function<void(std::size_t extent, void* event)> extent_copied;
};

struct ExtentStatus {
  enum class State { Pending, Done, Failed, Cancelled };
  State state = State::Pending;
  std::uint64_t bytes_done = 0;
  std::string error;  // the failure, naming the file (Failed only)
};

// What a submission did: the backend, its settings and the path each file took.
struct TransferStats {
  std::string backend;  // "staged" or "cufile"
  unsigned threads = 0;
  unsigned slots_per_thread = 0;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t staging_bytes = 0;  // leased from the process's pool
  bool staging_pinned = false;
  std::string note;  // why fewer threads or slots ran than were asked for; empty if none
  // Of which: why the route passed a backend over (cuFile, DirectStorage); empty if none.
  std::string route_note;
  double route_seconds = 0;  // in submit(): choosing the route, registering the destination
  double staging_seconds = 0;
  double setup_thread_seconds = 0, read_thread_seconds = 0, wait_thread_seconds = 0,
         queue_thread_seconds = 0;
  // In options.observer, and waiting there for an extent's earlier bytes (staged path).
  double observe_thread_seconds = 0, observe_wait_thread_seconds = 0;
  std::uint64_t bytes_moved = 0;     // file bytes read or written (alignment included)
  std::uint64_t copies = 0;          // staged path: copies queued between staging and memory
  std::vector<FileLoadStats> files;  // the files touched
  PipelineTimes pipeline;            // the staged path's timeline
  // Page-cache DMA: bytes copied from registered page-cache mappings, and the seconds this
  // submission spent mapping and registering files.
  std::uint64_t bytes_from_registered_page_cache = 0;
  double page_cache_register_seconds = 0;
};

namespace detail {
struct TicketState;
}

class Ticket {
 public:
  Ticket() = default;
  explicit Ticket(std::shared_ptr<detail::TicketState> state);
  Ticket(Ticket&&) noexcept = default;
  Ticket& operator=(Ticket&& other) noexcept;
  // Waits for work still in flight: memory and staging are never freed under a copy.
  ~Ticket();

  // Until every extent landed, failed or was cancelled.
  void wait() const;
  // wait() for at most `seconds`; returns ready().
  bool wait_for(double seconds) const;
  bool ready() const;
  // Workers stop before their next chunk; extents not finished become Cancelled.
  void cancel();
  bool cancelled() const;

  std::size_t extent_count() const;
  ExtentStatus status(std::size_t extent) const;
  std::uint64_t bytes_done() const;
  // After wait(): throws the first failure as its own type (FormatError, std::system_error...),
  // else ferry::Cancelled where cancel() left extents unfinished.
  void rethrow_if_failed() const;
  // Makes the CUDA stream `cu_stream` (a CUstream) wait, on the device, for every copy of this
  // transfer: returns once they are all queued, usually before they land.
  void order_before(void* cu_stream) const;
  // After wait().
  const TransferStats& stats() const;

 private:
  std::shared_ptr<detail::TicketState> _state;
};

// Submits to the process's engine (worker pool, staging pool, streams: kept between calls).
// Throws std::invalid_argument for a bad extent shape (a hole in a write, a file index out of
// the set, zero staging) and where options.backend cannot be honoured; everything that happens
// while moving bytes is reported through the ticket.
Ticket submit(std::shared_ptr<const FileSet> files, Direction direction,
              std::vector<Extent> extents, const TransferOptions& options);

// What warm_up readied, and how long it took.
struct WarmUpReport {
  std::uint64_t staging_bytes = 0;  // staging made ahead (pinned where `pinned`)
  unsigned slabs = 0;               // one per worker, as many as the staging bound let in
  bool pinned = false;
  unsigned threads = 0;  // worker threads the process's pool holds
  unsigned streams = 0;  // copy streams made (and kept) for the device
  // Page-cache DMA (options.page_cache_pin_bytes and files given): the files' bytes registered
  // (kept by the process's registry for the submission), and why a file was not, if one was not.
  std::uint64_t page_cache_bytes = 0;
  std::string page_cache_why_not;
  double seconds = 0;
};

// Makes ahead, on the calling thread, what the staged path's first file -> memory submission
// with these options onto `device` would set up while it runs: each worker's staging slots
// (pinned for a GPU: the driver's registration, tens of milliseconds per 128 MiB, serialised),
// the worker threads, the copy streams and their fences. They are kept by the process (as every
// submission's are), so the next submission of that shape starts at full speed; one that runs
// meanwhile uses what is ready and makes the rest. For a server: call it while it builds its
// model. With `files` and options.page_cache_pin_bytes, also registers those of the files wholly
// in the page cache for page-cache DMA (the registration a first such load pays: about a second
// per 10-20 GB), kept by the process for the submission to find. Throws CudaError where the GPU
// cannot be used, std::invalid_argument where the staging cannot hold one slot.
WarmUpReport warm_up(const Device& device, const TransferOptions& options,
                     const FileSet* files = nullptr);

// Bounds the staging memory of all transfers of the process together (1 GiB by default).
void set_staging_limit(std::uint64_t bytes);
std::uint64_t staging_limit();
// The most staging memory ever held at once.
std::uint64_t staging_high_water();

// Unregisters and unmaps the page-cache registrations (TransferOptions::page_cache_pin_bytes)
// that no transfer in flight uses; returns the bytes still registered (in use). The process
// keeps them otherwise until it exits.
std::uint64_t release_page_cache_registrations();

}  // namespace ferry
