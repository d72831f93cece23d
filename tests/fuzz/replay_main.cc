// main() for the normal (GCC) build of a fuzz target: runs every file of the
// directories named on the command line (and every file named itself)
// through LLVMFuzzerTestOneInput once, in name order, so the default test suite replays the seed corpus and every
// regression input (README "Fuzzing").
// Exit status 1 when no input was found at all: a replay of nothing would
// pass whatever the target does. A missing directory is skipped (a target
// with no regressions yet has none).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  size_t num_inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_regular_file(arg)) {
      files.push_back(arg);
    } else if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file() && entry.path().filename().string()[0] != '.') {
          files.push_back(entry.path());
        }
      }
    } else {
      std::printf("replay: %s does not exist; skipped\n", argv[i]);
      continue;
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
      if (!in.eof() && in.fail()) {
        std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
        return 1;
      }
      // Named before the run, so that a crash shows which input caused it.
      std::printf("replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
      std::fflush(stdout);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++num_inputs;
    }
  }
  if (num_inputs == 0) {
    std::fprintf(stderr, "replay: no input files in the directories given\n");
    return 1;
  }
  std::printf("replay: %zu inputs, no crash\n", num_inputs);
  return 0;
}
