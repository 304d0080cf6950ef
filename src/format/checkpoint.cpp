#include "ferry/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>

#include "ferry/error.hpp"
#include "ferry/gguf.hpp"
#include "ferry/safetensors.hpp"
#include "format/name_index.hpp"
#include "format/safetensors_index.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

fs::path find_index(const fs::path& dir) {
  fs::path standard = dir / "model.safetensors.index.json";
  if (fs::exists(standard)) return standard;
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && ends_with(entry.path().filename().string(), ".safetensors.index.json"))
      found.push_back(entry.path());
  FERRY_EXPECT(found.size() <= 1, FormatError, dir.string(),
               ": several *.safetensors.index.json files; name the one to load");
  return found.empty() ? fs::path() : found.front();
}

// The regular files of `dir` with this extension, sorted (split GGUF and shards sort by number).
std::vector<fs::path> files_named(const fs::path& dir, std::string_view extension) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == extension)
      found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  return found;
}

// Split GGUF files are named PREFIX-00001-of-00003.gguf (llama.cpp's gguf-split): every number
// from 1 to the count must be there, or the model would load with layers missing.
void expect_complete_splits(const std::vector<fs::path>& ggufs, const fs::path& dir) {
  static const std::regex kSplitName(R"((.*)-([0-9]{5})-of-([0-9]{5})\.gguf)");
  std::map<std::pair<std::string, unsigned>, std::set<unsigned>> numbers;  // (prefix, count)
  for (const auto& file : ggufs) {
    std::smatch m;
    const std::string name = file.filename().string();
    if (std::regex_match(name, m, kSplitName))
      numbers[{m[1].str(), static_cast<unsigned>(std::stoul(m[3].str()))}].insert(
          static_cast<unsigned>(std::stoul(m[2].str())));
  }
  for (const auto& [key, found] : numbers) {
    const auto& [prefix, count] = key;
    for (unsigned n = 1; n <= count; ++n) {
      char name[32];
      std::snprintf(name, sizeof name, "-%05u-of-%05u.gguf", n, count);
      FERRY_FORMAT_EXPECT(found.count(n) == 1, (dir / (prefix + name)).string(),
                          ": missing: split GGUF part ", n, " of ", count, " (found ",
                          found.size(), " of its parts in ", dir.string(), ")");
    }
  }
}

// Each part of a split GGUF says how many parts there are (split.count): the directory must
// hold that many GGUF files.
void expect_split_count(const std::vector<CheckpointFile>& files, const fs::path& dir) {
  for (const auto& f : files) {
    const auto it = f.metadata.find("split.count");
    if (it == f.metadata.end()) continue;
    FERRY_FORMAT_EXPECT(it->second == std::to_string(files.size()), f.path.string(),
                        ": split.count is ", it->second, " but ", dir.string(), " holds ",
                        files.size(), " GGUF files");
  }
}

CheckpointFormat detect_format(const fs::path& file) {
  return file.extension() == ".gguf" || is_gguf_file(file) ? CheckpointFormat::Gguf
                                                           : CheckpointFormat::Safetensors;
}

// GGUF metadata for a CheckpointFile: scalars as text, everything as typed JSON.
void describe_gguf(CheckpointFile& entry, GgufHeader& header) {
  entry.gguf_version = header.version;
  entry.gguf_alignment = header.alignment;
  entry.data_start = header.data_start;
  entry.has_metadata = true;
  for (const auto& kv : header.metadata)
    if (kv.value.type != GgufValueType::Array)
      entry.metadata.emplace(kv.key, gguf_value_text(kv.value));
  entry.gguf_metadata = std::move(header.metadata);
}

}  // namespace

std::shared_ptr<const Checkpoint> Checkpoint::open_shared(const std::filesystem::path& path) {
  return std::make_shared<const Checkpoint>(open(path));
}

std::string CheckpointFile::metadata_json() const {
  return format == CheckpointFormat::Gguf ? gguf_metadata_json(gguf_metadata) : std::string();
}

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint ckpt;
  ckpt._path = path;
  ckpt._file_set = FileSet::create();
  // The system calls below would see only the part before a NUL: another file.
  FERRY_EXPECT(path.native().find('\0') == std::string::npos, std::invalid_argument, "path \"",
               path.native().substr(0, path.native().find('\0')), "\\0...\" holds a NUL character");
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) detail::fail_errno(ENOENT, path.string());
  // Anything else (a FIFO, a device) could block a read forever.
  FERRY_EXPECT(fs::is_directory(status) || fs::is_regular_file(status), std::invalid_argument,
               path.string(), ": not a regular file or a directory");

  fs::path index_path;
  if (fs::is_directory(status)) {
    const std::vector<fs::path> shards = files_named(path, ".safetensors");
    const std::vector<fs::path> ggufs = files_named(path, ".gguf");
    FERRY_FORMAT_EXPECT(shards.empty() || ggufs.empty(), path.string(),
                        ": directory mixes .safetensors and .gguf files (",
                        shards.front().filename().string(), ", ", ggufs.front().filename().string(),
                        "...); name the file to load");
    index_path = ggufs.empty() ? find_index(path) : fs::path();
    if (index_path.empty()) {
      FERRY_FORMAT_EXPECT(!shards.empty() || !ggufs.empty(), path.string(),
                          ": no .safetensors files and no .gguf files in directory");
      expect_complete_splits(ggufs, path);
      for (const auto& shard : ggufs.empty() ? shards : ggufs) ckpt.add_file(shard);
      if (!ggufs.empty()) expect_split_count(ckpt.files(), path);
      ckpt.index_names();
      return ckpt;
    }
  } else if (ends_with(path.string(), ".json")) {
    index_path = path;
  } else {
    ckpt.add_file(path);
    ckpt.index_names();
    return ckpt;
  }

  const detail::SafetensorsIndex index = detail::read_safetensors_index(index_path);
  const fs::path dir = index_path.parent_path();
  for (const auto& shard : index.shards) ckpt.add_file(dir / shard);
  ckpt.index_names();

  // The index and the shards must agree exactly: a mismatch means a stale or mixed checkout.
  // Shard i of the index is file i; names are unique on both sides, so every tensor is listed
  // when each listed one is found.
  const std::string label = index_path.string();
  std::vector<bool> listed(ckpt._tensors.size());
  for (const auto& [tensor, shard] : index.shard_of_tensor) {
    const TensorInfo* info = ckpt.find(tensor);
    FERRY_FORMAT_EXPECT(info != nullptr, label, ": tensor \"", tensor, "\" is listed in \"",
                        index.shards[shard], "\" but no shard holds it");
    FERRY_FORMAT_EXPECT(info->file_index == shard, label, ": tensor \"", tensor,
                        "\" is listed in \"", index.shards[shard], "\" but is held by ",
                        ckpt._files[info->file_index].path.string());
    listed[info - ckpt._tensors.data()] = true;
  }
  for (std::size_t i = 0; i < listed.size(); ++i) {
    const TensorInfo& t = ckpt._tensors[i];
    FERRY_FORMAT_EXPECT(listed[i], label, ": ", ckpt._files[t.file_index].path.string(),
                        " holds tensor \"", t.name, "\", which the index does not list");
  }
  return ckpt;
}

void Checkpoint::add_file(const fs::path& file) {
  // Header sizes come from the file: running out of memory for one is that file's problem.
  try {
    add_file_unguarded(file);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(file.string() + ": out of memory while reading its header");
  }
}

void Checkpoint::add_file_unguarded(const fs::path& file) {
  CheckpointFile entry;
  entry.path = file;
  entry.format = detect_format(file);
  FERRY_FORMAT_EXPECT(_files.empty() || entry.format == _format, file.string(), ": a ",
                      checkpoint_format_name(entry.format), " file in a ",
                      checkpoint_format_name(_format), " checkpoint");
  _format = entry.format;
  // Opened first and kept: the identity taken here is what every later read must find.
  FileSet& set = *_file_set;
  const std::uint32_t kept = set.add(file);
  FERRY_ASSERT(kept == _files.size());
  std::vector<TensorInfo> tensors;
  if (entry.format == CheckpointFormat::Gguf) {
    GgufHeader header = read_gguf_header(file);
    describe_gguf(entry, header);
    tensors = std::move(header.tensors);
  } else {
    SafetensorsHeader header = read_safetensors_header(file);
    entry.metadata = std::move(header.metadata);
    entry.has_metadata = header.has_metadata;
    entry.data_start = header.data_start;
    tensors = std::move(header.tensors);
  }
  entry.size = set.size_at_open(kept);
  // The parser read the path: it must still be the file kept open.
  std::error_code ec;
  const auto parsed_size = fs::file_size(file, ec);
  if (ec || parsed_size != entry.size)
    detail::fail_errno(ESTALE, file.string(), ": the file changed while it was being opened");
  const auto file_index = static_cast<std::uint32_t>(_files.size());
  // Doubling, not exact: a reserve per shard would move every tensor again for each one.
  if (_tensors.capacity() < _tensors.size() + tensors.size())
    _tensors.reserve(std::max(_tensors.size() + tensors.size(), 2 * _tensors.capacity()));
  _files.push_back(std::move(entry));
  for (auto& t : tensors) {
    t.file_index = file_index;
    _total_bytes += t.size;
    _tensors.push_back(std::move(t));
  }
}

void Checkpoint::index_names() {
  auto index = std::make_shared<detail::NameIndex>();
  if (const auto repeated = index->build(_tensors)) {
    const auto& [first, second] = *repeated;
    detail::fail<FormatError>("tensor \"", _tensors[second].name, "\" appears in both ",
                              _files[_tensors[first].file_index].path.string(), " and ",
                              _files[_tensors[second].file_index].path.string());
  }
  _by_name = std::move(index);
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  if (!_by_name) return nullptr;
  const std::size_t at = _by_name->find(name, _tensors);
  return at == detail::NameIndex::npos ? nullptr : &_tensors[at];
}

}  // namespace ferry
