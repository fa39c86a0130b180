#include "engine/chat/chat_template.h"

#include <fstream>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::chat {
namespace {

using ::testing::HasSubstr;

constexpr char kChatMl[] =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const std::vector<ChatMessage> kConversation = {{"system", "Be brief."}, {"user", "Hi"}};

TEST(ChatTemplateTest, RendersMessagesAndGenerationPrompt) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(kChatMl, "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render(kConversation, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*t->Render({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, TrimsBlocksLikeHuggingFace) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(
      "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n"
      "  {% endif %}\n{% endfor %}\n{{ eos_token }}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render(kConversation, false), "<s>\n[Hi]\n</s>");
}

// A call-only assistant turn, as pd-router gives it: content "" flagged as null by the
// client, arguments parsed into an object with the client's text beside them. DeepSeek's
// template (this is its tool-call branch, cut down) tests `content is none` and writes the
// arguments with `+`: it sees None and the text. A template that writes `arguments | tojson`
// and tests `reasoning_content is not none` (Qwen3's) sees "" and the object.
TEST(ChatTemplateTest, CallOnlyTurnsAsEachTemplateReadsThem) {
  absl::StatusOr<Value> calls =
      ParseJsonValue(R"([{"id": "c1", "type": "function", "function": {"name": "f",
                         "arguments": {"city": "Paris"}}}])");
  ASSERT_TRUE(calls.ok()) << calls.status();
  Dict fields;
  fields.Set(Value::String("tool_calls"), *calls);
  ChatMessage call{"assistant", ""};
  call.content_none = true;
  call.fields = Value::MakeDict(std::move(fields));
  call.call_arguments = {R"({"city":  "Paris"})"};
  const std::vector<ChatMessage> messages = {{"user", "Weather?"}, call};

  absl::StatusOr<ChatTemplate> deepseek = ChatTemplate::Create(
      "{% for m in messages %}{% if m['role'] == 'assistant' and m['content'] is none %}"
      "{% for tool in m['tool_calls'] %}{{ tool['function']['name'] + ':' + "
      "tool['function']['arguments'] }}{% endfor %}{% elif m['content'] is not none %}"
      "{{ m['role'] + '=' + m['content'] + ';' }}{% endif %}{% endfor %}",
      "", "");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status();
  EXPECT_TRUE(deepseek->none_call_content());
  EXPECT_TRUE(deepseek->text_call_arguments());
  EXPECT_EQ(*deepseek->Render(messages, false), R"(user=Weather?;f:{"city":  "Paris"})");

  absl::StatusOr<ChatTemplate> qwen = ChatTemplate::Create(
      "{% for m in messages %}{% if m.reasoning_content is not none %}{{ m.role }}:"
      "{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}"
      "{% endfor %};{% endif %}{% endfor %}",
      "", "");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_FALSE(qwen->none_call_content());
  EXPECT_FALSE(qwen->text_call_arguments());
  EXPECT_EQ(*qwen->Render(messages, false), R"(user:Weather?;assistant:{"city": "Paris"};)");
}

TEST(ChatTemplateTest, ExtraVarsAndRaiseException) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be user') }}"
      "{% endif %}{{ tools | tojson }}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Value> extra = ParseJsonValue(R"({"tools": [{"name": "f"}]})");
  ASSERT_TRUE(extra.ok());
  EXPECT_EQ(*t->Render({{"user", "x"}}, false, *extra), "[{\"name\": \"f\"}]");
  EXPECT_EQ(t->Render(kConversation, false).status(),
            absl::InvalidArgumentError("first message must be user"));
}

TEST(ChatTemplateTest, SyntaxErrorNamesLine) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create("ok\n{% if %}", "", "");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(t.status()));
  EXPECT_THAT(t.status().message(), HasSubstr("line 2"));
}

TEST(ChatTemplateTest, TokenizerConfigForms) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromTokenizerConfigJson(
      R"({"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
          "bos_token": {"content": "<|begin|>", "lstrip": false}, "eos_token": "<|end|>"})",
      "cfg");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token(), "<|begin|>");
  EXPECT_EQ(*t->Render({{"user", "x"}}, false), "<|begin|>x<|end|>");

  t = ChatTemplate::FromTokenizerConfigJson(
      R"({"chat_template": [{"name": "tool_use", "template": "T"},
                            {"name": "default", "template": "D"}], "bos_token": null})",
      "cfg");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source(), "D");
  EXPECT_EQ(t->bos_token(), "");

  EXPECT_TRUE(absl::IsNotFound(
      ChatTemplate::FromTokenizerConfigJson(R"({"bos_token": "<s>"})", "cfg").status()));
  EXPECT_TRUE(absl::IsNotFound(ChatTemplate::FromTokenizerConfigJson(
                                   R"({"chat_template": [{"name": "x", "template": "T"}]})", "cfg")
                                   .status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(ChatTemplate::FromTokenizerConfigJson("{not json", "cfg").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ChatTemplate::FromTokenizerConfigJson(R"({"chat_template": 3})", "cfg").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ChatTemplate::FromTokenizerConfigJson(R"({"chat_template": "x", "eos_token": 1})", "cfg")
          .status()));
}

TEST(ChatTemplateTest, FromModelDirFallsBackToChatTemplateJinja) {
  absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  EXPECT_TRUE(absl::IsNotFound(ChatTemplate::FromModelDir(dir->path()).status()));
  std::ofstream(dir->File("tokenizer_config.json")) << R"({"eos_token": "</s>"})";
  EXPECT_TRUE(absl::IsNotFound(ChatTemplate::FromModelDir(dir->path()).status()));
  std::ofstream(dir->File("chat_template.jinja")) << "{{ messages | length }}{{ eos_token }}\n";
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromModelDir(dir->path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render(kConversation, false), "2</s>");
  std::ofstream(dir->File("tokenizer_config.json")) << R"({"chat_template": "cfg"})";
  t = ChatTemplate::FromModelDir(dir->path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source(), "cfg");
}

constexpr char kHostile[] =
    "{% for i in range(1000000) %}{% for j in range(1000000) %}{{ i }}{% endfor %}{% endfor %}";

TEST(ChatTemplateTest, SampleRenderRefusesAPathologicalTemplate) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(kHostile, "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Status s = t->CheckRendersSample();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("the chat template exceeds its limits on a 3-message "
                                     "sample conversation: template render exceeded its "
                                     "memory limit"));
  // A template that works, and one that rejects the sample by design, load.
  t = ChatTemplate::Create(kChatMl, "", "");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->CheckRendersSample().ok());
  t = ChatTemplate::Create("{{ raise_exception('system message required') }}", "", "");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->CheckRendersSample().ok());
}

TEST(ChatTemplateTest, RendersInFlightAreBounded) {
  ChatTemplateLimits limits;
  limits.max_in_flight = 2;
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(kChatMl, "", "", limits);
  ASSERT_TRUE(t.ok()) << t.status();
  const ChatTemplate copy = *t;  // copies share the count
  {
    absl::StatusOr<std::shared_ptr<void>> a = t->HoldRenderSlotForTest();
    absl::StatusOr<std::shared_ptr<void>> b = copy.HoldRenderSlotForTest();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(t->Render(kConversation, false).status(),
              absl::UnavailableError("chat template: 2 renders are running already; retry"));
    EXPECT_TRUE(absl::IsUnavailable(copy.HoldRenderSlotForTest().status()));
  }
  // Released slots are free again, refused ones took none.
  EXPECT_TRUE(t->Render(kConversation, false).ok());
  EXPECT_TRUE(t->HoldRenderSlotForTest().ok());
}

TEST(ChatTemplateTest, LimitsAreValidated) {
  ChatTemplateLimits limits;
  limits.max_in_flight = 0;
  EXPECT_EQ(ChatTemplate::Create(kChatMl, "", "", limits).status(),
            absl::InvalidArgumentError("chat template max_in_flight must be positive, got 0"));
  limits = ChatTemplateLimits();
  limits.render.max_iterations = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(ChatTemplate::Create(kChatMl, "", "", limits).status()));
}

}  // namespace
}  // namespace pd::chat
