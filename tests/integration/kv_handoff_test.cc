// The worker half of prefill/decode disaggregation, driven at the protocol
// level: this test plays the coordinator (a ControlServer) for two real
// headway-worker processes on a tiny model, with kv_transfer over UCX TCP.
// Worker A prefills and decodes a sequence, then writes its KV blocks into
// worker B's pool (TransferPlan) under a different block numbering; B meets
// the sequence for the first time at position 41 and must sample exactly
// what A samples there (same kernels, same KV: the same bits).
//
// KvHandoffStalledSenderTest starts worker A with the test-only fault
// HEADWAY_FAULT_TRANSFER_STALL_MS: every transfer stalls half-way. A stall
// past the plan's timeout must fail the transfer on time while A keeps
// answering steps (transfers run off the control thread); a shorter stall
// must still deliver every block.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/control_channel.h"
#include "comm/kv_write_auth.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlockSize = 16;
constexpr int kSlots = 4;       // tiny model: 2 layers x 2 KV heads, TP 1
constexpr int kBlocksPerSlot = 3;  // positions [0, 48)

class KvHandoffTest : public ::testing::Test {
 protected:
  // HEADWAY_FAULT_TRANSFER_STALL_MS for worker A (the sender); 0 = unset.
  virtual int SenderStallMs() const { return 0; }

  void SetUp() override {
    dir_ = testing::MakeTempDir("headway-kv-handoff");
    ASSERT_TRUE(testing::WriteTinyLlama(dir_ + "/tiny.gguf", {}).ok());
    const int control_port = testing::FreePort();
    const std::string address = "tcp://127.0.0.1:" + std::to_string(control_port);
    std::ofstream(dir_ + "/deploy.yaml")
        << "model: {path: " << dir_ << "/tiny.gguf}\n"
        << "coordinator: {control_address: \"" << address << "\"}\n"
        << "cache: {block_size: " << kBlockSize << ", kv_memory_mb: 4}\n"
        << "kv_transfer: {transports: tcp, timeout_ms: 5000}\n"
        << "pools:\n"
        << "  - {name: a, role: mixed, instances: [{tp_size: 1, num_threads: 1}]}\n"
        << "  - {name: b, role: mixed, instances: [{tp_size: 1, num_threads: 1}]}\n";
    Result<std::unique_ptr<ControlServer>> server = ControlServer::Bind(address);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    for (int instance : {0, 1}) {
      std::vector<std::string> argv;
      if (instance == 0 && SenderStallMs() > 0) {
        // ChildProcess passes the parent's environment on; env(1) adds to it.
        argv = {"/usr/bin/env",
                "HEADWAY_FAULT_TRANSFER_STALL_MS=" + std::to_string(SenderStallMs())};
      }
      for (const std::string& arg :
           {testing::BinaryPath("headway-worker"), std::string("--config"),
            dir_ + "/deploy.yaml", std::string("--instance-id"), std::to_string(instance),
            std::string("--tp-rank"), std::string("0")}) {
        argv.push_back(arg);
      }
      workers_.push_back(std::make_unique<testing::ChildProcess>(
          argv, dir_ + "/worker" + std::to_string(instance) + ".log"));
    }
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
    while (endpoints_.size() < 2 && Clock::now() < deadline) {
      std::optional<Inbound> in = server_->Receive(std::chrono::milliseconds(100));
      if (!in || !in->envelope.has_register_request()) continue;
      endpoints_[in->peer] = in->envelope.register_request().kv_endpoint();
      write_keys_[in->peer] = in->envelope.register_request().kv_write_key();
      proto::Envelope reply;
      reply.mutable_register_response()->set_accepted(true);
      ASSERT_TRUE(server_->Send(in->peer, reply).ok());
    }
    ASSERT_EQ(endpoints_.size(), 2u) << workers_[0]->Log() << workers_[1]->Log();
    for (const auto& [peer, e] : endpoints_) {
      ASSERT_FALSE(e.worker_address().empty()) << peer << " published no KV endpoint";
      EXPECT_EQ(e.num_blocks(), 4u * 1024 * 1024 / e.block_bytes());
    }
  }

  void TearDown() override {
    workers_.clear();
    std::filesystem::remove_all(dir_);
  }

  // Sends `env` to `peer` and returns its next message of the wanted kind
  // (heartbeats are skipped).
  proto::Envelope Ask(const std::string& peer, const proto::Envelope& env,
                      bool (proto::Envelope::*has)() const) {
    EXPECT_TRUE(server_->Send(peer, env).ok());
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::optional<Inbound> in = server_->Receive(std::chrono::milliseconds(100));
      if (in && in->peer == peer && (in->envelope.*has)()) return in->envelope;
    }
    ADD_FAILURE() << "no answer from " << peer;
    return proto::Envelope();
  }

  // The StepPlan of one greedy step of sequence `seq_id`; `blocks[slot]`
  // are the slot's blocks from logical 0 (sent only when `is_new`).
  static proto::Envelope StepEnvelope(uint64_t step_id, uint64_t seq_id, bool is_new,
                                      const std::vector<int32_t>& tokens, int start_pos,
                                      const std::vector<std::vector<int32_t>>& blocks) {
    proto::Envelope env;
    proto::StepPlan* plan = env.mutable_step_plan();
    plan->set_step_id(step_id);
    proto::SequenceStep* s = plan->add_seqs();
    s->set_seq_id(seq_id);
    s->set_is_new(is_new);
    for (int32_t t : tokens) s->add_token_ids(t);
    s->set_start_pos(uint32_t(start_pos));
    s->set_sample(true);
    s->mutable_sampling()->set_temperature(0.0f);
    s->mutable_sampling()->set_top_p(1.0f);
    s->mutable_sampling()->set_num_logprobs(5);
    s->mutable_sampling()->set_logprobs(true);
    if (is_new) {
      for (int slot = 0; slot < kSlots; ++slot) {
        proto::SlotDelta* d = s->add_deltas();
        d->set_slot(uint32_t(slot));
        d->set_first_logical(0);
        for (int32_t b : blocks[size_t(slot)]) d->add_appended(b);
      }
    }
    return env;
  }

  // Runs StepEnvelope(...) on `peer`; returns the sampled token.
  proto::SampledToken Step(const std::string& peer, uint64_t step_id, uint64_t seq_id,
                           bool is_new, const std::vector<int32_t>& tokens, int start_pos,
                           const std::vector<std::vector<int32_t>>& blocks) {
    proto::Envelope out =
        Ask(peer, StepEnvelope(step_id, seq_id, is_new, tokens, start_pos, blocks),
            &proto::Envelope::has_step_result);
    EXPECT_EQ(out.step_result().error(), "") << peer;
    EXPECT_EQ(out.step_result().tokens_size(), 1) << peer;
    return out.step_result().tokens_size() == 1 ? out.step_result().tokens(0)
                                                 : proto::SampledToken();
  }

  // A TransferPlan moving slot s's blocks src[s][i] -> dst[s][i] to `to`,
  // granted with `write_key` as the coordinator grants it (the receiver's
  // key; another key makes a grant the receiver refuses).
  static proto::Envelope TransferEnvelope(uint64_t id, const proto::KvEndpoint& to,
                                          const std::string& write_key,
                                          const std::vector<std::vector<int32_t>>& src,
                                          const std::vector<std::vector<int32_t>>& dst,
                                          uint32_t timeout_ms) {
    proto::Envelope env;
    proto::TransferPlan* plan = env.mutable_transfer_plan();
    plan->set_transfer_id(id);
    plan->set_timeout_ms(timeout_ms);
    plan->set_write_lifetime_ms(timeout_ms + 2000);
    proto::TransferTarget* target = plan->add_targets();
    *target->mutable_endpoint() = to;
    for (int slot = 0; slot < kSlots; ++slot) {
      for (size_t i = 0; i < src[size_t(slot)].size(); ++i) {
        target->add_src_blocks(uint32_t(src[size_t(slot)][i]));
        target->add_dst_blocks(uint32_t(dst[size_t(slot)][i]));
      }
    }
    const std::vector<uint32_t> dst_blocks(target->dst_blocks().begin(),
                                           target->dst_blocks().end());
    Result<KvWriteGrant> grant =
        GrantKvWrites(write_key, id, plan->write_lifetime_ms(), dst_blocks);
    EXPECT_TRUE(grant.ok()) << grant.status().ToString();
    if (grant.ok()) {
      for (const KvWriteRange& range : grant->ranges) {
        proto::KvWriteRange* r = target->add_write_ranges();
        r->set_first_block(range.first_block);
        r->set_num_blocks(range.num_blocks);
        r->set_tag(range.tag.data(), range.tag.size());
      }
    }
    return env;
  }

  // Runs TransferEnvelope(...) on worker A.
  proto::TransferResult Transfer(uint64_t id, const proto::KvEndpoint& to,
                                 const std::vector<std::vector<int32_t>>& src,
                                 const std::vector<std::vector<int32_t>>& dst,
                                 uint32_t timeout_ms = 5000) {
    return Ask("i0r0", TransferEnvelope(id, to, write_keys_["i1r0"], src, dst, timeout_ms),
               &proto::Envelope::has_transfer_result)
        .transfer_result();
  }

  // A prefills and decodes a 40-token prompt, moves the KV of positions
  // [0, 41) into B's pool (under another block numbering) with a plan of
  // `timeout_ms`, and both then decode position 41: B must sample A's token
  // with bit-identical logprobs, which only holds if B's blocks equal A's.
  // Returns the TransferResult.
  proto::TransferResult HandoffAndCompareDecode(uint32_t timeout_ms) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 37) % 290);
    // A's blocks: slot s uses 8s, 8s+1, 8s+2. B's: another numbering, reversed.
    std::vector<std::vector<int32_t>> a_blocks(kSlots), b_blocks(kSlots), fresh(kSlots);
    for (int s = 0; s < kSlots; ++s) {
      for (int i = 0; i < kBlocksPerSlot; ++i) {
        a_blocks[size_t(s)].push_back(8 * s + i);
        b_blocks[size_t(s)].push_back(500 - 10 * s - i);
        fresh[size_t(s)].push_back(900 + 10 * s + i);
      }
    }
    const proto::SampledToken t1 = Step("i0r0", 1, 7, true, prompt, 0, a_blocks);
    const proto::SampledToken t2 = Step("i0r0", 2, 7, false, {t1.token_id()}, 40, a_blocks);

    const proto::TransferResult moved =
        Transfer(1, endpoints_["i1r0"], a_blocks, b_blocks, timeout_ms);
    EXPECT_EQ(moved.error(), "");
    EXPECT_EQ(moved.blocks(), uint64_t(kSlots * kBlocksPerSlot));
    EXPECT_EQ(moved.bytes(), moved.blocks() * endpoints_["i1r0"].block_bytes());

    const proto::SampledToken on_a = Step("i0r0", 3, 7, false, {t2.token_id()}, 41, a_blocks);
    const proto::SampledToken on_b = Step("i1r0", 1, 7, true, {t2.token_id()}, 41, b_blocks);
    EXPECT_EQ(on_b.token_id(), on_a.token_id());
    EXPECT_EQ(on_b.logprob(), on_a.logprob());  // bit-identical
    EXPECT_EQ(on_b.top_logprobs_size(), on_a.top_logprobs_size());
    for (int i = 0; i < std::min(on_a.top_logprobs_size(), on_b.top_logprobs_size()); ++i) {
      EXPECT_EQ(on_b.top_logprobs(i).token_id(), on_a.top_logprobs(i).token_id());
      EXPECT_EQ(on_b.top_logprobs(i).logprob(), on_a.top_logprobs(i).logprob());
    }
    // Control: the same step over blocks that received nothing differs, so the
    // equality above is the transfer's doing.
    const proto::SampledToken empty = Step("i1r0", 2, 8, true, {t2.token_id()}, 41, fresh);
    EXPECT_NE(empty.logprob(), on_a.logprob());
    return moved;
  }

  std::string dir_;
  std::unique_ptr<ControlServer> server_;
  std::vector<std::unique_ptr<testing::ChildProcess>> workers_;
  std::map<std::string, proto::KvEndpoint> endpoints_;  // by peer name
  std::map<std::string, std::string> write_keys_;       // by peer name
};

TEST_F(KvHandoffTest, DecodeOnTheReceiverMatchesTheSender) {
  HandoffAndCompareDecode(5000);
}

TEST_F(KvHandoffTest, BadPlansFailWithAReasonAndTheWorkerKeepsServing) {
  std::vector<std::vector<int32_t>> blocks(kSlots, std::vector<int32_t>{0});
  for (int s = 0; s < kSlots; ++s) blocks[size_t(s)][0] = s;
  proto::KvEndpoint other_layout = endpoints_["i1r0"];
  other_layout.set_block_bytes(other_layout.block_bytes() * 2);
  proto::TransferResult r = Transfer(1, other_layout, blocks, blocks);
  EXPECT_NE(r.error().find("differs"), std::string::npos) << r.error();

  std::vector<std::vector<int32_t>> out_of_range(kSlots, std::vector<int32_t>{1 << 30});
  r = Transfer(2, endpoints_["i1r0"], blocks, out_of_range);
  EXPECT_NE(r.error().find("OutOfRange"), std::string::npos) << r.error();

  // A grant made with another key (here the sender's own): B refuses it,
  // and the result says so at once, not at the timeout.
  r = Ask("i0r0",
          TransferEnvelope(3, endpoints_["i1r0"], write_keys_["i0r0"], blocks, blocks, 5000),
          &proto::Envelope::has_transfer_result)
          .transfer_result();
  EXPECT_NE(r.error().find("receiver refused"), std::string::npos) << r.error();
  EXPECT_LT(r.seconds(), 5.0);
  EXPECT_NE(workers_[1]->Log().find("refused a block message with no valid grant"),
            std::string::npos)
      << workers_[1]->Log();

  // A write range whose tag is cut short: nothing of the target is sent.
  proto::Envelope short_tag =
      TransferEnvelope(4, endpoints_["i1r0"], write_keys_["i1r0"], blocks, blocks, 5000);
  short_tag.mutable_transfer_plan()->mutable_targets(0)->mutable_write_ranges(0)->set_tag("abc");
  r = Ask("i0r0", short_tag, &proto::Envelope::has_transfer_result).transfer_result();
  EXPECT_NE(r.error().find("3-byte tag"), std::string::npos) << r.error();
  EXPECT_EQ(r.blocks(), 0u);

  r = Transfer(5, endpoints_["i1r0"], blocks, blocks);
  EXPECT_EQ(r.error(), "");
  // B has no kv_sender problem either: it answers steps.
  Step("i1r0", 1, 1, true, {5, 6, 7}, 0, blocks);
}

// Worker A stalls every transfer target for kStallMs after half its blocks.
class KvHandoffStalledSenderTest : public KvHandoffTest {
 protected:
  static constexpr int kStallMs = 1500;
  int SenderStallMs() const override { return kStallMs; }

  // Waits up to `timeout` for `text` in worker A's log.
  bool WaitForSenderLog(const std::string& text, std::chrono::milliseconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (workers_[0]->Log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

TEST_F(KvHandoffStalledSenderTest, StallPastTheTimeoutFailsOnTimeAndStepsKeepFlowing) {
  constexpr uint32_t kTimeoutMs = 700;
  static_assert(kStallMs > int(kTimeoutMs));
  std::vector<std::vector<int32_t>> blocks(kSlots), dst(kSlots);
  for (int s = 0; s < kSlots; ++s) {
    for (int i = 0; i < kBlocksPerSlot; ++i) {
      blocks[size_t(s)].push_back(8 * s + i);
      dst[size_t(s)].push_back(500 - 10 * s - i);
    }
  }
  constexpr int kBlocks = kSlots * kBlocksPerSlot;
  const Clock::time_point sent = Clock::now();
  ASSERT_TRUE(server_
                  ->Send("i0r0", TransferEnvelope(1, endpoints_["i1r0"], write_keys_["i1r0"],
                                                  blocks, dst, kTimeoutMs))
                  .ok());
  // The transfer is now stalled half-way; A must still answer a step.
  const std::string fault = "injected fault: transfer 1 stalls " + std::to_string(kStallMs) +
                            " ms after " + std::to_string((kBlocks + 1) / 2) + " of " +
                            std::to_string(kBlocks) + " blocks";
  ASSERT_TRUE(WaitForSenderLog(fault, std::chrono::milliseconds(kTimeoutMs)))
      << workers_[0]->Log();
  ASSERT_TRUE(
      server_->Send("i0r0", StepEnvelope(1, 7, true, {5, 6, 7, 8}, 0, blocks)).ok());

  std::optional<proto::StepResult> step;
  std::optional<proto::TransferResult> transfer;
  bool step_first = false;
  const Clock::time_point deadline = sent + std::chrono::milliseconds(kTimeoutMs + 1000);
  while ((!step || !transfer) && Clock::now() < deadline) {
    std::optional<Inbound> in = server_->Receive(std::chrono::milliseconds(10));
    if (!in || in->peer != "i0r0") continue;
    if (in->envelope.has_step_result()) {
      step = in->envelope.step_result();
      step_first = !transfer.has_value();
    } else if (in->envelope.has_transfer_result()) {
      transfer = in->envelope.transfer_result();
    }
  }
  ASSERT_TRUE(step.has_value()) << "no StepResult within the transfer's timeout + 1 s\n"
                                << workers_[0]->Log();
  ASSERT_TRUE(transfer.has_value()) << "no TransferResult within its timeout + 1 s\n"
                                    << workers_[0]->Log();
  EXPECT_TRUE(step_first) << "the StepResult waited behind the stalled transfer";
  EXPECT_EQ(step->error(), "");
  EXPECT_EQ(step->tokens_size(), 1);
  EXPECT_EQ(transfer->transfer_id(), 1u);
  EXPECT_NE(transfer->error().find("timed out"), std::string::npos) << transfer->error();
  EXPECT_EQ(transfer->blocks(), uint64_t((kBlocks + 1) / 2));  // the half before the stall
  EXPECT_GE(transfer->seconds(), kTimeoutMs / 1000.0 - 0.01);

  // The worker is unharmed: the next transfer fails the same way, on time.
  const Clock::time_point again = Clock::now();
  const proto::TransferResult second = Transfer(2, endpoints_["i1r0"], blocks, dst, kTimeoutMs);
  EXPECT_NE(second.error().find("timed out"), std::string::npos) << second.error();
  EXPECT_LT(Clock::now() - again, std::chrono::milliseconds(kTimeoutMs + 1000));
}

TEST_F(KvHandoffStalledSenderTest, StallWithinTheTimeoutStillDeliversEveryBlock) {
  const proto::TransferResult moved = HandoffAndCompareDecode(5000);
  EXPECT_GE(moved.seconds(), kStallMs / 1000.0 - 0.01);  // the stall did happen
  EXPECT_NE(workers_[0]->Log().find("injected fault: transfer 1 stalls"), std::string::npos);
}

}  // namespace
}  // namespace headway
