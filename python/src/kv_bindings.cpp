// ferry._ferry.KVStoreCore and KVTicketCore: the KV block store for ferry/kv.py, which turns torch
// tensors into (address, bytes, device) pieces and keeps them alive while a batch runs. The GIL
// is released while blocks move; completion callbacks take it on the store's worker thread.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/kv_pages.hpp"
#include "ferry/kv_store.hpp"
#include "ferry/load_options.hpp"
#include "interpreter_exit.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry {
namespace {

// (address, bytes, device)
using PyPiece = std::tuple<std::uintptr_t, std::uint64_t, std::string>;
using PyBlock = std::vector<PyPiece>;
// A paged batch (ferry.KVPages): segments of per layer (address of row 0, row bytes, row
// stride, rows, device) and each block's row, their blocks in order.
using PyLayer =
    std::tuple<std::uintptr_t, std::uint64_t, std::uint64_t, std::uint64_t, std::string>;
using PyPages = std::tuple<std::vector<PyLayer>, std::vector<std::uint64_t>>;
using PyBlocks = std::variant<std::vector<PyPages>, std::vector<PyBlock>>;
// (status, route, message, route_reason)
using PyResult = std::tuple<std::string, std::string, std::string, std::string>;

const char* status_name(KVStatus s) {
  switch (s) {
    case KVStatus::ok:
      return "ok";
    case KVStatus::already_present:
      return "already_present";
    case KVStatus::missing:
      return "missing";
    case KVStatus::bad_size:
      return "bad_size";
    case KVStatus::no_space:
      return "no_space";
    case KVStatus::io_error:
      return "io_error";
    case KVStatus::unsupported:
      return "unsupported";
    case KVStatus::read_only:
      return "read_only";
  }
  return "unknown";
}

std::vector<PyResult> py_results(const std::vector<KVResult>& results) {
  std::vector<PyResult> out;
  out.reserve(results.size());
  for (const auto& r : results)
    out.emplace_back(status_name(r.status), to_string(r.route), r.message, r.route_reason);
  return out;
}

KVBlockList blocks_of(const std::vector<PyBlock>& blocks) {
  KVBlockList out(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (const auto& [address, size, device] : blocks[i])
      out[i].push_back({reinterpret_cast<void*>(address), size, Device::parse(device)});
  return out;
}

KVBlockList blocks_of(const std::vector<PyPages>& segments) {
  KVBlockList out;
  for (const auto& [py_layers, rows] : segments) {
    std::vector<KVPagedLayer> layers;
    layers.reserve(py_layers.size());
    for (const auto& [address, row_bytes, row_stride, count, device] : py_layers)
      layers.push_back({reinterpret_cast<const void*>(address), row_bytes, row_stride, count,
                        Device::parse(device)});
    KVBlockList blocks = paged_blocks(layers, rows);
    out.insert(out.end(), std::make_move_iterator(blocks.begin()),
               std::make_move_iterator(blocks.end()));
  }
  return out;
}

KVBlockList blocks_of(const PyBlocks& blocks) {
  return std::visit([](const auto& b) { return blocks_of(b); }, blocks);
}

// A Python callable held by C++ threads: called with the GIL, and released with it (a worker
// dropping the last reference must not touch a reference count without the GIL).
struct PyCallable {
  explicit PyCallable(nb::object fn) : fn(std::move(fn)) {}
  ~PyCallable() {
    if (!InterpreterExit::get().enter()) {
      fn.release();  // the interpreter is exiting: leak it rather than touch Python
      return;
    }
    {
      nb::gil_scoped_acquire gil;
      fn = nb::object();
    }
    InterpreterExit::get().leave();
  }
  nb::object fn;
};

KVCallback py_callback(nb::object callback) {
  if (!callback.is_valid() || callback.is_none()) return nullptr;
  auto held = std::make_shared<PyCallable>(std::move(callback));
  return [held](const std::vector<KVResult>& results) {
    if (!InterpreterExit::get().enter()) return;  // no calls into an exiting interpreter
    struct Leave {
      ~Leave() { InterpreterExit::get().leave(); }
    } leave;
    nb::gil_scoped_acquire gil;
    try {
      held->fn(py_results(results));
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("ferry KV completion callback");
    }
  };
}

// The store, closable before Python drops it (close waits for batches whose callbacks need the
// GIL, so it runs without it). The KVStore object itself lives as long as this one: a call on
// another thread may still be entering it when close() runs (KVStore::close refuses it then).
// Dropped by a completion callback's captures, it is destroyed on the store's worker thread,
// which KVStore's destructor allows.
struct PyKVStore {
  std::optional<KVStore> store;
  KVStore& get() {
    FERRY_EXPECT(store.has_value(), std::invalid_argument, "the KV store is closed");
    return *store;
  }
  void close() {
    if (store) without_gil([&] { store->close(); });
  }
  ~PyKVStore() {
    if (store) without_gil([&] { store.reset(); });
  }
};

}  // namespace

void bind_kv(nb::module_& m) {
  m.def(
      "kv_key",
      [](nb::bytes data) {
        return kv_key({static_cast<const std::byte*>(data.data()), data.size()});
      },
      "data"_a, "The XXH3-64 key of a byte string (a block hash given as bytes).");

  nb::class_<KVTicket>(m, "KVTicketCore")
      .def(
          "wait",
          [](const KVTicket& t, std::optional<double> timeout) {
            return without_gil([&] {
              if (!timeout) {
                t.wait();
                return true;
              }
              return t.wait_for(*timeout);
            });
          },
          "timeout"_a = nb::none())
      .def("ready", &KVTicket::ready)
      .def("results", [](const KVTicket& t) {
        without_gil([&] { t.wait(); });
        return py_results(t.results());
      });

  nb::class_<PyKVStore>(m, "KVStoreCore")
      .def(
          "__init__",
          [](PyKVStore* self, nb::bytes root, const std::string& model, const std::string& dtype,
             const std::string& block_layout, int tp_rank, int world_size,
             std::uint64_t capacity_bytes, std::uint64_t block_bytes, const std::string& gpu_path,
             bool allow_compat, bool read_only, unsigned slab_count, std::uint64_t checkpoint_every,
             const std::string& page_cache_pin, unsigned fleet_writers) {
            KVStoreOptions o;
            o.gpu_path = parse_kv_path(gpu_path);
            o.allow_compat = allow_compat;
            o.read_only = read_only;
            o.slab_count = slab_count;
            o.checkpoint_every = checkpoint_every;
            o.fleet_writers = fleet_writers;
            LoadOptions sized;  // the one parser of sizes: "4GiB" as the loader's keyword
            set_load_option(sized, "page_cache_pin", page_cache_pin);
            o.page_cache_pin_bytes = sized.page_cache_pin_bytes;
            const KVNamespace ns{model, dtype, block_layout, tp_rank, world_size};
            // The bytes the system sees (os.fsencode in ferry/kv.py, which refuses a NUL).
            const std::filesystem::path where(std::string(root.c_str(), root.size()));
            new (self) PyKVStore();
            self->store.emplace(without_gil(
                [&] { return KVStore::open(where, ns, capacity_bytes, block_bytes, o); }));
          },
          "root"_a, "model"_a, "dtype"_a, "block_layout"_a, "tp_rank"_a, "world_size"_a,
          "capacity_bytes"_a, "block_bytes"_a, "gpu_path"_a, "allow_compat"_a, "read_only"_a,
          "slab_count"_a, "checkpoint_every"_a, "page_cache_pin"_a, "fleet_writers"_a = 0u)
      .def("close", &PyKVStore::close)
      .def(
          "put",
          [](PyKVStore& s, const std::vector<KVKey>& keys, const PyBlocks& blocks,
             std::uintptr_t after_event) {
            const KVBlockList list = blocks_of(blocks);
            const std::vector<KVBlock> spans(list.begin(), list.end());
            KVPutOptions o;
            o.after_event = reinterpret_cast<void*>(after_event);
            KVStore& store = s.get();
            return py_results(without_gil([&] { return store.put(keys, spans, o); }));
          },
          "keys"_a, "blocks"_a, "after_event"_a)
      .def(
          "get",
          [](PyKVStore& s, const std::vector<KVKey>& keys, const PyBlocks& blocks) {
            const KVBlockList list = blocks_of(blocks);
            const std::vector<KVBlock> spans(list.begin(), list.end());
            KVStore& store = s.get();
            return py_results(without_gil([&] { return store.get(keys, spans); }));
          },
          "keys"_a, "blocks"_a)
      .def(
          "put_async",
          [](PyKVStore& s, std::vector<KVKey> keys, const PyBlocks& blocks,
             std::uintptr_t after_event, nb::object callback) {
            KVPutOptions o;
            o.after_event = reinterpret_cast<void*>(after_event);
            return s.get().put_async(std::move(keys), blocks_of(blocks), o,
                                     py_callback(std::move(callback)));
          },
          "keys"_a, "blocks"_a, "after_event"_a, "callback"_a)
      .def(
          "get_async",
          [](PyKVStore& s, std::vector<KVKey> keys, const PyBlocks& blocks, nb::object callback) {
            return s.get().get_async(std::move(keys), blocks_of(blocks),
                                     py_callback(std::move(callback)));
          },
          "keys"_a, "blocks"_a, "callback"_a)
      .def(
          "lookup",
          [](PyKVStore& s, const std::vector<KVKey>& keys) {
            KVStore& store = s.get();
            return without_gil([&] { return store.lookup(keys); });
          },
          "keys"_a)
      .def(
          "contains",
          [](PyKVStore& s, const std::vector<KVKey>& keys) {
            KVStore& store = s.get();
            const std::vector<bool> found = without_gil([&] { return store.contains(keys); });
            return std::vector<bool>(found.begin(), found.end());
          },
          "keys"_a)
      .def(
          "remove",
          [](PyKVStore& s, const std::vector<KVKey>& keys) {
            KVStore& store = s.get();
            return py_results(without_gil([&] { return store.remove(keys); }));
          },
          "keys"_a)
      .def(
          "stored_length", [](PyKVStore& s, KVKey key) { return s.get().stored_length(key); },
          "key"_a)
      .def("checkpoint",
           [](PyKVStore& s) {
             KVStore& store = s.get();
             without_gil([&] { store.checkpoint(); });
           })
      .def("keys", [](PyKVStore& s) { return s.get().keys(); })
      .def("stats", [](PyKVStore& s) {
        const KVStats st = s.get().stats();
        nb::dict d;
        const std::string& dir = st.directory.native();  // as os.fsdecode shows it
        d["directory"] = nb::steal<nb::str>(
            PyUnicode_DecodeFSDefaultAndSize(dir.data(), static_cast<Py_ssize_t>(dir.size())));
        d["block_bytes"] = st.block_bytes;
        d["slot_bytes"] = st.slot_bytes;
        d["capacity_blocks"] = st.capacity_blocks;
        d["blocks"] = st.blocks;
        d["puts"] = st.puts;
        d["gets"] = st.gets;
        d["hits"] = st.hits;
        d["misses"] = st.misses;
        d["evictions"] = st.evictions;
        d["corrupt_dropped"] = st.corrupt_dropped;
        d["journal_records"] = st.journal_records;
        d["checkpoints"] = st.checkpoints;
        d["index_bytes"] = st.index_bytes;
        d["last_sequence"] = st.last_sequence;
        d["direct_io"] = st.direct_io;
        d["writers_active"] = st.writers_active;
        d["read_only"] = st.read_only;
        d["page_cache_pin"] = st.page_cache_pin_bytes;
        d["page_cache_dma_bytes"] = st.page_cache_dma_bytes;
        d["page_cache_windows_registered"] = st.page_cache_windows_registered;
        d["page_cache_register_seconds"] = st.page_cache_register_seconds;
        d["page_cache_windows_pending"] = st.page_cache_windows_pending;
        d["page_cache_stale_rereads"] = st.page_cache_stale_rereads;
        // Where the calls' time went (seconds summed over calls; see KVStats).
        d["put_move_seconds"] = st.put_move_seconds;
        d["put_sync_seconds"] = st.put_sync_seconds;
        d["put_journal_seconds"] = st.put_journal_seconds;
        d["get_move_seconds"] = st.get_move_seconds;
        d["staged_io_seconds"] = st.staged_io_seconds;
        d["staged_copy_wait_seconds"] = st.staged_copy_wait_seconds;
        d["staged_queue_seconds"] = st.staged_queue_seconds;
        d["staged_hash_seconds"] = st.staged_hash_seconds;
        d["staged_hash_wait_seconds"] = st.staged_hash_wait_seconds;
        d["staged_setup_seconds"] = st.staged_setup_seconds;
        d["staged_transfer_seconds"] = st.staged_transfer_seconds;
        d["staged_copies"] = st.staged_copies;
        d["page_cache_dma_seconds"] = st.page_cache_dma_seconds;
        d["page_cache_checksum_seconds"] = st.page_cache_checksum_seconds;
        d["page_cache_scatter_seconds"] = st.page_cache_scatter_seconds;
        d["gpu_path"] = st.gpu_path == KVPath::Auto     ? "auto"
                        : st.gpu_path == KVPath::Staged ? "staged"
                                                        : "direct";
        return d;
      });
}

}  // namespace ferry
