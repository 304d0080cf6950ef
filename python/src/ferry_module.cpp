// ferry._ferry: the engine for Python. Loaded tensors leave as 1-D uint8 DLPack arrays that view
// ferry's memory (host or device) and keep it alive; ferry/torch.py and ferry/numpy.py give
// them their dtype and shape without copying. The GIL is released while I/O runs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

#include "engine_options.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/machine.hpp"
#include "ferry/safetensors.hpp"
#include "ferry/tensor_reader.hpp"
#include "ferry/transfer.hpp"
#include "interpreter_exit.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry {
void bind_save(nb::module_& m);  // save_bindings.cpp
void bind_prepare(nb::module_& m);  // prepare_bindings.cpp
void bind_kv(nb::module_& m);    // kv_bindings.cpp
void bind_stream(nb::module_& m);  // stream_bindings.cpp
void bind_fanout(nb::module_& m);  // fanout_bindings.cpp

namespace {

using Bytes = nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig>;

// nanobind refuses DLPack views of more dimensions (a fatal error, not an exception); such
// tensors leave as bytes and are shaped in Python.
constexpr std::size_t kMaxViewRank = 128;

// A path from str, bytes or os.PathLike, as the bytes the system sees (os.fsencode); a NUL
// inside is a ValueError.
std::filesystem::path fs_path(nb::handle path) {
  PyObject* converted = nullptr;
  if (!PyUnicode_FSConverter(path.ptr(), &converted)) throw nb::python_error();
  nb::bytes bytes = nb::steal<nb::bytes>(converted);
  return std::string(bytes.c_str(), bytes.size());
}

// A path as Python shows it (os.fsdecode): bytes that are not UTF-8 survive as surrogates.
nb::str fs_str(const std::filesystem::path& path) {
  const std::string& text = path.native();
  return nb::steal<nb::str>(PyUnicode_DecodeFSDefaultAndSize(text.data(),
                                                             static_cast<Py_ssize_t>(text.size())));
}

// The DLPack type of the dtypes every torch and numpy build reads from DLPack; others (bool,
// unsigned wider than 8 bits, float8 and packed types) leave as bytes and are retyped in Python.
std::optional<nb::dlpack::dtype> dlpack_dtype(DType dtype) {
  using nb::dlpack::dtype_code;
  const auto make = [](dtype_code code, unsigned bits) {
    return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (dtype) {
    case DType::U8: return make(dtype_code::UInt, 8);
    case DType::I8: return make(dtype_code::Int, 8);
    case DType::I16: return make(dtype_code::Int, 16);
    case DType::I32: return make(dtype_code::Int, 32);
    case DType::I64: return make(dtype_code::Int, 64);
    case DType::F16: return make(dtype_code::Float, 16);
    case DType::BF16: return make(dtype_code::Bfloat, 16);
    case DType::F32: return make(dtype_code::Float, 32);
    case DType::F64: return make(dtype_code::Float, 64);
    default: return std::nullopt;
  }
}

// An owner for DLPack views that holds a reference to `memory` until the last consumer lets go.
nb::capsule keep_alive(const std::shared_ptr<void>& memory) {
  auto* keep = new std::shared_ptr<void>(memory);
  return nb::capsule(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
}

// A view of `size` bytes at `data` that keeps `memory` alive for as long as any consumer holds it.
Bytes byte_view(const std::shared_ptr<void>& memory, void* data, std::uint64_t size,
                const Device& device) {
  nb::capsule owner = keep_alive(memory);
  const std::size_t shape[1] = {static_cast<std::size_t>(size)};
  return Bytes(data, 1, shape, owner, nullptr, nb::dtype<std::uint8_t>(),
               device.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value,
               device.is_cuda() ? device.index : 0);
}

// Python callables are called with the GIL held, from whichever reader thread finished a chunk.
using Progress = std::function<void(std::uint64_t, std::uint64_t)>;

// Whether this thread's last load stopped for a KeyboardInterrupt.
bool& interrupted_flag() {
  thread_local bool flag = false;
  return flag;
}

void translate_system_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Cancelled& e) {
    // Stopped by a KeyboardInterrupt seen while waiting: raise that again.
    const bool by_signal = std::exchange(interrupted_flag(), false);
    PyErr_SetString(by_signal ? PyExc_KeyboardInterrupt : PyExc_RuntimeError, e.what());
  } catch (const std::system_error& e) {
    const int code = e.code().value();
    PyObject* type = code == ENOENT ? PyExc_FileNotFoundError : PyExc_OSError;
    nb::object error = nb::steal(PyObject_CallFunction(type, "is", code, e.what()));
    PyErr_SetObject(type, error.ptr());
  }
}

// A uint8 view of one loaded tensor's bytes that keeps the loaded memory alive.
Bytes tensor_bytes(const LoadedCheckpoint& l, const std::string& name) {
  const LoadedTensor* t = l.find(name);
  FERRY_EXPECT(t != nullptr, std::invalid_argument, "tensor \"", name, "\" was not loaded");
  return byte_view(l.memory(), t->data, t->info->size, l.device());
}

// (name, DLPack view with the tensor's dtype and shape, or None) for every tensor: one call for
// all, since per-tensor Python calls cost more than the I/O of a small tensor, and one owner
// shared by every view. None where the dtype has no DLPack type every framework reads.
std::vector<std::pair<std::string, nb::object>> tensor_views(const LoadedCheckpoint& l) {
  std::vector<std::pair<std::string, nb::object>> out;
  out.reserve(l.tensors().size());
  const int device_type = l.device().is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  const int device_id = l.device().is_cuda() ? l.device().index : 0;
  nb::capsule owner = keep_alive(l.memory());
  std::vector<std::size_t> shape;
  for (const auto& t : l.tensors()) {
    const auto type = t.info->ggml_type < 0 ? dlpack_dtype(t.info->dtype) : std::nullopt;
    if (!type || t.info->shape.size() > kMaxViewRank) {
      out.emplace_back(t.info->name, nb::none());
      continue;
    }
    shape.assign(t.info->shape.begin(), t.info->shape.end());
    nb::ndarray<> view(t.data, shape.size(), shape.data(), owner, nullptr, *type, device_type,
                       device_id);
    out.emplace_back(t.info->name, nb::cast(view));
  }
  return out;
}

// A load under way, held by Python. Dropped without wait(), it is cancelled and its copies
// stop without the GIL held: a progress callback may need the GIL to let a worker go on.
struct PyPendingLoad {
  std::optional<PendingLoad> load;
  const LoadedCheckpoint& loaded() const {
    FERRY_EXPECT(load.has_value(), std::logic_error, "load: waited for already");
    return load->loaded();
  }
  ~PyPendingLoad() {
    if (!load) return;
    nb::gil_scoped_release release;
    load.reset();
  }
};

}  // namespace

// The library's JSON of the statistics, as a Python dict: one list of fields for every front end.
nb::object stats_dict(const LoadStats& s) {
  nb::object stats = nb::module_::import_("json").attr("loads")(to_json(s));
  // The JSON holds what UTF-8 can; Python gets each path exactly.
  nb::list files = nb::cast<nb::list>(stats["files"]);
  for (std::size_t i = 0; i < s.files.size(); ++i) {
    nb::object file = files[i];
    file["path"] = fs_str(s.files[i].path);
  }
  return stats;
}

// Engine settings arrive as keywords (io, backend, allow_compat, staging_bytes, chunk_bytes,
// threads, slots) and go through set_load_option, the mapping the CLI and the C ABI use too.
// None leaves a setting at its default.
LoadOptions make_options(const std::string& device, std::optional<std::vector<std::string>> names,
                         std::optional<nb::callable> progress, const nb::kwargs& engine) {
  LoadOptions o;
  o.device = Device::parse(device);
  if (names) o.names = std::move(*names);
  for (auto [key, value] : engine) {
    if (value.is_none()) continue;
    const std::string k = nb::cast<std::string>(key);
    const std::string v = nb::isinstance<nb::bool_>(value) ? (nb::cast<bool>(value) ? "true" : "false")
                                                           : nb::cast<std::string>(nb::str(value));
    set_load_option(o, k, v);
  }
  // The waiting thread looks for signals (Ctrl-C) while the load runs without the GIL; a pending
  // KeyboardInterrupt cancels the load and is raised in its place.
  o.keep_going = [] {
    // Python is exiting: no GIL to take, and the load stops so the exit need not wait for it.
    if (!InterpreterExit::get().enter()) return false;
    struct Leave {
      ~Leave() { InterpreterExit::get().leave(); }
    } leave;
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return true;
    PyErr_Clear();
    interrupted_flag() = true;
    return false;
  };
  if (progress) {
    // The callable is shared so that copies made off the GIL never touch its reference count.
    auto fn = std::make_shared<nb::callable>(std::move(*progress));
    o.progress = [fn](std::uint64_t done, std::uint64_t total) {
      if (!InterpreterExit::get().enter()) return;  // no more calls while Python exits
      struct Leave {
        ~Leave() { InterpreterExit::get().leave(); }
      } leave;
      nb::gil_scoped_acquire gil;
      (*fn)(done, total);
    };
  }
  return o;
}

}  // namespace ferry

NB_MODULE(_ferry, m) {
  using namespace ferry;
  m.doc() = "ferry's engine: checkpoints opened, planned and loaded into GPU or host memory";
  nb::register_exception_translator(translate_system_error);
  // Malformed files raise SafetensorError, a ValueError as FormatError is an invalid_argument
  // (safetensors' own SafetensorError derives from Exception; ferry's from ValueError, so that
  // both `except ValueError` and `except SafetensorError` catch it). Where safetensors is
  // installed, it derives from safetensors.SafetensorError too: code written for safetensors
  // that catches its error keeps working when ferry loads.
  nb::object bases = nb::make_tuple(nb::handle(PyExc_ValueError));
  try {
    nb::object theirs = nb::module_::import_("safetensors").attr("SafetensorError");
    bases = nb::make_tuple(theirs, nb::handle(PyExc_ValueError));
  } catch (const nb::python_error&) {
    // Not installed (or not importable): a ValueError alone.
  }
  nb::exception<FormatError>(m, "SafetensorError", bases);
  // A KV store's own files (journal, checkpoint, manifest): registered later, so tried first.
  nb::exception<KVFormatError>(m, "KVFormatError", PyExc_ValueError);
  InterpreterExit::get().set_main_thread(
      nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident")));
  nb::module_::import_("atexit").attr("register")(
      nb::cpp_function([] { InterpreterExit::get().close(); }));

  nb::class_<Checkpoint>(m, "Checkpoint")
      .def_static(
          "open",
          [](nb::handle path) {
            const std::filesystem::path file = fs_path(path);
            return without_gil([&] { return Checkpoint::open_shared(file); });
          },
          "path"_a, "Opens and validates a .safetensors file, a shard directory or an index "
                    "(str, bytes or os.PathLike).")
      .def_prop_ro("path", [](const Checkpoint& c) { return fs_str(c.path()); })
      .def("files",
           [](const Checkpoint& c) {
             nb::list out;
             for (const auto& f : c.files()) out.append(fs_str(f.path));
             return out;
           })
      .def("metadata", [](const Checkpoint& c, std::size_t file) {
             FERRY_EXPECT(file < c.files().size(), std::out_of_range, "file index ", file,
                          " is out of range");
             return c.files()[file].metadata;
           }, "file"_a = 0)
      .def("tensors",
           [](const Checkpoint& c) {
             // (name, dtype, shape, bytes, file index, offset), in read order.
             std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>,
                                    std::uint64_t, std::uint32_t, std::uint64_t>>
                 out;
             for (const auto& t : c.tensors())
               out.emplace_back(t.name, std::string(dtype_name(t.dtype)), t.shape, t.size,
                                t.file_index, t.offset);
             return out;
           })
      .def("names",
           [](const Checkpoint& c, bool sorted) {
             // Straight into a list: 100,000 names would otherwise be copied twice.
             std::vector<std::string_view> names;
             names.reserve(c.tensors().size());
             for (const auto& t : c.tensors()) names.push_back(t.name);
             if (sorted) std::sort(names.begin(), names.end());  // bytes: code point order
             nb::list out;
             for (const auto name : names) {
               PyObject* text =
                   PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
               if (text == nullptr) throw nb::python_error();
               out.append(nb::steal(text));
             }
             return out;
           },
           "sorted"_a = false,
           "Tensor names in read order (by file, then offset), or sorted (as keys() gives them).")
      .def("tensor",
           [](const Checkpoint& c, const std::string& name)
               -> std::optional<std::tuple<std::string, std::vector<std::uint64_t>, std::uint64_t>> {
             const TensorInfo* t = c.find(name);
             if (t == nullptr) return std::nullopt;
             return std::make_tuple(std::string(dtype_name(t->dtype)), t->shape, t->size);
           },
           "name"_a, "(dtype, shape, bytes) of one tensor, or None where there is none.")
      .def("has_metadata",
           [](const Checkpoint& c, std::size_t file) {
             FERRY_EXPECT(file < c.files().size(), std::out_of_range, "file index ", file,
                          " is out of range");
             return c.files()[file].has_metadata;
           },
           "file"_a = 0, "Whether the header has a __metadata__ object (an empty one included).")
      .def_prop_ro("total_bytes", &Checkpoint::total_bytes)
      .def_prop_ro("format",
                   [](const Checkpoint& c) { return std::string(checkpoint_format_name(c.format())); })
      .def("metadata_json",
           [](const Checkpoint& c, std::size_t file) {
             FERRY_EXPECT(file < c.files().size(), std::out_of_range, "file index ", file,
                          " is out of range");
             return c.files()[file].metadata_json();
           },
           "file"_a = 0, "GGUF metadata, typed, as JSON text (empty for safetensors).")
      .def("ggml_tensors",
           [](const Checkpoint& c) {
             // (name, ggml type name, dims with ne[0] first) for GGUF tensors.
             std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>>> out;
             for (const auto& t : c.tensors())
               if (t.ggml_type >= 0)
                 out.emplace_back(t.name, std::string(ggml_type_name(t.ggml_type)), t.ggml_dims);
             return out;
           });

  nb::class_<LoadedCheckpoint>(m, "Loaded")
      .def_prop_ro("device", [](const LoadedCheckpoint& l) { return l.device().to_string(); })
      .def("names",
           [](const LoadedCheckpoint& l) {
             std::vector<std::string> out;
             for (const auto& t : l.tensors()) out.push_back(t.info->name);
             return out;
           })
      .def("bytes", &tensor_bytes, "name"_a,
           "A uint8 view of the tensor's bytes that keeps the loaded memory alive.")
      .def("address",
           [](const LoadedCheckpoint& l, const std::string& name) {
             const LoadedTensor* t = l.find(name);
             FERRY_EXPECT(t != nullptr, std::invalid_argument, "tensor \"", name,
                          "\" was not loaded");
             return reinterpret_cast<std::uintptr_t>(t->data);
           },
           "name"_a, "The tensor's address (host or device); valid while this object lives.")
      .def("views", &tensor_views,
           "(name, DLPack view with the tensor's dtype and shape, or None) for every tensor.")
      .def("stats", [](const LoadedCheckpoint& l) { return stats_dict(l.stats()); });

  m.def(
      "load",
      [](std::shared_ptr<const Checkpoint> checkpoint, const std::string& device,
         std::optional<std::vector<std::string>> names, std::optional<nb::callable> progress,
         nb::kwargs engine) {
        LoadOptions o = make_options(device, std::move(names), std::move(progress), engine);
        return without_gil([&] { return load(std::move(checkpoint), o); });
      },
      "checkpoint"_a, "device"_a = "cpu", "names"_a = nb::none(), "progress"_a = nb::none(),
      "engine"_a,
      "Loads the named tensors (all when names is None) into one new allocation on device.\n"
      "Keywords set the engine: io, backend, allow_compat, staging_bytes, chunk_bytes, threads,\n"
      "slots.");

  // A load whose reads run while Python builds its tensors (ferry/torch.py): the views exist
  // before the bytes land, and are handed out only after wait().
  nb::class_<PyPendingLoad>(m, "PendingLoad")
      .def("bytes", [](const PyPendingLoad& p, const std::string& name) {
             return tensor_bytes(p.loaded(), name);
           }, "name"_a, "As Loaded.bytes; the bytes land by the time wait() returns.")
      .def("views", [](const PyPendingLoad& p) { return tensor_views(p.loaded()); },
           "As Loaded.views; the bytes land by the time wait() returns.")
      .def("wait",
           [](PyPendingLoad& p) {
             p.loaded();  // not waited for already
             LoadedCheckpoint out = without_gil([&] { return p.load->wait(); });
             p.load.reset();
             return out;
           },
           "Until every byte landed: the Loaded result. Raises the load's error. Once.");

  m.def(
      "start_load",
      [](std::shared_ptr<const Checkpoint> checkpoint, const std::string& device,
         std::optional<std::vector<std::string>> names, std::optional<nb::callable> progress,
         nb::kwargs engine) {
        LoadOptions o = make_options(device, std::move(names), std::move(progress), engine);
        auto out = std::make_unique<PyPendingLoad>();
        without_gil([&] { out->load.emplace(start_load(std::move(checkpoint), o)); });
        return out;
      },
      "checkpoint"_a, "device"_a = "cpu", "names"_a = nb::none(), "progress"_a = nb::none(),
      "engine"_a,
      "As load, but returns once the reads are under way: a PendingLoad whose views can be\n"
      "built while the bytes land, and whose wait() gives the Loaded result.");

  m.def(
      "load_into",
      [](std::shared_ptr<const Checkpoint> checkpoint,
         const std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>& destinations,
         const std::string& device, std::optional<nb::callable> progress, nb::kwargs engine) {
        std::vector<TensorDestination> dst;
        for (const auto& [name, address, capacity] : destinations)
          dst.push_back({name, reinterpret_cast<void*>(address), capacity});
        LoadOptions o = make_options(device, std::nullopt, std::move(progress), engine);
        const LoadStats stats = without_gil([&] { return load_into(*checkpoint, dst, o); });
        return stats_dict(stats);
      },
      "checkpoint"_a, "destinations"_a, "device"_a = "cpu", "progress"_a = nb::none(),
      "engine"_a,
      "Loads (name, address, capacity) destinations the caller owns on device; keywords as load.");

  nb::class_<TensorReader>(m, "TensorReader")
      .def(
          "__init__",
          [](TensorReader* self, std::shared_ptr<const Checkpoint> checkpoint) {
            without_gil([&] { new (self) TensorReader(std::move(checkpoint)); });
          },
          "checkpoint"_a, "Opens every file of the checkpoint and holds it until closed.")
      .def(
          "read",
          [](const TensorReader& r, const std::string& name, std::uint64_t begin,
             std::uint64_t length, std::uintptr_t address) {
            const TensorInfo* t = r.checkpoint().find(name);
            FERRY_EXPECT(t != nullptr, std::out_of_range, "no tensor named \"", name, "\"");
            // Small reads come from the page cache in microseconds: releasing the GIL would
            // cost more than it frees.
            if (length < (1u << 20)) {
              r.read(*t, begin, length, reinterpret_cast<void*>(address));
            } else {
              without_gil([&] { r.read(*t, begin, length, reinterpret_cast<void*>(address)); });
            }
          },
          "name"_a, "begin"_a, "length"_a, "address"_a,
          "Reads bytes [begin, begin + length) of the tensor into host memory at address.")
      .def(
          "read_ranges",
          [](const TensorReader& r, const std::string& name,
             const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
             std::uintptr_t address) {
            const TensorInfo* t = r.checkpoint().find(name);
            FERRY_EXPECT(t != nullptr, std::out_of_range, "no tensor named \"", name, "\"");
            std::vector<TensorReader::Range> list;
            list.reserve(ranges.size());
            for (const auto& [begin, end] : ranges) list.push_back({begin, end});
            without_gil([&] { r.read_ranges(*t, list, reinterpret_cast<void*>(address)); });
          },
          "name"_a, "ranges"_a, "address"_a,
          "Reads the (begin, end) byte ranges of the tensor packed back to back at address.")
      .def(
          "submit",
          [](const TensorReader& r, const std::string& name, std::uint64_t begin,
             std::uint64_t length, std::uintptr_t address, const std::string& device,
             std::uintptr_t after_event) {
            const TensorInfo* t = r.checkpoint().find(name);
            FERRY_EXPECT(t != nullptr, std::out_of_range, "no tensor named \"", name, "\"");
            const Device d = Device::parse(device);
            return without_gil(
                [&] { return r.submit(*t, begin, length, reinterpret_cast<void*>(address), d,
                                      reinterpret_cast<void*>(after_event)); });
          },
          "name"_a, "begin"_a, "length"_a, "address"_a, "device"_a, "after_event"_a = 0,
          "Starts reading bytes [begin, begin + length) of the tensor into memory at address on\n"
          "device (cpu or cuda:N) through the transfer engine; returns a Ticket at once. The\n"
          "memory must outlive the ticket. after_event: a CUevent (as int) the writes wait for.")
      .def(
          "submit_ranges",
          [](const TensorReader& r, const std::string& name,
             const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
             std::uintptr_t address, const std::string& device, std::uintptr_t after_event) {
            const TensorInfo* t = r.checkpoint().find(name);
            FERRY_EXPECT(t != nullptr, std::out_of_range, "no tensor named \"", name, "\"");
            std::vector<TensorReader::Range> list;
            list.reserve(ranges.size());
            for (const auto& [begin, end] : ranges) list.push_back({begin, end});
            const Device d = Device::parse(device);
            return without_gil([&] {
              return r.submit_ranges(*t, list, reinterpret_cast<void*>(address), d,
                                     reinterpret_cast<void*>(after_event));
            });
          },
          "name"_a, "ranges"_a, "address"_a, "device"_a, "after_event"_a = 0,
          "submit() for (begin, end) byte ranges, packed back to back at address.")
      .def(
          "submit_tensors",
          [](const TensorReader& r,
             const std::vector<std::pair<std::string, std::uintptr_t>>& tensors,
             const std::string& device, std::uintptr_t after_event) {
            std::vector<TensorReader::Whole> list;
            list.reserve(tensors.size());
            for (const auto& [name, address] : tensors) {
              const TensorInfo* t = r.checkpoint().find(name);
              FERRY_EXPECT(t != nullptr, std::out_of_range, "no tensor named \"", name, "\"");
              list.push_back({t, reinterpret_cast<void*>(address)});
            }
            const Device d = Device::parse(device);
            return without_gil([&] {
              return r.submit_tensors(list, d, reinterpret_cast<void*>(after_event));
            });
          },
          "tensors"_a, "device"_a, "after_event"_a = 0,
          "Starts reading whole tensors, (name, address) each, as ONE ticket (one extent per\n"
          "tensor); the memory must outlive the ticket.")
      .def(
          "wait",
          [](const TensorReader& r, const Ticket& ticket) {
            without_gil([&] { r.wait(ticket); });
          },
          "ticket"_a, "Waits for a submitted read; raises its failure.")
      .def(
          "through_page_cache",
          [](const TensorReader& r, const std::string& name) {
            const TensorInfo* t = r.checkpoint().find(name);
            FERRY_EXPECT(t != nullptr, std::out_of_range, "no tensor named \"", name, "\"");
            return without_gil([&] { return r.through_page_cache(*t); });
          },
          "name"_a,
          "Whether reads of the tensor's file go through the page cache (not O_DIRECT).")
      .def_prop_ro("bytes_read", &TensorReader::bytes_read,
                   "File bytes this reader has read (O_DIRECT alignment included).");

  nb::class_<Ticket>(m, "Ticket")
      .def("ready", &Ticket::ready)
      .def(
          "wait",
          [](const Ticket& t) {
            without_gil([&] { t.wait(); });
            t.rethrow_if_failed();
          },
          "Waits until the transfer is over; raises its failure.")
      .def("cancel", &Ticket::cancel,
           "Stops the transfer before its next chunk; dropping the ticket then waits only for "
           "chunks in flight.");

  m.def(
      "parse_header",
      [](nb::bytes data, const std::string& label) {
        // (data_start, has_metadata, metadata, [(name, dtype, shape, offset, size)] by offset)
        const auto* bytes = static_cast<const std::byte*>(data.data());
        SafetensorsHeader h = parse_safetensors_header(
            std::span<const std::byte>(bytes, data.size()), data.size(), label);
        std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>,
                               std::uint64_t, std::uint64_t>>
            tensors;
        tensors.reserve(h.tensors.size());
        for (const auto& t : h.tensors)
          tensors.emplace_back(t.name, std::string(dtype_name(t.dtype)), t.shape, t.offset,
                               t.size);
        return std::make_tuple(h.data_start, h.has_metadata, h.metadata, tensors);
      },
      "data"_a, "label"_a = "<bytes>",
      "Parses and validates the safetensors file held in `data` (the whole file).");

  m.attr("__version__") = FERRY_VERSION;
  m.def("cuda_available", &cuda_available);
  m.def(
      "page_cache_fraction",
      [](const std::string& path) {
        return page_cache_residency_measured() ? page_cache_fraction(path) : 0.0;
      },
      "path"_a,
      "The fraction of the file's pages in the page cache (sampled on large files, as a load's "
      "choice between O_DIRECT and buffered reads is); 0 where the system cannot tell (Windows).");
  m.def("release_staging_memory", &release_staging_memory);
  // Page-cache DMA's registrations no load is using (page_cache_pin); returns the bytes still held.
  m.def("release_page_cache_registrations", &release_page_cache_registrations);
  // The device memory cache's memory no load is using (cache_device_memory); returns the bytes
  // it still holds.
  m.def("release_cached_device_memory", &release_cached_device_memory);
  bind_save(m);
  bind_prepare(m);
  bind_kv(m);
  bind_stream(m);
  bind_fanout(m);
}
