// Safetensors files (https://github.com/huggingface/safetensors), read zero-copy from a mapping.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {...}, "<name>": {"dtype": "F32", "shape": [2, 3],
//                                      "data_offsets": [begin, end]}, ...}
// then the data section; offsets are relative to its start (byte 8 + N). __metadata__ is
// ignored.
//
// SafetensorsFile::Open validates the whole header before anything is exposed, so every
// TensorView points at exactly its own bytes inside the file:
//   - the header length fits in the file (and is at most kMaxHeaderBytes);
//   - the header is a JSON object without duplicate tensor names;
//   - each tensor has a known dtype, a shape of non-negative integers, and data_offsets
//     [begin, end] with begin <= end <= data section size;
//   - product(shape) * dtype size == end - begin (no overflow);
//   - the data of a tensor is aligned to its element size in memory (true for every file the
//     safetensors library writes: it pads the header to 8 bytes and sorts tensors by dtype
//     size), so typed pointers are legal;
//   - no two non-empty tensors overlap. Holes between tensors and trailing bytes are allowed
//     (the reference reader rejects them; they are harmless to a zero-copy reader).
// Every violation is InvalidArgument naming the file, the tensor and the numbers involved.
//
// WeightSet merges one file or a sharded checkpoint (model.safetensors.index.json, whose
// weight_map names the file of each tensor) into one name -> TensorView map.
//
// Ownership: SafetensorsFile / WeightSet own the mappings; TensorView::data stays valid while the
// owner (or the object it was moved into) lives. Thread-safety: immutable after Open; all const
// methods may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/mapped_file.h"
#include "kernels/types.h"

namespace pd::engine {

// Every dtype of the safetensors format.
enum class SafetensorsDtype : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// The header spelling: "BOOL", "U8", ..., "F8_E5M2", "F8_E4M3", "BF16", "F32", ...
absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
// Bytes per element (1, 2, 4 or 8).
size_t SafetensorsDtypeSize(SafetensorsDtype dtype);
// The parse of a header spelling; nullopt for an unknown one.
std::optional<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name);
// F32 / BF16 / F16 as a kernel dtype; nullopt for every other dtype.
std::optional<kernels::DType> ToKernelDType(SafetensorsDtype dtype);
SafetensorsDtype FromKernelDType(kernels::DType dtype);

// One tensor inside a mapped file. Row-major; shape may be empty (a scalar, one element).
struct TensorView {
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // first byte, aligned to the element size; nullptr if empty
  uint64_t size_bytes = 0;     // product(shape) * element size

  int64_t num_elements() const;
  // "[2048, 8192]" for messages.
  std::string ShapeString() const;
};

class SafetensorsFile {
 public:
  // Upper bound on the JSON header (the reference implementation uses the same 100 MB).
  static constexpr uint64_t kMaxHeaderBytes = 100u << 20;

  // Maps and validates `path` (see the file comment).
  // Errors: as MappedFile::Open; InvalidArgument for any format violation.
  static absl::StatusOr<SafetensorsFile> Open(absl::string_view path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return file_.path(); }
  // Tensors by name, sorted.
  const absl::btree_map<std::string, TensorView>& tensors() const { return tensors_; }
  // nullptr when there is no tensor `name`.
  const TensorView* Find(absl::string_view name) const;
  // Byte offset of the data section in the file (8 + header length).
  uint64_t data_offset() const { return data_offset_; }

 private:
  SafetensorsFile(MappedFile file, uint64_t data_offset,
                  absl::btree_map<std::string, TensorView> tensors)
      : file_(std::move(file)), data_offset_(data_offset), tensors_(std::move(tensors)) {}

  MappedFile file_;
  uint64_t data_offset_ = 0;
  absl::btree_map<std::string, TensorView> tensors_;  // data points into file_
};

// The tensors of a whole checkpoint, possibly spread over several files.
class WeightSet {
 public:
  // The checkpoint in directory `dir`: model.safetensors.index.json when it exists, otherwise
  // model.safetensors. NotFound when neither exists; otherwise as OpenIndex / OpenFile.
  static absl::StatusOr<WeightSet> Open(absl::string_view dir);
  // One file.
  static absl::StatusOr<WeightSet> OpenFile(absl::string_view path);
  // A sharded checkpoint: the index's "weight_map" maps every tensor name to a file name in the
  // index's directory. Errors: as SafetensorsFile::Open for each shard; InvalidArgument when
  // the index is not JSON, weight_map is missing or not an object of strings, a file name is
  // empty or contains '/', a mapped tensor is not in its file, or a shard holds a tensor the
  // map does not assign to it (unlisted, or listed under another shard).
  static absl::StatusOr<WeightSet> OpenIndex(absl::string_view index_path);

  WeightSet(WeightSet&&) noexcept = default;
  WeightSet& operator=(WeightSet&&) noexcept = default;
  WeightSet(const WeightSet&) = delete;
  WeightSet& operator=(const WeightSet&) = delete;

  // All tensors by name, sorted.
  const absl::btree_map<std::string, TensorView>& tensors() const { return tensors_; }
  // nullptr when there is no tensor `name`.
  const TensorView* Find(absl::string_view name) const;
  // The mapped files, in the order they were opened (sorted by name for an index).
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  WeightSet() = default;

  std::vector<SafetensorsFile> files_;
  absl::btree_map<std::string, TensorView> tensors_;  // copies of the files' views
};

}  // namespace pd::engine
