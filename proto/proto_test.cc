// Tests of the generated proto code: wire round trips of the main messages, and the rule that
// every element of our .proto files carries a leading comment (checked on pd_protos.desc, the
// descriptor set protoc writes with --include_source_info).
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "pd/v1/generation.grpc.pb.h"
#include "pd/v1/generation.pb.h"
#include "pd/v1/kv_events.grpc.pb.h"
#include "pd/v1/kv_events.pb.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "pd/v1/worker.grpc.pb.h"

namespace pd {
namespace {

namespace gpb = ::google::protobuf;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Serializes `in`, parses the bytes into a fresh message and expects it equal to `in`.
template <typename Message>
Message RoundTrip(const Message& in) {
  std::string wire;
  EXPECT_TRUE(in.SerializeToString(&wire));
  Message out;
  EXPECT_TRUE(out.ParseFromString(wire));
  EXPECT_TRUE(gpb::util::MessageDifferencer::Equals(in, out)) << "in:\n"
                                                              << in.DebugString() << "out:\n"
                                                              << out.DebugString();
  return out;
}

// 16 bytes standing in for a block hash.
std::string FakeHash(char fill) { return std::string(16, fill); }

TEST(ProtoRoundTripTest, GenerateRequestWithText) {
  pdserve::v1::GenerateRequest req;
  req.set_model("stories260K");
  req.set_text("Once upon a time");
  pdserve::v1::SamplingParams* sampling = req.mutable_sampling();
  sampling->set_max_tokens(64);
  sampling->set_temperature(0.7f);
  sampling->set_top_p(0.9f);
  sampling->set_seed(0);  // explicit presence: set to zero is not unset
  sampling->add_stop("\n\n");
  sampling->add_stop_token_ids(2);
  req.set_client_request_id("client-1");
  req.set_cache_salt("tenant-a");
  req.set_timeout_ms(30000);

  pdserve::v1::GenerateRequest out = RoundTrip(req);
  EXPECT_EQ(out.prompt_case(), pdserve::v1::GenerateRequest::kText);
  EXPECT_TRUE(out.sampling().has_seed());
  EXPECT_EQ(out.sampling().seed(), 0u);
  EXPECT_TRUE(out.has_cache_salt());
  EXPECT_FALSE(out.has_tenant());
}

TEST(ProtoRoundTripTest, GenerateRequestWithTokenIds) {
  pdserve::v1::GenerateRequest req;
  for (uint32_t id : {1u, 15043u, 3186u, 4u}) {
    req.mutable_token_ids()->add_ids(id);
  }
  pdserve::v1::GenerateRequest out = RoundTrip(req);
  EXPECT_EQ(out.prompt_case(), pdserve::v1::GenerateRequest::kTokenIds);
  EXPECT_THAT(out.token_ids().ids(), ElementsAre(1u, 15043u, 3186u, 4u));
  EXPECT_FALSE(out.sampling().has_seed());
}

TEST(ProtoRoundTripTest, GenerateResponseFinalMessage) {
  pdserve::v1::GenerateResponse resp;
  resp.add_token_ids(42);
  resp.add_token_ids(2);
  resp.set_text("caf\xc3\xa9");  // UTF-8 "café"
  resp.set_finish_reason(pdserve::v1::FINISH_REASON_STOP);
  resp.mutable_usage()->set_prompt_tokens(37);
  resp.mutable_usage()->set_cached_tokens(32);
  resp.mutable_usage()->set_completion_tokens(9);
  resp.mutable_timings()->set_queue_us(120);
  resp.mutable_timings()->set_first_token_us(18'000'000'000ull);  // > 2^32
  resp.set_request_id("r-00000001");

  pdserve::v1::GenerateResponse out = RoundTrip(resp);
  EXPECT_EQ(out.finish_reason(), pdserve::v1::FINISH_REASON_STOP);
  EXPECT_EQ(out.timings().first_token_us(), 18'000'000'000ull);
  EXPECT_EQ(out.text(), "caf\xc3\xa9");
}

TEST(ProtoRoundTripTest, KvEventBatchWithSnapshotAndEvents) {
  pdserve::internal::v1::KvEventBatch batch;
  batch.set_worker_id("decode-0");
  batch.set_epoch(0x9e3779b97f4a7c15ull);

  pdserve::internal::v1::KvSnapshot* snapshot = batch.mutable_snapshot();
  snapshot->set_sequence(41);
  snapshot->set_reason(pdserve::internal::v1::SNAPSHOT_REASON_HISTORY_TRUNCATED);
  snapshot->set_complete(true);
  pdserve::internal::v1::BlockStored* held = snapshot->add_blocks();
  held->set_block_hashes(FakeHash('a') + FakeHash('b'));
  held->set_tier(pdserve::internal::v1::TIER_HBM);
  held->set_num_tokens(32);

  pdserve::internal::v1::KvEvent* stored = batch.add_events();
  stored->set_sequence(42);
  stored->set_worker_id("decode-0");
  stored->mutable_stored()->set_block_hashes(FakeHash('c'));
  stored->mutable_stored()->set_parent_hash(FakeHash('b'));
  stored->mutable_stored()->set_tier(pdserve::internal::v1::TIER_HBM);
  stored->mutable_stored()->set_num_tokens(16);

  pdserve::internal::v1::KvEvent* removed = batch.add_events();
  removed->set_sequence(43);
  removed->set_worker_id("decode-0");
  removed->mutable_removed()->set_block_hashes(FakeHash('a'));
  removed->mutable_removed()->set_tier(pdserve::internal::v1::TIER_HBM);

  pdserve::internal::v1::KvEvent* cleared = batch.add_events();
  cleared->set_sequence(44);
  cleared->set_worker_id("decode-0");
  cleared->mutable_cleared();

  pdserve::internal::v1::KvEventBatch out = RoundTrip(batch);
  ASSERT_THAT(out.events(), SizeIs(3));
  EXPECT_EQ(out.events(0).event_case(), pdserve::internal::v1::KvEvent::kStored);
  EXPECT_EQ(out.events(1).event_case(), pdserve::internal::v1::KvEvent::kRemoved);
  EXPECT_EQ(out.events(2).event_case(), pdserve::internal::v1::KvEvent::kCleared);
  EXPECT_EQ(out.snapshot().blocks(0).block_hashes().size(), 32u);
}

TEST(ProtoRoundTripTest, ServiceNames) {
  EXPECT_STREQ(pdserve::v1::Generation::service_full_name(), "pdserve.v1.Generation");
  EXPECT_STREQ(pdserve::internal::v1::PrefillService::service_full_name(),
               "pdserve.internal.v1.PrefillService");
  EXPECT_STREQ(pdserve::internal::v1::DecodeService::service_full_name(),
               "pdserve.internal.v1.DecodeService");
  EXPECT_STREQ(pdserve::internal::v1::KvEventService::service_full_name(),
               "pdserve.internal.v1.KvEventService");
  EXPECT_STREQ(pdserve::internal::v1::TierService::service_full_name(),
               "pdserve.internal.v1.TierService");
  EXPECT_STREQ(grpc::health::v1::Health::service_full_name(), "grpc.health.v1.Health");
}

// ---- documentation check -----------------------------------------------------------------------

bool IsBlank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// Appends "file:line: kind full.name" to `out` unless `d` has a non-blank leading comment.
template <typename Descriptor>
void CheckDocumented(const Descriptor& d, const char* kind, std::vector<std::string>* out) {
  gpb::SourceLocation location;
  if (d.GetSourceLocation(&location) && !IsBlank(location.leading_comments)) {
    return;
  }
  std::string where = d.file()->name();
  if (d.GetSourceLocation(&location)) {
    where += ":" + std::to_string(location.start_line + 1);
  }
  out->push_back(where + ": " + kind + " " + d.full_name());
}

void CheckEnum(const gpb::EnumDescriptor& e, std::vector<std::string>* out) {
  CheckDocumented(e, "enum", out);
  for (int i = 0; i < e.value_count(); ++i) {
    CheckDocumented(*e.value(i), "enum value", out);
  }
}

void CheckMessage(const gpb::Descriptor& m, std::vector<std::string>* out) {
  // The entry message protoc synthesises for a map<K, V> field has no source of its own: the
  // map field's comment documents it.
  if (m.options().map_entry()) {
    return;
  }
  CheckDocumented(m, "message", out);
  for (int i = 0; i < m.field_count(); ++i) {
    CheckDocumented(*m.field(i), "field", out);
  }
  // Synthetic oneofs (proto3 `optional`) have no source of their own.
  for (int i = 0; i < m.real_oneof_decl_count(); ++i) {
    CheckDocumented(*m.oneof_decl(i), "oneof", out);
  }
  for (int i = 0; i < m.enum_type_count(); ++i) {
    CheckEnum(*m.enum_type(i), out);
  }
  for (int i = 0; i < m.nested_type_count(); ++i) {
    CheckMessage(*m.nested_type(i), out);
  }
}

// Every message, field, oneof, enum, enum value, service and method of `file` lacking a leading
// comment, as "file:line: kind full.name".
std::vector<std::string> UndocumentedElements(const gpb::FileDescriptor& file) {
  std::vector<std::string> out;
  for (int i = 0; i < file.message_type_count(); ++i) {
    CheckMessage(*file.message_type(i), &out);
  }
  for (int i = 0; i < file.enum_type_count(); ++i) {
    CheckEnum(*file.enum_type(i), &out);
  }
  for (int i = 0; i < file.service_count(); ++i) {
    const gpb::ServiceDescriptor& service = *file.service(i);
    CheckDocumented(service, "service", &out);
    for (int j = 0; j < service.method_count(); ++j) {
      CheckDocumented(*service.method(j), "method", &out);
    }
  }
  return out;
}

TEST(ProtoDocTest, CheckerReportsElementsWithoutComments) {
  // A file without source info: every element counts as undocumented.
  gpb::FileDescriptorProto proto;
  proto.set_name("pd/v1/undocumented.proto");
  proto.set_package("pdserve.test");
  proto.set_syntax("proto3");
  gpb::DescriptorProto* message = proto.add_message_type();
  message->set_name("Bare");
  gpb::FieldDescriptorProto* field = message->add_field();
  field->set_name("x");
  field->set_number(1);
  field->set_type(gpb::FieldDescriptorProto::TYPE_UINT32);
  field->set_label(gpb::FieldDescriptorProto::LABEL_OPTIONAL);
  // map<uint32, float> m = 2: the field counts, its synthetic entry message does not.
  gpb::DescriptorProto* entry = message->add_nested_type();
  entry->set_name("MEntry");
  entry->mutable_options()->set_map_entry(true);
  for (int i = 1; i <= 2; ++i) {
    gpb::FieldDescriptorProto* kv = entry->add_field();
    kv->set_name(i == 1 ? "key" : "value");
    kv->set_number(i);
    kv->set_type(i == 1 ? gpb::FieldDescriptorProto::TYPE_UINT32
                        : gpb::FieldDescriptorProto::TYPE_FLOAT);
    kv->set_label(gpb::FieldDescriptorProto::LABEL_OPTIONAL);
  }
  gpb::FieldDescriptorProto* map = message->add_field();
  map->set_name("m");
  map->set_number(2);
  map->set_type(gpb::FieldDescriptorProto::TYPE_MESSAGE);
  map->set_type_name(".pdserve.test.Bare.MEntry");
  map->set_label(gpb::FieldDescriptorProto::LABEL_REPEATED);
  gpb::DescriptorPool pool;
  const gpb::FileDescriptor* file = pool.BuildFile(proto);
  ASSERT_NE(file, nullptr);
  EXPECT_THAT(UndocumentedElements(*file),
              ElementsAre("pd/v1/undocumented.proto: message pdserve.test.Bare",
                          "pd/v1/undocumented.proto: field pdserve.test.Bare.x",
                          "pd/v1/undocumented.proto: field pdserve.test.Bare.m"));
}

TEST(ProtoDocTest, EveryElementHasLeadingComment) {
  const std::string path = std::string(PD_BINARY_DIR) + "/proto/pd_protos.desc";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::stringstream bytes;
  bytes << in.rdbuf();
  gpb::FileDescriptorSet set;
  ASSERT_TRUE(set.ParseFromString(bytes.str())) << "cannot parse " << path;

  gpb::SimpleDescriptorDatabase database;
  for (const gpb::FileDescriptorProto& file : set.file()) {
    ASSERT_TRUE(database.Add(file)) << file.name();
  }
  gpb::DescriptorPool pool(&database);

  std::vector<std::string> checked_files;
  std::vector<std::string> undocumented;
  for (const gpb::FileDescriptorProto& file_proto : set.file()) {
    const std::string& name = file_proto.name();
    if (name.rfind("pd/", 0) != 0 && name.rfind("grpc/", 0) != 0) {
      continue;
    }
    ASSERT_TRUE(file_proto.has_source_code_info())
        << name << " was compiled without --include_source_info";
    const gpb::FileDescriptor* file = pool.FindFileByName(name);
    ASSERT_NE(file, nullptr) << "cannot build " << name;
    checked_files.push_back(name);
    for (std::string& element : UndocumentedElements(*file)) {
      undocumented.push_back(std::move(element));
    }
  }

  EXPECT_THAT(checked_files,
              ::testing::IsSupersetOf({"pd/v1/generation.proto", "pd/v1/worker.proto",
                                       "pd/v1/kv_events.proto", "pd/v1/tierd.proto",
                                       "grpc/health/v1/health.proto"}));
  std::string report;
  for (const std::string& element : undocumented) {
    report += "  " + element + "\n";
  }
  EXPECT_THAT(undocumented, IsEmpty())
      << undocumented.size() << " proto elements lack a leading // comment:\n"
      << report;
}

}  // namespace
}  // namespace pd
