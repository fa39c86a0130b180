// Fuzzes SafetensorsFile::Open: the header-length prefix, the JSON header and the validation of
// the tensor table (engine/model/safetensors.h). The input is a whole .safetensors file, served
// from a memfd so that Open maps it like a file on disk.
//
// Oracle: an independent validator written from the rules in safetensors.h must agree with
// Open on accept / reject, and every accepted tensor must view exactly its own bytes of the
// input (dtype, shape, size and contents compared).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

namespace {

using Json = nlohmann::json;
using pd::engine::SafetensorsDtype;

struct RefTensor {
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

std::optional<uint64_t> RefSmall(const Json& v) {
  if (!v.is_number_integer()) {
    return std::nullopt;
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u <= (uint64_t{1} << 62) ? std::optional<uint64_t>(u) : std::nullopt;
  }
  const int64_t s = v.get<int64_t>();
  return s >= 0 && s <= (int64_t{1} << 62) ? std::optional<uint64_t>(s) : std::nullopt;
}

// The rules of safetensors.h, applied to `file`; nullopt when the file must be rejected.
std::optional<std::map<std::string, RefTensor>> RefValidate(absl::string_view file) {
  if (file.size() < 8) {
    return std::nullopt;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(file[i]);
  }
  if (n > file.size() - 8 || n > pd::engine::SafetensorsFile::kMaxHeaderBytes) {
    return std::nullopt;
  }
  const absl::string_view header = file.substr(8, n);
  const uint64_t data_offset = 8 + n;
  const uint64_t data_size = file.size() - data_offset;
  std::map<std::string, int> key_count;
  Json::parser_callback_t count_keys = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1) {
      ++key_count[parsed.get<std::string>()];
    }
    return true;
  };
  const Json j = Json::parse(header.begin(), header.end(), count_keys, false);
  if (j.is_discarded() || !j.is_object()) {
    return std::nullopt;
  }
  for (const auto& [key, count] : key_count) {
    if (count > 1) {
      return std::nullopt;
    }
  }
  std::map<std::string, RefTensor> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      continue;
    }
    const Json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return std::nullopt;
    }
    const auto dtype = pd::engine::ParseSafetensorsDtype(e["dtype"].get<std::string>());
    if (!dtype.has_value()) {
      return std::nullopt;
    }
    RefTensor t{*dtype, {}, 0, 0};
    // product(shape) * element size, refusing overflow of the running product (left to right,
    // as a reader multiplying the dimensions in order would).
    unsigned __int128 elements = 1;
    for (const Json& d : e["shape"]) {
      const auto dim = RefSmall(d);
      if (!dim.has_value()) {
        return std::nullopt;
      }
      t.shape.push_back(static_cast<int64_t>(*dim));
      elements *= *dim;
      if (elements > static_cast<unsigned __int128>(INT64_MAX)) {
        return std::nullopt;
      }
    }
    const unsigned __int128 bytes = elements * pd::engine::SafetensorsDtypeSize(*dtype);
    const auto begin = RefSmall(e["data_offsets"][0]);
    const auto end = RefSmall(e["data_offsets"][1]);
    if (!begin || !end || *begin > *end || *end > data_size || *end - *begin != bytes) {
      return std::nullopt;
    }
    if (bytes > 0 && (data_offset + *begin) % pd::engine::SafetensorsDtypeSize(*dtype) != 0) {
      return std::nullopt;  // the mapping is page-aligned, so file offsets decide alignment
    }
    t.begin = *begin;
    t.end = *end;
    out.emplace(it.key(), std::move(t));
  }
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (const auto& [name, t] : out) {
    if (t.end > t.begin) {
      extents.emplace_back(t.begin, t.end);
    }
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].second) {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static pd::fuzz::MemFile* file = new pd::fuzz::MemFile("safetensors_fuzzer");
  const absl::string_view input = pd::fuzz::AsView(data, size);
  file->Write(input);
  absl::StatusOr<pd::engine::SafetensorsFile> opened =
      pd::engine::SafetensorsFile::Open(file->path());
  const auto ref = RefValidate(input);
  CHECK_EQ(opened.ok(), ref.has_value())
      << "Open and the reference validator disagree; Open says: " << opened.status();
  if (!opened.ok()) {
    CHECK(absl::IsInvalidArgument(opened.status())) << opened.status();
    return 0;
  }
  const uint64_t data_offset = opened->data_offset();
  CHECK_EQ(opened->tensors().size(), ref->size());
  for (const auto& [name, view] : opened->tensors()) {
    auto it = ref->find(name);
    CHECK(it != ref->end()) << name;
    const RefTensor& t = it->second;
    CHECK(view.dtype == t.dtype) << name;
    CHECK(view.shape == t.shape) << name;
    CHECK_EQ(view.size_bytes, t.end - t.begin) << name;
    CHECK_EQ(view.size_bytes, static_cast<uint64_t>(view.num_elements()) *
                                  pd::engine::SafetensorsDtypeSize(view.dtype))
        << name;
    CHECK(!view.ShapeString().empty());
    CHECK_EQ(opened->Find(name), &view) << name;
    if (view.size_bytes == 0) {
      CHECK(view.data == nullptr) << name;
      continue;
    }
    CHECK_EQ(reinterpret_cast<uintptr_t>(view.data) % pd::engine::SafetensorsDtypeSize(view.dtype),
             0u)
        << name;
    CHECK_EQ(std::memcmp(view.data, input.data() + data_offset + t.begin, view.size_bytes), 0)
        << name << " does not view its own bytes";
  }
  return 0;
}
