// ShmRegion: one POSIX shared-memory object (shm_open + mmap), the memory of pd-tierd's DRAM
// tier (G2). tierd creates it (Create: owner side, unlinks it on destruction); the node's
// workers map the same object by name (MapExisting) and copy blocks in and out of it, as
// tierd.proto's Attach flow describes. Both sides map it read-write and MAP_SHARED, so a byte
// written through one mapping is visible through every other, in any process.
//
// Names follow shm_open(3): a leading '/', no other '/', at most NAME_MAX (255) characters,
// e.g. "/pdserve-node1-g2". The object lives in /dev/shm (tmpfs): its size counts against that
// mount's size, which is why Create reserves the memory up front (a short tmpfs otherwise shows
// up as SIGBUS on first touch, long after startup).
//
// Ownership: RAII; the mapping is released on destruction. Pointers from data() die with it.
// Thread-safety: immutable after creation; all methods may be called concurrently. Access to
// the bytes is synchronised by the callers (DramPool's slot states).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::tier_shm {

class ShmRegion {
 public:
  // Owner side: creates `name` with `size_bytes` (> 0) bytes, maps it and, when `reserve`,
  // allocates its pages in /dev/shm (fallocate) so that a too-small /dev/shm fails here. A stale
  // object of the same name (left by a crashed tierd) is unlinked and replaced, with a warning;
  // workers still mapping the old one keep their old memory until they re-attach. The object is
  // unlinked when the returned region is destroyed.
  //   InvalidArgument    bad name or size 0;
  //   ResourceExhausted  /dev/shm has less room than size_bytes (message names the object, the
  //                      bytes needed and available, and how to grow /dev/shm), or mmap failed;
  //   PermissionDenied / NotFound / Internal  shm_open refused (message names the object and
  //                      whether /dev/shm is mounted).
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(absl::string_view name,
                                                           size_t size_bytes, bool reserve = true);

  // Worker side: maps the existing object `name` read-write. Never creates or unlinks it.
  //   NotFound            no such object (tierd not running, or restarted with another name);
  //   FailedPrecondition  the object's size is not `expected_size_bytes` (message has both);
  //   InvalidArgument     bad name; PermissionDenied / Internal for other shm_open/mmap errors.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> MapExisting(absl::string_view name,
                                                                size_t expected_size_bytes);

  // Checks `name` against the shm_open rules above. InvalidArgument naming the rule broken.
  static absl::Status ValidateName(absl::string_view name);

  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion();

  // First byte of the mapping: page-aligned, size_bytes() long.
  uint8_t* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  const std::string& name() const { return name_; }
  // True for the region from Create (it unlinks the object when destroyed).
  bool owner() const { return owner_; }

 private:
  ShmRegion(std::string name, uint8_t* data, size_t size_bytes, bool owner)
      : name_(std::move(name)), data_(data), size_bytes_(size_bytes), owner_(owner) {}

  const std::string name_;
  uint8_t* const data_;  // owned mapping of size_bytes_
  const size_t size_bytes_;
  const bool owner_;
};

}  // namespace pd::tier_shm
