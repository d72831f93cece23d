// NodeSupervisor against a fake ProcessRunner and a clock the test moves:
// one instance's ranks restart together, the other instances are left
// alone, the backoff doubles and caps, an instance that stayed up recovers
// its short backoff, a worker refusing its configuration is not restarted,
// and StopAll stops everything for good.
#include "deploy/node/node_supervisor.h"

#include <sys/wait.h>

#include <deque>
#include <set>

#include <gtest/gtest.h>

namespace headway::node {
namespace {

using namespace std::chrono_literals;
using launcher::ExitedChild;
using launcher::ProcessSpec;

class FakeRunner final : public ProcessRunner {
 public:
  Result<pid_t> Start(const ProcessSpec& spec) override {
    const int attempt = attempts++;
    if (fail_starts > 0 || attempt == fail_on_start) {
      if (fail_starts > 0) --fail_starts;
      return Status::FailedPrecondition("cannot execute " + spec.argv[0]);
    }
    const pid_t pid = next_pid++;
    running[pid] = spec.name;
    started.push_back(spec.name);
    return pid;
  }
  std::optional<ExitedChild> ReapExited() override {
    if (exits.empty()) return std::nullopt;
    ExitedChild e = exits.front();
    exits.pop_front();
    return e;
  }
  void Stop(const std::vector<pid_t>& pids, Mode mode) override {
    for (pid_t pid : pids) {
      EXPECT_TRUE(running.count(pid)) << "stopping pid " << pid << " that does not run";
      running.erase(pid);
      stopped.insert(pid);
      modes[pid] = mode;
    }
  }

  // The worker `pid` exits with `wait_status`.
  void Exit(pid_t pid, int wait_status) {
    ASSERT_TRUE(running.count(pid));
    exits.push_back({running[pid], pid, wait_status});
    running.erase(pid);
  }

  pid_t next_pid = 100;
  int attempts = 0;
  int fail_starts = 0;     // the next this many starts fail
  int fail_on_start = -1;  // the start with this index (0-based) fails
  std::map<pid_t, std::string> running;
  std::vector<std::string> started;
  std::set<pid_t> stopped;
  std::map<pid_t, Mode> modes;  // how each stopped pid was stopped
  std::deque<ExitedChild> exits;
};

ProcessSpec Worker(int instance, int rank) {
  ProcessSpec spec;
  spec.name = "worker i" + std::to_string(instance) + "r" + std::to_string(rank);
  spec.argv = {"/bin/headway-worker"};
  spec.instance_id = instance;
  spec.tp_rank = rank;
  return spec;
}

constexpr int kKilled = SIGKILL;        // a wait status: killed by signal 9
constexpr int kExit1 = 1 << 8;          // exited with status 1
constexpr int kExit2 = 2 << 8;          // exited with status 2
constexpr int kExit0 = 0;               // exited with status 0 (released by a drain)

class NodeSupervisorTest : public ::testing::Test {
 protected:
  // Instance 0 has ranks 0 and 1 here; instance 1 has rank 0.
  NodeSupervisorTest()
      : supervisor_({Worker(0, 1), Worker(0, 0), Worker(1, 0)}, &runner_, Policy()) {}

  static RestartPolicy Policy() {
    RestartPolicy p;
    p.initial_backoff = 1000ms;
    p.max_backoff = 8000ms;
    p.healthy_after = 60000ms;
    return p;
  }

  NodeSupervisor::InstanceStatus Status(int instance) const {
    for (const auto& s : supervisor_.Instances()) {
      if (s.instance_id == instance) return s;
    }
    ADD_FAILURE() << "no instance " << instance;
    return {};
  }

  void Poll(Clock::time_point now) {
    std::vector<std::string> log;
    ASSERT_TRUE(supervisor_.Poll(now, &log).ok());
  }

  FakeRunner runner_;
  NodeSupervisor supervisor_;
  Clock::time_point t0_ = Clock::time_point() + std::chrono::hours(1);
};

TEST_F(NodeSupervisorTest, StartsEveryRankInInstanceAndRankOrder) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  EXPECT_EQ(runner_.started,
            (std::vector<std::string>{"worker i0r0", "worker i0r1", "worker i1r0"}));
  EXPECT_EQ(Status(0).pids.size(), 2u);
  EXPECT_TRUE(Status(1).running);
}

TEST_F(NodeSupervisorTest, ADeadRankTakesItsInstanceDownAndBothRestartTogether) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  const pid_t r0 = Status(0).pids[0], r1 = Status(0).pids[1], other = Status(1).pids[0];
  runner_.Exit(r1, kKilled);
  std::vector<std::string> log;
  ASSERT_TRUE(supervisor_.Poll(t0_ + 10ms, &log).ok());
  EXPECT_TRUE(runner_.stopped.count(r0)) << "rank 0 must stop with rank 1";
  EXPECT_FALSE(Status(0).running);
  EXPECT_EQ(Status(0).restart_at, t0_ + 10ms + 1000ms);
  EXPECT_TRUE(runner_.running.count(other)) << "the other instance keeps serving";
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log[0].find("killed by signal 9"), std::string::npos) << log[0];

  Poll(t0_ + 900ms);  // not yet due
  EXPECT_FALSE(Status(0).running);
  Poll(t0_ + 1010ms);
  EXPECT_TRUE(Status(0).running);
  EXPECT_EQ(Status(0).pids.size(), 2u);
  EXPECT_EQ(Status(0).starts, 2);
}

TEST_F(NodeSupervisorTest, BackoffDoublesCapsAndRecoversAfterAHealthyRun) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  Clock::time_point now = t0_;
  std::vector<std::chrono::milliseconds> waits;
  for (int failure = 0; failure < 6; ++failure) {
    runner_.Exit(Status(1).pids[0], kExit1);
    Poll(now);
    ASSERT_TRUE(Status(1).restart_at.has_value());
    waits.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(*Status(1).restart_at -
                                                                          now));
    now = *Status(1).restart_at;
    Poll(now);
    ASSERT_TRUE(Status(1).running);
  }
  EXPECT_EQ(waits, (std::vector<std::chrono::milliseconds>{1000ms, 2000ms, 4000ms, 8000ms,
                                                           8000ms, 8000ms}));
  // Up for longer than healthy_after: the next failure waits the shortest time.
  now += 61s;
  runner_.Exit(Status(1).pids[0], kExit1);
  Poll(now);
  EXPECT_EQ(*Status(1).restart_at - now, 1000ms);
  EXPECT_EQ(Status(1).consecutive_failures, 1);
}

TEST_F(NodeSupervisorTest, ARestartThatCannotStartIsOneMoreFailure) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  runner_.Exit(Status(1).pids[0], kKilled);
  Poll(t0_);
  runner_.fail_starts = 1;
  std::vector<std::string> log;
  ASSERT_TRUE(supervisor_.Poll(t0_ + 1000ms, &log).ok());
  EXPECT_FALSE(Status(1).running);
  EXPECT_EQ(Status(1).consecutive_failures, 2);
  EXPECT_EQ(*Status(1).restart_at, t0_ + 1000ms + 2000ms);
  Poll(t0_ + 3000ms);
  EXPECT_TRUE(Status(1).running);
}

TEST_F(NodeSupervisorTest, AConfigurationErrorIsNotRestarted) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  const pid_t other_rank = Status(0).pids[1];
  runner_.Exit(Status(0).pids[0], kExit2);
  std::vector<std::string> log;
  const headway::Status s = supervisor_.Poll(t0_, &log);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("worker i0r0"), std::string::npos) << s.message();
  EXPECT_TRUE(runner_.stopped.count(other_rank));
}

TEST_F(NodeSupervisorTest, StartFailureLeavesNothingRunning) {
  // The third worker (instance 1) cannot start: instance 0, started, stops.
  runner_.fail_on_start = 2;
  EXPECT_FALSE(supervisor_.Start(t0_).ok());
  EXPECT_EQ(runner_.started.size(), 2u);
  EXPECT_TRUE(runner_.running.empty());
}

TEST_F(NodeSupervisorTest, StopAllStopsForGood) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  runner_.Exit(Status(1).pids[0], kKilled);
  Poll(t0_);
  const std::vector<pid_t> instance0 = Status(0).pids;
  supervisor_.StopAll(ProcessRunner::Mode::kDrain);
  EXPECT_TRUE(runner_.running.empty());
  for (pid_t pid : instance0) EXPECT_EQ(runner_.modes[pid], ProcessRunner::Mode::kDrain);
  Poll(t0_ + 60s);
  EXPECT_TRUE(runner_.running.empty()) << "nothing restarts after StopAll";
}

// A rank that exits 0 was released by a drain (a rolling restart): its
// instance starts again at once and no failure is counted; a broken
// instance's other ranks are stopped at once, not drained.
TEST_F(NodeSupervisorTest, AReleasedInstanceStartsAgainAtOnce) {
  ASSERT_TRUE(supervisor_.Start(t0_).ok());
  const pid_t other_rank = Status(0).pids[1];
  runner_.Exit(Status(0).pids[0], kExit0);
  Poll(t0_);
  EXPECT_TRUE(Status(0).running);
  EXPECT_EQ(Status(0).starts, 2);
  EXPECT_EQ(Status(0).consecutive_failures, 0);
  EXPECT_EQ(runner_.modes[other_rank], ProcessRunner::Mode::kNow);

  runner_.Exit(Status(0).pids[1], kExit1);  // a failure afterwards waits its backoff
  Poll(t0_ + 1ms);
  EXPECT_FALSE(Status(0).running);
  EXPECT_EQ(Status(0).consecutive_failures, 1);
}

}  // namespace
}  // namespace headway::node
