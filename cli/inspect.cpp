// ferry inspect PATH [--json]: what a checkpoint holds, without reading tensor data.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/utf8_path.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

bool is_gguf(const Checkpoint& c) { return c.format() == CheckpointFormat::Gguf; }

nlohmann::json file_json(const CheckpointFile& f) {
  nlohmann::json out = {{"path", f.path.string()},
                        {"size", f.size},
                        {"format", checkpoint_format_name(f.format)},
                        {"data_start", f.data_start},
                        {"metadata", f.metadata}};
  if (f.format == CheckpointFormat::Gguf) {
    out["gguf_version"] = f.gguf_version;
    out["alignment"] = f.gguf_alignment;
    out["gguf_metadata"] = nlohmann::json::parse(f.metadata_json());
  }
  return out;
}

nlohmann::json checkpoint_json(const Checkpoint& c) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : c.files()) files.push_back(file_json(f));
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : c.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.size},
                       {"file", c.files()[t.file_index].path.string()},
                       {"offset", t.offset}});
    if (t.ggml_type >= 0) {
      tensors.back()["ggml_type"] = ggml_type_name(t.ggml_type);
      tensors.back()["ggml_type_id"] = t.ggml_type;
      tensors.back()["ggml_dims"] = t.ggml_dims;
    }
  }
  return {{"path", c.path().string()},
          {"format", checkpoint_format_name(c.format())},
          {"total_bytes", c.total_bytes()},
          {"files", files},
          {"tensors", tensors}};
}

// One line of a metadata value for people: escaped for a terminal, long text cut (never inside
// a UTF-8 sequence).
std::string one_line(const std::string& text) {
  constexpr std::size_t kMaxShown = 100;
  if (text.size() <= kMaxShown) return printable(text);
  std::size_t cut = kMaxShown;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return printable(std::string_view(text).substr(0, cut)) + "... (" + std::to_string(text.size()) +
         " bytes)";
}

// GGUF metadata, typed; arrays summarized (--json gives them in full).
void print_gguf_metadata(const CheckpointFile& f) {
  std::printf("  gguf: version %u, alignment %llu, tensor data at byte %llu\n", f.gguf_version,
              static_cast<unsigned long long>(f.gguf_alignment),
              static_cast<unsigned long long>(f.data_start));
  const auto metadata = nlohmann::ordered_json::parse(f.metadata_json());  // file order
  for (const auto& [key, item] : metadata.items()) {
    const std::string type = item["type"].get<std::string>();
    std::string value;
    if (type == "ARRAY")
      value = "[" + std::to_string(item["value"].size()) + " items of " +
              item["element_type"].get<std::string>() + "]";
    else if (item["value"].is_string())
      value = one_line(item["value"].get<std::string>());
    else
      value = item["value"].dump();
    std::printf("  metadata: %s (%s) = %s\n", one_line(key).c_str(), type.c_str(), value.c_str());
  }
}

void print_text(const Checkpoint& c) {
  std::printf("checkpoint: %s\n", printable(c.path().string()).c_str());
  if (is_gguf(c)) std::printf("format: gguf\n");
  std::printf("tensors: %zu, %s in %zu file(s)\n", c.tensors().size(),
              human_bytes(c.total_bytes()).c_str(), c.files().size());
  for (const auto& f : c.files()) {
    std::printf("file: %s (%s)\n", printable(f.path.string()).c_str(), human_bytes(f.size).c_str());
    if (f.format == CheckpointFormat::Gguf) {
      print_gguf_metadata(f);
      continue;
    }
    for (const auto& [key, value] : f.metadata)
      std::printf("  metadata: %s = %s\n", printable(key).c_str(), printable(value).c_str());
  }
  // GGUF rows: name, ggml type, dims as GGUF states them (ne[0] first), bytes, absolute offset.
  for (const auto& t : c.tensors()) {
    if (t.ggml_type >= 0)
      std::printf("%s\t%s\t%s\t%llu\t%llu\n", printable(t.name).c_str(),
                  std::string(ggml_type_name(t.ggml_type)).c_str(), shape_text(t.ggml_dims).c_str(),
                  static_cast<unsigned long long>(t.size),
                  static_cast<unsigned long long>(t.offset));
    else
      std::printf("%s\t%s\t%s\t%llu\n", printable(t.name).c_str(),
                  std::string(dtype_name(t.dtype)).c_str(), shape_text(t.shape).c_str(),
                  static_cast<unsigned long long>(t.size));
  }
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect",
                                 "List a checkpoint's tensors, dtypes, shapes, sizes, "
                                 "metadata and files");
  static std::string path;
  static bool json = false;
  cmd->add_option("path", path,
                  "a .safetensors or .gguf file, a directory of either, or an index .json")
      ->required();
  cmd->add_flag("--json", json, "print JSON");
  cmd->callback([] {
    Checkpoint c = Checkpoint::open(path_from_utf8(path));
    if (json)
      // GGUF names and strings are UTF-8 by the spec but unchecked: bad bytes print as U+FFFD.
      std::cout << checkpoint_json(c).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    else
      print_text(c);
  });
}

}  // namespace ferry::cli
