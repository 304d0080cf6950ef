#include "ferry/file_set.hpp"

#include <algorithm>
#include <cerrno>
#include <list>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "platform/file.hpp"

namespace ferry {
namespace detail {

struct FileSetState {
  struct Entry {
    std::filesystem::path path;
    FileAccess access = FileAccess::Read;
    FileIdentity identity;
    bool wants_direct = false;
    std::shared_ptr<PlatformFile> open;  // null while closed
    std::list<std::uint32_t>::iterator in_lru;
  };

  std::size_t max_open = 1;
  mutable std::mutex mutex;
  std::vector<Entry> entries;
  std::list<std::uint32_t> lru;  // open entries, most recently used first

  // Closes idle files, least recently used first, until fewer than `keep` are open; returns
  // whether one was closed. A file whose pointer is held elsewhere is in use: never closed.
  bool close_idle(std::size_t keep) {
    bool closed = false;
    for (auto it = lru.end(); lru.size() > keep && it != lru.begin();) {
      --it;
      Entry& e = entries[*it];
      if (e.open.use_count() > 1) continue;
      e.open.reset();
      it = lru.erase(it);
      closed = true;
    }
    return closed;
  }

  // Opens with one retry after closing an idle file, where the process ran out of descriptors.
  PlatformFile open_file(const Entry& e) {
    try {
      return PlatformFile::open(e.path, e.access, e.wants_direct);
    } catch (const std::system_error& error) {
      if (error.code().value() != EMFILE || !close_idle(0)) throw;
    }
    return PlatformFile::open(e.path, e.access, e.wants_direct);
  }

  void make_room() { close_idle(max_open - 1); }

  void mark_open(std::uint32_t index, PlatformFile file) {
    Entry& e = entries[index];
    e.open = std::make_shared<PlatformFile>(std::move(file));
    lru.push_front(index);
    e.in_lru = lru.begin();
  }
};

}  // namespace detail

namespace {

std::size_t default_max_open() {
  const std::uint64_t limit = detail::open_file_limit();
  if (limit == 0) return 1024;
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(limit / 4, 4, 1024));
}

[[noreturn]] void changed_underneath(const std::filesystem::path& path, const std::string& how) {
  detail::fail_errno(detail::kFileChangedErrno, path.string(),
                     ": the file changed underneath ferry since it was "
                     "opened (",
                     how, "); open it again");
}

}  // namespace

std::shared_ptr<FileSet> FileSet::create(std::size_t max_open) {
  return std::shared_ptr<FileSet>(new FileSet(max_open ? max_open : default_max_open()));
}

FileSet::FileSet(std::size_t max_open) : _state(std::make_unique<detail::FileSetState>()) {
  _state->max_open = std::max<std::size_t>(1, max_open);
}

FileSet::~FileSet() = default;

std::uint32_t FileSet::add(const std::filesystem::path& path, FileAccess access) {
  std::lock_guard lock(_state->mutex);
  detail::FileSetState& s = *_state;
  s.make_room();
  detail::FileSetState::Entry entry;
  entry.path = path;
  entry.access = access;
  detail::PlatformFile file = s.open_file(entry);
  entry.identity = file.identity();
  const auto index = static_cast<std::uint32_t>(s.entries.size());
  s.entries.push_back(std::move(entry));
  s.mark_open(index, std::move(file));
  return index;
}

std::size_t FileSet::size() const {
  std::lock_guard lock(_state->mutex);
  return _state->entries.size();
}

const std::filesystem::path& FileSet::path(std::uint32_t index) const {
  std::lock_guard lock(_state->mutex);
  FERRY_EXPECT(index < _state->entries.size(), std::out_of_range, "file index ", index,
               " is not in this file set of ", _state->entries.size());
  return _state->entries[index].path;
}

std::uint64_t FileSet::size_at_open(std::uint32_t index) const {
  std::lock_guard lock(_state->mutex);
  FERRY_EXPECT(index < _state->entries.size(), std::out_of_range, "file index ", index,
               " is not in this file set of ", _state->entries.size());
  return _state->entries[index].identity.size;
}

std::size_t FileSet::max_open() const noexcept { return _state->max_open; }

std::size_t FileSet::open_now() const {
  std::lock_guard lock(_state->mutex);
  return _state->lru.size();
}

std::shared_ptr<const detail::PlatformFile> FileSet::acquire(std::uint32_t index,
                                                             bool want_direct) const {
  std::lock_guard lock(_state->mutex);
  detail::FileSetState& s = *_state;
  FERRY_EXPECT(index < s.entries.size(), std::out_of_range, "file index ", index,
               " is not in this file set of ", s.entries.size());
  auto& e = s.entries[index];
  e.wants_direct |= want_direct;
  if (!e.open) {
    s.make_room();
    detail::PlatformFile file;
    try {
      file = s.open_file(e);
    } catch (const std::system_error& error) {
      if (error.code() == std::errc::no_such_file_or_directory)
        changed_underneath(e.path, "it was removed");
      throw;
    }
    const bool same = e.access == FileAccess::Read ? file.identity().same_contents(e.identity)
                                                   : file.identity().same_file(e.identity);
    if (!same) changed_underneath(e.path, "the path now names a different or rewritten file");
    s.mark_open(index, std::move(file));
  } else {
    s.lru.splice(s.lru.begin(), s.lru, e.in_lru);
  }
  if (want_direct) e.open->add_direct();
  return e.open;
}

}  // namespace ferry
