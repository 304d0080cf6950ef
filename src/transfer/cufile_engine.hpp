// The cuFile data path: each planned copy is split into a 4 KiB-aligned body that cuFile reads
// straight into GPU memory and unaligned edges that go through host memory. Pieces run on
// several threads, sharing registered file handles from the process-wide cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cufile/gds_mode.hpp"
#include "transfer/staged_engine.hpp"

namespace ferry::detail {

// `verdicts` holds one per file (gds or compat). `registered` is a cuFileBufRegister'ed range
// holding every destination, or {0, 0}.
void run_cufile(std::span<const CheckpointFile> files, std::span<const EngineChunk> chunks,
                const EngineSettings& settings, std::span<const CuFileVerdict> verdicts,
                std::uintptr_t registered_base, LoadStats& stats);

// Which path runs a GPU load, and why; throws where options.backend == Cufile cannot be
// honoured (no cuFile, or compatibility mode not allowed).
struct BackendChoice {
  bool cufile = false;
  std::vector<CuFileVerdict> verdicts;  // per file, when cufile
  std::string note;                     // why cuFile was not used, for the staged path's stats
};
BackendChoice choose_backend(std::span<const CheckpointFile> files, const LoadOptions& options);

// Registers [base, base + bytes) with cuFile for the life of the object, where cuFile allows it.
class RegisteredBuffer {
 public:
  RegisteredBuffer(std::uintptr_t base, std::uint64_t bytes);
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;
  ~RegisteredBuffer();
  std::uintptr_t base() const noexcept { return _registered ? _base : 0; }

 private:
  std::uintptr_t _base;
  bool _registered = false;
};

}  // namespace ferry::detail
