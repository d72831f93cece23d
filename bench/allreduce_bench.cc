// All-reduce latency of the CPU TP backends ("gloo" over TCP loopback and
// "shm"), printed as one JSON object. Each rank is a separate process forked
// by this one (as TP workers are), reaching the parent's in-memory store over
// a socketpair. Per backend and count: median and p90 microseconds of one
// AllReduceSum on rank 0 (calls back to back, after --warmup untimed ones),
// the slowest rank's median, and the gloo/shm ratio of the same run.
// Decode-step tensors are [n_tokens, 576] f32 (SmolLM2-135M hidden size).
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"

namespace headway {
namespace {

struct BenchOptions {
  int ranks = 3;
  int iters = 2000;
  int warmup = 100;
  std::vector<size_t> counts = {576, 2304, 294912};
  std::vector<std::string> backends = {"gloo", "shm"};
  int timeout_ms = 60000;
};

// Latencies of one rank, one count, microseconds.
struct Latency {
  double median_us = 0;
  double p90_us = 0;
};

Latency Summarise(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 9 / 10]};
}

// One rank, in a forked child: connects, times every count, and publishes
// "<prefix>/result/<rank>" = JSON {count: [median_us, p90_us]}.
Status RunRank(const BenchOptions& opts, const std::string& backend, int rank,
               RendezvousStore& store, const std::string& prefix) {
  CommunicatorOptions options;
  options.backend = backend;
  options.rank = rank;
  options.size = opts.ranks;
  options.key_prefix = prefix;
  options.timeout = std::chrono::milliseconds(opts.timeout_ms);
  HW_ASSIGN_OR_RETURN(auto comm, CreateCommunicator(options, store));
  nlohmann::json result = nlohmann::json::object();
  for (size_t count : opts.counts) {
    std::vector<float> source(count), data(count);
    for (size_t i = 0; i < count; ++i) source[i] = float((i % 97) * 0.01 + rank);
    std::vector<double> us;
    us.reserve(opts.iters);
    HW_RETURN_IF_ERROR(comm->Barrier());
    for (int it = 0; it < opts.warmup + opts.iters; ++it) {
      // Fresh inputs each call (outside the timing) keep values finite.
      std::copy(source.begin(), source.end(), data.begin());
      const auto start = std::chrono::steady_clock::now();
      HW_RETURN_IF_ERROR(comm->AllReduceSum(data.data(), count));
      const auto end = std::chrono::steady_clock::now();
      if (it >= opts.warmup) us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
    Latency l = Summarise(std::move(us));
    result[std::to_string(count)] = {l.median_us, l.p90_us};
  }
  HW_RETURN_IF_ERROR(comm->Barrier());
  return store.Set(prefix + "/result/" + std::to_string(rank), result.dump());
}

// Forks opts.ranks children for `backend` (this process holds no other
// threads at that point), serves their store, and returns each rank's
// result JSON.
Result<std::vector<nlohmann::json>> RunBackend(const BenchOptions& opts, const std::string& backend) {
  const std::string prefix = "bench-" + backend + "-" + std::to_string(getpid());
  std::vector<int> parent_fds;
  std::vector<pid_t> children;
  for (int rank = 0; rank < opts.ranks; ++rank) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return Status::Unavailable("socketpair failed");
    pid_t pid = fork();
    if (pid < 0) return Status::Unavailable("fork failed");
    if (pid == 0) {
      for (int fd : parent_fds) close(fd);
      close(fds[0]);
      auto store = NewSocketStoreClient(fds[1]);
      Status status = RunRank(opts, backend, rank, *store, prefix);
      if (!status.ok()) std::cerr << backend << " rank " << rank << ": " << status.ToString() << "\n";
      std::cerr.flush();
      _exit(status.ok() ? 0 : 1);
    }
    close(fds[1]);
    parent_fds.push_back(fds[0]);
    children.push_back(pid);
  }
  auto store = NewInMemoryStore();
  std::vector<std::thread> servers;
  for (int fd : parent_fds) servers.emplace_back([&store, fd] { (void)ServeRendezvousStore(*store, fd); });
  bool all_ok = true;
  for (pid_t pid : children) {
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    all_ok = all_ok && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  }
  for (auto& t : servers) t.join();
  for (int fd : parent_fds) close(fd);
  if (!all_ok) return Status::Unavailable(backend + ": a rank failed (see stderr)");
  std::vector<nlohmann::json> results;
  for (int rank = 0; rank < opts.ranks; ++rank) {
    HW_ASSIGN_OR_RETURN(std::string text,
                        store->Get(prefix + "/result/" + std::to_string(rank), std::chrono::milliseconds(0)));
    results.push_back(nlohmann::json::parse(text));
  }
  return results;
}

int Main(int argc, char** argv) {
  BenchOptions opts;
  std::string counts_arg = "576,2304,294912";
  std::string backends_arg = "gloo,shm";
  CLI::App app{"All-reduce latency of the gloo and shm TP backends, one process per rank"};
  app.add_option("--ranks", opts.ranks, "TP ranks (processes)")->check(CLI::Range(1, 64));
  app.add_option("--iters", opts.iters, "timed all-reduces per count")->check(CLI::Range(1, 10000000));
  app.add_option("--warmup", opts.warmup, "untimed all-reduces per count first")->check(CLI::NonNegativeNumber);
  app.add_option("--counts", counts_arg, "comma-separated f32 counts per all-reduce");
  app.add_option("--backends", backends_arg, "comma-separated backends");
  app.add_option("--timeout-ms", opts.timeout_ms, "collective timeout")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    std::stringstream ss(s);
    for (std::string part; std::getline(ss, part, ',');) if (!part.empty()) parts.push_back(part);
    return parts;
  };
  opts.counts.clear();
  for (const auto& c : split(counts_arg)) {
    try {
      opts.counts.push_back(std::stoul(c));
    } catch (const std::exception&) {
      std::cerr << "bad --counts entry: " << c << "\n";
      return 2;
    }
  }
  opts.backends = split(backends_arg);
  // A rank that dies must not kill its peers through a write to a closed
  // socket (gloo).
  signal(SIGPIPE, SIG_IGN);

  nlohmann::json out;
  out["ranks"] = opts.ranks;
  out["iters"] = opts.iters;
  out["warmup"] = opts.warmup;
  out["host_cpus"] = std::thread::hardware_concurrency();
  out["results"] = nlohmann::json::array();
  std::map<std::string, std::map<size_t, Latency>> rank0;
  for (const auto& backend : opts.backends) {
    auto results = RunBackend(opts, backend);
    if (!results.ok()) {
      std::cerr << results.status().ToString() << "\n";
      return 1;
    }
    for (size_t count : opts.counts) {
      const std::string key = std::to_string(count);
      double slowest_median = 0;
      for (const auto& r : *results) slowest_median = std::max(slowest_median, r[key][0].get<double>());
      Latency l{(*results)[0][key][0].get<double>(), (*results)[0][key][1].get<double>()};
      rank0[backend][count] = l;
      out["results"].push_back({{"backend", backend},
                                {"count", count},
                                {"median_us", l.median_us},
                                {"p90_us", l.p90_us},
                                {"slowest_rank_median_us", slowest_median}});
    }
  }
  if (rank0.count("gloo") && rank0.count("shm")) {
    out["gloo_over_shm"] = nlohmann::json::array();
    for (size_t count : opts.counts) {
      out["gloo_over_shm"].push_back(
          {{"count", count},
           {"median", rank0["gloo"][count].median_us / rank0["shm"][count].median_us},
           {"p90", rank0["gloo"][count].p90_us / rank0["shm"][count].p90_us}});
    }
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) { return headway::Main(argc, argv); }
