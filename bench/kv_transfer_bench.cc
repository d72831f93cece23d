// KV block transfer bandwidth (KvTransferAgent::WriteBlocks) between two
// processes on this host, next to UCX's own ucx_perftest (ucp_put_bw) with
// the same transports and message size, printed as one JSON object.
//
// Per transport set (UCX_TLS syntax): this process forks a receiver (maps
// its pool, publishes KvPeerInfo over a pipe, checks the bytes at the end)
// and a sender (the same info by fork), so neither shares UCX state with the
// parent. The sender writes all --blocks blocks (ids 0..n-1 -> 0..n-1) in
// one WriteBlocks call, --runs times after one warm-up, twice: with runs
// coalesced into messages of up to 256 KiB ("coalesced") and with one
// message per block ("per_block", the same message size as ucx_perftest -s
// block_bytes).
// GB/s = blocks * block_bytes / 1e9 / median seconds of one call.
//
// ucx_perftest runs twice: -s block_bytes (the per_block message size; its
// 8 KiB buffer stays in cache and, with shared memory, lives in a UCX-made
// shm segment that the peer maps directly) and -s blocks*block_bytes (the
// coalesced size).
//
// ucx_perftest prints "bandwidth (MB/s)" where MB = 2^20 bytes (UCX's
// UCS_MBYTE); the JSON gives its raw overall MiB/s and the same in GB/s.
// Default block: SmolLM2-135M, 16 positions x 64 head_dim x (K, V) x f32.
//
// --veth: every process of a measurement runs in one of two network
// namespaces joined by a veth pair (bench/veth_link.h): the receiver and
// ucx_perftest's server in a, the sender and the client in b, UCX on the
// veth device only (KvTransferOptions::net_devices, UCX_NET_DEVICES), so
// TCP crosses a real link as between hosts (transports default to tcp).
// --tcp-seg-size and --mtu repeat every measurement per value (UCX's TCP
// segment size: KvTransferOptions::tcp_seg_size for the agents,
// UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE for ucx_perftest; the veth
// MTU), so UCX's defaults and a tuning compare in one run.
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comm/fd_io.h"
#include "comm/kv_transfer.h"
#include "bench/veth_link.h"

namespace headway {
namespace {

struct BenchOptions {
  std::vector<std::string> transports = {"tcp", "sm"};
  uint64_t block_bytes = 8192;
  uint32_t blocks = 4096;
  int runs = 7;
  int perftest_iters = 20000;
  int perftest_whole_iters = 20;
  // ucx_perftest tests to run beside WriteBlocks; ucp_am_bw sends active
  // messages as WriteBlocks does (ucp_put_bw is emulated over tcp in UCX 1.13).
  std::vector<std::string> perftest_tests = {"ucp_put_bw"};
  int timeout_ms = 60000;
};

// Where and with what UCX settings one measurement runs.
struct Setting {
  std::string tls;
  std::string tcp_seg_size;  // "" = UCX's; agents: KvTransferOptions, ucx_perftest: UCX_TCP_*
  const bench::VethLink* link = nullptr;  // null: this namespace, 127.0.0.1
};

// First thing in a forked agent child: joins its side of the link, if any,
// and returns the setting's agent options. Exits with
// a message on stderr when the namespace cannot be entered.
KvTransferOptions EnterSide(const Setting& setting, int side) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);  // the parent cleans up
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // a parent stopped by a signal leaves no child
  KvTransferOptions options;
  options.transports = setting.tls;
  if (setting.link != nullptr) {
    const std::string err = setting.link->Enter(side);
    if (!err.empty()) {
      std::cerr << "kv-transfer-bench: " << err << "\n";
      _exit(4);
    }
    options.net_devices = setting.link->device(side);
  }
  options.tcp_seg_size = setting.tcp_seg_size;
  return options;
}

uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>(i * 7 + i / 4099); }

// Receiver child: publishes, waits for the parent's "done", then answers
// whether its pool holds the sender's pattern.
[[noreturn]] void RunReceiver(const BenchOptions& opts, const Setting& setting, int up,
                              int down) {
  KvTransferOptions options = EnterSide(setting, 0);
  std::vector<uint8_t> pool(opts.block_bytes * opts.blocks, 0);
  auto agent = KvTransferAgent::Create(pool.data(), opts.block_bytes, opts.blocks, options);
  if (!agent.ok()) {
    std::cerr << "receiver: " << agent.status().ToString() << "\n";
    _exit(2);
  }
  if (!SendPeerInfo(up, (*agent)->local_info(), (*agent)->write_key())) _exit(3);
  char done = 0;
  ReadAll(down, &done, 1);
  char good = 1;
  for (uint64_t i = 0; i < pool.size(); ++i) {
    if (pool[i] != PatternByte(i)) {
      good = 0;
      break;
    }
  }
  WriteAll(up, &good, 1);
  agent->reset();
  _exit(0);
}

// Sender child: times WriteBlocks, writes "<coalesced_s> <per_block_s>\n"
// (median seconds) or "error <message>\n" to `up`. Each run writes under a
// grant of its own made with the receiver's `write_key` (as the coordinator
// grants each transfer), outside the timed part.
[[noreturn]] void RunSender(const BenchOptions& opts, const Setting& setting,
                            const KvPeerInfo& peer_info, const std::string& write_key, int up) {
  const KvTransferOptions base = EnterSide(setting, 1);
  std::vector<uint8_t> pool(opts.block_bytes * opts.blocks);
  for (uint64_t i = 0; i < pool.size(); ++i) pool[i] = PatternByte(i);
  std::vector<BlockCopy> copies(opts.blocks);
  for (uint32_t b = 0; b < opts.blocks; ++b) copies[b] = {b, b};
  std::vector<uint32_t> dst_blocks(opts.blocks);
  for (uint32_t b = 0; b < opts.blocks; ++b) dst_blocks[b] = b;
  uint64_t transfer_id = 0;
  std::ostringstream out;
  for (bool coalesce : {true, false}) {
    KvTransferOptions options = base;
    options.coalesce_runs = coalesce;
    auto agent = KvTransferAgent::Create(pool.data(), opts.block_bytes, opts.blocks, options);
    if (!agent.ok()) {
      out.str("error " + agent.status().ToString());
      break;
    }
    auto peer = (*agent)->Connect(peer_info);
    if (!peer.ok()) {
      out.str("error " + peer.status().ToString());
      break;
    }
    std::vector<double> seconds;
    Status failure = Status::Ok();
    for (int run = 0; run <= opts.runs && failure.ok(); ++run) {
      Result<KvWriteGrant> grant =
          GrantKvWrites(write_key, ++transfer_id, uint32_t(opts.timeout_ms) + 1000, dst_blocks);
      if (!grant.ok()) {
        failure = grant.status();
        break;
      }
      auto start = std::chrono::steady_clock::now();
      failure = (*agent)->WriteBlocks(*peer, copies, *grant,
                                      std::chrono::milliseconds(opts.timeout_ms));
      std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (run > 0) seconds.push_back(took.count());  // run 0 warms up
    }
    if (!failure.ok()) {
      out.str("error " + failure.ToString());
      break;
    }
    std::sort(seconds.begin(), seconds.end());
    out << seconds[seconds.size() / 2] << " ";
  }
  std::string line = out.str() + "\n";
  WriteAll(up, line.data(), line.size());
  _exit(0);
}

// One transport set: {"coalesced_gbps", "per_block_gbps", "verified"} or
// {"error"}.
nlohmann::json MeasureAgent(const BenchOptions& opts, const Setting& setting) {
  int r_up[2], r_down[2], s_up[2];
  if (pipe(r_up) != 0 || pipe(r_down) != 0 || pipe(s_up) != 0) return {{"error", "pipe"}};
  pid_t receiver = fork();
  if (receiver == 0) {
    close(r_up[0]);
    close(r_down[1]);
    dup2(STDERR_FILENO, STDOUT_FILENO);  // UCX logs to stdout: keep it for the JSON
    RunReceiver(opts, setting, r_up[1], r_down[0]);
  }
  close(r_up[1]);
  close(r_down[0]);
  nlohmann::json result;
  KvPeerInfo info;
  std::string write_key;
  if (!ReceivePeerInfo(r_up[0], &info, &write_key)) {
    result["error"] = "receiver did not start";
  } else {
    pid_t sender = fork();
    if (sender == 0) {
      close(s_up[0]);
      dup2(STDERR_FILENO, STDOUT_FILENO);  // UCX logs to stdout: keep it for the JSON
      RunSender(opts, setting, info, write_key, s_up[1]);
    }
    close(s_up[1]);
    std::string line;
    char c;
    while (read(s_up[0], &c, 1) == 1 && c != '\n') line += c;
    waitpid(sender, nullptr, 0);
    std::istringstream in(line);
    double coalesced_s = 0, per_block_s = 0;
    const double bytes = static_cast<double>(opts.block_bytes) * opts.blocks;
    if (line.rfind("error", 0) == 0 || !(in >> coalesced_s >> per_block_s)) {
      result["error"] = line.empty() ? "sender died" : line;
    } else {
      result["coalesced_gbps"] = bytes / 1e9 / coalesced_s;
      result["per_block_gbps"] = bytes / 1e9 / per_block_s;
      result["coalesced_ms"] = coalesced_s * 1e3;
      result["per_block_ms"] = per_block_s * 1e3;
    }
  }
  char done = 1, good = 0;
  WriteAll(r_down[1], &done, 1);
  result["verified"] = ReadAll(r_up[0], &good, 1) && good == 1;
  waitpid(receiver, nullptr, 0);
  close(r_up[0]);
  close(r_down[1]);
  close(s_up[0]);
  return result;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool OnPath(const std::string& program) {
  return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

// `ucx_perftest` + args with the setting's UCX variables, in `side`'s
// namespace of the link if there is one (restricted to its veth end).
std::string PerftestCommand(const Setting& setting, int side, const std::string& args) {
  std::string cmd = "env UCX_TLS='" + setting.tls + "' ";
  if (!setting.tcp_seg_size.empty()) {
    cmd += "UCX_TCP_TX_SEG_SIZE=" + setting.tcp_seg_size +
           " UCX_TCP_RX_SEG_SIZE=" + setting.tcp_seg_size + " ";
  }
  if (setting.link == nullptr) return cmd + "ucx_perftest" + args;
  return setting.link->ExecPrefix(side) + cmd +
         "UCX_NET_DEVICES=" + setting.link->device(side) + " ucx_perftest" + args;
}

// ucx_perftest -t ucp_put_bw as a server + client pair (on 127.0.0.1, or
// server in namespace a and client in b):
// {"overall_mib_per_s", "gbps"} from the client's "Final:" row, or {"error"}.
nlohmann::json MeasurePerftest(const Setting& setting, const std::string& test,
                               uint64_t message_bytes, int iters) {
  if (!OnPath("ucx_perftest")) return {{"error", "ucx_perftest not on PATH"}};
  const int port = FreePort();
  const std::string args = " -t " + test + " -s " + std::to_string(message_bytes) + " -n " +
                           std::to_string(iters) + " -p " + std::to_string(port);
  pid_t server = fork();
  if (server == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::string cmd = "exec " + PerftestCommand(setting, 0, args) + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  nlohmann::json result;
  const std::string host = setting.link == nullptr ? "127.0.0.1" : setting.link->address(0);
  const std::string client = PerftestCommand(setting, 1, args) + " " + host + " 2>&1";
  std::string final_row;
  // The server may not listen yet: retry the client a few times.
  for (int attempt = 0; attempt < 20 && final_row.empty(); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    FILE* pipe = popen(client.c_str(), "r");
    if (pipe == nullptr) break;
    char buf[1024];
    while (fgets(buf, sizeof buf, pipe) != nullptr) {
      if (std::strncmp(buf, "Final:", 6) == 0) final_row = buf;
    }
    pclose(pipe);
  }
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  // Final: iterations, overhead p50/avg/overall (us), bandwidth avg/overall
  // (MiB/s), message rate avg/overall (msg/s).
  std::istringstream in(final_row);
  std::string label;
  double row_iters, p50_us, avg_us, overall_us, bw_avg, bw_overall;
  if (final_row.empty() ||
      !(in >> label >> row_iters >> p50_us >> avg_us >> overall_us >> bw_avg >> bw_overall)) {
    return {{"error", "no Final row from ucx_perftest client"}};
  }
  result["overall_mib_per_s"] = bw_overall;
  result["gbps"] = bw_overall * 1048576.0 / 1e9;
  result["iters"] = iters;
  result["message_bytes"] = message_bytes;
  return result;
}

// WriteBlocks and ucx_perftest (per-block and whole-call message sizes)
// under one setting, with their ratios.
nlohmann::json MeasureSetting(const BenchOptions& opts, const Setting& setting) {
  nlohmann::json entry;
  entry["write_blocks"] = MeasureAgent(opts, setting);
  const auto& wb = entry["write_blocks"];
  for (const std::string& test : opts.perftest_tests) {
    // ucp_put_bw keeps the plain names: ucx_perftest, ratio_..._to_perftest;
    // others add their name: ucx_perftest_ucp_am_bw, ..._to_perftest_ucp_am_bw.
    const std::string tag = test == "ucp_put_bw" ? "perftest" : "perftest_" + test;
    nlohmann::json pt = MeasurePerftest(setting, test, opts.block_bytes, opts.perftest_iters);
    // The same bytes as one message ("coalesced" sends them as 256 KiB messages).
    nlohmann::json whole = MeasurePerftest(setting, test, opts.block_bytes * opts.blocks,
                                           opts.perftest_whole_iters);
    if (wb.contains("per_block_gbps") && pt.contains("gbps")) {
      entry["ratio_per_block_to_" + tag] = wb["per_block_gbps"].get<double>() / pt["gbps"].get<double>();
      entry["ratio_coalesced_to_" + tag] = wb["coalesced_gbps"].get<double>() / pt["gbps"].get<double>();
    }
    if (wb.contains("coalesced_gbps") && whole.contains("gbps")) {
      entry["ratio_coalesced_to_" + tag + "_whole"] =
          wb["coalesced_gbps"].get<double>() / whole["gbps"].get<double>();
    }
    entry["ucx_" + tag] = std::move(pt);
    entry["ucx_" + tag + "_whole"] = std::move(whole);
  }
  return entry;
}

int Main(int argc, char** argv) {
  BenchOptions opts;
  CLI::App app{"KV block transfer bandwidth vs ucx_perftest"};
  app.add_option("--transports", opts.transports,
                 "UCX transport sets, one per measurement (UCX_TLS syntax)");
  app.add_option("--block-bytes", opts.block_bytes, "bytes per KV block")->check(CLI::PositiveNumber);
  app.add_option("--blocks", opts.blocks, "blocks per WriteBlocks call")->check(CLI::PositiveNumber);
  app.add_option("--runs", opts.runs, "timed calls per mode (median)")->check(CLI::PositiveNumber);
  app.add_option("--perftest-iters", opts.perftest_iters, "ucx_perftest -n")
      ->check(CLI::PositiveNumber);
  app.add_option("--perftest-whole-iters", opts.perftest_whole_iters,
                 "ucx_perftest -n with -s blocks*block_bytes")
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout-ms", opts.timeout_ms, "WriteBlocks timeout")->check(CLI::PositiveNumber);
  app.add_option("--perftest-tests", opts.perftest_tests,
                 "ucx_perftest -t values, each run beside WriteBlocks")
      ->delimiter(',')
      ->check(CLI::IsMember({"ucp_put_bw", "ucp_am_bw"}));
  bool veth = false;
  std::vector<std::string> seg_sizes = {"default"};
  std::vector<int> mtus;
  auto* veth_flag = app.add_flag("--veth", veth,
                                 "run each side in its own network namespace over a veth pair "
                                 "(root, iproute2; transports default to tcp)");
  app.add_option("--tcp-seg-size", seg_sizes,
                 "UCX TCP segment sizes to measure, one run each: \"default\" (UCX's) or a "
                 "UCX size such as 512k (UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE)")
      ->delimiter(',');
  app.add_option("--mtu", mtus, "veth MTUs to measure, one run each")
      ->needs(veth_flag)
      ->delimiter(',')
      ->check(CLI::Range(68, 65535));
  CLI11_PARSE(app, argc, argv);
  if (veth && app.count("--transports") == 0) opts.transports = {"tcp"};

  signal(SIGPIPE, SIG_IGN);  // a dead child's pipe must not end the run before cleanup
  bench::VethLink link;
  if (veth) {
    const std::string err = link.Setup();
    if (!err.empty()) {
      std::cerr << "kv-transfer-bench: " << err << "\n";
      return 1;
    }
  }
  nlohmann::json report;
  report["block_bytes"] = opts.block_bytes;
  report["blocks"] = opts.blocks;
  report["runs"] = opts.runs;
  report["units"] = "GB/s = 1e9 bytes/s; ucx_perftest MB/s = MiB/s (2^20 bytes)";
  if (veth) report["veth"] = {{"devices", {link.device(0), link.device(1)}},
                              {"addresses", {link.address(0), link.address(1)}}};
  if (mtus.empty()) mtus = {0};  // 0: leave the MTU as created (1500)
  for (int mtu : mtus) {
    if (mtu != 0 && !link.SetMtu(mtu)) {
      std::cerr << "kv-transfer-bench: cannot set the veth MTU to " << mtu << "\n";
      return 1;
    }
    for (const std::string& seg : seg_sizes) {
      for (const std::string& tls : opts.transports) {
        Setting setting{tls, {}, veth ? &link : nullptr};
        std::string name = tls;
        if (seg != "default") {
          setting.tcp_seg_size = seg;
          name += " tcp_seg_size=" + seg;
        }
        if (mtu != 0) name += " mtu=" + std::to_string(mtu);
        report["transports"][name] = MeasureSetting(opts, setting);
      }
    }
  }
  std::cout << report.dump(2) << std::endl;
  return 0;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) { return headway::Main(argc, argv); }
