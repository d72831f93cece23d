#include "comm/curve_keys.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "tests/support/process.h"

namespace headway {
namespace {

TEST(CurveKeysTest, LibzmqHasCurve) { EXPECT_TRUE(CurveAvailable()); }

TEST(CurveKeysTest, WritesAPairThatReadsBack) {
  testing::ScopedTempDir dir("curve-keys");
  auto pair = GenerateCurveKeyPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_EQ(pair->public_key.size(), 40u);
  EXPECT_NE(pair->public_key, pair->secret_key);
  const std::string path = dir.path + "/worker.key";
  ASSERT_TRUE(WriteCurveKeyFiles(*pair, path).ok());

  struct stat st {};
  ASSERT_EQ(::stat((path + "_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // The public file must not leak the secret.
  EXPECT_EQ(testing::ReadText(path).find(pair->secret_key), std::string::npos);

  auto secret = ReadCurveSecretKeyFile(path + "_secret");
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  EXPECT_EQ(secret->public_key, pair->public_key);
  EXPECT_EQ(secret->secret_key, pair->secret_key);
  auto public_key = ReadCurvePublicKeyFile(path);
  ASSERT_TRUE(public_key.ok()) << public_key.status().ToString();
  EXPECT_EQ(*public_key, pair->public_key);
  // The public file is no secret key file.
  auto not_secret = ReadCurveSecretKeyFile(path);
  EXPECT_EQ(not_secret.status().code(), StatusCode::kInvalidArgument);
}

TEST(CurveKeysTest, NeverOverwrites) {
  testing::ScopedTempDir dir("curve-keys");
  auto first = GenerateCurveKeyPair();
  auto second = GenerateCurveKeyPair();
  ASSERT_TRUE(first.ok() && second.ok());
  const std::string path = dir.path + "/a.key";
  std::ofstream(path + "_secret") << "keep me";
  Status s = WriteCurveKeyFiles(*first, path);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(path + "_secret"), std::string::npos) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(path));  // no half-written pair
  EXPECT_EQ(testing::ReadText(path + "_secret"), "keep me");
}

TEST(CurveKeysTest, RefusesAPublicKeyThatIsNotTheSecretsOwn) {
  testing::ScopedTempDir dir("curve-keys");
  auto a = GenerateCurveKeyPair();
  auto b = GenerateCurveKeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string path = dir.path + "/mixed_secret";
  std::ofstream(path) << "curve\n    public-key = \"" << b->public_key << "\"\n    secret-key = \""
                      << a->secret_key << "\"\n";
  auto read = ReadCurveSecretKeyFile(path);
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("does not belong"), std::string::npos)
      << read.status().ToString();
}

TEST(CurveKeysTest, RefusesMalformedAndMissingKeys) {
  testing::ScopedTempDir dir("curve-keys");
  const std::string bad = dir.path + "/bad.key";
  std::ofstream(bad) << "curve\n    public-key = \"tooshort\"\n";
  auto read = ReadCurvePublicKeyFile(bad);
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("40 Z85 characters"), std::string::npos)
      << read.status().ToString();
  EXPECT_EQ(ReadCurvePublicKeyFile(dir.path + "/absent.key").status().code(),
            StatusCode::kNotFound);
  const std::string empty = dir.path + "/empty";
  std::ofstream(empty) << "# nothing here\n";
  EXPECT_EQ(ReadCurvePublicKeyFile(empty).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadAuthorizedKeys(empty).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(CheckZ85Key(std::string(40, ' '), "k").ok());
}

TEST(CurveKeysTest, AuthorizedKeysFromAFileOrADirectory) {
  testing::ScopedTempDir dir("curve-keys");
  std::vector<CurveKeyPair> pairs;
  std::filesystem::create_directory(dir.path + "/clients");
  for (int i = 0; i < 3; ++i) {
    auto pair = GenerateCurveKeyPair();
    ASSERT_TRUE(pair.ok());
    pairs.push_back(*pair);
    // A directory as headway-keygen fills it: public and secret files; the
    // secrets are skipped.
    ASSERT_TRUE(WriteCurveKeyFiles(*pair, dir.path + "/clients/w" + std::to_string(i)).ok());
  }
  auto from_dir = ReadAuthorizedKeys(dir.path + "/clients");
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  ASSERT_EQ(from_dir->size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*from_dir)[i], pairs[i].public_key);

  const std::string list = dir.path + "/authorized";
  std::ofstream(list) << "# two workers\npublic-key = \"" << pairs[0].public_key
                      << "\"\npublic-key = \"" << pairs[2].public_key << "\"\n";
  auto from_file = ReadAuthorizedKeys(list);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(*from_file, (std::vector<std::string>{pairs[0].public_key, pairs[2].public_key}));
}

}  // namespace
}  // namespace headway
