#include "ferry/load_options.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <limits>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr std::array<std::string_view, 12> kKeys = {
    "device",  "io",    "backend",      "allow_compat", "staging_bytes",  "chunk_bytes",
    "threads", "slots", "copy_streams", "profile",      "page_cache_pin", "cache_device_memory"};

[[noreturn]] void bad_value(std::string_view key, std::string_view value, std::string_view why) {
  detail::fail<std::invalid_argument>("option ", key, " = \"", value, "\": ", why);
}

std::uint64_t parse_count(std::string_view key, std::string_view value, std::uint64_t most) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || ec == std::errc::invalid_argument || end != value.data() + value.size())
    bad_value(key, value, "expected a whole number");
  if (ec == std::errc::result_out_of_range || n > most)
    bad_value(key, value, "at most " + std::to_string(most) + " is allowed");
  return n;
}

// "4194304", "4MiB", "1.5 GiB", "512KiB", "0": bytes, rounded to a whole number.
std::uint64_t parse_bytes(std::string_view key, std::string_view value, std::uint64_t most) {
  constexpr std::array<std::pair<std::string_view, double>, 5> kUnits = {
      {{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
       {"B", 1.0}}};
  std::string_view number = value;
  double scale = 1;
  for (const auto& [unit, factor] : kUnits) {
    if (number.size() > unit.size() && number.substr(number.size() - unit.size()) == unit) {
      number.remove_suffix(unit.size());
      scale = factor;
      break;
    }
  }
  while (!number.empty() && number.back() == ' ') number.remove_suffix(1);
  if (scale == 1 && number.find('.') == std::string_view::npos)
    return parse_count(key, value, most);
  double n = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), n,
                                         std::chars_format::fixed);
  if (number.empty() || ec != std::errc() || end != number.data() + number.size() ||
      !std::isfinite(n) || n < 0)
    bad_value(key, value, "expected a size such as 4194304, 4MiB or 1.5GiB");
  const double bytes = std::round(n * scale);
  if (bytes > static_cast<double>(most))
    bad_value(key, value, "at most " + std::to_string(most) + " bytes is allowed");
  return static_cast<std::uint64_t>(bytes);
}

bool parse_flag(std::string_view key, std::string_view value) {
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  bad_value(key, value, "expected true or false");
}

}  // namespace

std::span<const std::string_view> load_option_keys() { return kKeys; }

void set_load_option(LoadOptions& options, std::string_view key, std::string_view value) {
  if (key == "device") {
    options.device = Device::parse(value);
  } else if (key == "io") {
    options.io = parse_io_mode(value);
  } else if (key == "backend") {
    options.backend = parse_backend(value);
  } else if (key == "allow_compat") {
    options.allow_compat = parse_flag(key, value);
  } else if (key == "staging_bytes") {
    const std::uint64_t bytes = parse_bytes(key, value, kMaxStagingBytes);
    if (bytes == 0) bad_value(key, value, "staging must hold at least one read");
    options.staging_bytes = bytes;
  } else if (key == "chunk_bytes") {
    options.chunk_bytes = parse_bytes(key, value, kMaxChunkBytes);  // 0: chosen
  } else if (key == "threads") {
    options.reader_threads = static_cast<unsigned>(parse_count(key, value, kMaxReaderThreads));
  } else if (key == "slots") {
    options.slots_per_thread = static_cast<unsigned>(parse_count(key, value, kMaxSlotsPerThread));
  } else if (key == "copy_streams") {
    options.copy_streams = static_cast<unsigned>(parse_count(key, value, kMaxReaderThreads));
  } else if (key == "profile") {
    options.profile = parse_flag(key, value);
  } else if (key == "page_cache_pin") {
    options.page_cache_pin_bytes = parse_bytes(key, value, kMaxPageCachePinBytes);  // 0: off
  } else if (key == "cache_device_memory") {
    options.cache_device_memory = parse_flag(key, value);
  } else {
    std::string known;
    for (std::string_view k : kKeys) known += (known.empty() ? "" : ", ") + std::string(k);
    detail::fail<std::invalid_argument>("unknown load option \"", key, "\": expected one of ",
                                        known);
  }
}

}  // namespace ferry
