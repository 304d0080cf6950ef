// The I/O vocabulary every layer shares: how a file is read (IoMode), which engine moves it
// (Backend), the path each file really took (IoPath) and a submission's timeline. Below both the
// transfer core and the loader, so neither reads the other's options to learn these words.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace ferry {

enum class IoMode {
  Auto,      // per file: buffered when mostly in page cache, else O_DIRECT where supported
  Direct,    // O_DIRECT, an error where the file system refuses it
  Buffered,  // always through the page cache
};

// "auto" | "direct" | "buffered"; throws std::invalid_argument otherwise.
IoMode parse_io_mode(std::string_view text);

enum class Backend {
  Auto,           // cuFile where it really does GPUDirect Storage for every file, else staged
  Cufile,         // cuFile; an error where it cannot run, or would run in compatibility mode unless
                  // allow_compat is set
  Posix,          // the staged path: reads into pinned host memory, then asynchronous copies
  DirectStorage,  // Windows' DirectStorage (dstorage.dll); an error where it cannot run unless
                  // allow_compat lets the staged path stand in (said so per file)
};

// "auto" | "cufile" | "posix" | "directstorage"; throws std::invalid_argument otherwise.
Backend parse_backend(std::string_view text);

inline constexpr std::uint64_t kDefaultStagingBytes = 256ull << 20;

enum class IoPath {
  Direct,         // O_DIRECT reads into pinned staging ("odirect")
  Buffered,       // reads through the page cache into pinned staging ("buffered")
  CufileGds,      // cuFile with true GPUDirect Storage DMA into GPU memory ("cufile-gds")
  CufileCompat,   // cuFile in compatibility mode: POSIX reads inside cuFile ("cufile-compat")
  DirectStorage,  // Windows DirectStorage requests into host staging ("directstorage")
  PageCacheDma,   // copied straight from the page cache's registered pages ("page-cache-dma")
};

std::string_view io_path_name(IoPath path);

struct FileLoadStats {
  std::filesystem::path path;
  IoPath io_path = IoPath::Buffered;
  std::string reason;  // why this path: page-cache residency, O_DIRECT refused, forced...
  std::uint64_t bytes_read = 0;
};

// Where a staged submission's time went, in seconds from its start (0 where a stage was not
// reached, or on another backend): the head is the wait for the first copy, the tail the time
// from the last read to the last copy finished. With profiling, the GPU's own clock says how
// long copies were queued or running (copy_busy) within copy_span: the copy engine starved for
// the rest.
struct PipelineTimes {
  // A first load's start-up, before any read: files registered for page-cache DMA (where on),
  // the first and the last worker running (thread start, the pool's hand-off), and every worker
  // holding its first staging slot (pinned for a GPU) and its streams and events.
  double page_cache_leased = 0;
  double first_job = 0;
  double last_job = 0;
  double staging_ready = 0;
  double streams_ready = 0;
  double first_read = 0;   // the first read into staging finished
  double first_copy = 0;   // the first copy out of staging was queued
  double last_read = 0;    // the last read finished
  double last_copy = 0;    // the last copy was queued
  double copies_done = 0;  // every copy had finished (the workers' drains returned)
  double done = 0;         // the submission completed (statistics gathered)
  // Profiled only (timed events around each read's copies, on the GPU's clock):
  double copy_span = 0;           // from the first copy's start to the last one's end
  double copy_busy = 0;           // of which at least one copy was queued or running
  std::uint64_t copy_groups = 0;  // reads whose copies were timed
};

}  // namespace ferry
