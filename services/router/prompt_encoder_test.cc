// PromptEncoder against the real stories260K model and tokenizer: text and token-id prompts as
// GenerationService sends them, chat messages through a chat template, and LoadChatTemplate.
#include "services/router/prompt_encoder.h"

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/stories_front_test_util.h"

namespace pd::router {
namespace {

namespace v1 = pdserve::v1;

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Every message's content, one after the other, then "A:" when a generation prompt is asked.
constexpr char kJoin[] =
    "{% for m in messages %}{{ m.content }} {% endfor %}{% if add_generation_prompt %}A:{% endif "
    "%}";

class PromptEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(LoadStoriesFront(&model_));
    ASSERT_TRUE(model_->add_bos());
  }

  std::unique_ptr<chat::ChatTemplate> Template(const std::string& source, std::string bos = "",
                                               const chat::ChatTemplateLimits& limits = {}) {
    absl::StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::Create(source, bos, "", limits);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::make_unique<chat::ChatTemplate>(*std::move(t)) : nullptr;
  }

  std::vector<uint32_t> Tokens(const std::string& text, bool add_bos) const {
    absl::StatusOr<std::vector<uint32_t>> ids = model_->tokenizer().Encode(text, add_bos, false);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<uint32_t>();
  }

  std::unique_ptr<engine::ModelFront> model_;
};

TEST_F(PromptEncoderTest, TextIsTokenizedWithTheModelsBos) {
  PromptEncoder prompts(model_.get(), nullptr);
  v1::GenerateRequest r;
  r.set_text("Once upon a time");
  absl::StatusOr<std::vector<uint32_t>> ids = prompts.Encode(r);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, Tokens("Once upon a time", true));
  EXPECT_EQ(ids->front(), model_->tokenizer().bos_id());
}

TEST_F(PromptEncoderTest, TokenIdsPassAsSentAndOutOfRangeOnesAreNamed) {
  PromptEncoder prompts(model_.get(), nullptr);
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(5);
  r.mutable_token_ids()->add_ids(7);
  absl::StatusOr<std::vector<uint32_t>> ids = prompts.Encode(r);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<uint32_t>{5, 7}));

  r.mutable_token_ids()->add_ids(512);
  ids = prompts.Encode(r);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.status().message(), "token_ids[2] = 512 is out of range: vocabulary size is 512");
}

TEST_F(PromptEncoderTest, NoPromptIsInvalid) {
  PromptEncoder prompts(model_.get(), nullptr);
  EXPECT_EQ(prompts.Encode(v1::GenerateRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PromptEncoderTest, ChatWithoutATemplateIsRefused) {
  PromptEncoder prompts(model_.get(), nullptr);
  absl::StatusOr<std::vector<uint32_t>> ids = prompts.EncodeChat({{"user", "hi"}}, true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("this model has no chat template"));
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("--chat_template FILE"));
}

TEST_F(PromptEncoderTest, ChatIsRenderedThenTokenizedWithOneBos) {
  PromptEncoder prompts(model_.get(), Template(kJoin));
  absl::StatusOr<std::vector<uint32_t>> ids =
      prompts.EncodeChat({{"system", "Be kind."}, {"user", "Tell a story."}}, true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, Tokens("Be kind. Tell a story. A:", true));
  ids = prompts.EncodeChat({{"user", "Tell a story."}}, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, Tokens("Tell a story. ", true));
}

// A template that writes the BOS token itself gets none from the tokenizer.
TEST_F(PromptEncoderTest, TemplateWithItsOwnBosGetsNoSecond) {
  PromptEncoder prompts(
      model_.get(),
      Template("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "<s>"));
  absl::StatusOr<std::vector<uint32_t>> ids = prompts.EncodeChat({{"user", "Hello"}}, true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, Tokens("<s>Hello", false));
}

TEST_F(PromptEncoderTest, RenderFailuresAreTheRequestsFault) {
  PromptEncoder prompts(model_.get(), Template("{{ raise_exception('roles must alternate') }}"));
  absl::StatusOr<std::vector<uint32_t>> ids = prompts.EncodeChat({{"user", "hi"}}, true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()), StartsWith("chat template: "));
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("roles must alternate"));

  // A render limit (ResourceExhausted from the template) is a 400 too.
  chat::ChatTemplateLimits limits;
  limits.render.max_iterations = 10;
  PromptEncoder bounded(model_.get(),
                        Template("{% for i in range(100) %}x{% endfor %}", "", limits));
  ids = bounded.EncodeChat({{"user", "hi"}}, true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()), StartsWith("chat template: "));
}

// Too many renders at once: Unavailable as the template says it, so the client retries.
TEST_F(PromptEncoderTest, BusyTemplateIsUnavailable) {
  chat::ChatTemplateLimits limits;
  limits.max_in_flight = 1;
  std::unique_ptr<chat::ChatTemplate> t = Template(kJoin, "", limits);
  ASSERT_NE(t, nullptr);
  absl::StatusOr<std::shared_ptr<void>> slot = t->HoldRenderSlotForTest();
  ASSERT_TRUE(slot.ok()) << slot.status();
  PromptEncoder prompts(model_.get(), std::move(t));
  EXPECT_EQ(prompts.EncodeChat({{"user", "hi"}}, true).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(LoadChatTemplateTest, LlamaCheckpointHasNoneUnlessAFileIsGiven) {
  absl::StatusOr<std::unique_ptr<chat::ChatTemplate>> t = LoadChatTemplate(kStoriesModel, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, nullptr);

  absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string file = dir->File("chat.jinja");
  std::ofstream(file) << kJoin;
  t = LoadChatTemplate(kStoriesModel, file);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ((*t)->source(), kJoin);
  EXPECT_EQ((*t)->bos_token(), "");  // llama2.c: no tokenizer_config.json

  const std::string bad = dir->File("bad.jinja");
  std::ofstream(bad) << "{% for %}";
  t = LoadChatTemplate(kStoriesModel, bad);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), StartsWith("--chat_template " + bad + ": "));

  t = LoadChatTemplate(kStoriesModel, dir->File("missing.jinja"));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::router
