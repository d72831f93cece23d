// What the fuzz targets share: a check that stops the run on a broken
// invariant (libFuzzer and the replay driver both report an abort as a
// crash, with the input that caused it), and where the models are.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

// Aborts with `what` when `cond` is false. For properties every input must
// keep (a parser's output obeys its contract), not for bad input.
#define FUZZ_CHECK(cond, what)                                                       \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: %s\n", __FILE__, __LINE__, \
                   #cond, std::string(what).c_str());                               \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

namespace headway::fuzz {

// Path of `file` in the model directory: HEADWAY_MODEL_DIR, else
// ~/.cache/headway/models (deploy/setup.sh puts the models there). When
// the file is missing, exits 77 (CTest's skip code for these tests) saying
// so, or 1 under HEADWAY_REQUIRE_MODEL=1 (as in CI). Call from
// LLVMFuzzerInitialize, the target's main.
std::string RequireModel(const std::string& file);

// Directory of the files the fuzz targets read (tests/fuzz/data).
std::string DataDir();

}  // namespace headway::fuzz
