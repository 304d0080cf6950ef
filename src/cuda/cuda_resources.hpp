// Move-only owners of CUDA driver resources. Every one requires a usable driver (see
// shim::CudaDriver) and releases what it holds in a noexcept destructor.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

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
// at full speed. Transparent huge pages are asked for first: they halve the time pinning takes (measured: 256 MiB in 40 ms instead of 90 ms).
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::size_t bytes, const PrimaryContext* pin_in);
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& other) noexcept
      : _data(std::exchange(other._data, nullptr)),
        _size(std::exchange(other._size, 0)),
        _pinned(other._pinned) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  ~HostBuffer();

  std::byte* data() const noexcept { return _data; }
  std::size_t size() const noexcept { return _size; }
  bool pinned() const noexcept { return _pinned; }
  // Pins the buffer now (portable: usable from every context), if it is not yet.
  void pin(const PrimaryContext& context);

 private:
  void release() noexcept;
  std::byte* _data = nullptr;
  std::size_t _size = 0;
  bool _pinned = false;
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
