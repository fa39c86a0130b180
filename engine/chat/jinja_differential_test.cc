// Differential test: every engine/chat/testdata/<name>.jinja, with each context of
// <name>.json, rendered by this engine and by Python's jinja2 (Debian's python3-jinja2, run by
// testdata/render_jinja.py the way Hugging Face renders chat templates) must give the same
// bytes, or both must fail. A raise_exception failure must carry the same message.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/chat/jinja.h"
#include "gtest/gtest.h"

namespace pd::chat {
namespace {

constexpr char kTestData[] = PD_SOURCE_DIR "/engine/chat/testdata";
constexpr char kPython[] = "/usr/bin/python3";

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return false;
  }
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

TEST(JinjaDifferential, MatchesPythonJinja2) {
  absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create("pd-jinja-diff-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string out_dir = dir->File("python");
  absl::StatusOr<testing::Subprocess> py = testing::Subprocess::Spawn(
      {kPython, absl::StrCat(kTestData, "/render_jinja.py"), kTestData, out_dir},
      dir->File("python.log"));
  ASSERT_TRUE(py.ok()) << py.status() << " (scripts/setup.sh installs python3 and python3-jinja2)";
  absl::StatusOr<testing::ExitInfo> exit = py->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->Success()) << exit->ToString() << "\n"
                               << py->LogTail(30) << "\n(scripts/setup.sh installs python3-jinja2)";

  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(kTestData, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (absl::EndsWith(file, ".jinja")) {
      names.push_back(std::string(absl::StripSuffix(file, ".jinja")));
    }
  }
  ASSERT_FALSE(ec) << ec.message();
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 15u);

  int compared = 0;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    std::string source, contexts_text;
    ASSERT_TRUE(ReadFile(absl::StrCat(kTestData, "/", name, ".jinja"), &source));
    ASSERT_TRUE(ReadFile(absl::StrCat(kTestData, "/", name, ".json"), &contexts_text));
    absl::StatusOr<Value> contexts = ParseJsonValue(contexts_text);
    ASSERT_TRUE(contexts.ok() && contexts->is_list()) << name << ".json: a list of contexts";
    TemplateOptions options;
    options.trim_blocks = options.lstrip_blocks = !absl::EndsWith(name, ".notrim");
    const absl::StatusOr<Template> tmpl = Template::Parse(source, options);
    for (size_t i = 0; i < contexts->list().size(); ++i) {
      SCOPED_TRACE(absl::StrCat("context ", i));
      const std::string base = absl::StrCat(out_dir, "/", name, ".", i);
      const absl::StatusOr<std::string> ours =
          tmpl.ok() ? tmpl->Render(contexts->list()[i]) : tmpl.status();
      std::string expected, error;
      if (ReadFile(base + ".out", &expected)) {
        ASSERT_TRUE(ours.ok()) << ours.status() << "\njinja2 rendered:\n" << expected;
        EXPECT_EQ(*ours, expected);
      } else {
        ASSERT_TRUE(ReadFile(base + ".err", &error)) << "no jinja2 result for " << base;
        EXPECT_FALSE(ours.ok()) << "jinja2 failed with " << error << "we rendered:\n" << *ours;
        absl::string_view err = error;
        if (absl::ConsumePrefix(&err, "TemplateError: ")) {
          // raise_exception(msg): the message is part of the contract.
          EXPECT_EQ(ours.status().message(), absl::StripSuffix(err, "\n"));
        }
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 40);
}

}  // namespace
}  // namespace pd::chat
