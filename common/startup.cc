#include "common/startup.h"

#include <utility>

#include "common/deployment_check.h"
#include "common/head_pattern.h"
#include "common/model_tensors.h"

namespace headway {

std::string DefaultModelDir(const char* headway_model_dir, const char* home) {
  if (headway_model_dir != nullptr && *headway_model_dir != '\0') return headway_model_dir;
  const std::string home_dir = home != nullptr && *home != '\0' ? home : "/root";
  return home_dir + "/.cache/headway/models";
}

Result<StartupModel> OpenAndCheckModel(const Config& config, const StartupCheckOptions& options,
                                       StartupCheck* failed) {
  auto fail = [failed](StartupCheck check, Status status) -> Result<StartupModel> {
    if (failed != nullptr) *failed = check;
    return status;
  };
  if (options.check_deployment) {
    if (Status s = CheckSupported(config); !s.ok()) return fail(StartupCheck::kSupported, s);
  }
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(config.model_path);
  if (!file.ok()) return fail(StartupCheck::kModelFile, file.status());
  Result<ModelSpec> spec = LoadModelSpec(**file);
  if (!spec.ok()) return fail(StartupCheck::kModelSpec, spec.status());
  if (Status s = CheckModelTensors(**file, *spec); !s.ok()) {
    return fail(StartupCheck::kModelSpec, s);
  }
  if (Status s = ApplyHeadPattern(config, *spec); !s.ok()) {
    return fail(StartupCheck::kHeadPattern, s);
  }
  if (options.check_deployment) {
    if (Status s = CheckConfigAgainstModel(config, *spec); !s.ok()) {
      return fail(StartupCheck::kAgainstModel, s);
    }
  }
  return StartupModel{std::move(file).value(), std::move(spec).value()};
}

}  // namespace headway
