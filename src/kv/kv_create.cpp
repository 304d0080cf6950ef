// Creating a namespace's directory whole. The manifest, the preallocated slabs and an empty
// journal are made in a temporary directory beside it ("tmp-ns-...<pid>", which list() never
// takes for a store) and renamed into place: a creation that fails (no space, a killed
// process) leaves nothing that a later open would take for a store with other settings, and a
// reader never sees a half-made one. The journal is the last file an older ferry made in place,
// so a directory without journal and checkpoint is such an unfinished creation: the writer
// clears it and creates the store again.
#include <cerrno>
#include <system_error>

#include "ferry/error.hpp"
#include "kv/kv_store_impl.hpp"
#include "platform/file_ops.hpp"
#include "platform/system.hpp"

namespace ferry {

namespace {

bool present(const fs::path& path) {
  std::error_code error;
  return fs::exists(fs::symlink_status(path, error));
}

}  // namespace

void KVStore::Impl::create_directory_whole(const fs::path& root) {
  if (present(dir)) return;
  const fs::path staged =
      root / ("tmp-" + dir.filename().string() + "." + std::to_string(detail::process_id()));
  std::error_code ignored;
  fs::remove_all(staged, ignored);  // left by a killed creator that had this pid
  if (!detail::create_directory(staged, 0700))
    FERRY_SYSCALL_FAIL(staged.string(), ": cannot create the namespace directory");
  try {
    const std::string manifest = manifest_json_now().dump(2) + "\n";
    write_atomically(staged / "manifest.json", std::as_bytes(std::span(manifest)));
    { SlabFiles made(staged, slab_count, slots_per_slab * slot_bytes, true); }  // fsynced
    write_atomically(staged / "journal", encode_journal_header(0));
  } catch (...) {
    fs::remove_all(staged, ignored);
    throw;
  }
  std::error_code error;
  fs::rename(staged, dir, error);
  if (error) {
    fs::remove_all(staged, ignored);
    if (present(dir)) return;  // another process created it meanwhile: that one stands
    detail::fail_errno(error.value(), dir.string(), ": cannot rename ", staged.string(),
                       " to it");
  }
  fsync_directory(root);
}

void KVStore::Impl::clear_unfinished_creation() {
  // The single writer's names: a store made by this ferry always has a journal.
  if (present(dir / "journal") || present(dir / "checkpoint") || !present(dir / "manifest.json"))
    return;
  // Nothing was ever committed here (every commit is in the journal or the checkpoint).
  for (unsigned i = 0; i < 256; ++i) {
    const fs::path slab = dir / ("slab-" + std::to_string(i) + ".dat");
    if (!detail::remove_file(slab) && errno != ENOENT)
      FERRY_SYSCALL_FAIL(slab.string(), ": cannot remove (an unfinished store creation)");
  }
  const fs::path manifest = dir / "manifest.json";
  if (!detail::remove_file(manifest) && errno != ENOENT)
    FERRY_SYSCALL_FAIL(manifest.string(), ": cannot remove (an unfinished store creation)");
  fsync_directory(dir);
}

}  // namespace ferry
