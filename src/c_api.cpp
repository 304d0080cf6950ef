// The C ABI over the C++ API: every entry point catches everything and maps it to a status.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "c_api_guard.hpp"
#include "c_api_handles.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/ferry.h"
#include "ferry/ggml_type.hpp"
#include "ferry/load_options.hpp"
#include "ferry/load_preparation.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tensor_digest.hpp"
#include "ferry/transfer.hpp"
#include "ferry/utf8_path.hpp"

namespace ferry::capi {
thread_local std::string last_error;
}  // namespace ferry::capi

struct ferry_loaded {
  ferry::LoadedCheckpoint loaded;
  std::vector<std::string> file_paths;
  std::vector<std::string> file_reasons;
};

struct ferry_ticket {
  ferry::Ticket ticket;
  std::vector<std::string> errors;  // per transfer, kept for ferry_ticket_status
};

namespace {

using ferry::capi::fail;
using ferry::capi::guarded;
using ferry::capi::require;
using ferry::capi::require_size;
using ferry::capi::wait_ticket;

using ferry::capi::Field;

constexpr Field kLoadOptionsFields[] = {
    FERRY_FIELD(ferry_load_options, struct_size),
    FERRY_FIELD(ferry_load_options, device),
    FERRY_FIELD(ferry_load_options, names),
    FERRY_FIELD(ferry_load_options, name_count),
    FERRY_FIELD(ferry_load_options, io_mode),
    FERRY_FIELD(ferry_load_options, staging_bytes),
    FERRY_FIELD(ferry_load_options, chunk_bytes),
    FERRY_FIELD(ferry_load_options, reader_threads),
    FERRY_FIELD(ferry_load_options, backend),
    FERRY_FIELD(ferry_load_options, allow_compat),
    FERRY_FIELD(ferry_load_options, slots_per_thread),
    FERRY_FIELD(ferry_load_options, page_cache_pin_bytes),
    FERRY_FIELD(ferry_load_options, cache_device_memory),
};
static_assert(ferry::capi::lists_every_field<ferry_load_options>(kLoadOptionsFields));

constexpr Field kTransferOptionsFields[] = {
    FERRY_FIELD(ferry_transfer_options, struct_size),
    FERRY_FIELD(ferry_transfer_options, io_mode),
    FERRY_FIELD(ferry_transfer_options, threads),
    FERRY_FIELD(ferry_transfer_options, chunk_bytes),
    FERRY_FIELD(ferry_transfer_options, staging_bytes),
    FERRY_FIELD(ferry_transfer_options, after_event),
    FERRY_FIELD(ferry_transfer_options, durable),
};
static_assert(ferry::capi::lists_every_field<ferry_transfer_options>(kTransferOptionsFields));

}  // namespace

namespace ferry::capi {

LoadOptions load_options(const ferry_load_options& given) {
  ferry_load_options defaults;
  ferry_load_options_init(&defaults);
  const ferry_load_options o = read_sized(given, defaults, kLoadOptionsFields, "options");
  LoadOptions cpp;
  cpp.device = Device::parse(o.device ? o.device : "cpu");
  for (size_t i = 0; i < o.name_count; ++i) {
    FERRY_EXPECT(o.names && o.names[i], std::invalid_argument, "names[", i, "] is NULL");
    cpp.names.emplace_back(o.names[i]);
  }
  FERRY_EXPECT(o.io_mode >= FERRY_IO_MODE_AUTO && o.io_mode <= FERRY_IO_MODE_BUFFERED,
               std::invalid_argument, "unknown io_mode ", o.io_mode);
  cpp.io = static_cast<IoMode>(o.io_mode);
  // Numbers go through the same checks as the CLI's flags and Python's keywords.
  const auto set = [&](std::string_view key, const std::string& value) {
    set_load_option(cpp, key, value);
  };
  if (o.staging_bytes) set("staging_bytes", std::to_string(o.staging_bytes));
  set("chunk_bytes", std::to_string(o.chunk_bytes));
  set("threads", std::to_string(o.reader_threads));
  if (o.backend) set("backend", o.backend);
  set("allow_compat", o.allow_compat ? "true" : "false");
  set("slots", std::to_string(o.slots_per_thread));
  set("page_cache_pin", std::to_string(o.page_cache_pin_bytes));
  set("cache_device_memory", o.cache_device_memory ? "true" : "false");
  return cpp;
}

}  // namespace ferry::capi

extern "C" {

const char* ferry_last_error(void) { return ferry::capi::last_error.c_str(); }

const char* ferry_version(void) { return FERRY_VERSION; }

ferry_status ferry_checkpoint_open(const char* path, ferry_checkpoint** out) {
  return guarded([&] {
    require(path, "path");
    require(out, "out");
    auto handle = std::make_unique<ferry_checkpoint>();
    handle->checkpoint = ferry::Checkpoint::open_shared(ferry::path_from_utf8(path));
    for (const auto& f : handle->checkpoint->files())
      handle->file_names.push_back(ferry::utf8_of(f.path));
    *out = handle.release();
  });
}

void ferry_checkpoint_free(ferry_checkpoint* checkpoint) { delete checkpoint; }

size_t ferry_checkpoint_tensor_count(const ferry_checkpoint* checkpoint) {
  return checkpoint ? checkpoint->checkpoint->tensors().size() : 0;
}

ferry_status ferry_checkpoint_tensor_info(const ferry_checkpoint* checkpoint, size_t index,
                                          ferry_tensor_info* out) {
  return guarded([&] {
    require(checkpoint, "checkpoint");
    require(out, "out");
    const auto& tensors = checkpoint->checkpoint->tensors();
    FERRY_EXPECT(index < tensors.size(), std::invalid_argument, "tensor index ", index,
                 " is out of range (", tensors.size(), " tensors)");
    const ferry::TensorInfo& t = tensors[index];
    const bool gguf = t.ggml_type >= 0;
    *out = ferry_tensor_info{t.name.c_str(),
                             ferry::dtype_name(t.dtype).data(),
                             t.shape.data(),
                             t.shape.size(),
                             t.size,
                             checkpoint->file_names[t.file_index].c_str(),
                             t.offset,
                             gguf ? ferry::ggml_type_name(t.ggml_type).data() : nullptr,
                             gguf ? t.ggml_dims.data() : nullptr,
                             gguf ? t.ggml_dims.size() : 0};
  });
}

void ferry_load_options_init(ferry_load_options* options) {
  if (!options) return;
  *options = ferry_load_options{};
  options->struct_size = sizeof(ferry_load_options);
  options->device = "cpu";
  options->io_mode = FERRY_IO_MODE_AUTO;
}

void ferry_load_options_init_sized(ferry_load_options* options, size_t struct_size) {
  ferry::capi::init_prefix(options, struct_size, ferry_load_options_init);
}

ferry_status ferry_checkpoint_load(const ferry_checkpoint* checkpoint,
                                   const ferry_load_options* options, ferry_loaded** out) {
  return guarded([&] {
    require(checkpoint, "checkpoint");
    require(out, "out");
    ferry_load_options defaults;
    ferry_load_options_init(&defaults);
    const ferry::LoadOptions cpp = ferry::capi::load_options(options ? *options : defaults);
    auto handle = std::make_unique<ferry_loaded>(
        ferry_loaded{ferry::load(checkpoint->checkpoint, cpp), {}, {}});
    for (const auto& f : handle->loaded.stats().files) {
      handle->file_paths.push_back(ferry::utf8_of(f.path));
      handle->file_reasons.push_back(f.reason);
    }
    *out = handle.release();
  });
}

void ferry_loaded_free(ferry_loaded* loaded) { delete loaded; }

struct ferry_load_preparation {
  ferry::LoadPreparation preparation;
};

ferry_status ferry_load_prepare(const ferry_load_options* options, ferry_load_preparation** out) {
  return guarded([&] {
    require(out, "out");
    ferry_load_options defaults;
    ferry_load_options_init(&defaults);
    const ferry::LoadOptions cpp = ferry::capi::load_options(options ? *options : defaults);
    *out = new ferry_load_preparation{ferry::LoadPreparation(cpp)};
  });
}

ferry_status ferry_load_preparation_wait(ferry_load_preparation* preparation,
                                         uint64_t* staging_bytes) {
  return guarded([&] {
    require(preparation, "preparation");
    const ferry::WarmUpReport report = preparation->preparation.wait();
    if (staging_bytes) *staging_bytes = report.staging_bytes;
  });
}

void ferry_load_preparation_free(ferry_load_preparation* preparation) { delete preparation; }

ferry_status ferry_release_cached_device_memory(uint64_t* still_held) {
  return guarded([&] {
    const std::uint64_t held = ferry::release_cached_device_memory();
    if (still_held) *still_held = held;
  });
}

static const ferry::LoadedTensor& find_loaded(const ferry_loaded* loaded, const char* name) {
  require(loaded, "loaded");
  require(name, "name");
  const ferry::LoadedTensor* t = loaded->loaded.find(name);
  FERRY_EXPECT(t != nullptr, std::invalid_argument, "tensor \"", name, "\" was not loaded");
  return *t;
}

ferry_status ferry_loaded_tensor_data(const ferry_loaded* loaded, const char* name, void** data,
                                      uint64_t* bytes) {
  return guarded([&] {
    const ferry::LoadedTensor& t = find_loaded(loaded, name);
    if (data) *data = t.data;
    if (bytes) *bytes = t.info->size;
  });
}

ferry_status ferry_loaded_tensor_digest(const ferry_loaded* loaded, const char* name,
                                        uint64_t* digest) {
  return guarded([&] {
    require(digest, "digest");
    // Looked up first: the order in which arguments are evaluated is unspecified, and
    // loaded->loaded must not be formed before loaded is checked.
    const ferry::LoadedTensor& tensor = find_loaded(loaded, name);
    *digest = ferry::tensor_digest(loaded->loaded, tensor);
  });
}

ferry_status ferry_loaded_stats(const ferry_loaded* loaded, ferry_load_stats* out) {
  return guarded([&] {
    require(loaded, "loaded");
    const ferry::LoadStats& s = loaded->loaded.stats();
    ferry_load_stats all{};
    all.tensor_bytes = s.tensor_bytes;
    all.bytes_read = s.bytes_read;
    all.seconds = s.seconds;
    all.gigabytes_per_second = s.gigabytes_per_second();
    all.reader_threads = s.reader_threads;
    all.chunk_bytes = s.chunk_bytes;
    all.staging_bytes = s.staging_bytes;
    all.file_count = s.files.size();
    all.slots_per_thread = s.slots_per_thread;
    all.settings_source = s.settings_source.c_str();
    all.bytes_from_registered_page_cache = s.bytes_from_registered_page_cache;
    all.page_cache_register_seconds = s.page_cache_register_seconds;
    ferry::capi::write_sized(out, all, "out");
  });
}

ferry_status ferry_loaded_file_stats(const ferry_loaded* loaded, size_t index,
                                     ferry_file_stats* out) {
  return guarded([&] {
    require(loaded, "loaded");
    require(out, "out");
    const auto& files = loaded->loaded.stats().files;
    FERRY_EXPECT(index < files.size(), std::invalid_argument, "file index ", index,
                 " is out of range (", files.size(), " files)");
    *out = ferry_file_stats{loaded->file_paths[index].c_str(),
                            ferry::io_path_name(files[index].io_path).data(),
                            loaded->file_reasons[index].c_str(), files[index].bytes_read};
  });
}

void ferry_transfer_options_init(ferry_transfer_options* options) {
  if (options == nullptr) return;
  *options = ferry_transfer_options{};
  options->struct_size = sizeof(ferry_transfer_options);
  options->io_mode = FERRY_IO_MODE_AUTO;
}

void ferry_transfer_options_init_sized(ferry_transfer_options* options, size_t struct_size) {
  ferry::capi::init_prefix(options, struct_size, ferry_transfer_options_init);
}

ferry_status ferry_file_set_create(size_t max_open, ferry_file_set** out) {
  return guarded([&] {
    require(out, "out");
    auto handle = std::make_unique<ferry_file_set>();
    handle->set = ferry::FileSet::create(max_open);
    *out = handle.release();
  });
}

ferry_status ferry_file_set_add(ferry_file_set* set, const char* path, int writable,
                                uint32_t* index) {
  return guarded([&] {
    require(set, "set");
    require(path, "path");
    const std::uint32_t i =
        set->set->add(ferry::path_from_utf8(path),
                      writable ? ferry::FileAccess::ReadWrite : ferry::FileAccess::Read);
    if (index) *index = i;
  });
}

void ferry_file_set_free(ferry_file_set* set) { delete set; }

ferry_status ferry_transfer_submit(ferry_file_set* set, ferry_direction direction,
                                   const ferry_transfer* transfers, size_t count,
                                   const ferry_transfer_options* options, ferry_ticket** out) {
  return guarded([&] {
    require(set, "set");
    require(out, "out");
    FERRY_EXPECT(transfers != nullptr || count == 0, std::invalid_argument,
                 "transfers must not be NULL");
    FERRY_EXPECT(
        direction == FERRY_DIRECTION_FILE_TO_MEMORY || direction == FERRY_DIRECTION_MEMORY_TO_FILE,
        std::invalid_argument, "unknown direction ", static_cast<int>(direction));
    ferry_transfer_options defaults;
    ferry_transfer_options_init(&defaults);
    // Fields the caller's (possibly older, smaller) struct does not hold keep their defaults.
    const ferry_transfer_options given =
        options ? ferry::capi::read_sized(*options, defaults, kTransferOptionsFields, "options")
                : defaults;
    ferry::TransferOptions o;
    FERRY_EXPECT(given.io_mode >= FERRY_IO_MODE_AUTO && given.io_mode <= FERRY_IO_MODE_BUFFERED,
                 std::invalid_argument, "unknown io_mode ", given.io_mode);
    o.io = static_cast<ferry::IoMode>(given.io_mode);
    o.threads = given.threads;
    o.chunk_bytes = given.chunk_bytes;
    if (given.staging_bytes) o.staging_bytes = given.staging_bytes;
    o.after_event = given.after_event;
    o.durable = given.durable != 0;
    std::vector<ferry::Extent> extents;
    extents.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const ferry_transfer& t = transfers[i];
      const ferry::Device device = t.device ? ferry::Device::parse(t.device) : ferry::Device::cpu();
      FERRY_EXPECT(t.memory != nullptr || t.length == 0, std::invalid_argument, "transfer ", i,
                   ": memory must not be NULL");
      extents.push_back({t.file, t.file_offset, {{device, t.memory, t.length}}});
    }
    auto handle = std::make_unique<ferry_ticket>();
    handle->errors.resize(count);
    handle->ticket =
        ferry::submit(set->set,
                      direction == FERRY_DIRECTION_FILE_TO_MEMORY ? ferry::Direction::FileToMemory
                                                                  : ferry::Direction::MemoryToFile,
                      std::move(extents), o);
    *out = handle.release();
  });
}

ferry_status ferry_ticket_wait(ferry_ticket* ticket, int64_t timeout_ms, int* ready) {
  return guarded([&] { wait_ticket(ticket, timeout_ms, ready); });
}

int ferry_ticket_ready(const ferry_ticket* ticket) {
  return ticket == nullptr || ticket->ticket.ready() ? 1 : 0;
}

void ferry_ticket_cancel(ferry_ticket* ticket) {
  if (ticket) ticket->ticket.cancel();
}

ferry_status ferry_ticket_status(ferry_ticket* ticket, size_t index, ferry_transfer_state* state,
                                 uint64_t* bytes_done, const char** error) {
  return guarded([&] {
    require(ticket, "ticket");
    FERRY_EXPECT(index < ticket->errors.size(), std::invalid_argument, "transfer index ", index,
                 " is out of range (", ticket->errors.size(), " transfers)");
    const ferry::ExtentStatus s = ticket->ticket.status(index);
    if (state) *state = static_cast<ferry_transfer_state>(static_cast<int>(s.state));
    if (bytes_done) *bytes_done = s.bytes_done;
    if (error) {
      ticket->errors[index] = s.error;
      *error = ticket->errors[index].c_str();
    }
  });
}

void ferry_ticket_free(ferry_ticket* ticket) { delete ticket; }  // ~Ticket waits

}  // extern "C"
