// The `ferry` subcommands. Each registers its options on the app and runs when chosen; errors
// are thrown and reported once, by main.
#pragma once

#include <CLI/CLI.hpp>

namespace ferry::cli {

void add_inspect(CLI::App& app);
void add_load(CLI::App& app);
void add_doctor(CLI::App& app);
void add_demo(CLI::App& app);
void add_kv(CLI::App& app);
void add_plan(CLI::App& app);

}  // namespace ferry::cli
