#include "engine/model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; add byte swapping for big-endian hosts");

using Json = nlohmann::json;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kBool, "BOOL", 1},      {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},          {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU16, "U16", 2},        {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},      {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU32, "U32", 4},        {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF64, "F64", 8},        {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kU64, "U64", 8},
};

const DtypeInfo& Info(SafetensorsDtype dtype) {
  return kDtypes[static_cast<size_t>(dtype)];  // kDtypes is in enum order
}

std::string Short(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) {
    s = absl::StrCat(s.substr(0, 77), "...");
  }
  return s;
}

// A JSON integer in [0, 2^62] (keeps later sums and products checkable), else nullopt.
std::optional<uint64_t> SmallUnsigned(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u <= (uint64_t{1} << 62) ? std::optional<uint64_t>(u) : std::nullopt;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    const uint64_t u = static_cast<uint64_t>(v.get<int64_t>());
    return u <= (uint64_t{1} << 62) ? std::optional<uint64_t>(u) : std::nullopt;
  }
  return std::nullopt;
}

struct Extent {
  uint64_t begin;
  uint64_t end;
  const std::string* name;
};

// Parses one tensor entry of the header. `data_size` is the size of the data section.
absl::StatusOr<TensorView> ParseTensor(const std::string& name, const Json& entry,
                                       const uint8_t* data_section, uint64_t data_size,
                                       absl::string_view path) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\": ", why));
  };
  if (!entry.is_object()) {
    return invalid(absl::StrCat("entry must be an object, got ", Short(entry)));
  }
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return invalid("missing or non-string \"dtype\"");
  }
  const std::optional<SafetensorsDtype> dtype =
      ParseSafetensorsDtype(dtype_it->get_ref<const std::string&>());
  if (!dtype.has_value()) {
    return invalid(absl::StrCat("unknown dtype ", Short(*dtype_it)));
  }
  TensorView view;
  view.dtype = *dtype;
  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return invalid("missing or non-array \"shape\"");
  }
  uint64_t elements = 1;
  for (const Json& d : *shape_it) {
    const std::optional<uint64_t> dim = SmallUnsigned(d);
    if (!dim.has_value()) {
      return invalid(
          absl::StrCat("shape ", Short(*shape_it), " must hold non-negative integers below 2^62"));
    }
    view.shape.push_back(static_cast<int64_t>(*dim));
    // Every running product must fit int64_t, the type of TensorView::num_elements() (which
    // multiplies in the same order): [2^62, 2, 0] is empty but would overflow there (found by
    // tests/fuzz/safetensors_fuzzer).
    if (__builtin_mul_overflow(elements, *dim, &elements) ||
        elements > static_cast<uint64_t>(INT64_MAX)) {
      return invalid(absl::StrCat("shape ", Short(*shape_it), " overflows 64 bits"));
    }
  }
  const size_t elem_size = Info(view.dtype).size;
  uint64_t needed = 0;
  if (__builtin_mul_overflow(elements, elem_size, &needed)) {
    return invalid(absl::StrCat("shape ", Short(*shape_it), " overflows 64 bits in bytes"));
  }
  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return invalid("missing \"data_offsets\" or not a pair [begin, end]");
  }
  const std::optional<uint64_t> begin = SmallUnsigned((*offsets_it)[0]);
  const std::optional<uint64_t> end = SmallUnsigned((*offsets_it)[1]);
  if (!begin.has_value() || !end.has_value() || *begin > *end) {
    return invalid(absl::StrCat("data_offsets ", Short(*offsets_it),
                                " must be non-negative integers with begin <= end"));
  }
  if (*end > data_size) {
    return invalid(absl::StrCat("data_offsets [", *begin, ", ", *end,
                                "] run past the end of the data section (", data_size, " bytes)"));
  }
  if (*end - *begin != needed) {
    return invalid(absl::StrCat("shape ", view.ShapeString(), " of ", Info(view.dtype).name,
                                " needs ", needed, " bytes but data_offsets [", *begin, ", ", *end,
                                "] span ", *end - *begin, " bytes"));
  }
  view.size_bytes = needed;
  view.data = needed == 0 ? nullptr : data_section + *begin;
  if (reinterpret_cast<uintptr_t>(view.data) % elem_size != 0) {
    return invalid(absl::StrCat(
        "data at offset ", *begin, " of the data section is not aligned to ", elem_size, " bytes (",
        Info(view.dtype).name, "); re-save the file with the safetensors library"));
  }
  return view;
}

absl::Status CheckOverlaps(std::vector<Extent> extents, absl::string_view path) {
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : *a.name < *b.name;
  });
  for (size_t i = 1; i < extents.size(); ++i) {
    const Extent& prev = extents[i - 1];
    const Extent& cur = extents[i];
    if (cur.begin < prev.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensors \"", *prev.name, "\" [", prev.begin, ", ", prev.end, ") and \"",
          *cur.name, "\" [", cur.begin, ", ", cur.end, ") overlap in the data section"));
    }
  }
  return absl::OkStatus();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::string_view DirName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? absl::string_view(".") : path.substr(0, slash);
}

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }

size_t SafetensorsDtypeSize(SafetensorsDtype dtype) { return Info(dtype).size; }

std::optional<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) {
      return info.dtype;
    }
  }
  return std::nullopt;
}

std::optional<kernels::DType> ToKernelDType(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return kernels::DType::kF32;
    case SafetensorsDtype::kBF16:
      return kernels::DType::kBF16;
    case SafetensorsDtype::kF16:
      return kernels::DType::kF16;
    default:
      return std::nullopt;
  }
}

SafetensorsDtype FromKernelDType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return SafetensorsDtype::kF32;
    case kernels::DType::kBF16:
      return SafetensorsDtype::kBF16;
    case kernels::DType::kF16:
      return SafetensorsDtype::kF16;
    case kernels::DType::kI8:
    case kernels::DType::kF8E4M3:
    case kernels::DType::kI4:
      break;  // KV-cache-only dtypes are never weights
  }
  return SafetensorsDtype::kF32;
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    n *= d;  // validated not to overflow when the view was created
  }
  return n;
}

std::string TensorView::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(absl::string_view path) {
  PD_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const uint64_t size = file.size();
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", size, " bytes, shorter than the 8-byte safetensors header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), sizeof(header_len));
  if (header_len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the file size ", size, " minus 8"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  const char* header = reinterpret_cast<const char*>(file.data()) + 8;
  // The callback sees every key; depth 1 keys are tensor names, which must be unique (JSON
  // objects silently keep the last duplicate).
  std::string duplicate;
  absl::flat_hash_set<std::string> seen;
  Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) {
        duplicate = key;
      }
    }
    return true;
  };
  Json j = Json::parse(header, header + header_len, on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the ", header_len, "-byte header is not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": duplicate tensor name \"", duplicate, "\" in the header"));
  }
  const uint64_t data_offset = 8 + header_len;
  const uint8_t* data_section = file.data() + data_offset;
  const uint64_t data_size = size - data_offset;
  absl::btree_map<std::string, TensorView> tensors;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      continue;
    }
    PD_ASSIGN_OR_RETURN(TensorView view,
                        ParseTensor(it.key(), it.value(), data_section, data_size, path));
    tensors.emplace(it.key(), std::move(view));
  }
  std::vector<Extent> extents;
  for (const auto& [name, view] : tensors) {
    if (view.size_bytes > 0) {
      const uint64_t begin = static_cast<const uint8_t*>(view.data) - data_section;
      extents.push_back(Extent{begin, begin + view.size_bytes, &name});
    }
  }
  PD_RETURN_IF_ERROR(CheckOverlaps(std::move(extents), path));
  return SafetensorsFile(std::move(file), data_offset, std::move(tensors));
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<WeightSet> WeightSet::Open(absl::string_view dir) {
  const std::string index = absl::StrCat(dir, "/model.safetensors.index.json");
  if (FileExists(index)) {
    return OpenIndex(index);
  }
  const std::string single = absl::StrCat(dir, "/model.safetensors");
  if (FileExists(single)) {
    return OpenFile(single);
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json exists"));
}

absl::StatusOr<WeightSet> WeightSet::OpenFile(absl::string_view path) {
  PD_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  WeightSet set;
  set.tensors_ = file.tensors();
  set.files_.push_back(std::move(file));
  return set;
}

absl::StatusOr<WeightSet> WeightSet::OpenIndex(absl::string_view index_path) {
  PD_ASSIGN_OR_RETURN(MappedFile index, MappedFile::Open(index_path));
  const absl::string_view text = index.contents();
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", why));
  };
  if (j.is_discarded() || !j.is_object()) {
    return invalid("not a JSON object");
  }
  auto map_it = j.find("weight_map");
  if (map_it == j.end() || !map_it->is_object()) {
    return invalid("missing \"weight_map\" object");
  }
  // tensor name -> shard file name, and the sorted set of shards.
  absl::btree_map<std::string, std::string> wanted;
  absl::btree_map<std::string, size_t> shard_index;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it->is_string()) {
      return invalid(absl::StrCat("weight_map[\"", it.key(), "\"] is not a string: ", Short(*it)));
    }
    const std::string& file = it->get_ref<const std::string&>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
      return invalid(absl::StrCat("weight_map[\"", it.key(), "\"] = \"", file,
                                  "\" is not a plain file name in the index's directory"));
    }
    wanted.emplace(it.key(), file);
    shard_index.emplace(file, 0);
  }
  WeightSet set;
  const absl::string_view dir = DirName(index_path);
  for (auto& [file, idx] : shard_index) {
    idx = set.files_.size();
    PD_ASSIGN_OR_RETURN(SafetensorsFile shard, SafetensorsFile::Open(absl::StrCat(dir, "/", file)));
    set.files_.push_back(std::move(shard));
  }
  for (const auto& [name, file] : wanted) {
    const SafetensorsFile& shard = set.files_[shard_index[file]];
    const TensorView* view = shard.Find(name);
    if (view == nullptr) {
      return invalid(absl::StrCat("weight_map assigns tensor \"", name, "\" to ", file,
                                  ", which has no such tensor"));
    }
    set.tensors_.emplace(name, *view);
  }
  for (const auto& [file, idx] : shard_index) {
    for (const auto& [name, view] : set.files_[idx].tensors()) {
      auto it = wanted.find(name);
      if (it == wanted.end() || it->second != file) {
        return invalid(absl::StrCat("shard ", file, " holds tensor \"", name,
                                    "\", which weight_map ",
                                    it == wanted.end() ? std::string("does not list")
                                                       : absl::StrCat("assigns to ", it->second)));
      }
    }
  }
  return set;
}

const TensorView* WeightSet::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace pd::engine
