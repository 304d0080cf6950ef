// Small Win32 helpers for platform/windows/: UTF-8 <-> UTF-16 (ferry's API speaks UTF-8, Windows
// wants wide paths), an owned HANDLE, and Win32 errors thrown as std::system_error with the
// nearest errno (so bindings still map ERROR_FILE_NOT_FOUND to FileNotFoundError) and the
// system's own words.
#pragma once

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <string>
#include <string_view>
#include <utility>

#include "ferry/error.hpp"

namespace ferry::detail::win32 {

std::wstring widen(std::string_view utf8);
std::string narrow(std::wstring_view utf16);

// The errno that best names a Win32 error (EIO where none does).
int errno_of(DWORD error) noexcept;
// FormatMessage's text for `error`, in UTF-8, without the trailing line break.
std::string message_of(DWORD error);

template <class... Parts>
[[noreturn]] void fail(DWORD error, Parts&&... parts) {
  fail_errno(errno_of(error), std::forward<Parts>(parts)..., " (", message_of(error),
             ", Windows error ", error, ")");
}

class Handle {
 public:
  Handle() = default;
  explicit Handle(HANDLE h) noexcept : _h(h == INVALID_HANDLE_VALUE ? nullptr : h) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : _h(std::exchange(other._h, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      _h = std::exchange(other._h, nullptr);
    }
    return *this;
  }
  ~Handle() { reset(); }
  HANDLE get() const noexcept { return _h; }
  HANDLE release() noexcept { return std::exchange(_h, nullptr); }
  explicit operator bool() const noexcept { return _h != nullptr; }
  void reset() noexcept {
    if (_h) ::CloseHandle(std::exchange(_h, nullptr));
  }

 private:
  HANDLE _h = nullptr;
};

// Positioned I/O on a synchronous handle: ReadFile/WriteFile with the offset in an OVERLAPPED,
// which neither uses nor moves the handle's file pointer, so threads may share the handle.
// Both return false with GetLastError() set on failure; ERROR_HANDLE_EOF is a read of 0 bytes.
bool read_at(HANDLE file, void* buffer, DWORD size, std::uint64_t offset, DWORD& got) noexcept;
bool write_at(HANDLE file, const void* buffer, DWORD size, std::uint64_t offset,
              DWORD& put) noexcept;

}  // namespace ferry::detail::win32
