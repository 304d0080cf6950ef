// What every C entry point shares: the per-thread last error and the guard that maps C++
// exceptions to ferry_status (nothing throws across the C ABI).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>

#include "ferry/error.hpp"
#include "ferry/ferry.h"

namespace ferry::capi {

// The message ferry_last_error() returns, per thread.
// Defined once in c_api.cpp: an inline thread_local would be defined in every file under mingw.
extern thread_local std::string last_error;

inline ferry_status fail(ferry_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

// Runs `body`, mapping each exception type to its status and recording its message.
template <class Body>
ferry_status guarded(Body&& body) noexcept {
  try {
    last_error.clear();
    body();
    return FERRY_STATUS_OK;
  } catch (const ferry::FormatError& e) {
    return fail(FERRY_STATUS_FORMAT_ERROR, e.what());
  } catch (const ferry::CudaError& e) {
    return fail(FERRY_STATUS_CUDA_ERROR, e.what());
  } catch (const std::system_error& e) {
    const bool missing = e.code() == std::errc::no_such_file_or_directory;
    return fail(missing ? FERRY_STATUS_NOT_FOUND : FERRY_STATUS_IO_ERROR, e.what());
  } catch (const std::invalid_argument& e) {
    return fail(FERRY_STATUS_INVALID_ARGUMENT, e.what());
  } catch (const ferry::OutOfMemory& e) {
    return fail(FERRY_STATUS_OUT_OF_MEMORY, e.what());
  } catch (const std::bad_alloc&) {
    return fail(FERRY_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(FERRY_STATUS_INTERNAL_ERROR, e.what());
  } catch (...) {
    return fail(FERRY_STATUS_INTERNAL_ERROR, "unknown error");
  }
}

inline void require(const void* pointer, const char* what) {
  FERRY_EXPECT(pointer != nullptr, std::invalid_argument, what, " must not be NULL");
}

// A ticket's wait as the C ABI offers it: until done where timeout_ms < 0, else at most
// timeout_ms; *ready (where given) says whether it finished. A transfer's and a KV call's alike.
template <class Handle>
void wait_ticket(Handle* ticket, int64_t timeout_ms, int* ready) {
  require(ticket, "ticket");
  bool done = true;
  if (timeout_ms < 0)
    ticket->ticket.wait();
  else
    done = ticket->ticket.wait_for(static_cast<double>(timeout_ms) / 1000.0);
  if (ready) *ready = done ? 1 : 0;
}

// A growable struct's struct_size must be one this library can honour: at least the struct_size
// field itself, and no larger than the struct it knows (a host built against a newer ferry.h
// would otherwise lose settings, or read counters never written).
template <class Struct>
void require_size(const Struct& s, const char* what) {
  static_assert(offsetof(Struct, struct_size) == 0);
  FERRY_EXPECT(s.struct_size != 0, std::invalid_argument, what,
               "->struct_size is 0: set it to sizeof (the *_init functions do)");
  FERRY_EXPECT(s.struct_size >= sizeof(s.struct_size), std::invalid_argument, what,
               "->struct_size ", s.struct_size, " is smaller than the struct_size field itself (",
               sizeof(s.struct_size), " bytes): set it to sizeof (the *_init functions do)");
  FERRY_EXPECT(s.struct_size <= sizeof(Struct), std::invalid_argument, what, "->struct_size ",
               s.struct_size, " is larger than this library's ", sizeof(Struct),
               " (built against a newer ferry.h?)");
}

// One field of a growable struct: where it lies.
struct Field {
  std::size_t offset, size;
};
#define FERRY_FIELD(Struct, member) \
  ::ferry::capi::Field { offsetof(Struct, member), sizeof(Struct::member) }

// Every field of `Struct` listed, in order, up to its end: a field added to ferry.h at the end
// (the only way structs grow) and not listed here fails the build instead of being ignored.
template <class Struct, std::size_t N>
constexpr bool lists_every_field(const Field (&fields)[N]) {
  for (std::size_t i = 1; i < N; ++i)
    if (fields[i].offset < fields[i - 1].offset + fields[i - 1].size) return false;
  const std::size_t end = fields[N - 1].offset + fields[N - 1].size;
  return fields[0].offset == 0 &&
         (end + alignof(Struct) - 1) / alignof(Struct) * alignof(Struct) == sizeof(Struct);
}

// A caller's options struct as this library's: each field that lies wholly inside
// in.struct_size copied, every other one keeping its default from `defaults`. Nothing past
// struct_size is read (a host's struct may end there), and no field is taken in part.
template <class Struct, std::size_t N>
Struct read_sized(const Struct& in, Struct defaults, const Field (&fields)[N], const char* what) {
  require_size(in, what);
  const auto* from = reinterpret_cast<const unsigned char*>(&in);
  auto* to = reinterpret_cast<unsigned char*>(&defaults);
  for (const Field& f : fields)
    if (f.offset + f.size <= in.struct_size) std::memcpy(to + f.offset, from + f.offset, f.size);
  return defaults;
}

// Statistics into a caller's struct: `all` (this library's whole struct) copied as far as
// out->struct_size reaches, struct_size itself left as the caller set it. Nothing past
// struct_size is written.
template <class Struct>
void write_sized(Struct* out, const Struct& all, const char* what) {
  require(out, what);
  require_size(*out, what);
  constexpr std::size_t header = sizeof(out->struct_size);
  std::memcpy(reinterpret_cast<unsigned char*>(out) + header,
              reinterpret_cast<const unsigned char*>(&all) + header, out->struct_size - header);
}

// A *_init_sized entry point: the defaults `init` gives, written into the first `size` bytes only
// (the caller's struct, perhaps from an older ferry.h), with struct_size set to what was written.
template <class Struct>
void init_prefix(Struct* options, std::size_t size, void (*init)(Struct*)) {
  static_assert(offsetof(Struct, struct_size) == 0);
  if (!options || size < sizeof(options->struct_size)) return;
  Struct full;
  init(&full);
  const std::size_t written = std::min(size, sizeof(Struct));
  full.struct_size = static_cast<decltype(full.struct_size)>(written);
  std::memcpy(static_cast<void*>(options), &full, written);
}

inline void set_last_error(std::string message) { last_error = std::move(message); }

}  // namespace ferry::capi
