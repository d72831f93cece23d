// Startup checks shared by headway-launch, headway-coordinator and
// headway-worker: where a relative model path resolves, and the checks of a
// config against this build and the model it names, made before anything
// starts (the launcher: before any process; the coordinator: before it
// binds; a worker: before it loads weights). Each binary keeps its own
// wording and exit codes: the checks say which of them failed
// (StartupCheck) and return that check's Status unchanged.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/gguf.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace headway {

// The directory a relative model.path resolves against when no --model-dir
// is given: `headway_model_dir` ($HEADWAY_MODEL_DIR) when set and not empty,
// else `home` ($HOME; "/root" when unset or empty) + "/.cache/headway/models".
// nullptr = variable unset. The caller reads the environment (in main only)
// and passes the values.
std::string DefaultModelDir(const char* headway_model_dir, const char* home);

// The checks OpenAndCheckModel runs, in this order.
enum class StartupCheck {
  kSupported,       // CheckSupported: the config needs what this build lacks
  kModelFile,       // GgufFile::Open: the model file is missing or corrupt
  kModelSpec,       // LoadModelSpec, CheckModelTensors: the file's metadata is not a
                    // model we serve, or its tensors do not match it
  kHeadPattern,     // ApplyHeadPattern: model.head_pattern does not fit
  kAgainstModel,    // CheckConfigAgainstModel: TP sizes, max_model_len
};

struct StartupCheckOptions {
  // Runs the deployment-wide checks too: kSupported (before the file is
  // opened) and kAgainstModel (every instance's TP size). The launcher and
  // the coordinator check the whole deployment; a worker, only itself.
  bool check_deployment = true;
};

// The model a config names, opened and checked.
struct StartupModel {
  std::unique_ptr<GgufFile> file;  // open; callers that need no tensors reset it
  ModelSpec spec;                  // with the config's head pattern applied
};

// Opens config.model_path (already resolved by ResolveModelPath) and runs
// the checks in StartupCheck order. Returns the model, or the first failed
// check's Status as that check returned it, and then sets `*failed` (when
// not null) to that check. Errors: those of the checks (common/gguf.h,
// common/model_spec.h, common/model_tensors.h, common/head_pattern.h,
// common/deployment_check.h).
Result<StartupModel> OpenAndCheckModel(const Config& config, const StartupCheckOptions& options,
                                       StartupCheck* failed);

}  // namespace headway
