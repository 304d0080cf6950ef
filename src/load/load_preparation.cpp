#include "ferry/load_preparation.hpp"

#include <chrono>
#include <stdexcept>

#include "load/settings.hpp"

namespace ferry {

LoadPreparation::LoadPreparation(const LoadOptions& options)
    : LoadPreparation(options, nullptr) {}

LoadPreparation::LoadPreparation(const LoadOptions& options,
                                 std::shared_ptr<const Checkpoint> checkpoint) {
  const TransferOptions t = detail::staging_options(
      detail::choose_settings(options, detail::tuning_for(options)), options);
  _report = std::async(std::launch::async, [device = options.device, t, checkpoint] {
              return warm_up(device, t, checkpoint ? checkpoint->shared_file_set().get() : nullptr);
            }).share();
}

LoadPreparation::~LoadPreparation() {
  if (_report.valid()) _report.wait();
}

bool LoadPreparation::done() const {
  return _report.valid() &&
         _report.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

WarmUpReport LoadPreparation::wait() const {
  if (!_report.valid()) throw std::logic_error("load preparation: none was started");
  return _report.get();
}

}  // namespace ferry
