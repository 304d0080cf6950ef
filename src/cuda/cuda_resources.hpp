// Move-only owners of CUDA driver resources. Every one requires a usable driver (see
// shim::CudaDriver) and releases what it holds in a noexcept destructor.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "shim/cuda_driver.hpp"

namespace ferry::detail {

// The device's primary context (the one PyTorch and the CUDA runtime share), retained for the
// owner's lifetime. Shared by every allocation made in it, so it outlives them all.
class PrimaryContext {
 public:
  explicit PrimaryContext(int ordinal);
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext();

  // Each thread that calls the driver must make the context current first.
  void make_current() const;
  int ordinal() const noexcept { return _ordinal; }
  shim::cu::Context get() const noexcept { return _context; }

 private:
  int _ordinal;
  shim::cu::Device _device = 0;
  shim::cu::Context _context = nullptr;
};

class Stream {
 public:
  Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept : _stream(std::exchange(other._stream, nullptr)) {}
  ~Stream();
  shim::cu::Stream get() const noexcept { return _stream; }
  void synchronize() const;

 private:
  shim::cu::Stream _stream = nullptr;
};

class Event {
 public:
  // Timed events cost more to record; only they can be passed to elapsed_seconds.
  explicit Event(bool timed = false);
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept
      : _event(std::exchange(other._event, nullptr)), _recorded(other._recorded) {}
  ~Event();
  void record(const Stream& stream);
  // Waits for the last recorded work; returns at once if nothing was recorded.
  void synchronize() const;
  shim::cu::Event get() const noexcept { return _event; }
  // Seconds between two recorded, completed, timed events; 0 where the driver cannot say.
  static double elapsed_seconds(const Event& start, const Event& end);

 private:
  shim::cu::Event _event = nullptr;
  bool _recorded = false;
};

// For its life, the calling thread's driver calls are tolerated while another thread captures a
// CUDA graph (the thread's capture mode is relaxed). A transfer worker synchronises its own
// streams and events, never part of a capture; in the default (global) mode those calls would
// invalidate a capture another thread runs, such as torch.cuda.graph's. Same thread to destroy.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept;
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
  ~RelaxedCaptureMode();

 private:
  int _previous = -1;  // -1: not swapped
};

// Page-aligned host memory (platform/system.hpp: mmap; VirtualAlloc on Windows), pinned
// (registered with the driver) when a context is given, so copies to the GPU run asynchronously
// at full speed. Buffers of 2 MiB or more start on a 2 MiB boundary in pages that ask for
// transparent huge pages: pinning huge pages takes half the time (measured: 256 MiB in 40 ms
// instead of 90 ms), and an unaligned start leaves a buffer's first and last 2 MiB in small pages.
// A buffer may instead be pinned a range at a time (pin_range: one registration each), so that a
// transfer's first slot is usable before the rest are pinned. A copy must lie within one
// registration (the driver treats one that spans two as pageable memory).
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::size_t bytes, const PrimaryContext* pin_in);
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  ~HostBuffer();

  std::byte* data() const noexcept { return _data; }
  std::size_t size() const noexcept { return _size; }
  // Wholly pinned, in one registration or several.
  bool pinned() const noexcept { return _data != nullptr && _pinned_bytes >= mapped_size(); }
  std::size_t pinned_bytes() const noexcept { return _pinned_bytes; }
  // Pins the whole buffer in one registration (portable: usable from every context), unless it
  // is already; registrations of ranges are replaced (no copy may be using the buffer then).
  void pin(const PrimaryContext& context);
  // Registers [offset, offset + bytes) (page multiples inside the buffer, overlapping no
  // registration made before).
  void pin_range(std::size_t offset, std::size_t bytes, const PrimaryContext& context);
  // Touches every page of [offset, offset + bytes) (clamped to the buffer), so that the kernel
  // zeroes them on this thread rather than inside a later registration.
  void fault_in(std::size_t offset, std::size_t bytes) noexcept;
  // Unregisters every range (no copy may be using the buffer).
  void unpin() noexcept;

 private:
  std::size_t mapped_size() const noexcept;
  void release() noexcept;
  std::byte* _data = nullptr;
  std::size_t _size = 0;
  void* _region = nullptr;  // the mapping _data lies in (aligned up from it)
  std::size_t _region_bytes = 0;
  std::size_t _pinned_bytes = 0;
  std::vector<std::byte*> _registrations;  // the start of each registered range
};

// The primary context of device `ordinal`, retained for the life of the process: the transfer
// core's streams and pinned slots belong to it. Never released, on purpose (no CUDA call from a
// static destructor). Throws CudaError for a missing device or no driver.
const PrimaryContext& device_context(int ordinal);

// Device memory in `context`, freed when the last reference goes; the deleter keeps the
// context alive until then.
std::shared_ptr<void> allocate_device_memory(std::shared_ptr<PrimaryContext> context,
                                             std::size_t bytes);

// Page-aligned host memory (2 MiB-aligned huge pages where granted, for large sizes) freed when
// the last reference goes.
std::shared_ptr<void> allocate_host_memory(std::size_t bytes);

}  // namespace ferry::detail
