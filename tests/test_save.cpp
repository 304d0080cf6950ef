// The saver: header bytes and order as safetensors writes them, the streamed write path against
// the in-memory one, and failures that leave no file behind.
#include <gtest/gtest.h>
#ifndef _WIN32
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/safetensors_save.hpp"
#include "platform/file_descriptor.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> directory_entries(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  return out;
}

// Host tensors with random contents, kept alive by the fixture.
struct HostTensors {
  std::vector<std::vector<std::byte>> storage;
  std::vector<SaveTensor> tensors;

  void add(std::string name, DType dtype, std::vector<std::uint64_t> shape, std::uint64_t seed) {
    const auto size = *tensor_byte_size(dtype, shape);
    storage.push_back(test::random_bytes(size, seed));
    tensors.push_back(
        {{std::move(name), dtype, std::move(shape)}, storage.back().data(), size, {}});
  }
};

std::string serialized(std::span<const SaveTensor> tensors,
                       const std::optional<SafetensorsMetadata>& metadata) {
  std::string out;
  serialize_safetensors(tensors, metadata, [&](std::uint64_t size) {
    out.resize(size);
    return reinterpret_cast<std::byte*>(out.data());
  });
  return out;
}

TEST(SafetensorsWriteOrder, WidestDtypeRankFirstThenNameBytewise) {
  const std::vector<TensorSpec> specs = {
      {"b", DType::Bool, {1}}, {"a", DType::F32, {1}},  {"z", DType::U64, {1}},
      {"B", DType::F32, {1}},  {"c", DType::BF16, {1}}, {"d", DType::F16, {1}},
      {"e", DType::F4, {2}},   {"f", DType::U8, {1}},   {"g", DType::F8_E4M3, {1}}};
  std::vector<std::string> names;
  for (auto i : safetensors_write_order(specs)) names.push_back(specs[i].name);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "B", "a", "c", "d", "g", "f", "e", "b"}));
}

TEST(SafetensorsHeader, CompactJsonPaddedWithSpacesToEightBytes) {
  const std::vector<TensorSpec> specs = {{"w", DType::F32, {2, 3}}, {"s", DType::I64, {}}};
  const auto header = encode_safetensors_header(specs, SafetensorsMetadata{{"format", "pt"}});
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("s":{"dtype":"I64","shape":[],"data_offsets":[24,32]}})";
  const std::size_t padded = (json.size() + 7) / 8 * 8;
  ASSERT_EQ(header.bytes.size(), 8 + padded);
  EXPECT_EQ(header.bytes.substr(8), json + std::string(padded - json.size(), ' '));
  EXPECT_EQ(static_cast<unsigned char>(header.bytes[0]), padded & 0xff);
  EXPECT_EQ(header.file_size, 8 + padded + 32);
  EXPECT_EQ(header.layout[1].offset, 8 + padded + 24);
}

TEST(SafetensorsHeader, EmptyMetadataIsWrittenAndAbsentMetadataIsNot) {
  const std::vector<TensorSpec> specs = {{"w", DType::U8, {0}}};
  EXPECT_NE(
      encode_safetensors_header(specs, SafetensorsMetadata{}).bytes.find(R"("__metadata__":{})"),
      std::string::npos);
  EXPECT_EQ(encode_safetensors_header(specs, std::nullopt).bytes.find("__metadata__"),
            std::string::npos);
}

TEST(SafetensorsHeader, RefusesDuplicateNamesAndTheMetadataKey) {
  const std::vector<TensorSpec> twice = {{"w", DType::U8, {1}}, {"w", DType::U8, {1}}};
  EXPECT_THROW(encode_safetensors_header(twice, std::nullopt), std::invalid_argument);
  const std::vector<TensorSpec> reserved = {{"__metadata__", DType::U8, {1}}};
  EXPECT_THROW(encode_safetensors_header(reserved, std::nullopt), std::invalid_argument);
  const std::vector<TensorSpec> odd_f4 = {{"q", DType::F4, {3}}};
  EXPECT_THROW(encode_safetensors_header(odd_f4, std::nullopt), std::invalid_argument);
}

HostTensors mixed_tensors() {
  HostTensors t;
  t.add("embed", DType::BF16, {1000, 37}, 1);
  t.add("scalar", DType::F32, {}, 2);
  t.add("empty", DType::F16, {0, 5}, 3);
  t.add("big", DType::U8, {(3u << 20) + 4097}, 4);
  t.add("flags", DType::Bool, {13}, 5);
  t.add("q", DType::F8_E4M3, {777}, 6);
  t.add("ids", DType::I64, {33}, 7);
  return t;
}

TEST(SaveSafetensors, FileEqualsTheInMemoryBytesForEveryPieceAndStagingSize) {
  TempDir dir;
  const auto tensors = mixed_tensors();
  const SafetensorsMetadata metadata{{"format", "pt"}, {"note", "ünïcode \"quoted\"\n"}};
  const std::string expected = serialized(tensors.tensors, metadata);
  struct Case {
    std::uint64_t staging, piece;
    unsigned writers;
    bool direct;
  };
  for (const Case c : {Case{128u << 20, 16u << 20, 4, true}, Case{8192, 4096, 3, true},
                       Case{1, 5000, 1, false}, Case{1u << 20, 64u << 10, 8, true}}) {
    const auto path = dir / "m.safetensors";
    const auto stats = save_safetensors(path, tensors.tensors, metadata,
                                        {c.direct, c.staging, c.piece, c.writers});
    ASSERT_EQ(read_all(path), expected) << "piece " << c.piece << " staging " << c.staging;
    EXPECT_EQ(stats.file_bytes, expected.size());
    EXPECT_LE(stats.staging_bytes,
              std::max<std::uint64_t>(c.staging, 2 * ((c.piece + 4095) / 4096 * 4096)));
    EXPECT_FALSE(stats.pinned);  // no GPU tensor
    if (!c.direct) {
      EXPECT_EQ(stats.io_path, "buffered");
    }
    EXPECT_EQ(directory_entries(dir.path()), std::vector<std::string>{"m.safetensors"});
  }
}

TEST(SaveSafetensors, ReadsBackThroughTheCheckpointReader) {
  TempDir dir;
  const auto tensors = mixed_tensors();
  const auto path = dir / "m.safetensors";
  save_safetensors(path, tensors.tensors, SafetensorsMetadata{{"format", "pt"}});
  const auto checkpoint = Checkpoint::open(path);
  ASSERT_EQ(checkpoint.tensors().size(), tensors.tensors.size());
  for (std::size_t i = 0; i < tensors.tensors.size(); ++i) {
    const auto* info = checkpoint.find(tensors.tensors[i].spec.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->shape, tensors.tensors[i].spec.shape);
    EXPECT_EQ(test::read_plain(checkpoint, *info), tensors.storage[i]);
  }
}

TEST(SaveSafetensors, ReplacesAnExistingFileWhole) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_file(path, std::string(10u << 20, 'x'));
  const auto tensors = mixed_tensors();
  save_safetensors(path, tensors.tensors, std::nullopt);
  EXPECT_EQ(read_all(path), serialized(tensors.tensors, std::nullopt));
}

// A reader holding the old file keeps reading the old bytes; the name gives the new file. On
// Windows the classic rename (MoveFileExW) refuses to replace an open file, so the saver takes
// the POSIX-semantics rename (Windows 10 1809+, NTFS); where that does not exist (Wine, older
// Windows) the save fails naming the file, and the old file stays whole beside no leftover.
TEST(SaveSafetensors, ReplacesAFileThatAReaderHoldsOpen) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  const std::string old_bytes(3u << 20, 'o');
  test::write_file(path, old_bytes);
  const auto tensors = mixed_tensors();
  {
    const auto reader = detail::open_for_reading(path);
    bool replaced = true;
    try {
      save_safetensors(path, tensors.tensors, std::nullopt);
    } catch (const std::system_error& e) {
#ifndef _WIN32
      throw;
#endif
      replaced = false;
      EXPECT_EQ(e.code().value(), EBUSY) << e.what();
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_all(path), replaced ? serialized(tensors.tensors, std::nullopt) : old_bytes);
    std::string held(old_bytes.size(), '\0');
    detail::read_exact(reader, held.data(), held.size(), 0, path);
    EXPECT_EQ(held, old_bytes);
  }
  EXPECT_EQ(directory_entries(dir.path()), std::vector<std::string>{"m.safetensors"});
}

// A name that is not ASCII (UTF-16 on Windows) and data that text mode would change: CR LF and
// 0x1A (end of file for the C runtime's text mode) land unchanged.
TEST(SaveSafetensors, NonAsciiNameAndTextModeBytesRoundTrip) {
  TempDir dir;
  const auto path = dir.path() / std::filesystem::path(u8"modèle-模型.safetensors");
  HostTensors t;
  t.add("w", DType::F32, {64, 33}, 9);
  const std::uint8_t trap[] = {13, 10, 26, 10, 13, 13, 10, 26};
  t.storage.emplace_back();
  for (int i = 0; i < 4001; ++i)
    for (std::uint8_t b : trap) t.storage.back().push_back(std::byte{b});
  t.tensors.push_back({{"crlf", DType::U8, {t.storage.back().size()}},
                       t.storage.back().data(),
                       t.storage.back().size(),
                       {}});
  save_safetensors(path, t.tensors, std::nullopt);
  EXPECT_EQ(read_all(path), serialized(t.tensors, std::nullopt));
  const auto checkpoint = Checkpoint::open(path);
  for (std::size_t i = 0; i < t.tensors.size(); ++i)
    EXPECT_EQ(test::read_plain(checkpoint, *checkpoint.find(t.tensors[i].spec.name)), t.storage[i]);
}

TEST(SaveSafetensors, SizeDisagreeingWithShapeIsRefusedBeforeAnyFile) {
  TempDir dir;
  auto tensors = mixed_tensors();
  tensors.tensors[0].size -= 1;
  try {
    save_safetensors(dir / "m.safetensors", tensors.tensors, std::nullopt);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("embed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("m.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(directory_entries(dir.path()).empty());
}

TEST(SaveSafetensors, MissingOrNonDirectoryParentNamesThePath) {
  TempDir dir;
  const auto tensors = mixed_tensors();
  test::write_file(dir / "file", "x");
  for (const auto& path : {dir / "no" / "m.safetensors", dir / "file" / "m.safetensors"}) {
    try {
      save_safetensors(path, tensors.tensors, std::nullopt);
      FAIL() << "no error for " << path;
    } catch (const std::system_error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
}

#ifndef _WIN32
// Permission bits, mounts, file-size limits and fork: POSIX only.
TEST(SaveSafetensors, UnwritableDirectoryLeavesNothing) {
  TempDir dir;
  const auto locked = dir / "locked";
  std::filesystem::create_directory(locked);
  ::chmod(locked.c_str(), 0555);
  bool mounted = false;
  if (::access(locked.c_str(), W_OK) == 0) {
    // Permission bits do not stop root: a read-only mount does.
    if (::mount("tmpfs", locked.c_str(), "tmpfs", MS_RDONLY, "size=1m") != 0)
      GTEST_SKIP() << "this user writes anywhere and cannot mount: " << std::strerror(errno);
    mounted = true;
  }
  const auto tensors = mixed_tensors();
  try {
    save_safetensors(locked / "m.safetensors", tensors.tensors, std::nullopt);
    ADD_FAILURE() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(directory_entries(locked).empty());
  if (mounted) ::umount2(locked.c_str(), MNT_DETACH);
}

// Runs `body` in a child process; returns its exit status (body returns the status to exit with).
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int status = 99;
    try {
      status = body();
    } catch (...) {
    }
    ::_exit(status);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// 0: the save failed with EFBIG or ENOSPC naming the path; others: what went wrong.
int save_expecting_full(const std::filesystem::path& path, std::span<const SaveTensor> tensors,
                        bool direct) {
  try {
    save_safetensors(path, tensors, std::nullopt, {direct, 1u << 20, 64u << 10, 2});
    return 1;
  } catch (const std::system_error& e) {
    const int code = e.code().value();
    if (code != EFBIG && code != ENOSPC) return 2;
    return std::string(e.what()).find(path.string()) == std::string::npos ? 3 : 0;
  }
}

TEST(SaveSafetensors, FileSizeLimitFailsCleanlyAndKeepsTheOldFile) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_file(path, "old");
  const auto tensors = mixed_tensors();
  for (bool direct : {true, false}) {
    const int status = in_child([&] {
      ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead of killing
      const rlimit limit{1u << 20, 1u << 20};
      ::setrlimit(RLIMIT_FSIZE, &limit);
      return save_expecting_full(path, tensors.tensors, direct);
    });
    EXPECT_EQ(status, 0) << "direct=" << direct;
    EXPECT_EQ(read_all(path), "old");
    EXPECT_EQ(directory_entries(dir.path()), std::vector<std::string>{"m.safetensors"});
  }
}

// A small tmpfs: a real full disk (ENOSPC). Needs the right to mount (root in CI containers).
TEST(SaveSafetensors, FullDiskFailsCleanly) {
  TempDir dir;
  const auto mount_point = dir / "small";
  std::filesystem::create_directory(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::filesystem::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mount_point};
  const auto tensors = mixed_tensors();
  const auto path = mount_point / "m.safetensors";
  EXPECT_EQ(save_expecting_full(path, tensors.tensors, true), 0);
  EXPECT_TRUE(directory_entries(mount_point).empty());
}

// tmpfs refused O_DIRECT before Linux 6.6; either way the bytes are right and the path is said.
TEST(SaveSafetensors, DirectOnTmpfsWritesTheSameBytesAndSaysWhichPathRan) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const auto path = std::filesystem::path("/dev/shm") /
                    ("ferry-test-save-" + std::to_string(::getpid()) + ".safetensors");
  struct Remove {
    std::filesystem::path p;
    ~Remove() { std::filesystem::remove(p); }
  } remove{path};
  const auto tensors = mixed_tensors();
  const auto stats = save_safetensors(path, tensors.tensors, std::nullopt);
  EXPECT_EQ(read_all(path), serialized(tensors.tensors, std::nullopt));
  if (stats.io_path == "buffered") {
    EXPECT_NE(stats.io_reason.find("refused"), std::string::npos) << stats.io_reason;
  } else {
    EXPECT_EQ(stats.io_path, "direct");
  }
}

#endif  // _WIN32

TEST(SaveSafetensors, EmptyAndZeroDimTensorsOnly) {
  TempDir dir;
  HostTensors t;
  t.add("e", DType::F32, {0}, 1);
  t.add("s", DType::U8, {}, 2);
  t.add("z", DType::BF16, {3, 0, 2}, 3);
  const auto path = dir / "m.safetensors";
  save_safetensors(path, t.tensors, std::nullopt);
  EXPECT_EQ(read_all(path), serialized(t.tensors, std::nullopt));
  HostTensors none;
  save_safetensors(path, none.tensors, SafetensorsMetadata{});
  EXPECT_EQ(read_all(path), serialized(none.tensors, SafetensorsMetadata{}));
}

}  // namespace
}  // namespace ferry
