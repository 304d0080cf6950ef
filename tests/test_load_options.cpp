// set_load_option: the one mapping from a setting's name and text to LoadOptions.
#include <gtest/gtest.h>

#include <string>

#include "ferry/load_options.hpp"

namespace ferry {
namespace {

std::string error_of(std::string_view key, std::string_view value) {
  LoadOptions o;
  try {
    set_load_option(o, key, value);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(LoadOptions, EveryKeySetsItsField) {
  LoadOptions o;
  set_load_option(o, "device", "cuda:1");
  set_load_option(o, "io", "direct");
  set_load_option(o, "backend", "cufile");
  set_load_option(o, "allow_compat", "true");
  set_load_option(o, "staging_bytes", "64MiB");
  set_load_option(o, "chunk_bytes", "1.5MiB");
  set_load_option(o, "threads", "12");
  set_load_option(o, "slots", "3");
  set_load_option(o, "copy_streams", "2");
  set_load_option(o, "profile", "true");
  set_load_option(o, "page_cache_pin", "4GiB");
  set_load_option(o, "cache_device_memory", "true");
  EXPECT_EQ(o.device, Device::cuda(1));
  EXPECT_EQ(o.io, IoMode::Direct);
  EXPECT_EQ(o.backend, Backend::Cufile);
  EXPECT_TRUE(o.allow_compat);
  EXPECT_EQ(o.staging_bytes, 64ull << 20);
  EXPECT_EQ(o.chunk_bytes, 3ull << 19);
  EXPECT_EQ(o.reader_threads, 12u);
  EXPECT_EQ(o.slots_per_thread, 3u);
  EXPECT_EQ(o.copy_streams, 2u);
  EXPECT_TRUE(o.profile);
  EXPECT_EQ(o.page_cache_pin_bytes, 4ull << 30);
  EXPECT_TRUE(o.cache_device_memory);
  EXPECT_EQ(load_option_keys().size(), 12u);
  set_load_option(o, "page_cache_pin", "0");  // off
  EXPECT_EQ(o.page_cache_pin_bytes, 0u);
}

TEST(LoadOptions, DstorageNamesTheDirectStorageBackend) {
  LoadOptions o;
  set_load_option(o, "backend", "dstorage");
  EXPECT_EQ(o.backend, Backend::DirectStorage);
  set_load_option(o, "backend", "posix");
  set_load_option(o, "backend", "directstorage");
  EXPECT_EQ(o.backend, Backend::DirectStorage);
  EXPECT_NE(error_of("backend", "dstor").find("directstorage (dstorage)"), std::string::npos);
}

TEST(LoadOptions, SizesTakePlainBytesAndUnits) {
  LoadOptions o;
  set_load_option(o, "chunk_bytes", "4096");
  EXPECT_EQ(o.chunk_bytes, 4096u);
  set_load_option(o, "chunk_bytes", "512KiB");
  EXPECT_EQ(o.chunk_bytes, 512u << 10);
  set_load_option(o, "staging_bytes", "2GiB");
  EXPECT_EQ(o.staging_bytes, 2ull << 30);
  set_load_option(o, "chunk_bytes", "0MiB");  // 0: chosen by the engine
  EXPECT_EQ(o.chunk_bytes, 0u);
}

TEST(LoadOptions, BadValuesNameTheOptionAndTheValue) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"staging_bytes", "nan"},
           {"staging_bytes", "1e30MiB"},
           {"staging_bytes", "0"},
           {"staging_bytes", "-1MiB"},
           {"chunk_bytes", "18446744073709551615"},
           {"chunk_bytes", "infMiB"},
           {"threads", "4294967295"},
           {"threads", "-3"},
           {"threads", ""},
           {"slots", "1.5"},
           {"allow_compat", "maybe"},
           {"profile", "yes"},
           {"copy_streams", "1000"},
           {"page_cache_pin", "lots"},
           {"cache_device_memory", "maybe"},
           {"page_cache_pin", "-4GiB"},
           {"page_cache_pin", "2000000TiB"},
       }) {
    const std::string message = error_of(key, value);
    EXPECT_NE(message.find(key), std::string::npos) << key << "=" << value << ": " << message;
    EXPECT_NE(message.find("\"" + value + "\""), std::string::npos) << message;
  }
  EXPECT_NE(error_of("threads", "300").find("at most 256"), std::string::npos);
  EXPECT_NE(error_of("speed", "fast").find("unknown load option \"speed\""), std::string::npos);
  EXPECT_NE(error_of("io", "sideways").find("sideways"), std::string::npos);
  EXPECT_NE(error_of("backend", "gds").find("gds"), std::string::npos);
  EXPECT_NE(error_of("device", "tpu:0").find("tpu:0"), std::string::npos);
}

}  // namespace
}  // namespace ferry
