// The Jinja subset renderer and chat templates against Python jinja2's
// renders (tests/data/chat_template/expected.json, made by
// make_expected.py next to it).
#include "coordinator/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "coordinator/tokenizer/jinja.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using nlohmann::json;

json LoadExpected() {
  std::ifstream in(testing::TestDataPath("chat_template/expected.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

std::map<std::string, jinja::Value> Context(const json& j) {
  std::map<std::string, jinja::Value> ctx;
  for (auto it = j.begin(); it != j.end(); ++it) ctx[it.key()] = jinja::Value::FromJson(it.value());
  return ctx;
}

TEST(JinjaTest, MatchesPythonJinja2) {
  json expected = LoadExpected();
  ASSERT_TRUE(expected.is_object()) << "cannot read chat_template/expected.json";
  ASSERT_GE(expected["cases"].size(), 5u);
  for (const json& c : expected["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto t = jinja::Template::Parse(c["template"].get<std::string>());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Result<std::string> out = t->Render(Context(c["context"]));
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok());
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(out.status().message(), c["error"].get<std::string>());
    } else {
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(*out, c["expected"].get<std::string>());
    }
  }
}

std::string Render(const std::string& source, const std::map<std::string, jinja::Value>& ctx = {}) {
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) return "PARSE: " + t.status().ToString();
  Result<std::string> out = t->Render(ctx);
  return out.ok() ? *out : "RENDER: " + out.status().ToString();
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("a\n  {% if true %}\nx\n  {% endif %}\nb"), "a\nx\nb");
  EXPECT_EQ(Render("{# c #}\nx"), "x");
}

TEST(JinjaTest, ExpressionsAndScoping) {
  // As in jinja2, ~ binds tighter than +: 1 + (2 ~ 'x') is a type error.
  EXPECT_NE(Render("{{ 1 + 2 ~ 'x' }}").find("unsupported operand"), std::string::npos);
  EXPECT_EQ(Render("{{ (1 + 2) ~ 'x' }}"), "3x");
  EXPECT_EQ(Render("{{ a or 'b' }}|{{ 0 and 1 }}|{{ 'y' if x is defined else 'n' }}"), "b|0|n");
  // set inside a loop does not leak; namespace attributes do.
  EXPECT_EQ(Render("{% set v = 1 %}{% set ns = namespace(v=1) %}{% for i in [1, 2] %}"
                   "{% set v = v + i %}{% set ns.v = ns.v + i %}{% endfor %}{{ v }} {{ ns.v }}"),
            "1 4");
  EXPECT_EQ(Render("{{ m.role }}{{ m['content'][1:] }}",
                   {{"m", jinja::Value(jinja::Object{{"role", jinja::Value("user")},
                                                     {"content", jinja::Value("hey")}})}}),
            "userey");
}

TEST(JinjaTest, UnsupportedConstructsNameThePosition) {
  Result<jinja::Template> t = jinja::Template::Parse("ab\n{% macro f() %}{% endmacro %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("line 2, column 4"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("macro"), std::string::npos);

  std::string r = Render("{{ x | tojson }}");
  EXPECT_NE(r.find("Unimplemented"), std::string::npos) << r;
  EXPECT_NE(r.find("tojson"), std::string::npos) << r;
  EXPECT_NE(r.find("line 1, column 8"), std::string::npos) << r;

  t = jinja::Template::Parse("{% if x %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("never closed"), std::string::npos) << t.status().message();

  t = jinja::Template::Parse("{{ 'abc }}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("unterminated string"), std::string::npos);

  r = Render("{{ 'a' + 1 }}");
  EXPECT_NE(r.find("unsupported operand types for +: 'string' and 'int'"), std::string::npos) << r;
  r = Render("{{ nope.attr }}");
  EXPECT_NE(r.find("undefined"), std::string::npos) << r;
}

TEST(ChatTemplateTest, SmolLm2FromGguf) {
  std::string path = testing::SmolLm2Path();
  HW_REQUIRE_MODEL(path);
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok());
  auto tokenizer = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tokenizer.ok());
  auto chat = ChatTemplate::FromGguf(**gguf, **tokenizer);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  json expected = LoadExpected();
  for (const json& c : expected["cases"]) {
    if (c["name"].get<std::string>().rfind("smollm2_", 0) != 0) continue;
    std::vector<ChatMessage> messages;
    for (const json& m : c["context"]["messages"]) messages.push_back({m["role"], m["content"]});
    Result<std::string> out = chat->Apply(messages, c["context"]["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << c["name"];
  }
}

}  // namespace
}  // namespace headway
