// A crash-safe store of fixed-size attention KV blocks on local storage (prefix caching).
//
// One namespace (model, dtype, block layout, tensor-parallel rank, world size) is one directory
// under the root, so two ranks or two models never share a block. Blocks live in a few
// preallocated slab files of 4 KiB-aligned slots; an append-only journal plus a periodic
// checkpoint make the index survive restarts. Publish order: a block's bytes are written and
// made durable before the journal record that makes it visible. Every block carries an
// XXH3-64 checksum, checked on every get: a mismatch drops the block and reports a miss (the
// destination's bytes are then undefined: blocks move straight into it where they can).
//
// Keys are 64-bit (vLLM's block hashes are integers); byte-string keys are hashed with
// kv_key(). A key names content: putting a key that is present keeps the stored block.
//
// Data paths: host memory moves through an aligned bounce buffer (the host path); GPU memory
// (any cuda:N) through the transfer core, staged (device <-> pinned slots <-> O_DIRECT) or direct
// (cuFile, straight between the slab files and device memory), chosen by KVStoreOptions::gpu_path.
// Opt-in page-cache DMA (KVStoreOptions::page_cache_pin_bytes): a get into GPU memory whose
// slab window is wholly in the page cache copies straight from the page cache's registered
// pages, then checks the checksum of the bytes where they landed, on that GPU (a mismatch, such
// as a window another writer left stale, re-reads the block on the usual path). Every result
// names the path its block took (and, with page-cache DMA on, why).
//
// Sharing: one writer process per namespace (an flock on writer.lock) and any number of reader
// processes (options.read_only), which pick up the writer's commits from the journal before
// each call; readers never see an uncommitted block. All methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/device.hpp"

namespace ferry {

using KVKey = std::uint64_t;

// The key of a byte-string block id: its XXH3-64 hash.
KVKey kv_key(std::span<const std::byte> bytes);

struct KVNamespace {
  std::string model;
  std::string dtype;
  std::string block_layout;  // e.g. "layers=32,kv=2,block=16,heads=8,head_dim=128"
  int tp_rank = 0;
  int world_size = 1;
};

// How blocks in GPU memory reach the slabs (host memory always takes the host path).
enum class KVPath {
  Auto,    // direct where cuFile does true GPUDirect Storage, else staged
  Staged,  // device <-> pinned staging slots <-> O_DIRECT file I/O
  Direct,  // cuFile; refused (per key, unsupported) where it would run in compatibility mode,
           // unless allow_compat is set
};
// "auto" | "staged" | "direct"; throws std::invalid_argument otherwise.
KVPath parse_kv_path(std::string_view text);

// How GPU gets and puts of blocks in pieces (vLLM's per-layer pages) move through a device
// bounce buffer: in groups of about `bytes` (a larger block alone), `flights` of them moving at
// once, each on `threads` of the transfer core's workers. 0: ferry's choice (128 MiB, 3; gets
// read through the page cache 1 GiB, 2; half the workers where the batch has several groups).
// For measuring (`ferry kv bench --group-bytes ...`) and for capping the memory: the bounce
// buffer takes up to `bytes` x `flights` of each GPU's memory (a call's multi-piece blocks,
// 2 GiB at most by default), kept between calls.
struct KVGpuGroups {
  std::uint64_t bytes = 0;
  unsigned flights = 0;
  unsigned threads = 0;
};

struct KVStoreOptions {
  KVPath gpu_path = KVPath::Auto;
  bool allow_compat = false;           // KVPath::Direct may run in cuFile's compatibility mode
  bool read_only = false;              // a reader: no lock, no writes, follows the writer
  unsigned slab_count = 4;             // slab files the slots are spread over (at creation;
                                       // an existing store keeps its own)
  std::uint64_t checkpoint_every = 65536;  // journal records between checkpoints
  bool checkpoint_on_close = true;     // a writer's destructor checkpoints (off: the journal
                                       // alone carries the commits, as after a crash)
  // Page-cache DMA for gets into GPU memory: the most bytes of slab windows (64 MiB of whole
  // slots each) kept mapped and registered with the GPU driver at once, least recently used
  // evicted; 0: off. A window is registered only where all of it is in the page cache; every
  // block copied out is checked by the GPU that received it (XXH3 of the bytes that landed;
  // per-layer pieces are scattered only once they match); a put first unregisters the windows
  // it writes into. Else, for host memory, and where ferry was built without nvcc (no GPU
  // checksum kernel), the usual path (each result says why).
  std::uint64_t page_cache_pin_bytes = 0;
  // A fleet of writer processes on one namespace (fixed at creation; 0: one writer). The slots
  // are split into this many shares; each writer takes a free share (its own journal and
  // checkpoint, its slots the only ones it writes and evicts) and every call first folds in the
  // other shares' commits. Readers take the count from the store (leave it 0).
  unsigned fleet_writers = 0;
  KVGpuGroups gpu_groups;
};

// One memory span of a block. A block is one span or a list of per-layer pieces, gathered
// into one write (and scattered from one read) in the order given: host or cuda:N memory,
// mixed freely within a block.
struct KVPiece {
  void* data = nullptr;
  std::uint64_t size = 0;
  Device device = Device::cpu();
};
using KVBlock = std::span<const KVPiece>;

enum class KVStatus {
  ok,
  already_present,  // put: the key was stored before; its block is kept
  missing,          // get/remove: not stored (or dropped as corrupt)
  bad_size,         // the pieces' total does not fit the block size / stored length
  no_space,         // put: every slot is busy with in-flight reads or writes
  io_error,         // the system refused a read, write or sync (message says which file)
  unsupported,      // the path asked for cannot run here (message says why)
  read_only,        // a write through a reader
};
const char* to_string(KVStatus status);

// The path a block's bytes took.
enum class KVRoute {
  none,           // no bytes moved (a miss, a present key, a bad argument)
  host,           // host memory through the aligned bounce buffer
  staged,         // GPU memory through the transfer core's pinned staging
  cufile_gds,     // GPU memory straight to/from storage (GPUDirect Storage)
  cufile_compat,  // cuFile in compatibility mode (it stages internally)
  page_cache_dma, // GPU memory straight from the slab's registered page-cache pages
};
const char* to_string(KVRoute route);

struct KVResult {
  KVStatus status = KVStatus::ok;
  std::string message;  // empty for ok; otherwise says what and where
  KVRoute route = KVRoute::none;
  // With page-cache DMA on (a get): why the block took `route`, in words ("its window was
  // registered by this get in 3.2 ms", "its window is not fully in the page cache (83.0%...)").
  std::string route_reason;
  bool ok() const noexcept { return status == KVStatus::ok; }
};

// Per call: how a put orders itself after the producer of its memory.
struct KVPutOptions {
  // A CUevent (cast to void*) recorded behind the work that writes the sources (kernels, or a
  // copy into pinned host memory): no source byte is read before it fires, so half-computed KV
  // is never persisted.
  void* after_event = nullptr;
};

// An owned block for the asynchronous forms: the piece list is copied, the memory it points to
// must stay valid (and, for a put, unchanged) until the ticket completes.
using KVBlockList = std::vector<std::vector<KVPiece>>;

namespace detail {
struct KVTicketState;
}

// An asynchronous put or get. The batch runs on the store's worker threads; results are per key
// in order. The completion callback (if any) runs once on a worker thread, before wait() returns;
// the results are final when it runs. Inside a completion callback, a wait (or results(), ready())
// ends once the results are final: a callback may ask its own ticket, or start another batch of
// the store and wait for it (a worker thread runs queued batches while it waits).
class KVTicket {
 public:
  KVTicket() = default;
  explicit KVTicket(std::shared_ptr<detail::KVTicketState> state);
  void wait() const;
  bool wait_for(double seconds) const;
  bool ready() const;
  // After wait(): one result per key.
  const std::vector<KVResult>& results() const;

 private:
  std::shared_ptr<detail::KVTicketState> _state;
};
using KVCallback = std::function<void(const std::vector<KVResult>&)>;

struct KVStats {
  std::filesystem::path directory;  // this namespace's directory
  std::uint64_t block_bytes = 0;
  std::uint64_t slot_bytes = 0;     // block_bytes rounded up to 4 KiB
  std::uint64_t capacity_blocks = 0;
  std::uint64_t blocks = 0;         // committed blocks in the index
  std::uint64_t puts = 0, gets = 0, hits = 0, misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t corrupt_dropped = 0;      // blocks dropped because their checksum failed
  std::uint64_t journal_records = 0;      // records since the last checkpoint
  std::uint64_t checkpoints = 0;
  std::uint64_t journal_tail_dropped = 0; // bytes of torn journal tail ignored at open
  // Journal records that fail their checksum with valid records after them (damage in the
  // middle, not a torn tail): skipped, the later records kept; `ferry kv verify` reports them.
  // Counted at open and by a reader's refreshes; the next checkpoint leaves them behind.
  std::uint64_t journal_corrupt_records = 0;
  std::uint64_t journal_corrupt_offset = 0;  // the first one's byte offset in the journal
  std::uint64_t index_bytes = 0;          // memory of the in-memory index
  std::uint64_t last_sequence = 0;
  // Where the time of puts and gets went (seconds summed over calls, for `kv bench`): moving
  // block bytes (copies, I/O, checksums), making the slabs durable, appending the journal.
  double put_move_seconds = 0, put_sync_seconds = 0, put_journal_seconds = 0;
  double get_move_seconds = 0;
  // The staged path's workers, thread-seconds summed: reading or writing the slabs, waiting for
  // copies, queueing copies (host memory: the memcpy; checksums included), checksumming bytes in
  // staging, and waiting to checksum a block's bytes in order.
  double staged_io_seconds = 0, staged_copy_wait_seconds = 0, staged_queue_seconds = 0,
         staged_hash_seconds = 0, staged_hash_wait_seconds = 0;
  double staged_setup_seconds = 0;  // the workers' staging leases and copy streams, per job
  // The staged transfers' wall time, that times their worker count, and the copies they queued.
  double staged_transfer_seconds = 0, staged_thread_span_seconds = 0;
  std::uint64_t staged_copies = 0;
  // The caller's thread in GPU batches before their first transfer started (route, groups,
  // bounce runs, a put's gathers) and after their last ended (last scatters, checks, outcomes);
  // and a get's checks of its keys and pieces before it moves them.
  double staged_lead_seconds = 0, staged_tail_seconds = 0, get_prepare_seconds = 0;
  // Page-cache DMA (KVStoreOptions::page_cache_pin_bytes): bytes gets copied from registered
  // page-cache windows, windows this store registered and the seconds that took (mapping,
  // populating, registering), and blocks whose window was found stale (checksum mismatch on
  // the DMA path: the window dropped and the block re-read on the usual path).
  std::uint64_t page_cache_dma_bytes = 0;
  std::uint64_t page_cache_windows_registered = 0;
  double page_cache_register_seconds = 0;
  // Windows a get found in the page cache but not registered, queued or being registered in the
  // background (a get never waits for a registration: it takes the usual path meanwhile).
  std::uint64_t page_cache_windows_pending = 0;
  std::uint64_t page_cache_stale_rereads = 0;
  std::uint64_t page_cache_pin_bytes = 0;  // as opened
  // Its device seconds (the streams' events; a get's chunks overlap on two streams, so these
  // can add up to more than its wall time): the copies out of the page cache, the GPU checksums
  // of the bytes that landed, the scatters of multi-piece blocks from the bounce buffer.
  double page_cache_dma_seconds = 0, page_cache_checksum_seconds = 0,
         page_cache_scatter_seconds = 0;
  bool direct_io = false;                 // O_DIRECT on the slabs (else buffered: refused)
  // A fleet: its writers whose journals were written in the last 2 s (by their modification
  // times) as this store last looked, itself included where it writes. They share the namespace's storage: each writer's puts keep 1 / N
  // of one writer's writes in flight (a single writer: 1).
  unsigned writers_active = 1;
  KVPath gpu_path = KVPath::Auto;         // as opened
  bool read_only = false;
};

// A store found under a root (from its manifest), enough to open it again; or a damaged one.
struct KVStoreInfo {
  std::filesystem::path directory;
  KVNamespace ns;
  std::uint64_t block_bytes = 0;
  std::uint64_t capacity_bytes = 0;  // slots x slot size
  // Empty for a store that can be opened; else why not (its manifest is missing while the
  // store's files are there, or is not a regular file, or not a manifest): the other fields
  // are then unset.
  std::string problem;
};

class KVStore {
 public:
  // Opens (a writer creates) the namespace's directory under `root`. capacity_bytes / slot
  // size gives the slot count; both are fixed when the store is created and checked after.
  static KVStore open(const std::filesystem::path& root, const KVNamespace& ns,
                      std::uint64_t capacity_bytes, std::uint64_t block_bytes,
                      const KVStoreOptions& options = {});

  KVStore(KVStore&&) noexcept;
  KVStore& operator=(KVStore&&) noexcept;
  ~KVStore();  // close(), then frees what the calls in flight no longer hold

  // Waits for the calls and batches in flight (their callbacks included), checkpoints (a writer;
  // see checkpoint_on_close; errors are ignored: the journal has it all) and releases the files
  // and the writer lock. Later calls throw std::invalid_argument naming the store. Safe beside
  // calls on other threads; a second close() returns when the first is done. From a completion
  // callback of this store (which runs inside its batch, so cannot wait for it): new calls are
  // refused at once, and the files are released when the last batch in flight has ended. The
  // destructor, too, may run in a callback (the last owner letting go there): what is left is
  // freed by the store's last batch, never by a thread joining itself.
  void close();

  // One batch each; results are per key, in order (one bad key does not fail the others).
  std::vector<KVResult> put(std::span<const KVKey> keys, std::span<const KVBlock> sources,
                            const KVPutOptions& options = {});
  std::vector<KVResult> get(std::span<const KVKey> keys, std::span<const KVBlock> destinations);
  // The same, on the store's worker threads. A store's destructor waits for its tickets.
  KVTicket put_async(std::vector<KVKey> keys, KVBlockList sources, KVPutOptions options = {},
                     KVCallback done = nullptr);
  KVTicket get_async(std::vector<KVKey> keys, KVBlockList destinations, KVCallback done = nullptr);
  std::vector<KVResult> remove(std::span<const KVKey> keys);
  // How many leading keys are stored (the prefix hit length).
  std::size_t lookup(std::span<const KVKey> keys);
  std::vector<bool> contains(std::span<const KVKey> keys);
  // The stored length of a key's block, 0 when absent.
  std::uint64_t stored_length(KVKey key);

  // Writes a checkpoint now and starts an empty journal (a writer only).
  void checkpoint();
  // A reader: applies the writer's commits since the last call (every call does this first).
  void refresh();
  KVStats stats();

  // Every committed key, oldest use first (for `verify` and tests).
  std::vector<KVKey> keys();

  // A namespace's directory name under the root: "ns-" and 16 hex digits of its hash.
  static std::string directory_name(const KVNamespace& ns);
  // Every namespace directory under `root`, read from the manifests; those that cannot be
  // opened are listed with their problem (a directory being created, with no store file yet,
  // is left out).
  static std::vector<KVStoreInfo> list(const std::filesystem::path& root);

 private:
  struct Impl;
  explicit KVStore(std::unique_ptr<Impl> impl);
  std::shared_ptr<Impl> _impl;  // shared with the batches in flight
};

}  // namespace ferry
