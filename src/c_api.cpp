// The C ABI over the C++ API: every entry point catches everything and maps it to a status.
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/ferry.h"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tensor_digest.hpp"

struct ferry_checkpoint {
  std::shared_ptr<const ferry::Checkpoint> checkpoint;
  std::vector<std::string> file_names;
};

struct ferry_loaded {
  ferry::LoadedCheckpoint loaded;
  std::vector<std::string> file_paths;
  std::vector<std::string> file_reasons;
};

namespace {

thread_local std::string last_error;

ferry_status fail(ferry_status status, std::string message) {
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
  } catch (const std::bad_alloc&) {
    return fail(FERRY_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(FERRY_STATUS_INTERNAL_ERROR, e.what());
  } catch (...) {
    return fail(FERRY_STATUS_INTERNAL_ERROR, "unknown error");
  }
}

void require(const void* pointer, const char* what) {
  FERRY_EXPECT(pointer != nullptr, std::invalid_argument, what, " must not be NULL");
}

}  // namespace

extern "C" {

const char* ferry_last_error(void) { return last_error.c_str(); }

const char* ferry_version(void) { return FERRY_VERSION; }

ferry_status ferry_checkpoint_open(const char* path, ferry_checkpoint** out) {
  return guarded([&] {
    require(path, "path");
    require(out, "out");
    auto handle = std::make_unique<ferry_checkpoint>();
    handle->checkpoint = ferry::Checkpoint::open_shared(path);
    for (const auto& f : handle->checkpoint->files()) handle->file_names.push_back(f.path.string());
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
  if (options) *options = ferry_load_options{"cpu", nullptr, 0, FERRY_IO_MODE_AUTO, 0, 0, 0};
}

ferry_status ferry_checkpoint_load(const ferry_checkpoint* checkpoint,
                                   const ferry_load_options* options, ferry_loaded** out) {
  return guarded([&] {
    require(checkpoint, "checkpoint");
    require(out, "out");
    ferry_load_options defaults;
    ferry_load_options_init(&defaults);
    const ferry_load_options& o = options ? *options : defaults;
    ferry::LoadOptions cpp;
    cpp.device = ferry::Device::parse(o.device ? o.device : "cpu");
    for (size_t i = 0; i < o.name_count; ++i) {
      FERRY_EXPECT(o.names && o.names[i], std::invalid_argument, "names[", i, "] is NULL");
      cpp.names.emplace_back(o.names[i]);
    }
    FERRY_EXPECT(o.io_mode >= FERRY_IO_MODE_AUTO && o.io_mode <= FERRY_IO_MODE_BUFFERED,
                 std::invalid_argument, "unknown io_mode ", o.io_mode);
    cpp.io = static_cast<ferry::IoMode>(o.io_mode);
    if (o.staging_bytes) cpp.staging_bytes = o.staging_bytes;
    cpp.chunk_bytes = o.chunk_bytes;
    cpp.reader_threads = o.reader_threads;
    auto handle = std::make_unique<ferry_loaded>(
        ferry_loaded{ferry::load(checkpoint->checkpoint, cpp), {}, {}});
    for (const auto& f : handle->loaded.stats().files) {
      handle->file_paths.push_back(f.path.string());
      handle->file_reasons.push_back(f.reason);
    }
    *out = handle.release();
  });
}

void ferry_loaded_free(ferry_loaded* loaded) { delete loaded; }

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
    *digest = ferry::tensor_digest(loaded->loaded, find_loaded(loaded, name));
  });
}

ferry_status ferry_loaded_stats(const ferry_loaded* loaded, ferry_load_stats* out) {
  return guarded([&] {
    require(loaded, "loaded");
    require(out, "out");
    const ferry::LoadStats& s = loaded->loaded.stats();
    *out = ferry_load_stats{s.tensor_bytes,     s.bytes_read,   s.seconds,
                            s.gigabytes_per_second(), s.reader_threads, s.chunk_bytes,
                            s.staging_bytes,    s.files.size()};
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

}  // extern "C"
