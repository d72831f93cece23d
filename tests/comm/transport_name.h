// Test names for suites parameterised by a UCX transport list ("sm,self"
// becomes "sm_self": GoogleTest names allow no commas).
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace headway::testing {

inline std::string TransportName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (c == ',') c = '_';
  }
  return name;
}

}  // namespace headway::testing
