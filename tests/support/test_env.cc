#include "tests/support/test_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace headway::testing {
namespace {
std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

std::string ModelDir() {
  return EnvOr("HEADWAY_MODEL_DIR", EnvOr("HOME", "/root") + "/.cache/headway/models");
}
}  // namespace

std::string TestDataPath(const std::string& relative) {
  return EnvOr("HEADWAY_TEST_DATA_DIR", SourceDir() + "/tests/data") + "/" + relative;
}

std::string BinaryPath(const std::string& name) {
  return EnvOr("HEADWAY_BIN_DIR", SourceDir() + "/build/bin") + "/" + name;
}

std::string SourceDir() { return EnvOr("HEADWAY_SOURCE_DIR", "."); }

std::string SmolLm2Path() { return ModelDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

std::string Gemma3Path() { return ModelDir() + "/gemma-3-270m-q4_k_m.gguf"; }

bool HaveModel(const std::string& path) {
  if (std::filesystem::exists(path)) return true;
  const char* require = std::getenv("HEADWAY_REQUIRE_MODEL");
  if (require && std::string(require) == "1") {
    ADD_FAILURE() << "HEADWAY_REQUIRE_MODEL=1 but the model is missing at " << path;
  }
  return false;
}

}  // namespace headway::testing
