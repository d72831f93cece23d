#include "tests/support/control_keys.h"

#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway::testing {

std::string ControlPlaneKeysYaml(const std::string& dir, std::string* error) {
  const std::string keys = dir + "/keys";
  std::error_code ec;
  std::filesystem::create_directories(keys + "/authorized", ec);
  if (ec) {
    *error = "cannot make " + keys + "/authorized: " + ec.message();
    return "";
  }
  for (const char* name : {"coordinator", "worker"}) {
    // Made once per directory: several configs of one test share them.
    if (std::filesystem::exists(keys + "/" + name + ".key_secret")) continue;
    ChildProcess keygen({BinaryPath("headway-keygen"), keys + "/" + name + ".key"},
                        keys + "/keygen.log");
    const int status = keygen.WaitExit(std::chrono::seconds(10));
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      *error = "headway-keygen failed: " + keygen.Log();
      return "";
    }
  }
  std::filesystem::copy_file(keys + "/worker.key", keys + "/authorized/worker.key",
                             std::filesystem::copy_options::skip_existing, ec);
  if (ec) {
    *error = "cannot copy the worker's public key: " + ec.message();
    return "";
  }
  return "security:\n"
         "  coordinator_key: " + keys + "/coordinator.key_secret\n"
         "  coordinator_public_key: " + keys + "/coordinator.key\n"
         "  client_key: " + keys + "/worker.key_secret\n"
         "  authorized_keys: " + keys + "/authorized\n";
}

}  // namespace headway::testing
