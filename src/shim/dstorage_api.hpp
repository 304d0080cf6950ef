// The few DirectStorage declarations ferry uses, written from Microsoft's public documentation of
// dstorage.h (DirectStorage for Windows SDK 1.1 to 1.3: the 16-byte DSTORAGE_REQUEST_OPTIONS of
// SDK 1.1 and later), so that building needs no SDK. dstorage.dll itself is loaded at run time
// (shim/dstorage.cpp), never linked. Only what ferry calls is declared; the vtable order of each
// interface is the header's, which is its ABI.
#pragma once

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <unknwn.h>
#include <windows.h>

#include <cstdint>

struct ID3D12Device;
struct ID3D12Fence;
struct ID3D12Resource;

namespace ferry::dstorage {

enum RequestSourceType : std::uint64_t { kSourceFile = 0, kSourceMemory = 1 };
enum RequestDestinationType : std::uint64_t {
  kDestinationMemory = 0,
  kDestinationBuffer = 1,
};
enum Priority : std::int8_t { kPriorityNormal = 0 };
enum CommandType : std::int32_t { kCommandNone = -1, kCommandRequest = 0 };

inline constexpr std::uint16_t kMaxQueueCapacity = 0x2000;
inline constexpr std::uint16_t kMinQueueCapacity = 0x80;
inline constexpr int kRequestMaxName = 64;

struct QueueDesc {
  RequestSourceType SourceType;
  std::uint16_t Capacity;
  Priority Priority;
  const char* Name;
  ID3D12Device* Device;  // null: memory destinations only
};

struct RequestOptions {
  std::uint8_t CompressionFormat;  // 0: uncompressed (an 8-bit field of a UINT8 enum)
  std::uint8_t Reserved1[7];
  std::uint64_t SourceType : 1;
  std::uint64_t DestinationType : 7;
  std::uint64_t Reserved : 48;
};
static_assert(sizeof(RequestOptions) == 16);

struct IDStorageFile;

struct SourceFile {
  IDStorageFile* Source;
  std::uint64_t Offset;
  std::uint32_t Size;
};
struct SourceMemory {
  const void* Source;
  std::uint32_t Size;
};
union Source {
  SourceMemory Memory;
  SourceFile File;
};

struct DestinationMemory {
  void* Buffer;
  std::uint32_t Size;
};
struct DestinationBuffer {
  ID3D12Resource* Resource;
  std::uint64_t Offset;
  std::uint32_t Size;
};
// The union's largest members (a texture region, tiles) are 40 bytes; ferry uses two.
union Destination {
  DestinationMemory Memory;
  DestinationBuffer Buffer;
  unsigned char Largest[40];
};

struct Request {
  RequestOptions Options;
  Source Source;
  Destination Destination;
  std::uint32_t UncompressedSize;
  std::uint64_t CancellationTag;
  const char* Name;
};
static_assert(sizeof(Request) == 104);

struct ErrorParametersRequest {
  wchar_t Filename[MAX_PATH];
  char RequestName[kRequestMaxName];
  Request Request;
};
struct ErrorFirstFailure {
  HRESULT HResult;
  CommandType CommandType;
  union {
    ErrorParametersRequest Request;
    unsigned char Other[16];  // status, signal and event parameters
  };
};
struct ErrorRecord {
  std::uint32_t FailureCount;
  ErrorFirstFailure FirstFailure;
};

struct DECLSPEC_NOVTABLE IDStorageFile : public IUnknown {
  virtual void STDMETHODCALLTYPE Close() = 0;
  virtual HRESULT STDMETHODCALLTYPE GetFileInformation(BY_HANDLE_FILE_INFORMATION* info) = 0;
};

struct DECLSPEC_NOVTABLE IDStorageStatusArray : public IUnknown {
  virtual bool STDMETHODCALLTYPE IsComplete(std::uint32_t index) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetHResult(std::uint32_t index) = 0;
};

struct DECLSPEC_NOVTABLE IDStorageQueue : public IUnknown {
  virtual void STDMETHODCALLTYPE EnqueueRequest(const Request* request) = 0;
  virtual void STDMETHODCALLTYPE EnqueueStatus(IDStorageStatusArray* status,
                                               std::uint32_t index) = 0;
  virtual void STDMETHODCALLTYPE EnqueueSignal(ID3D12Fence* fence, std::uint64_t value) = 0;
  virtual void STDMETHODCALLTYPE Submit() = 0;
  virtual void STDMETHODCALLTYPE CancelRequestsWithTag(std::uint64_t mask, std::uint64_t value) = 0;
  virtual void STDMETHODCALLTYPE Close() = 0;
  virtual HANDLE STDMETHODCALLTYPE GetErrorEvent() = 0;
  virtual void STDMETHODCALLTYPE Query(void* info) = 0;
  virtual void STDMETHODCALLTYPE RetrieveErrorRecord(ErrorRecord* record) = 0;
};

struct DECLSPEC_NOVTABLE IDStorageFactory : public IUnknown {
  virtual HRESULT STDMETHODCALLTYPE CreateQueue(const QueueDesc* desc, REFIID riid, void** out) = 0;
  virtual HRESULT STDMETHODCALLTYPE OpenFile(const wchar_t* path, REFIID riid, void** out) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateStatusArray(std::uint32_t capacity, const char* name,
                                                      REFIID riid, void** out) = 0;
  virtual void STDMETHODCALLTYPE SetDebugFlags(std::uint32_t flags) = 0;
  virtual HRESULT STDMETHODCALLTYPE SetStagingBufferSize(std::uint32_t size) = 0;
};

// Interface identifiers, as dstorage.h declares them.
inline constexpr GUID kIidFactory = {
    0x6924ea0c, 0xc3cd, 0x4826, {0xb1, 0x0a, 0xf6, 0x4f, 0x4e, 0xd9, 0x27, 0xc1}};
inline constexpr GUID kIidFile = {
    0x5de95e7b, 0x955a, 0x4868, {0xa7, 0x3c, 0x24, 0x3b, 0x29, 0xf4, 0xb8, 0xda}};
inline constexpr GUID kIidQueue = {
    0xcfdbd83f, 0x9e06, 0x4fda, {0x8e, 0xa5, 0x69, 0x04, 0x21, 0x37, 0xf4, 0x9b}};
inline constexpr GUID kIidStatusArray = {
    0x82397587, 0x7cd5, 0x453b, {0xa0, 0x2e, 0x31, 0x37, 0x9b, 0xd6, 0x46, 0x56}};

// dstorage.dll's entry point: the factory (a process-wide singleton).
using GetFactoryFn = HRESULT(WINAPI*)(REFIID riid, void** out);

}  // namespace ferry::dstorage
