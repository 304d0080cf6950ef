// A stand-in for Microsoft's dstorage.dll, for tests under Wine (where the real runtime cannot
// start: Wine lacks the I/O ring API it calls). It implements the interfaces ferry declares
// (src/shim/dstorage_api.hpp) over plain Win32 reads: file requests into memory, executed in
// order at Submit, status entries completed with the first failure since the last one, and the
// queue's error record. Requests on a file whose name contains "fail-dstorage" fail (the disk's
// CRC error), so that tests see how a failed request is reported. Buffer destinations are read
// into the resource's memory (ID3D12Resource::Map: tests/fake_gpu's stand-in D3D12 maps host
// memory), and signals set the fence at Submit, after the requests before them (not after a
// failed one).
#include <atomic>
#include <cwchar>
#include <vector>

#include "shim/dstorage_api.hpp"
// After windows.h (through dstorage_api.hpp): the methods of the destination buffer and fence.
#include <d3d12.h>

namespace {

using namespace ferry::dstorage;

template <class Interface>
class Object : public Interface {
 public:
  HRESULT STDMETHODCALLTYPE QueryInterface(REFIID, void** out) override {
    *out = this;
    AddRef();
    return S_OK;
  }
  ULONG STDMETHODCALLTYPE AddRef() override { return ++_references; }
  ULONG STDMETHODCALLTYPE Release() override {
    const ULONG left = --_references;
    if (left == 0) delete this;
    return left;
  }
  virtual ~Object() = default;

 private:
  std::atomic<ULONG> _references{1};
};

class File final : public Object<IDStorageFile> {
 public:
  File(HANDLE handle, const wchar_t* path) : handle(handle), path(path) {}
  ~File() override { Close(); }
  void STDMETHODCALLTYPE Close() override {
    if (handle != INVALID_HANDLE_VALUE) ::CloseHandle(handle);
    handle = INVALID_HANDLE_VALUE;
  }
  HRESULT STDMETHODCALLTYPE GetFileInformation(BY_HANDLE_FILE_INFORMATION* info) override {
    return ::GetFileInformationByHandle(handle, info) ? S_OK : HRESULT_FROM_WIN32(::GetLastError());
  }
  HANDLE handle;
  std::wstring path;
};

class StatusArray final : public Object<IDStorageStatusArray> {
 public:
  explicit StatusArray(std::uint32_t capacity) : complete(capacity, true), result(capacity, S_OK) {}
  bool STDMETHODCALLTYPE IsComplete(std::uint32_t index) override { return complete.at(index); }
  HRESULT STDMETHODCALLTYPE GetHResult(std::uint32_t index) override { return result.at(index); }
  std::vector<bool> complete;
  std::vector<HRESULT> result;
};

class Queue final : public Object<IDStorageQueue> {
 public:
  void STDMETHODCALLTYPE EnqueueRequest(const Request* request) override {
    _pending.push_back({*request, nullptr, 0, nullptr, 0});
  }
  void STDMETHODCALLTYPE EnqueueStatus(IDStorageStatusArray* status, std::uint32_t index) override {
    auto* array = static_cast<StatusArray*>(status);
    array->complete.at(index) = false;
    _pending.push_back({{}, array, index, nullptr, 0});
  }
  void STDMETHODCALLTYPE EnqueueSignal(ID3D12Fence* fence, std::uint64_t value) override {
    _pending.push_back({{}, nullptr, 0, fence, value});
  }
  void STDMETHODCALLTYPE Submit() override {
    HRESULT since_status = S_OK;
    bool failed_since_signal = false;
    for (const Entry& e : _pending) {
      if (e.fence) {
        // After a failed request the fence is left as it was: nothing promises the signal then,
        // and ferry must not wait for it for ever.
        if (!failed_since_signal) e.fence->Signal(e.value);
        failed_since_signal = false;
        continue;
      }
      if (e.status) {
        e.status->result.at(e.index) = since_status;
        e.status->complete.at(e.index) = true;
        since_status = S_OK;
        continue;
      }
      if (const HRESULT hr = run(e.request); FAILED(hr)) {
        if (_record.FailureCount++ == 0) {
          _record.FirstFailure.HResult = hr;
          _record.FirstFailure.CommandType = kCommandRequest;
          auto* file = static_cast<File*>(e.request.Source.File.Source);
          std::wcsncpy(_record.FirstFailure.Request.Filename, file->path.c_str(), MAX_PATH - 1);
          _record.FirstFailure.Request.Request = e.request;
        }
        if (SUCCEEDED(since_status)) since_status = hr;
        failed_since_signal = true;
      }
    }
    _pending.clear();
  }
  void STDMETHODCALLTYPE CancelRequestsWithTag(std::uint64_t, std::uint64_t) override {}
  void STDMETHODCALLTYPE Close() override {}
  HANDLE STDMETHODCALLTYPE GetErrorEvent() override { return nullptr; }
  void STDMETHODCALLTYPE Query(void*) override {}
  void STDMETHODCALLTYPE RetrieveErrorRecord(ErrorRecord* record) override { *record = _record; }

 private:
  struct Entry {
    Request request;
    StatusArray* status;
    std::uint32_t index;
    ID3D12Fence* fence;
    std::uint64_t value;
  };
  static HRESULT run(const Request& r) {
    if (r.Options.SourceType != kSourceFile) return E_INVALIDARG;
    void* destination = nullptr;
    if (r.Options.DestinationType == kDestinationMemory) {
      destination = r.Destination.Memory.Buffer;
    } else if (r.Options.DestinationType == kDestinationBuffer) {
      void* base = nullptr;
      if (FAILED(r.Destination.Buffer.Resource->Map(0, nullptr, &base))) return E_INVALIDARG;
      destination = static_cast<char*>(base) + r.Destination.Buffer.Offset;
    } else {
      return E_INVALIDARG;
    }
    auto* file = static_cast<File*>(r.Source.File.Source);
    if (file->path.find(L"fail-dstorage") != std::wstring::npos)
      return HRESULT_FROM_WIN32(ERROR_CRC);
    OVERLAPPED at{};
    at.Offset = static_cast<DWORD>(r.Source.File.Offset);
    at.OffsetHigh = static_cast<DWORD>(r.Source.File.Offset >> 32);
    DWORD got = 0;
    if (!::ReadFile(file->handle, destination, r.Source.File.Size, &got, &at))
      return HRESULT_FROM_WIN32(::GetLastError());
    return got == r.Source.File.Size ? S_OK : HRESULT_FROM_WIN32(ERROR_HANDLE_EOF);
  }
  std::vector<Entry> _pending;
  ErrorRecord _record{};
};

class Factory final : public Object<IDStorageFactory> {
 public:
  HRESULT STDMETHODCALLTYPE CreateQueue(const QueueDesc*, REFIID, void** out) override {
    *out = static_cast<IDStorageQueue*>(new Queue());
    return S_OK;
  }
  HRESULT STDMETHODCALLTYPE OpenFile(const wchar_t* path, REFIID, void** out) override {
    HANDLE h =
        ::CreateFileW(path, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                      nullptr, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
    if (h == INVALID_HANDLE_VALUE) return HRESULT_FROM_WIN32(::GetLastError());
    *out = static_cast<IDStorageFile*>(new File(h, path));
    return S_OK;
  }
  HRESULT STDMETHODCALLTYPE CreateStatusArray(std::uint32_t capacity, const char*, REFIID,
                                              void** out) override {
    *out = static_cast<IDStorageStatusArray*>(new StatusArray(capacity));
    return S_OK;
  }
  void STDMETHODCALLTYPE SetDebugFlags(std::uint32_t) override {}
  HRESULT STDMETHODCALLTYPE SetStagingBufferSize(std::uint32_t) override { return S_OK; }
};

}  // namespace

extern "C" __declspec(dllexport) HRESULT WINAPI DStorageGetFactory(REFIID, void** out) {
  static Factory* const factory = new Factory();  // the process's singleton, as the real one
  factory->AddRef();
  *out = static_cast<IDStorageFactory*>(factory);
  return S_OK;
}
