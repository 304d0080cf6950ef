// ferry._ferry.save_file and save_bytes: the saver for ferry/_save.py, which checks tensors the
// way safetensors does and hands over their addresses. The GIL is released while the file is
// written; the bytes form fills a Python bytes object directly.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/safetensors_save.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry {
namespace {

// (name, safetensors dtype name, shape, address, bytes, device)
using PyTensor = std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t,
                            std::uint64_t, std::string>;

std::vector<SaveTensor> to_save_tensors(const std::vector<PyTensor>& tensors) {
  std::vector<SaveTensor> out;
  out.reserve(tensors.size());
  for (const auto& [name, dtype, shape, address, size, device] : tensors) {
    const auto parsed = dtype_from_name(dtype);
    FERRY_EXPECT(parsed.has_value(), std::invalid_argument, "tensor \"", name, "\": unknown dtype ",
                 dtype);
    out.push_back({{name, *parsed, shape}, reinterpret_cast<const void*>(address), size,
                   Device::parse(device)});
  }
  return out;
}

nb::dict stats_dict(const SaveStats& s) {
  nb::dict d;
  d["file_bytes"] = s.file_bytes;
  d["seconds"] = s.seconds;
  d["io_path"] = s.io_path;
  d["io_reason"] = s.io_reason;
  d["staging_bytes"] = s.staging_bytes;
  d["staging_pinned"] = s.pinned;
  d["fill_seconds"] = s.fill_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["write_seconds"] = s.write_seconds;
  return d;
}

}  // namespace

void bind_save(nb::module_& m) {
  m.def(
      "save_file",
      [](const std::string& path, const std::vector<PyTensor>& tensors,
         std::optional<SafetensorsMetadata> metadata, bool direct, std::uint64_t staging_bytes,
         std::uint64_t piece_bytes, unsigned writer_threads) {
        const auto save = to_save_tensors(tensors);
        SaveStats stats;
        {
          nb::gil_scoped_release release;
          stats = save_safetensors(path, save, metadata,
                                   {direct, staging_bytes, piece_bytes, writer_threads});
        }
        return stats_dict(stats);
      },
      "path"_a, "tensors"_a, "metadata"_a.none(), "direct"_a = true,
      "staging_bytes"_a = SaveOptions{}.staging_bytes, "piece_bytes"_a = SaveOptions{}.piece_bytes,
      "writer_threads"_a = SaveOptions{}.writer_threads,
      "Writes (name, dtype, shape, address, bytes, device) tensors as a safetensors file.");
  m.def(
      "save_bytes",
      [](const std::vector<PyTensor>& tensors, std::optional<SafetensorsMetadata> metadata) {
        const auto save = to_save_tensors(tensors);
        nb::object out;
        serialize_safetensors(save, metadata, [&](std::uint64_t size) {
          out = nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
          if (!out.is_valid()) throw nb::python_error();
          return reinterpret_cast<std::byte*>(PyBytes_AS_STRING(out.ptr()));
        });
        return nb::borrow<nb::bytes>(out);
      },
      "tensors"_a, "metadata"_a.none(), "The bytes of a safetensors file holding `tensors`.");
}

}  // namespace ferry
