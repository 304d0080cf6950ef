// The KV store when the disk fails under it: a file-size limit reached mid-put, a root remounted
// read-only, a full file system. POSIX only (file-size limits, fork and tmpfs mounts), so not in
// the Windows subset.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include "ferry/error.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

// A child with a file-size limit just above the journal's size: the journal append fails
// (EFBIG), the put reports it, and nothing half-written becomes visible. (RLIMIT_FSIZE limits
// write offsets in every file, so the slabs here are one slot each and the journal is made
// larger than them first.)
TEST(KvStore, FullDiskFailsThePutAndCommitsNothingPartial) {
  TempDir dir;
  KVStoreOptions options;
  options.checkpoint_on_close = false;
  const auto open = [&] { return KVStore::open(dir.path(), kv_namespace(), 4 * 4096, 4096, options); };
  {
    auto store = open();
    for (KVKey k : iota_keys(100)) ASSERT_TRUE(put_one(store, k, kv_bytes(k, 4096)).ok());
  }
  // 100 put records, and the 96 removes of the blocks they evicted (4 slots).
  const std::uint64_t journal_bytes = 32 + (100 + 96) * 56;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    auto store = open();
    // Room for four more records and a bit: the store is full, so each put appends the remove
    // record of the block it evicts, then its own.
    const rlimit limit{journal_bytes + 4 * 56 + 20, journal_bytes + 4 * 56 + 20};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::vector<KVStatus> status;
    for (KVKey k : iota_keys(3, 101)) status.push_back(put_one(store, k, kv_bytes(k, 4096)).status);
    std::_Exit(status == std::vector<KVStatus>{KVStatus::ok, KVStatus::ok, KVStatus::io_error}
                   ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto store = open();
  EXPECT_EQ(store.stats().journal_tail_dropped, 0u);  // the failed append was cut back
  EXPECT_FALSE(store.contains(std::vector<KVKey>{103})[0]);
  EXPECT_TRUE(store.contains(std::vector<KVKey>{101})[0]);
  EXPECT_TRUE(store.contains(std::vector<KVKey>{102})[0]);
  for (KVKey k : store.keys()) {
    std::vector<std::byte> out(4096);
    // The failed put wrote nothing over the block it would have evicted (its remove record
    // could not be written first): every visible block is whole.
    const KVResult r = get_one(store, k, out);
    ASSERT_TRUE(r.ok()) << k << ": " << r.message;
    EXPECT_EQ(out, kv_bytes(k, 4096));
  }
}

// A tmpfs of a given size mounted for one test (root only; skipped where mount is refused).
class SmallFileSystem {
 public:
  SmallFileSystem(const std::filesystem::path& at, const std::string& options) : _at(at) {
    std::filesystem::create_directories(at);
    _mounted = ::geteuid() == 0 && ::mount("tmpfs", at.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallFileSystem() {
    if (_mounted) ::umount2(_at.c_str(), MNT_DETACH);
  }
  bool mounted() const { return _mounted; }
  bool remount_read_only() {
    return ::mount("tmpfs", _at.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }

 private:
  std::filesystem::path _at;
  bool _mounted = false;
};

TEST(KvStore, ReadOnlyRootIsAClearErrorAndReadersStillWork) {
  TempDir dir;
  const auto root = dir.path() / "root";
  SmallFileSystem fs(root, "size=4m");
  if (!fs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  {
    auto store = KVStore::open(root, kv_namespace(), 16 * 4096, 4096);
    ASSERT_TRUE(put_one(store, 1, kv_bytes(1, 4096)).ok());
  }
  ASSERT_TRUE(fs.remount_read_only());
  try {
    KVStore::open(root, kv_namespace(), 16 * 4096, 4096);
    FAIL() << "a writer opened on a read-only file system";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(root.string()), std::string::npos) << e.what();
    EXPECT_EQ(e.code().value(), EROFS) << e.what();
  }
  KVStoreOptions reader;
  reader.read_only = true;
  auto view = KVStore::open(root, kv_namespace(), 16 * 4096, 4096, reader);
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(get_one(view, 1, out).ok());
  EXPECT_EQ(out, kv_bytes(1, 4096));
}

TEST(KvStore, FullFileSystemIsAClearErrorAndCommitsNothingPartial) {
  TempDir dir;
  const auto root = dir.path() / "root";
  SmallFileSystem fs(root, "size=256k");
  if (!fs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  try {  // slabs that do not fit: refused at open, by preallocation
    KVStore::open(root, kv_namespace("big"), 1024 * 1024, 4096);
    FAIL() << "a store larger than its file system opened";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOSPC) << e.what();
    EXPECT_NE(std::string(e.what()).find("slab-"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(root / KVStore::directory_name(kv_namespace("big")));
  KVKey failed = 0;
  {
    // The slabs fit; the journal grows until the file system is full.
    auto store = KVStore::open(root, kv_namespace(), 40 * 4096, 4096);
    for (KVKey k = 1; k < 10000 && failed == 0; ++k) {
      const KVResult r = put_one(store, k, kv_bytes(k, 4096));
      if (!r.ok()) {
        EXPECT_EQ(r.status, KVStatus::io_error);
        EXPECT_NE(r.message.find("journal"), std::string::npos) << r.message;
        failed = k;
      }
    }
  }
  ASSERT_NE(failed, 0u) << "the file system never filled";
  auto store = KVStore::open(root, kv_namespace(), 40 * 4096, 4096);
  EXPECT_FALSE(store.contains(std::vector<KVKey>{failed})[0]);
  EXPECT_TRUE(store.contains(std::vector<KVKey>{failed - 1})[0]);
  for (KVKey k : store.keys()) {
    std::vector<std::byte> out(4096);
    // The failed put wrote nothing over the block it would have evicted (its remove record
    // could not be written first): every visible block is whole.
    const KVResult r = get_one(store, k, out);
    ASSERT_TRUE(r.ok()) << k << ": " << r.message;
    EXPECT_EQ(out, kv_bytes(k, 4096));
  }
}

}  // namespace
}  // namespace ferry::test
