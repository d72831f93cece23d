#include "coordinator/http/api_keys.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace headway {
namespace {

TEST(ApiKeysTest, NoKeysAdmitEverything) {
  ApiKeys keys({});
  EXPECT_TRUE(keys.empty());
  EXPECT_TRUE(keys.Admits(""));
  EXPECT_TRUE(keys.Admits("Bearer anything"));
}

TEST(ApiKeysTest, AnyOfSeveralKeysAdmits) {
  ApiKeys keys({"key-one", "key-two", "k3"});
  EXPECT_EQ(keys.size(), 3u);
  EXPECT_TRUE(keys.Admits("Bearer key-one"));
  EXPECT_TRUE(keys.Admits("Bearer key-two"));
  EXPECT_TRUE(keys.Admits("Bearer k3"));
  // The scheme is case-insensitive (RFC 9110); the key is not.
  EXPECT_TRUE(keys.Admits("bearer key-one"));
  EXPECT_FALSE(keys.Admits("Bearer KEY-ONE"));
}

TEST(ApiKeysTest, RefusesWrongMissingAndMalformed) {
  ApiKeys keys({"s3cret"});
  EXPECT_FALSE(keys.Admits(""));
  EXPECT_FALSE(keys.Admits("Bearer"));
  EXPECT_FALSE(keys.Admits("Bearer "));
  EXPECT_FALSE(keys.Admits("Bearer s3cre"));     // a prefix
  EXPECT_FALSE(keys.Admits("Bearer s3cret "));   // a longer token
  EXPECT_FALSE(keys.Admits("Bearer s3cretX"));
  EXPECT_FALSE(keys.Admits("Basic s3cret"));
  EXPECT_FALSE(keys.Admits("s3cret"));
  EXPECT_FALSE(keys.Admits(std::string("Bearer s3cret\0", 14)));
}

}  // namespace
}  // namespace headway
