// How the step_plan fuzz target's inputs hold several control messages: the
// serialized proto::Envelopes one after another, each but the last followed
// by kStepPlanSeparator (bytes a short protobuf message rarely holds, and
// harmless when it does: the piece then fails to parse). Shared by the
// target and the seed generator (make_seeds.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace headway::fuzz {

inline constexpr std::string_view kStepPlanSeparator("\xff" "PLAN", 5);

inline std::vector<std::string_view> SplitMessages(std::string_view input) {
  std::vector<std::string_view> pieces;
  for (;;) {
    const size_t at = input.find(kStepPlanSeparator);
    pieces.push_back(input.substr(0, at));
    if (at == std::string_view::npos) return pieces;
    input.remove_prefix(at + kStepPlanSeparator.size());
  }
}

inline std::string JoinMessages(const std::vector<std::string>& messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) out += kStepPlanSeparator;
    out += messages[i];
  }
  return out;
}

}  // namespace headway::fuzz
