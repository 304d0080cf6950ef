// ferry inspect PATH [--json]: what a checkpoint holds, without reading tensor data.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "ferry/checkpoint.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

nlohmann::json checkpoint_json(const Checkpoint& c) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : c.files())
    files.push_back({{"path", f.path.string()}, {"size", f.size}, {"metadata", f.metadata}});
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : c.tensors())
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.size},
                       {"file", c.files()[t.file_index].path.string()},
                       {"offset", t.offset}});
  return {{"path", c.path().string()},
          {"total_bytes", c.total_bytes()},
          {"files", files},
          {"tensors", tensors}};
}

void print_text(const Checkpoint& c) {
  std::printf("checkpoint: %s\n", c.path().c_str());
  std::printf("tensors: %zu, %s in %zu file(s)\n", c.tensors().size(),
              human_bytes(c.total_bytes()).c_str(), c.files().size());
  for (const auto& f : c.files()) {
    std::printf("file: %s (%s)\n", f.path.c_str(), human_bytes(f.size).c_str());
    for (const auto& [key, value] : f.metadata)
      std::printf("  metadata: %s = %s\n", key.c_str(), value.c_str());
  }
  for (const auto& t : c.tensors())
    std::printf("%s\t%s\t%s\t%llu\n", t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                shape_text(t.shape).c_str(), static_cast<unsigned long long>(t.size));
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "List a checkpoint's tensors, dtypes, shapes, sizes, "
                                            "metadata and files");
  static std::string path;
  static bool json = false;
  cmd->add_option("path", path, "a .safetensors file, a shard directory or an index .json")
      ->required();
  cmd->add_flag("--json", json, "print JSON");
  cmd->callback([] {
    Checkpoint c = Checkpoint::open(path);
    if (json)
      std::cout << checkpoint_json(c).dump(2) << "\n";
    else
      print_text(c);
  });
}

}  // namespace ferry::cli
