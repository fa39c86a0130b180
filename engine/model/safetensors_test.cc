#include "engine/model/safetensors.h"

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "engine/model/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A safetensors file: 8-byte length, `header` (space-padded so the data section starts 8-byte
// aligned, as the safetensors library does), `data`.
std::string Build(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, sizeof(n));
  return out + header + data;
}

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<pd::testing::TempDir>(std::move(*dir));
  }

  // Writes `bytes` as `name` and opens it.
  absl::StatusOr<SafetensorsFile> OpenBytes(const std::string& bytes,
                                            const std::string& name = "model.safetensors") {
    WriteFile(dir_->File(name), bytes);
    return SafetensorsFile::Open(dir_->File(name));
  }

  // Expects InvalidArgument whose message contains every fragment.
  void ExpectInvalid(const std::string& bytes, std::vector<std::string> fragments) {
    absl::StatusOr<SafetensorsFile> f = OpenBytes(bytes);
    ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(f.status().message(), HasSubstr(dir_->File("model.safetensors")));
    for (const std::string& fragment : fragments) {
      EXPECT_THAT(f.status().message(), HasSubstr(fragment));
    }
  }

  std::unique_ptr<pd::testing::TempDir> dir_;
};

TEST_F(SafetensorsTest, ReadsTensorsZeroCopy) {
  const std::string data =
      Floats({1, 2, 3, 4, 5, 6}) + std::string("\x80\x3f\x00\x40", 4) + Floats({7});
  const std::string bytes = Build(
      R"({"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
          "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
          "scalar": {"dtype": "F32", "shape": [], "data_offsets": [28, 32]},
          "empty": {"dtype": "F16", "shape": [0, 5], "data_offsets": [32, 32]}})",
      data);
  absl::StatusOr<SafetensorsFile> f = OpenBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), 4u);  // __metadata__ is not a tensor
  const TensorView* a = f->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, SafetensorsDtype::kF32);
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->num_elements(), 6);
  EXPECT_EQ(a->size_bytes, 24u);
  EXPECT_EQ(a->ShapeString(), "[2, 3]");
  EXPECT_EQ(static_cast<const float*>(a->data)[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 8, 0u);
  const TensorView* b = f->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, SafetensorsDtype::kBF16);
  EXPECT_EQ(ToKernelDType(b->dtype), kernels::DType::kBF16);
  EXPECT_EQ(static_cast<const uint16_t*>(b->data)[0], 0x3f80);  // 1.0 in bf16
  EXPECT_EQ(f->Find("scalar")->num_elements(), 1);
  EXPECT_EQ(static_cast<const float*>(f->Find("scalar")->data)[0], 7.0f);
  EXPECT_EQ(f->Find("empty")->data, nullptr);
  EXPECT_EQ(f->Find("empty")->num_elements(), 0);
  EXPECT_EQ(f->Find("missing"), nullptr);
  EXPECT_EQ(f->data_offset() % 8, 0u);

  // Views survive a move of the file (the mapping is not remapped).
  const void* before = a->data;
  SafetensorsFile moved = std::move(*f);
  EXPECT_EQ(moved.Find("a")->data, before);
}

TEST_F(SafetensorsTest, DtypeNames) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "F64", "I64", "U64"}) {
    std::optional<SafetensorsDtype> d = ParseSafetensorsDtype(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(SafetensorsDtypeName(*d), name);
  }
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kI64), 8u);
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kF8E4M3), 1u);
  EXPECT_FALSE(ParseSafetensorsDtype("F4").has_value());
  EXPECT_FALSE(ToKernelDType(SafetensorsDtype::kI32).has_value());
}

TEST_F(SafetensorsTest, TooShortAndHeaderLengthBeyondFile) {
  ExpectInvalid("abc", {"3 bytes", "8-byte"});
  std::string bytes =
      Build(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({1}));
  const uint64_t huge = bytes.size();  // more than size - 8
  std::memcpy(bytes.data(), &huge, sizeof(huge));
  ExpectInvalid(bytes, {absl::StrCat("header length ", huge), absl::StrCat(bytes.size())});
  const uint64_t enormous = ~uint64_t{0};
  std::memcpy(bytes.data(), &enormous, sizeof(enormous));
  ExpectInvalid(bytes, {"header length 18446744073709551615"});
}

TEST_F(SafetensorsTest, HeaderMustBeAJsonObject) {
  ExpectInvalid(Build("{\"a\": ", ""), {"not valid JSON"});
  ExpectInvalid(Build("[1, 2]", ""), {"not a JSON object"});
  ExpectInvalid(Build(R"({"a": 5})", ""), {"tensor \"a\"", "must be an object"});
}

TEST_F(SafetensorsTest, UnknownDtypeNamesTensorAndDtype) {
  ExpectInvalid(Build(R"({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})",
                      std::string(16, '\0')),
                {"tensor \"w\"", "unknown dtype \"F128\""});
}

TEST_F(SafetensorsTest, BadShapesAndOffsets) {
  ExpectInvalid(
      Build(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", Floats({1})),
      {"tensor \"w\"", "shape [-1]"});
  ExpectInvalid(Build(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", Floats({1})),
                {"tensor \"w\"", "\"shape\""});
  ExpectInvalid(
      Build(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", Floats({1})),
      {"tensor \"w\"", "begin <= end"});
  ExpectInvalid(Build(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", Floats({1})),
                {"tensor \"w\"", "data_offsets"});
  ExpectInvalid(Build(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4],
                               "data_offsets": [0, 4]}})",
                      Floats({1})),
                {"tensor \"w\"", "overflows"});
  // Found by tests/fuzz/safetensors_fuzzer: an empty tensor whose leading dimensions overflow
  // int64 (num_elements() multiplies them in order).
  ExpectInvalid(Build(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 2, 0],
                               "data_offsets": [0, 0]}})",
                      Floats({1})),
                {"tensor \"w\"", "overflows"});
}

TEST_F(SafetensorsTest, OffsetsPastTheEnd) {
  ExpectInvalid(
      Build(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})", Floats({1, 2})),
      {"tensor \"w\"", "data_offsets [0, 12]", "past the end", "(8 bytes)"});
}

TEST_F(SafetensorsTest, SizeMismatch) {
  ExpectInvalid(Build(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
                      Floats({1, 2, 3, 4})),
                {"tensor \"w\"", "shape [2, 2] of F32 needs 16 bytes", "[0, 12] span 12 bytes"});
  ExpectInvalid(Build(R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})",
                      Floats({1, 2, 3, 4})),
                {"needs 8 bytes", "span 16 bytes"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  ExpectInvalid(Build(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                      Floats({1, 2, 3, 4})),
                {"\"a\" [0, 12)", "\"b\" [8, 16)", "overlap"});
  // Same range twice.
  ExpectInvalid(Build(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                      Floats({1})),
                {"overlap"});
  // Empty tensors overlap nothing; holes are allowed.
  absl::StatusOr<SafetensorsFile> f =
      OpenBytes(Build(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                          "c": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})",
                      Floats({1, 2, 3, 4})));
  EXPECT_TRUE(f.ok()) << f.status();
}

TEST_F(SafetensorsTest, DuplicateNames) {
  ExpectInvalid(Build(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      Floats({1, 2})),
                {"duplicate tensor name \"a\""});
}

TEST_F(SafetensorsTest, MisalignedData) {
  ExpectInvalid(Build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
                      std::string(8, '\0')),
                {"tensor \"b\"", "not aligned to 4 bytes"});
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(SafetensorsFile::Open(dir_->File("nope.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(WeightSet::Open(dir_->path()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, WriterOutputIsReadable) {
  std::vector<SafetensorsTensorSpec> specs = {
      {"z.small", SafetensorsDtype::kBF16, {3}},
      {"a.big", SafetensorsDtype::kF32, {2, 2}},
      {"m.bytes", SafetensorsDtype::kU8, {5}},
      {"b.big", SafetensorsDtype::kF32, {1}},
  };
  const std::string path = dir_->File("written.safetensors");
  absl::StatusOr<SafetensorsWriter> w = SafetensorsWriter::Create(path, specs);
  ASSERT_TRUE(w.ok()) << w.status();
  // Larger elements first, then by name: every tensor naturally aligned.
  ASSERT_EQ(w->order().size(), 4u);
  EXPECT_EQ(w->order()[0].name, "a.big");
  EXPECT_EQ(w->order()[1].name, "b.big");
  EXPECT_EQ(w->order()[2].name, "z.small");
  EXPECT_EQ(w->order()[3].name, "m.bytes");
  EXPECT_EQ(w->data_bytes(), 16u + 4u + 6u + 5u);
  EXPECT_EQ(w->Finish().code(), absl::StatusCode::kFailedPrecondition);  // nothing written
  ASSERT_TRUE(w->Append(Floats({1, 2, 3, 4, 5}).data(), 20).ok());
  const uint16_t halves[3] = {0x3f80, 0x4000, 0x4040};
  ASSERT_TRUE(w->Append(halves, sizeof(halves)).ok());
  EXPECT_EQ(w->Append("abcdef", 6).code(), absl::StatusCode::kFailedPrecondition);  // too much
  ASSERT_TRUE(w->Append("abcde", 5).ok());
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_EQ(w->Append("x", 1).code(), absl::StatusCode::kFailedPrecondition);

  const std::string bytes = ReadFile(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_THAT(bytes.substr(8, header_len),
              AllOf(HasSubstr("\"__metadata__\":{\"format\":\"pt\"}"), HasSubstr("\"a.big\"")));
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(static_cast<const float*>(f->Find("b.big")->data)[0], 5.0f);
  EXPECT_EQ(static_cast<const uint16_t*>(f->Find("z.small")->data)[2], 0x4040);
  EXPECT_EQ(std::string(static_cast<const char*>(f->Find("m.bytes")->data), 5), "abcde");
  EXPECT_EQ(ReadFile(path + ".tmp"), "");  // renamed away

  EXPECT_EQ(SafetensorsWriter::Create(
                path, {{"x", SafetensorsDtype::kF32, {1}}, {"x", SafetensorsDtype::kF32, {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(dir_->File("no/such/dir/x.safetensors"), {}).status().code(),
            absl::StatusCode::kNotFound);
}

class ShardedTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    WriteFile(dir_->File("model-00001-of-00002.safetensors"),
              Build(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                    Floats({1, 2, 3})));
    WriteFile(
        dir_->File("model-00002-of-00002.safetensors"),
        Build(R"({"c": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({4})));
  }
  absl::StatusOr<WeightSet> OpenIndex(const std::string& index) {
    WriteFile(dir_->File("model.safetensors.index.json"), index);
    return WeightSet::Open(dir_->path());
  }
};

constexpr char kIndex[] = R"({"metadata": {"total_size": 16}, "weight_map": {
    "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
    "c": "model-00002-of-00002.safetensors"}})";

TEST_F(ShardedTest, MergesShards) {
  absl::StatusOr<WeightSet> w = OpenIndex(kIndex);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->files().size(), 2u);
  ASSERT_EQ(w->tensors().size(), 3u);
  EXPECT_EQ(static_cast<const float*>(w->Find("b")->data)[0], 3.0f);
  EXPECT_EQ(static_cast<const float*>(w->Find("c")->data)[0], 4.0f);
  // The index wins over a single file in the same directory.
  WriteFile(dir_->File("model.safetensors"), Build("{}", ""));
  w = WeightSet::Open(dir_->path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->tensors().size(), 3u);
  // Views survive moving the set.
  const void* c = w->Find("c")->data;
  WeightSet moved = std::move(*w);
  EXPECT_EQ(moved.Find("c")->data, c);
}

TEST_F(ShardedTest, IndexErrors) {
  absl::StatusOr<WeightSet> w = OpenIndex(R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(),
              AllOf(HasSubstr("\"d\""), HasSubstr("model-00002-of-00002.safetensors"),
                    HasSubstr("no such tensor")));
  w = OpenIndex(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), AllOf(HasSubstr("\"b\""), HasSubstr("does not list")));
  w = OpenIndex(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  w = OpenIndex(R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("plain file name"));
  w = OpenIndex(R"({"weight_map": {"a": 3}})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  w = OpenIndex(R"({"metadata": {}})");
  EXPECT_THAT(w.status().message(), HasSubstr("weight_map"));
  w = OpenIndex("not json");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  w = OpenIndex(R"({"weight_map": {"a": "model-00003-of-00003.safetensors"}})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  // A corrupt shard is reported with its own path.
  WriteFile(dir_->File("model-00002-of-00002.safetensors"), "bad");
  w = OpenIndex(kIndex);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

}  // namespace
}  // namespace pd::engine
