// Where tests find things. CTest sets HEADWAY_TEST_DATA_DIR, HEADWAY_BIN_DIR
// and HEADWAY_SOURCE_DIR (tests/CMakeLists.txt); the model lives in
// HEADWAY_MODEL_DIR (default ~/.cache/headway/models), put there by
// deploy/setup.sh.
#pragma once

#include <string>

namespace headway::testing {

// tests/data/<relative>.
std::string TestDataPath(const std::string& relative);

// build/bin/<name>.
std::string BinaryPath(const std::string& name);

// Repository root.
std::string SourceDir();

// Absolute path of the SmolLM2-135M-Instruct Q4_1 GGUF.
std::string SmolLm2Path();

// Absolute path of the Gemma 3 270M (base) Q4_K_M GGUF.
std::string Gemma3Path();

// True if the model file exists. When it does not and HEADWAY_REQUIRE_MODEL=1
// (as in CI), the calling test fails instead of skipping.
bool HaveModel(const std::string& path);

}  // namespace headway::testing

// In a TEST body: skip (or fail under HEADWAY_REQUIRE_MODEL=1) without the model.
#define HW_REQUIRE_MODEL(path)                                                   \
  do {                                                                           \
    if (!::headway::testing::HaveModel(path)) {                                  \
      GTEST_SKIP() << "model not found at " << (path)                            \
                   << "; run deploy/setup.sh";                                   \
    }                                                                            \
  } while (0)
