#include "deploy/launcher/slurm_script.h"

#include <yaml-cpp/yaml.h>

#include "deploy/launcher/launch_plan.h"

namespace headway::launcher {
namespace {

constexpr char kCoordinatorHostMark[] = "@HEADWAY_COORDINATOR_HOST@";

// The script quotes every option in double quotes: these would end or
// expand the quoting.
Status CheckShellSafe(const std::string& option, const std::string& value) {
  if (value.find_first_of("\"$`\\\n") == std::string::npos) return Status::Ok();
  return Status::InvalidArgument(option + " = \"" + value +
                                 "\": must not contain a quote, $, a backquote, a backslash or a "
                                 "newline (the batch script carries it verbatim)");
}

Result<std::string> RunConfig(const std::string& config_yaml, const Config& config, int port) {
  HW_ASSIGN_OR_RETURN(
      YAML::Node root,
      ConfigServingEverywhere(
          config_yaml, std::string("tcp://") + kCoordinatorHostMark + ":" + std::to_string(port),
          port));
  if (!config.head_pattern_path.empty()) root["model"]["head_pattern"] = config.head_pattern_path;
  YAML::Emitter out;
  out << root;
  return "# Rendered by headway-launch render slurm: headway.sbatch puts the batch host's\n"
         "# name in control_address and copies this file to run-$SLURM_JOB_ID/.\n" +
         std::string(out.c_str()) + "\n";
}

std::string Script(const SlurmOptions& o, int num_nodes, int http_port) {
  std::string s = "#!/bin/bash\n";
  s += "# Rendered by headway-launch render slurm. One node agent per node (node rank =\n"
       "# $SLURM_NODEID), the coordinator on the batch host (node 0). Submit with\n"
       "# `sbatch headway.sbatch`; `scancel` stops every process.\n";
  s += "#SBATCH --job-name=" + o.job_name + "\n";
  s += "#SBATCH --nodes=" + std::to_string(num_nodes) + "\n";
  s += "#SBATCH --ntasks-per-node=1\n";
  if (!o.time_limit.empty()) s += "#SBATCH --time=" + o.time_limit + "\n";
  if (!o.partition.empty()) s += "#SBATCH --partition=" + o.partition + "\n";
  s += "set -euo pipefail\n\n";
  s += "bin_dir=\"" + o.bin_dir + "\"\n";
  s += "model_dir=\"" + o.model_dir + "\"\n";
  s += "render_dir=\"" + o.render_dir + "\"\n";
  s += "run_dir=\"$render_dir/run-${SLURM_JOB_ID:?not inside a SLURM job}\"\n";
  s += "mkdir -p \"$run_dir\"\n";
  s += "coordinator_host=\"$(hostname)\"\n";
  s += std::string("sed \"s|") + kCoordinatorHostMark +
       "|$coordinator_host|g\" \"$render_dir/config.yaml\" > \"$run_dir/config.yaml\"\n\n";
  s += "\"$bin_dir/headway-coordinator\" --config \"$run_dir/config.yaml\" "
       "--model-dir \"$model_dir\" &\n";
  s += "coordinator=$!\n";
  s += "# Each agent binds every interface and gives peers its node's name.\n";
  s += "srun --nodes=" + std::to_string(num_nodes) +
       " --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \\\n"
       "  'exec \"$0\" --config \"$1\" --model-dir \"$2\" --node-rank \"$SLURM_NODEID\" "
       "--bind-host 0.0.0.0 --advertise-host \"$(hostname)\"' \\\n"
       "  \"$bin_dir/headway-node\" \"$run_dir/config.yaml\" \"$model_dir\" &\n";
  s += "agents=$!\n";
  s += "stop() { kill -TERM \"$coordinator\" \"$agents\" 2>/dev/null || true; }\n";
  s += "trap 'stop; wait; exit 0' TERM INT\n";
  s += "echo \"headway: serving on http://$coordinator_host:" + std::to_string(http_port) +
       " once /ready answers 200\"\n";
  s += "status=0\n";
  s += "wait -n \"$coordinator\" \"$agents\" || status=$?\n";
  s += "echo \"headway: the coordinator or the node agents ended (status $status); stopping\" >&2\n";
  s += "stop\n";
  s += "wait || true\n";
  s += "exit \"$status\"\n";
  return s;
}

}  // namespace

Result<std::vector<RenderedFile>> RenderSlurm(const std::string& config_yaml,
                                              const Config& config, const SlurmOptions& options) {
  HW_RETURN_IF_ERROR(CheckShellSafe("--job-name", options.job_name));
  HW_RETURN_IF_ERROR(CheckShellSafe("--bin-dir", options.bin_dir));
  HW_RETURN_IF_ERROR(CheckShellSafe("--model-dir", options.model_dir));
  HW_RETURN_IF_ERROR(CheckShellSafe("-o", options.render_dir));
  HW_RETURN_IF_ERROR(CheckShellSafe("--time", options.time_limit));
  HW_RETURN_IF_ERROR(CheckShellSafe("--partition", options.partition));
  HW_ASSIGN_OR_RETURN(const int port,
                      ControlPortOf(config.control_address,
                                    "the nodes of a SLURM job reach the coordinator over TCP"));
  if (config.http_port == 0) {
    return Status::InvalidArgument(
        "`coordinator.http_port` = 0: clients need a fixed port to reach the batch host");
  }
  LaunchOptions launch;
  launch.config_path = "config.yaml";
  const int num_nodes = int(WorkerHosts(PlanLaunch(config, launch)).size());
  HW_ASSIGN_OR_RETURN(std::string run_config, RunConfig(config_yaml, config, port));
  std::vector<RenderedFile> files;
  files.push_back({"config.yaml", std::move(run_config), false});
  files.push_back({"headway.sbatch", Script(options, num_nodes, config.http_port), true});
  return files;
}

}  // namespace headway::launcher
