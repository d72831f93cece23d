#include "tests/fuzz/fuzz_check.h"

#include <filesystem>

namespace headway::fuzz {

std::string RequireModel(const std::string& file) {
  const char* dir = std::getenv("HEADWAY_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string model_dir = dir != nullptr && *dir != '\0' ? std::string(dir)
                                : std::string(home != nullptr ? home : "") + "/.cache/headway/models";
  const std::string path = model_dir + "/" + file;
  if (std::filesystem::is_regular_file(path)) return path;
  const char* require = std::getenv("HEADWAY_REQUIRE_MODEL");
  const bool required = require != nullptr && std::string(require) == "1";
  std::fprintf(stderr, "model not found at %s; run deploy/setup.sh%s\n", path.c_str(),
               required ? " (HEADWAY_REQUIRE_MODEL=1: failing)" : " (skipped)");
  std::exit(required ? 1 : 77);
}

std::string DataDir() { return HEADWAY_FUZZ_DATA_DIR; }

}  // namespace headway::fuzz
