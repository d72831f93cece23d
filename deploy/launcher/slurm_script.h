// A SLURM batch script for a deployment config (`headway-launch render
// slurm`). Pure logic: text in, text out.
//
// What is rendered into DIR:
//   config.yaml     the config with coordinator.control_address
//                   tcp://@HEADWAY_COORDINATOR_HOST@:PORT (the script puts
//                   the batch host's name there), control_bind
//                   tcp://0.0.0.0:PORT, http_host 0.0.0.0, and a
//                   model.head_pattern made absolute (the nodes read it
//                   where the config's directory has it)
//   headway.sbatch  #SBATCH --nodes = the hosts that run workers; on the
//                   batch host (node 0) the coordinator, and on every node
//                   one node agent through srun:
//                     headway-node --node-rank $SLURM_NODEID --bind-host 0.0.0.0
//                                  --advertise-host $(hostname) ...
//
// Node rank R is the R-th host that runs workers in the config's order
// (launcher::WorkerHosts): the config's host names only group ranks onto
// nodes; SLURM picks the machines. The script writes the run's config to
// DIR/run-$SLURM_JOB_ID/ (DIR must be on a filesystem every node sees) and
// ends when the coordinator or srun ends, stopping the other; scancel
// (SIGTERM) stops both.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "deploy/launcher/rendered_file.h"

namespace headway::launcher {

struct SlurmOptions {
  std::string job_name = "headway";
  std::string bin_dir;           // on the nodes: headway-coordinator, -node, -worker
  std::string model_dir;         // on the nodes: for a relative model.path
  std::string render_dir;        // absolute: where the script finds config.yaml
  std::string time_limit;        // #SBATCH --time when not empty
  std::string partition;         // #SBATCH --partition when not empty
};

// Renders config.yaml and headway.sbatch (executable) from `config_yaml`
// (the config file's text) and `config` (as LoadConfigFile loaded it).
// Errors (InvalidArgument naming the key or option): control_address not
// tcp://HOST:PORT; http_port 0; options with
// characters a shell line cannot carry verbatim (quotes, $, backquote,
// newline); config_yaml that does not parse.
// REQUIRES: ValidateConfig(config).ok().
Result<std::vector<RenderedFile>> RenderSlurm(const std::string& config_yaml,
                                              const Config& config, const SlurmOptions& options);

}  // namespace headway::launcher
