#include "ferry/checkpoint.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ferry/error.hpp"
#include "ferry/gguf.hpp"
#include "ferry/safetensors.hpp"
#include "format/strict_json.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

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

// An index nests three levels deep (root, weight_map or metadata, value).
constexpr int kMaxIndexDepth = 8;

struct IndexFile {
  std::vector<std::string> shards;                      // in first-mention order
  std::map<std::string, std::string> shard_of_tensor;  // tensor -> shard file name
};

IndexFile read_index(const fs::path& index_path) {
  const std::string label = index_path.string();
  std::ifstream in(index_path, std::ios::binary);
  if (!in) detail::fail_errno(errno, label);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json root = detail::parse_strict_json(text, label, kMaxIndexDepth);
  FERRY_FORMAT_EXPECT(root.is_object() && root.contains("weight_map") &&
                          root["weight_map"].is_object(),
                      label, ": no \"weight_map\" object");
  IndexFile index;
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    FERRY_FORMAT_EXPECT(shard.is_string(), label, ": weight_map entry \"", tensor,
                        "\" is not a file name");
    const fs::path raw(shard.get<std::string>());
    // Shards must sit beside the index: no absolute paths, no ".." anywhere (a symlinked
    // directory makes "sub/.." lead elsewhere). Normalised, "./a" and "a" name one shard.
    FERRY_FORMAT_EXPECT(!raw.empty() && raw.is_relative() &&
                            std::none_of(raw.begin(), raw.end(), [](const fs::path& part) {
                              return part == "..";
                            }),
                        label, ": weight_map entry \"", tensor, "\" names \"", raw.string(),
                        "\", which is not a file beside the index");
    const std::string name = raw.lexically_normal().string();
    if (std::find(index.shards.begin(), index.shards.end(), name) == index.shards.end())
      index.shards.push_back(name);
    index.shard_of_tensor[tensor] = name;
  }
  FERRY_FORMAT_EXPECT(!index.shards.empty(), label, ": weight_map is empty");
  return index;
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

CheckpointFormat detect_format(const fs::path& file) {
  return file.extension() == ".gguf" || is_gguf_file(file) ? CheckpointFormat::Gguf
                                                           : CheckpointFormat::Safetensors;
}

// GGUF metadata for a CheckpointFile: scalars as text, everything as typed JSON.
void describe_gguf(CheckpointFile& entry, const GgufHeader& header) {
  entry.gguf_version = header.version;
  entry.gguf_alignment = header.alignment;
  entry.data_start = header.data_start;
  entry.metadata_json = gguf_metadata_json(header.metadata);
  entry.has_metadata = true;
  for (const auto& kv : header.metadata)
    if (kv.value.type != GgufValueType::Array)
      entry.metadata.emplace(kv.key, gguf_value_text(kv.value));
}

}  // namespace

std::shared_ptr<const Checkpoint> Checkpoint::open_shared(const std::filesystem::path& path) {
  return std::make_shared<const Checkpoint>(open(path));
}

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint ckpt;
  ckpt._path = path;
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
      for (const auto& shard : ggufs.empty() ? shards : ggufs) ckpt.add_file(shard);
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

  IndexFile index = read_index(index_path);
  const fs::path dir = index_path.parent_path();
  for (const auto& shard : index.shards) ckpt.add_file(dir / shard);
  ckpt.index_names();

  // The index and the shards must agree exactly: a mismatch means a stale or mixed checkout.
  const std::string label = index_path.string();
  for (const auto& [tensor, shard] : index.shard_of_tensor) {
    const TensorInfo* info = ckpt.find(tensor);
    FERRY_FORMAT_EXPECT(info != nullptr, label, ": tensor \"", tensor, "\" is listed in \"",
                        shard, "\" but no shard holds it");
    const auto& held_by = ckpt._files[info->file_index].path;
    FERRY_FORMAT_EXPECT(held_by == dir / shard, label, ": tensor \"",
                        tensor, "\" is listed in \"", shard, "\" but is held by ",
                        held_by.string());
  }
  for (const auto& t : ckpt._tensors)
    FERRY_FORMAT_EXPECT(index.shard_of_tensor.count(t.name) == 1, label, ": ",
                        ckpt._files[t.file_index].path.string(), " holds tensor \"", t.name,
                        "\", which the index does not list");
  return ckpt;
}

void Checkpoint::add_file(const fs::path& file) {
  CheckpointFile entry;
  entry.path = file;
  entry.format = detect_format(file);
  FERRY_FORMAT_EXPECT(_files.empty() || entry.format == _format, file.string(), ": a ",
                      checkpoint_format_name(entry.format), " file in a ",
                      checkpoint_format_name(_format), " checkpoint");
  _format = entry.format;
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
  entry.size = fs::file_size(file);
  const auto file_index = static_cast<std::uint32_t>(_files.size());
  _files.push_back(std::move(entry));
  for (auto& t : tensors) {
    t.file_index = file_index;
    _total_bytes += t.size;
    _tensors.push_back(std::move(t));
  }
}

void Checkpoint::index_names() {
  _by_name.clear();
  for (std::size_t i = 0; i < _tensors.size(); ++i) {
    auto [it, inserted] = _by_name.emplace(_tensors[i].name, i);
    FERRY_FORMAT_EXPECT(inserted, "tensor \"", _tensors[i].name, "\" appears in both ",
                        _files[_tensors[it->second].file_index].path.string(), " and ",
                        _files[_tensors[i].file_index].path.string());
  }
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = _by_name.find(std::string(name));
  return it == _by_name.end() ? nullptr : &_tensors[it->second];
}

}  // namespace ferry
