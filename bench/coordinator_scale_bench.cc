// One coordinator's limit: the real headway-coordinator (a child process)
// schedules N mixed TP 1 instances whose workers are fakes
// (tests/support/fake_worker.h, threads of this process) that answer every
// StepPlan at once, under streaming completions from an HTTP load generator
// in this process. For each N of --instances, over a fixed window after a
// warm-up, it measures:
//   * steps_per_s: StepPlans the fakes answered per second, all instances;
//   * output_tokens_per_s: tokens the fakes sampled per second;
//   * step_latency_us: per step, the time from a fake sending its
//     StepResult to receiving its instance's next StepPlan (median, p90,
//     p99, max). It includes the fake thread's own wake-up, so on an
//     oversubscribed host it is an upper bound of the coordinator's share;
//   * coordinator_cpu_percent (all its threads; 100 = one core) and its
//     busiest thread's, from /proc/<pid>/task/*/stat: the engine runs every
//     instance's scheduler on one thread (coordinator/engine/engine.h), so
//     that thread at ~100% is the coordinator's saturation;
//   * the client's own figures (completed requests/s, output tokens/s from
//     each stream's usage chunk, its threads' CPU), so that a load
//     generator that cannot keep up shows as such (client_limited), and
//     the machine's CPU use (/proc/stat), since the fakes, the client and
//     the coordinator share its cores.
// Prints one JSON object. Every child process is stopped on every path out
// (destructors; the coordinator also dies with this process: PDEATHSIG).
// docs/scaling.md reads the figures.
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/gguf.h"
#include "common/model_spec.h"
#include "tests/support/deployment.h"
#include "tests/support/fake_worker.h"
#include "tests/support/process.h"

namespace headway {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxInstances = 256;  // common/config.cc kMaxInstancesPerPool: one pool

struct BenchOptions {
  std::vector<int> instances = {1, 8, 64, 256};
  double warmup_s = 3;
  double window_s = 10;
  int streams_per_instance = 4;   // concurrent streaming requests per instance
  int max_num_seqs = 8;           // scheduler.max_num_seqs (>= streams_per_instance: none wait)
  int prompt_tokens = 32;
  int max_tokens = 128;
  int block_size = 16;
  int client_threads = 1;
  int32_t token_id = 1000;        // what the fakes sample: an ordinary SmolLM2 token
  std::string model_path;
  std::string bin_dir;
  std::string perf_dir;           // non-empty: perf record -g the coordinator in each window
  uint64_t seed = 0;
};

// ---- CPU time from /proc ------------------------------------------------

// utime + stime of /proc/<path>/stat, clock ticks; -1 if unreadable. The
// fields after the command name's closing ')' are 3..: utime is the 14th.
int64_t CpuTicks(const std::string& stat_path, std::string* name = nullptr) {
  std::string text = testing::ReadText(stat_path);
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return -1;
  if (name) *name = text.substr(open + 1, close - open - 1);
  std::istringstream in(text.substr(close + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && (in >> field); ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return utime + stime;
}

// Ticks of every thread of `pid`, by thread id.
std::map<int, int64_t> ThreadTicks(int pid, std::map<int, std::string>* names) {
  std::map<int, int64_t> out;
  std::error_code ec;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const int tid = std::atoi(entry.path().filename().c_str());
    std::string name;
    const int64_t ticks = CpuTicks(entry.path().string() + "/stat", &name);
    if (tid <= 0 || ticks < 0) continue;
    out[tid] = ticks;
    (*names)[tid] = name;
  }
  return out;
}

// The machine's busy and total jiffies from /proc/stat's "cpu" line
// (busy = total - idle - iowait).
std::pair<int64_t, int64_t> MachineJiffies() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  int64_t v = 0, total = 0, idle = 0;
  for (int i = 0; i < 8 && (in >> v); ++i) {
    total += v;
    if (i == 3 || i == 4) idle += v;
  }
  return {total - idle, total};
}

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- the load generator -------------------------------------------------

struct ClientTotals {
  int64_t completed = 0;  // requests that ended with [DONE] under status 200
  int64_t failed = 0;
  int64_t tokens = 0;     // usage.completion_tokens of the completed ones
  int64_t cpu_ns = 0;     // all client threads
  int64_t max_thread_cpu_ns = 0;
};

// `num_streams` streaming completions kept in flight against 127.0.0.1:port
// (a new one starts as soon as one ends), spread over `num_threads` epoll
// loops of non-blocking sockets, one connection per request ("Connection:
// close"). Each request is a fresh random prompt of token ids, so the
// prefix cache finds nothing to share.
class StreamLoad {
 public:
  StreamLoad(int port, int num_streams, int num_threads, const BenchOptions& options)
      : port_(port), options_(options), threads_stats_(size_t(num_threads)) {
    for (int t = 0; t < num_threads; ++t) {
      const int begin = num_streams * t / num_threads, end = num_streams * (t + 1) / num_threads;
      threads_.emplace_back([this, t, n = end - begin] { Loop(t, n); });
    }
  }
  ~StreamLoad() { Stop(); }
  StreamLoad(const StreamLoad&) = delete;
  StreamLoad& operator=(const StreamLoad&) = delete;

  // Closes every connection (the coordinator cancels their requests) and
  // joins the threads. Idempotent.
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  ClientTotals Totals() const {
    ClientTotals sum;
    for (const ThreadStats& s : threads_stats_) {
      sum.completed += s.completed;
      sum.failed += s.failed;
      sum.tokens += s.tokens;
      sum.cpu_ns += s.cpu_ns;
      sum.max_thread_cpu_ns = std::max<int64_t>(sum.max_thread_cpu_ns, s.cpu_ns);
    }
    return sum;
  }

  // The first failed request's status line and body start; "" if none.
  std::string FirstError() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  struct ThreadStats {
    std::atomic<int64_t> completed{0}, failed{0}, tokens{0}, cpu_ns{0};
  };
  enum class State { kIdle, kConnecting, kSending, kReading };
  struct Conn {
    int fd = -1;
    State state = State::kIdle;
    std::string request;
    size_t sent = 0;
    std::string response;
    bool done = false;                  // "[DONE]" seen
    Clock::time_point retry_at;         // kIdle: when to open again
  };

  std::string MakeRequest(std::mt19937_64& rng) const {
    std::uniform_int_distribution<int> token(1000, 39999);
    std::string prompt;
    for (int i = 0; i < options_.prompt_tokens; ++i) {
      prompt += (i ? "," : "") + std::to_string(token(rng));
    }
    const std::string body =
        R"({"model": "smollm2", "prompt": [)" + prompt + R"(], "max_tokens": )" +
        std::to_string(options_.max_tokens) +
        R"(, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})";
    return "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) +
           "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }

  void Open(int epoll_fd, Conn& c, std::mt19937_64& rng) {
    c = Conn{};
    c.request = MakeRequest(rng);
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (c.fd < 0 || (connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
                     errno != EINPROGRESS)) {
      return Fail(c, std::string("connect: ") + std::strerror(errno));
    }
    c.state = State::kConnecting;
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.ptr = &c;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c.fd, &ev);
  }

  // Ends a request that did not complete; the stream opens again 20 ms
  // later, so a refusing server is not hammered.
  void Fail(Conn& c, const std::string& why) {
    ++current_->failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_error_.empty()) first_error_ = why;
    }
    Close(c);
    c.retry_at = Clock::now() + milliseconds(20);
  }

  void Close(Conn& c) {
    if (c.fd >= 0) close(c.fd);  // also leaves the epoll set
    c.fd = -1;
    c.state = State::kIdle;
    c.retry_at = Clock::now();
  }

  // The response is whole: status 200, [DONE], usage.completion_tokens.
  void Finish(Conn& c) {
    if (c.response.rfind("HTTP/1.1 200", 0) != 0 || !c.done) {
      return Fail(c, c.response.substr(0, 300));
    }
    static const std::string kKey = "\"completion_tokens\":";
    const size_t at = c.response.rfind(kKey);
    if (at != std::string::npos) current_->tokens += std::atoll(c.response.c_str() + at + kKey.size());
    ++current_->completed;
    Close(c);
  }

  void OnEvent(int epoll_fd, Conn& c, uint32_t events) {
    if (c.state == State::kConnecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return Fail(c, std::string("connect: ") + std::strerror(err));
      c.state = State::kSending;
    }
    if (c.state == State::kSending) {
      const ssize_t n = send(c.fd, c.request.data() + c.sent, c.request.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) return Fail(c, std::string("send: ") + std::strerror(errno));
      if (n > 0) c.sent += size_t(n);
      if (c.sent < c.request.size()) return;
      c.state = State::kReading;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = &c;
      epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
      return;
    }
    if (c.state != State::kReading || !(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    char buf[16384];
    while (true) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return Finish(c);  // the server closed: Connection: close
      if (n < 0) {
        if (errno == EAGAIN) break;
        return Fail(c, std::string("recv: ") + std::strerror(errno));
      }
      const size_t from = c.response.size() > 8 ? c.response.size() - 8 : 0;
      c.response.append(buf, size_t(n));
      if (!c.done) c.done = c.response.find("data: [DONE]", from) != std::string::npos;
    }
    // The chunked body's last chunk after [DONE]: whole, without waiting for
    // the server to close.
    if (c.done && c.response.size() >= 5 && c.response.compare(c.response.size() - 5, 5, "0\r\n\r\n") == 0) {
      Finish(c);
    }
  }

  void Loop(int thread_index, int num_streams) {
    current_ = &threads_stats_[size_t(thread_index)];
    std::mt19937_64 rng(options_.seed * 7919 + uint64_t(thread_index));
    const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    std::vector<Conn> conns(static_cast<size_t>(num_streams));  // never resized: epoll holds pointers
    std::vector<epoll_event> events(256);
    while (!stop_) {
      const Clock::time_point now = Clock::now();
      for (Conn& c : conns) {
        if (c.state == State::kIdle && c.retry_at <= now) Open(epoll_fd, c, rng);
      }
      const int n = epoll_wait(epoll_fd, events.data(), int(events.size()), 10);
      for (int i = 0; i < n; ++i) OnEvent(epoll_fd, *static_cast<Conn*>(events[i].data.ptr), events[i].events);
      current_->cpu_ns = ThreadCpuNs();
    }
    for (Conn& c : conns) {
      if (c.fd >= 0) close(c.fd);
    }
    close(epoll_fd);
  }

  const int port_;
  const BenchOptions options_;
  std::vector<ThreadStats> threads_stats_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::string first_error_;  // guarded by mu_
  static thread_local ThreadStats* current_;  // the loop thread's own stats
};

thread_local StreamLoad::ThreadStats* StreamLoad::current_ = nullptr;

// ---- one run ------------------------------------------------------------

// Everything read at one instant of the run, for differences over the window.
struct Snapshot {
  Clock::time_point at;
  int64_t plans = 0, tokens = 0;
  int64_t coordinator_ticks = 0, bench_ticks = 0;
  std::map<int, int64_t> coordinator_threads;
  std::map<int, std::string> thread_names;
  std::pair<int64_t, int64_t> machine;
  ClientTotals client;
};

Snapshot Take(int coordinator_pid, const std::vector<std::unique_ptr<testing::FakeWorker>>& fakes,
              const StreamLoad& load) {
  Snapshot s;
  s.at = Clock::now();
  for (const auto& f : fakes) {
    s.plans += f->num_plans();
    s.tokens += f->num_sampled_tokens();
  }
  s.coordinator_ticks = CpuTicks("/proc/" + std::to_string(coordinator_pid) + "/stat");
  s.coordinator_threads = ThreadTicks(coordinator_pid, &s.thread_names);
  s.bench_ticks = CpuTicks("/proc/self/stat");
  s.machine = MachineJiffies();
  s.client = load.Totals();
  return s;
}

std::string ConfigYaml(const BenchOptions& o, int num_instances, int http_port, int num_streams) {
  const int max_model_len = (o.prompt_tokens + o.max_tokens + o.block_size - 1) / o.block_size * o.block_size;
  std::ostringstream y;
  y << "model:\n  path: " << o.model_path << "\n  served_name: smollm2\n"
    << "coordinator:\n  http_host: 127.0.0.1\n  http_port: " << http_port << "\n"
    << "  heartbeat_interval_ms: 1000\n  heartbeat_timeout_ms: 60000\n"
    << "  http_max_connections: " << std::min(4096, num_streams + 64) << "\n"
    << "cache:\n  block_size: " << o.block_size << "\n"
    << "scheduler:\n  max_num_seqs: " << o.max_num_seqs << "\n  max_model_len: " << max_model_len << "\n"
    << "pools:\n  - name: main\n    role: mixed\n    instances:\n"
    << "      count: " << num_instances << "\n      template:\n        tp_size: 1\n        device: cpu\n";
  return y.str();
}

// Latency summary in microseconds of `ns` (sorted here).
json LatencySummary(std::vector<int64_t> ns) {
  if (ns.empty()) return json{{"samples", 0}};
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) { return double(ns[std::min(ns.size() - 1, size_t(q * double(ns.size())))]) / 1e3; };
  double sum = 0;
  for (int64_t v : ns) sum += double(v);
  return json{{"samples", ns.size()}, {"mean", sum / double(ns.size()) / 1e3}, {"p50", at(0.50)},
              {"p90", at(0.90)},      {"p99", at(0.99)},                     {"max", double(ns.back()) / 1e3}};
}

double Round(double v, int digits = 1) {
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

Result<json> RunOne(const BenchOptions& o, const ModelSpec& spec, int num_instances) {
  testing::ScopedTempDir dir("headway-coordinator-scale");
  if (dir.path.empty()) return Status::Internal("cannot make a temp dir");
  const int num_streams = num_instances * o.streams_per_instance;
  const int http_port = testing::FreePort();
  const std::string control = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
  const std::string config = dir.path + "/deploy.yaml";
  std::ofstream(config) << ConfigYaml(o, num_instances, http_port, num_streams);
  const std::string log = dir.path + "/coordinator.log";
  auto log_tail = [&] {
    std::string text = testing::ReadText(log);
    return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
  };
  testing::ChildProcess coordinator({o.bin_dir + "/headway-coordinator", "--config", config,
                                     "--control-address", control},
                                    log);
  if (coordinator.pid() <= 0) return Status::Internal("cannot start headway-coordinator: " + log_tail());

  // The fakes' KV pool: every admitted sequence at max_model_len, twice
  // over, so that nothing is preempted.
  const int blocks_per_seq = (o.prompt_tokens + o.max_tokens + o.block_size - 1) / o.block_size;
  const int num_blocks = 2 * o.max_num_seqs * blocks_per_seq * spec.num_layers * spec.num_kv_heads;
  std::vector<std::unique_ptr<testing::FakeWorker>> fakes;
  for (int i = 0; i < num_instances; ++i) {
    testing::FakeWorkerOptions f;
    f.address = control;
    f.spec = spec;
    f.instance_id = i;
    f.token_id = o.token_id;
    f.block_size = o.block_size;
    f.num_blocks = num_blocks;
    f.check_plans = false;
    f.record_step_latency = true;
    f.heartbeat_interval_ms = 1000;
    f.poll_interval_ms = 100;
    fakes.push_back(std::make_unique<testing::FakeWorker>(std::move(f)));
  }
  auto stop_fakes = [&] {
    for (auto& f : fakes) f->RequestStop();
    fakes.clear();
  };

  const Clock::time_point start = Clock::now();
  const auto ready_timeout = std::chrono::seconds(60);
  while (true) {
    if (!coordinator.Running()) {
      stop_fakes();
      return Status::Internal("headway-coordinator exited: " + log_tail());
    }
    testing::HttpReply health = testing::HttpGet(http_port, "/health", 5);
    if (testing::EveryInstanceReady(health)) break;
    if (Clock::now() - start > ready_timeout) {
      stop_fakes();
      return Status::DeadlineExceeded("the instances were not ready in 60 s: " + log_tail());
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  const double ready_s = std::chrono::duration<double>(Clock::now() - start).count();

  StreamLoad load(http_port, num_streams, std::min(o.client_threads, num_streams), o);
  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_s));
  for (auto& f : fakes) (void)f->TakeStepLatencies();  // the warm-up's
  const Snapshot a = Take(coordinator.pid(), fakes, load);
  std::unique_ptr<testing::ChildProcess> perf;
  if (!o.perf_dir.empty()) {
    const std::string out = o.perf_dir + "/coordinator-" + std::to_string(num_instances) + ".perf.data";
    perf = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{"/usr/bin/perf", "record", "-g", "-p", std::to_string(coordinator.pid()),
                                 "-o", out, "--", "sleep", std::to_string(o.window_s)},
        o.perf_dir + "/perf-" + std::to_string(num_instances) + ".log");
  }
  // Half-way: how many sequences run and wait, from /health.
  std::this_thread::sleep_for(std::chrono::duration<double>(o.window_s / 2));
  const testing::HttpReply health = testing::HttpGet(http_port, "/health", 10);
  std::this_thread::sleep_for(a.at + std::chrono::duration<double>(o.window_s) - Clock::now());
  const Snapshot b = Take(coordinator.pid(), fakes, load);
  std::vector<int64_t> latencies;
  for (auto& f : fakes) {
    std::vector<int64_t> l = f->TakeStepLatencies();
    latencies.insert(latencies.end(), l.begin(), l.end());
  }
  if (perf) perf->WaitExit(std::chrono::seconds(30));
  const std::string client_error = load.FirstError();
  load.Stop();
  const bool coordinator_alive = coordinator.Running();
  coordinator.Stop();
  stop_fakes();
  if (!coordinator_alive) return Status::Internal("headway-coordinator died during the run: " + log_tail());

  const double window_s = std::chrono::duration<double>(b.at - a.at).count();
  const double ticks_per_s = double(sysconf(_SC_CLK_TCK));
  auto cpu_percent = [&](int64_t ticks) { return Round(100.0 * double(ticks) / ticks_per_s / window_s); };
  int busiest_tid = 0;
  int64_t busiest_ticks = -1;
  for (const auto& [tid, ticks] : b.coordinator_threads) {
    auto before = a.coordinator_threads.find(tid);
    const int64_t d = ticks - (before == a.coordinator_threads.end() ? 0 : before->second);
    if (d > busiest_ticks) {
      busiest_ticks = d;
      busiest_tid = tid;
    }
  }
  int running = 0, waiting = 0, busy_instances = 0;
  if (health.json.is_object() && health.json.contains("instances")) {
    for (const json& inst : health.json["instances"]) {
      running += inst.value("num_running", 0);
      waiting += inst.value("num_waiting", 0);
      busy_instances += inst.value("num_running", 0) > 0 ? 1 : 0;
    }
  }
  const double steps = double(b.plans - a.plans), tokens = double(b.tokens - a.tokens);
  const int64_t client_cpu_ns = b.client.cpu_ns - a.client.cpu_ns;
  const double client_max_thread_percent =
      100.0 * double(b.client.max_thread_cpu_ns - a.client.max_thread_cpu_ns) / 1e9 / window_s;
  const double machine_busy =
      100.0 * double(b.machine.first - a.machine.first) / double(std::max<int64_t>(1, b.machine.second - a.machine.second));
  const double client_tokens_per_s = double(b.client.tokens - a.client.tokens) / window_s;
  json run = {
      {"instances", num_instances},
      {"streams", num_streams},
      {"ready_s", Round(ready_s, 2)},
      {"window_s", Round(window_s, 2)},
      {"steps_per_s", Round(steps / window_s)},
      {"steps_per_s_per_instance", Round(steps / window_s / num_instances)},
      {"output_tokens_per_s", Round(tokens / window_s)},
      {"mean_batch", Round(steps > 0 ? tokens / steps : 0, 2)},
      {"step_latency_us", LatencySummary(std::move(latencies))},
      {"coordinator_cpu_percent", cpu_percent(b.coordinator_ticks - a.coordinator_ticks)},
      {"coordinator_busiest_thread_cpu_percent", cpu_percent(busiest_ticks)},
      {"coordinator_busiest_thread", b.thread_names.count(busiest_tid) ? b.thread_names.at(busiest_tid) : ""},
      {"coordinator_threads", b.coordinator_threads.size()},
      {"bench_process_cpu_percent", cpu_percent(b.bench_ticks - a.bench_ticks)},
      {"machine_cpu_busy_percent", Round(machine_busy)},
      {"health_mid_window", {{"running", running}, {"waiting", waiting}, {"busy_instances", busy_instances}}},
      {"client",
       {{"requests_per_s", Round(double(b.client.completed - a.client.completed) / window_s)},
        {"output_tokens_per_s", Round(client_tokens_per_s)},
        {"failed", b.client.failed - a.client.failed},
        {"cpu_percent", Round(100.0 * double(client_cpu_ns) / 1e9 / window_s)},
        {"busiest_thread_cpu_percent", Round(client_max_thread_percent)},
        {"first_error", client_error}}},
      // A client thread near a whole core cannot be sure to keep every
      // stream busy: the figures then bound the client, not the coordinator.
      {"client_limited", client_max_thread_percent > 90.0},
  };
  return run;
}

std::vector<int> ParseInts(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

std::string ExecutableDir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

int Main(int argc, char** argv) {
  BenchOptions o;
  const char* model_dir = std::getenv("HEADWAY_MODEL_DIR");
  const char* home = std::getenv("HOME");
  o.model_path = std::string(model_dir && *model_dir ? model_dir
                                                     : std::string(home ? home : "/root") + "/.cache/headway/models") +
                 "/SmolLM2-135M-Instruct.Q4_1.gguf";
  o.bin_dir = ExecutableDir();
  std::string instances_arg = "1,8,64,256";
  CLI::App app{"One coordinator's limit: the real coordinator, N fake instances, streaming load"};
  app.add_option("--instances", instances_arg, "comma-separated instance counts, each 1..256");
  app.add_option("--warmup-s", o.warmup_s, "seconds of load before the window")->check(CLI::NonNegativeNumber);
  app.add_option("--window-s", o.window_s, "measured seconds per instance count")->check(CLI::Range(0.5, 3600.0));
  app.add_option("--streams-per-instance", o.streams_per_instance,
                 "concurrent streaming requests per instance")->check(CLI::Range(1, 64));
  app.add_option("--max-num-seqs", o.max_num_seqs, "scheduler.max_num_seqs")->check(CLI::Range(1, 1024));
  app.add_option("--prompt-tokens", o.prompt_tokens, "random token ids per prompt")->check(CLI::Range(1, 4096));
  app.add_option("--max-tokens", o.max_tokens, "max_tokens of every request (ignore_eos)")->check(CLI::Range(1, 4096));
  app.add_option("--client-threads", o.client_threads, "load generator threads")->check(CLI::Range(1, 64));
  app.add_option("--model", o.model_path, "the coordinator's GGUF (SmolLM2-135M-Instruct)");
  app.add_option("--bin-dir", o.bin_dir, "where headway-coordinator is (default: beside this binary)");
  app.add_option("--perf-dir", o.perf_dir, "perf record -g the coordinator in each window, into this folder");
  app.add_option("--seed", o.seed, "prompts");
  CLI11_PARSE(app, argc, argv);
  try {
    o.instances = ParseInts(instances_arg);
  } catch (const std::exception&) {
    std::cerr << "--instances: not a comma-separated list of integers: " << instances_arg << "\n";
    return 2;
  }
  for (int n : o.instances) {
    if (n < 1 || n > kMaxInstances) {
      std::cerr << "--instances: " << n << " is outside 1.." << kMaxInstances
                << " (one pool holds at most " << kMaxInstances << " instances)\n";
      return 2;
    }
  }
  auto gguf = GgufFile::Open(o.model_path);
  if (!gguf.ok()) {
    std::cerr << "cannot read the model " << o.model_path << ": " << gguf.status().ToString()
              << " (deploy/setup.sh downloads it; --model or HEADWAY_MODEL_DIR point elsewhere)\n";
    return 2;
  }
  auto spec = LoadModelSpec(**gguf);
  if (!spec.ok()) {
    std::cerr << spec.status().ToString() << "\n";
    return 2;
  }
  if (o.token_id >= spec->vocab_size) {
    std::cerr << "token id " << o.token_id << " is outside the vocabulary (" << spec->vocab_size << ")\n";
    return 2;
  }
  if (!std::filesystem::exists(o.bin_dir + "/headway-coordinator")) {
    std::cerr << "no headway-coordinator in " << o.bin_dir << " (build it, or give --bin-dir)\n";
    return 2;
  }

  json out = {
      {"benchmark", "coordinator_scale"},
      {"machine", {{"cpus", std::thread::hardware_concurrency()}}},
      {"settings",
       {{"warmup_s", o.warmup_s},
        {"window_s", o.window_s},
        {"streams_per_instance", o.streams_per_instance},
        {"max_num_seqs", o.max_num_seqs},
        {"prompt_tokens", o.prompt_tokens},
        {"max_tokens", o.max_tokens},
        {"block_size", o.block_size},
        {"slots_per_sequence", spec->num_layers * spec->num_kv_heads},
        {"client_threads", o.client_threads},
        {"model", o.model_path}}},
      {"runs", json::array()},
  };
  int status = 0;
  for (int n : o.instances) {
    std::cerr << "instances " << n << " ...\n";
    Result<json> run = RunOne(o, *spec, n);
    if (!run.ok()) {
      std::cerr << "instances " << n << ": " << run.status().ToString() << "\n";
      out["runs"].push_back({{"instances", n}, {"error", run.status().ToString()}});
      status = 1;
      continue;
    }
    std::cerr << run->dump() << "\n";
    out["runs"].push_back(std::move(run).value());
  }
  std::cout << out.dump(2) << std::endl;
  return status;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) { return headway::Main(argc, argv); }
