// The health board between the HTTP threads and the engine thread: a drain
// asked for between the engine's snapshot and its publish survives the
// publish (the race a second POST /admin/instances/N/drain once won), and
// the board still reports what the engine found.
#include "coordinator/engine/health_board.h"

#include <gtest/gtest.h>

#include <vector>

namespace headway {
namespace {

std::vector<InstanceHealth> Instances(std::vector<InstanceState> states) {
  std::vector<InstanceHealth> out;
  for (size_t i = 0; i < states.size(); ++i) {
    InstanceHealth h;
    h.instance_id = int(i);
    h.state = states[i];
    out.push_back(h);
  }
  return out;
}

InstanceState StateOf(const HealthBoard& board, int instance_id) {
  return board.Health().at(size_t(instance_id)).state;
}

TEST(HealthBoardTest, APublishBetweenTwoDrainsKeepsTheFirstAndRefusesTheSecond) {
  using S = InstanceState;
  HealthBoard board(Instances({S::kReady, S::kReady}));
  // The engine thread builds its snapshot, then an HTTP thread drains
  // instance 0 before the engine publishes: the snapshot says ready.
  std::vector<InstanceHealth> built_before_the_drain = Instances({S::kReady, S::kReady});
  ASSERT_TRUE(board.RequestDrain(0, "first").ok());
  EXPECT_EQ(StateOf(board, 0), S::kDraining);
  board.Publish(built_before_the_drain);
  EXPECT_EQ(StateOf(board, 0), S::kDraining) << "the publish took the drain back";
  EXPECT_EQ(StateOf(board, 1), S::kReady);
  Status second = board.RequestDrain(0, "second");
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition) << second.message();
  EXPECT_NE(second.message().find("draining"), std::string::npos) << second.message();

  // The engine takes the one drain, applies it and publishes what it did.
  std::vector<DrainRequest> drains = board.TakeDrains();
  ASSERT_EQ(drains.size(), 1u);
  EXPECT_EQ(drains[0].instance_id, 0);
  EXPECT_EQ(drains[0].why, "first");
  EXPECT_TRUE(board.TakeDrains().empty());
  board.Publish(Instances({S::kDraining, S::kReady}));
  EXPECT_EQ(StateOf(board, 0), S::kDraining);
  // Drained: the engine's state is the truth again.
  board.Publish(Instances({S::kDown, S::kReady}));
  EXPECT_EQ(StateOf(board, 0), S::kDown);
  EXPECT_EQ(board.RequestDrain(0, "late").code(), StatusCode::kFailedPrecondition);
  // Back after its workers registered anew: it may be drained again.
  board.Publish(Instances({S::kReady, S::kReady}));
  EXPECT_TRUE(board.RequestDrain(0, "rolling restart, second round").ok());
}

TEST(HealthBoardTest, AQueuedDrainDoesNotHideAnInstanceThatWentDown) {
  using S = InstanceState;
  HealthBoard board(Instances({S::kReady}));
  ASSERT_TRUE(board.RequestDrain(0, "drain").ok());
  // The instance lost a rank before the engine took the drain.
  board.Publish(Instances({S::kDown}));
  EXPECT_EQ(StateOf(board, 0), S::kDown);
  EXPECT_EQ(board.RequestDrain(0, "again").code(), StatusCode::kFailedPrecondition);
}

TEST(HealthBoardTest, OnlyReadyInstancesOfTheConfigDrain) {
  using S = InstanceState;
  HealthBoard board(Instances({S::kJoining, S::kVacant, S::kReady}));
  EXPECT_EQ(board.RequestDrain(3, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(board.RequestDrain(-1, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(board.RequestDrain(0, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(board.RequestDrain(1, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(board.RequestDrain(2, "x").ok());
  EXPECT_EQ(board.TakeDrains().size(), 1u);
}

}  // namespace
}  // namespace headway
