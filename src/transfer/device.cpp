#include "ferry/device.hpp"

#include <charconv>
#include <map>
#include <memory>
#include <mutex>

#include "ferry/error.hpp"
#include "cuda/cuda_resources.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view prefix = "cuda:";
  if (text.substr(0, prefix.size()) == prefix) {
    auto digits = text.substr(prefix.size());
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && index >= 0)
      return cuda(index);
  }
  detail::fail<std::invalid_argument>("unknown device \"", text,
                                      "\": expected cpu, cuda or cuda:N");
}

std::string Device::to_string() const {
  return kind == Kind::Cpu ? "cpu" : "cuda:" + std::to_string(index);
}

bool cuda_available() { return shim::CudaDriver::get().usable; }

void prepare_device(const Device& device) {
  if (!device.is_cuda()) return;
  // Never destroyed, on purpose: releasing a context from a static destructor could call into a
  // driver that has already shut down.
  static auto* mutex = new std::mutex;
  static auto* started = new std::map<int, std::unique_ptr<detail::PrimaryContext>>;
  std::lock_guard lock(*mutex);
  auto& context = (*started)[device.index];
  if (!context) context = std::make_unique<detail::PrimaryContext>(device.index);
}

}  // namespace ferry
