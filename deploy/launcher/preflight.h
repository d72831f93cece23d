// What every host must agree on before a multi-host deployment starts: the
// Headway build, the config file and the model file. `headway-node
// --preflight` reports them on each host; headway-launch compares each
// report with its own (deploy/launcher/main.cc) and refuses to start on any
// difference, naming the host.
//
// Report format: one `key=value` line each, in any order, unknown keys
// ignored (a newer agent may say more):
//   version=git-1a2b3c4d5e6f             HeadwayVersion() of the reporting binary
//   config_hash=xxh64:0123456789abcdef   XXH64 of the config file's bytes, then
//                                        the head-pattern file's when it names one
//   model_path=/abs/path.gguf            the model file as that host resolves it
//   model_bytes=98362432                 its size; absent when model_error is set
//   model_checksum=xxh64:...             XXH64 of its bytes; absent likewise
//   model_error=not found                why the model could not be read
//   key_error=security.client_key = /k: ...   a key file the host's workers
//                                        would not read (see CheckWorkerKeyFiles);
//                                        one line each, absent when all are fine
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/security_config.h"
#include "common/status.h"

namespace headway::launcher {

// The version of this build: "git-" and the commit the build was configured
// at ("unknown" outside a git checkout). A rebuild after a commit changes it
// only once CMake reconfigures; uncommitted changes do not change it.
const char* HeadwayVersion();

struct PreflightReport {
  std::string version;
  std::string config_hash;
  std::string model_path;
  int64_t model_bytes = -1;      // -1 when model_error is set
  std::string model_checksum;
  std::string model_error;       // "" when the model file was read
  std::vector<std::string> key_errors;  // CheckWorkerKeyFiles's problems
};

// This host's report for the config file at `config_path`, the head-pattern
// file it names (`head_pattern_path`, "" = none) and the model file at
// `model_path` (already resolved against the model directory). Hashes the
// files in full (about 30 ms per 100 MB from the page cache). A model file
// that cannot be read is reported in model_error, not as an error.
// Errors: NotFound (naming the file) when the config or head-pattern file
// cannot be read.
Result<PreflightReport> LocalPreflight(const std::string& config_path,
                                       const std::string& head_pattern_path,
                                       const std::string& model_path);

// What keeps this host's workers from reading the control-plane key files
// `security` names (its coordinator_public_key and client_key; a host
// running only workers needs no other), one sentence each naming the config
// key and the path: a file that does not exist, is not a regular file or
// that this user cannot read, and a secret key (client_key) that every user
// may read. Empty when the config has no keys or all are fine. Reads
// nothing but the files' metadata and whether they open.
std::vector<std::string> CheckWorkerKeyFiles(const SecurityConfig& security);

// The report as key=value lines (the format above), ending in a newline.
std::string FormatPreflight(const PreflightReport& report);

// Reads a report from an agent's output; lines that are not key=value (log
// lines) are skipped. Errors: InvalidArgument naming the first missing key
// when `version`, `config_hash` or `model_path` is absent, or when neither
// the model's size and checksum nor model_error are given.
Result<PreflightReport> ParsePreflight(const std::string& text);

// What differs between this machine's report and a remote host's, each as a
// sentence that says what to fix there; empty when they agree. The model
// paths may differ (each host resolves its own model directory); size and
// checksum may not. Every key_errors entry of `remote` is a problem.
std::vector<std::string> PreflightProblems(const PreflightReport& local,
                                           const PreflightReport& remote);

}  // namespace headway::launcher
