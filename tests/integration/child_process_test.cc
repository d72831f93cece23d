// ChildProcess (tests/support/process.h) turns a sanitizer report that a
// child wrote to its log into a failure of the running test, whatever the
// child's exit status: this is how a sanitizer build (README "Tests" >
// "Sanitizers") fails a test whose headway-coordinator or headway-worker hit
// a report. The children here are shells that print what a sanitizer prints.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "tests/support/process.h"

namespace headway {
namespace {

using std::chrono::seconds;

// EXPECT_NONFATAL_FAILURE's statement cannot use locals: the log path is static.
std::string& LogPath() {
  static std::string path;
  return path;
}

// Runs `/bin/sh -c script` to its exit, logging to LogPath().
void RunShell(const std::string& script) {
  testing::ChildProcess child({"/bin/sh", "-c", script}, LogPath());
  ASSERT_NE(child.WaitExit(seconds(10)), -1);
}

class ChildProcessSanitizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path.empty());
    LogPath() = dir_.path + "/child.log";
  }
  testing::ScopedTempDir dir_{"child-process"};
};

TEST_F(ChildProcessSanitizerTest, AsanReportFailsTheTestEvenOnExitZero) {
  EXPECT_NONFATAL_FAILURE(
      RunShell("echo '==42==ERROR: AddressSanitizer: heap-use-after-free on address 0x1'; "
               "echo '    #0 0x1 in headway::Foo() coordinator/foo.cc:12'; "
               "echo 'SUMMARY: AddressSanitizer: heap-use-after-free coordinator/foo.cc:12'; "
               "exit 0"),
      "heap-use-after-free on address 0x1");
}

TEST_F(ChildProcessSanitizerTest, TsanAndUbsanReportsFailTheTest) {
  EXPECT_NONFATAL_FAILURE(
      RunShell("echo 'WARNING: ThreadSanitizer: data race (pid=7)'; "
               "echo 'SUMMARY: ThreadSanitizer: data race comm/x.cc:3 in Run'; exit 66"),
      "WARNING: ThreadSanitizer: data race (pid=7)");
  EXPECT_NONFATAL_FAILURE(
      RunShell("echo 'worker/a.cc:9:5: runtime error: signed integer overflow'; "
               "echo 'SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior worker/a.cc:9:5'"),
      "runtime error: signed integer overflow");
}

// A clean log, and a report that was in the (appended) log before this
// child started, are not this child's: no failure.
TEST_F(ChildProcessSanitizerTest, CleanLogAndEarlierReportsPass) {
  {
    std::ofstream earlier(LogPath());
    earlier << "SUMMARY: AddressSanitizer: 8 byte(s) leaked in 1 allocation(s).\n";
  }
  RunShell("echo 'ready'; exit 3");
}

}  // namespace
}  // namespace headway
