// The YAML config loader on arbitrary text: ParseConfig (yaml-cpp, then
// every key's type and range checks, ValidateConfig), and on what it
// accepts, the derived views every process reads (the instance list and
// each rank's addresses).
#include <cstdint>
#include <string>

#include "common/config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headway;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Result<Config> config = ParseConfig(text);
  if (!config.ok()) {
    FUZZ_CHECK(config.status().code() == StatusCode::kInvalidArgument,
               config.status().ToString());
    FUZZ_CHECK(!config.status().message().empty(), "an error without a message");
    return 0;
  }
  const Status again = ValidateConfig(*config);
  FUZZ_CHECK(again.ok(), "ParseConfig accepted what ValidateConfig refuses: " + again.ToString());
  const auto instances = config->Instances();
  FUZZ_CHECK(!instances.empty(), "accepted a config without instances");
  for (size_t i = 0; i < instances.size(); ++i) {
    FUZZ_CHECK(instances[i]->tp_size >= 1, "tp_size " + std::to_string(instances[i]->tp_size));
    for (int rank = 0; rank < instances[i]->tp_size; ++rank) {
      (void)WorkerAddressesOf(*config, int(i), rank, "", "");
    }
  }
  return 0;
}
