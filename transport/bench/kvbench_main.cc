// pd-kvbench: KV transfer bandwidth and latency between two processes. This process sends
// (prefill side); it spawns transport_conformance_peer as the receiver (decode side) over
// 127.0.0.1 and drives it through its control socket. Time is measured from PostTransfer to
// the sender's completion, which includes the receiver's acknowledgement that every block
// landed. Prints one JSON document.
//
//   pd-kvbench --backend=ucx --ucx_tls=shm,self,tcp --block_kib=2048 --batches=32 --iters=20
//
// Each point also reports `memcpy_gib_per_s`: one thread copying the same blocks between two
// pools of the same size in this process (the single-core ceiling for the same working set);
// with device pools (--memory=cuda, the default for --backend=nccl) it is omitted.
//
//   pd-kvbench --backend=nccl --cuda_device=0 --peer_cuda_device=1 --block_kib=2048
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "transport/conformance/conformance_suite.h"
#include "transport/conformance/peer_control.h"
#include "transport/registry.h"
#include "transport/testing/test_device_memory.h"

ABSL_FLAG(std::string, backend, "tcp", "tcp | ucx | nccl");
ABSL_FLAG(std::string, memory, "auto",
          "pool memory: host | cuda (cudaMalloc; builds with NCCL) | auto (cuda for nccl)");
ABSL_FLAG(int, cuda_device, 0, "cuda pools and nccl: this process's (sender's) device");
ABSL_FLAG(int, peer_cuda_device, 1,
          "cuda pools and nccl: the receiver's device (NCCL needs a different GPU per rank)");
ABSL_FLAG(std::string, ucx_tls, "", "UCX_TLS for both processes (e.g. shm,self,tcp or tcp)");
ABSL_FLAG(std::string, ucx_data_path, "auto", "ucx data path: auto | rma | am");
ABSL_FLAG(std::vector<std::string>, block_kib,
          std::vector<std::string>({"64", "256", "1024", "2048", "4096"}), "block sizes in KiB");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8", "32", "64"}),
          "blocks per transfer");
ABSL_FLAG(std::string, pool_memory, "transport",
          "where both pools live: transport (KvTransport::AllocateHost, as pd-worker does) | "
          "heap (new[])");
ABSL_FLAG(int, iters, 20, "timed transfers per point (after 2 warm-up transfers)");
ABSL_FLAG(std::string, peer_binary,
          PD_BINARY_DIR "/transport/conformance/transport_conformance_peer", "receiver binary");
ABSL_FLAG(std::string, peer_log, "/tmp/pd-kvbench-peer.log", "receiver log file");

namespace pd::transport {
namespace {

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

bool UseCudaPools() {
  const std::string m = absl::GetFlag(FLAGS_memory);
  return m == "cuda" || (m == "auto" && absl::GetFlag(FLAGS_backend) == "nccl");
}

absl::StatusOr<nlohmann::json> RunPoint(uint64_t block_bytes, uint32_t batch) {
  const uint32_t num_blocks = 64;
  const bool cuda = UseCudaPools();
  TransportConfig c;
  c.backend = absl::GetFlag(FLAGS_backend);
  c.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  std::vector<std::string> args = {absl::StrCat("--backend=", c.backend),
                                   absl::StrCat("--block_bytes=", block_bytes),
                                   absl::StrCat("--num_blocks=", num_blocks)};
  if (cuda) {
    args.push_back("--memory=cuda");
    args.push_back(absl::StrCat("--cuda_device=", absl::GetFlag(FLAGS_peer_cuda_device)));
  }
  if (!absl::GetFlag(FLAGS_ucx_tls).empty()) {
    c.ucx_options.push_back({"TLS", absl::GetFlag(FLAGS_ucx_tls)});
    args.push_back(absl::StrCat("--ucx_tls=", absl::GetFlag(FLAGS_ucx_tls)));
  }
  const std::string path = absl::GetFlag(FLAGS_ucx_data_path);
  c.ucx_data_path = path == "rma"  ? UcxDataPath::kRma
                    : path == "am" ? UcxDataPath::kActiveMessage
                                   : UcxDataPath::kAuto;
  args.push_back(absl::StrCat("--ucx_data_path=", path));
  const std::string pool_memory = absl::GetFlag(FLAGS_pool_memory);
  args.push_back(absl::StrCat("--pool_memory=", pool_memory));
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateTransport(c);
  if (!t.ok()) {
    return t.status();
  }
  std::unique_ptr<KvTransport> sender = *std::move(t);
  absl::StatusOr<std::unique_ptr<conformance::PeerControl>> peer = conformance::PeerControl::Start(
      absl::GetFlag(FLAGS_peer_binary), args, absl::GetFlag(FLAGS_peer_log), absl::Seconds(20));
  if (!peer.ok()) {
    return peer.status();
  }
  std::unique_ptr<HostAllocation> allocation;
  std::unique_ptr<char[]> heap;
  char* mem = nullptr;
  if (pool_memory != "transport" && pool_memory != "heap") {
    return absl::InvalidArgumentError(absl::StrCat("--pool_memory: unknown value ", pool_memory));
  }
  if (pool_memory == "transport") {
    PD_ASSIGN_OR_RETURN(allocation, sender->AllocateHost(block_bytes * num_blocks));
    mem = static_cast<char*>(allocation->data());
  } else {
    heap.reset(new char[block_bytes * num_blocks]);
    mem = heap.get();
  }
  std::memset(mem, 0x5a, block_bytes * num_blocks);
  const PoolGeometry g = conformance::TestGeometry(block_bytes, num_blocks);
  MemoryRegion region{mem, block_bytes * num_blocks, MemoryKind::kHost, 0, g};
  std::optional<TestDeviceBuffer> dev;
  if (cuda) {
    PD_ASSIGN_OR_RETURN(TestDeviceBuffer d,
                        TestDeviceBuffer::Allocate(region.size_bytes, c.cuda_device));
    PD_RETURN_IF_ERROR(d.CopyFromHost(0, mem, region.size_bytes));
    dev.emplace(std::move(d));
    region.base = dev->data();
    region.kind = MemoryKind::kCuda;
    region.device = c.cuda_device;
  }
  PD_ASSIGN_OR_RETURN(RegionHandle src, sender->Register(region));
  PD_ASSIGN_OR_RETURN(std::string ep, (*peer)->Call("endpoint"));
  PD_ASSIGN_OR_RETURN(PeerHandle h, sender->Connect(absl::HexStringToBytes(ep)));
  std::vector<BlockPair> pairs;
  std::vector<std::string> dst;
  for (uint32_t i = 0; i < batch; ++i) {
    pairs.push_back({BlockId(i), BlockId(i)});
    dst.push_back(absl::StrCat(i));
  }
  const std::string blocks = absl::StrJoin(dst, ",");
  std::vector<double> seconds;
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int i = -2; i < iters; ++i) {
    const uint64_t tag = static_cast<uint64_t>(i + 3);
    PD_ASSIGN_OR_RETURN(std::string r,
                        (*peer)->Call(absl::StrCat("expect ", tag, " 30000 ", blocks)));
    std::pair<std::string, std::string> idd = absl::StrSplit(r, ' ');
    const std::string desc = absl::HexStringToBytes(idd.second);
    const absl::Time start = absl::Now();
    PD_ASSIGN_OR_RETURN(TransferId id, sender->PostTransfer(h, tag, src, pairs, desc));
    PD_ASSIGN_OR_RETURN(TransferState s, sender->Wait(id, absl::Seconds(30)));
    const double dt = absl::ToDoubleSeconds(absl::Now() - start);
    if (s.phase != TransferPhase::kDone) {
      return absl::InternalError(absl::StrCat("transfer failed: ", s.status.ToString()));
    }
    PD_ASSIGN_OR_RETURN(std::string w, (*peer)->Call(absl::StrCat("wait ", idd.first, " 30000")));
    if (w != "done") {
      return absl::InternalError(absl::StrCat("receiver: ", w));
    }
    if (i >= 0) {
      seconds.push_back(dt);
    }
  }
  (*peer)->Call("quit").IgnoreError();
  PD_RETURN_IF_ERROR(sender->Deregister(src));  // before the allocation goes
  const double bytes = static_cast<double>(block_bytes) * batch;
  // Single-thread memcpy of the same blocks into a second pool of the same size.
  std::vector<double> copy_gibps;
  if (!cuda) {
    std::unique_ptr<char[]> dst_pool(new char[block_bytes * num_blocks]);
    std::memset(dst_pool.get(), 0, block_bytes * num_blocks);
    for (int i = -2; i < iters; ++i) {
      const absl::Time start = absl::Now();
      for (uint32_t b = 0; b < batch; ++b) {
        std::memcpy(dst_pool.get() + uint64_t{b} * block_bytes,
                    mem + uint64_t{b} * block_bytes, block_bytes);
      }
      const double dt = absl::ToDoubleSeconds(absl::Now() - start);
      if (i >= 0) {
        copy_gibps.push_back(bytes / dt / (1 << 30));
      }
    }
    if (dst_pool[block_bytes / 2] != 0x5a) {
      return absl::InternalError("memcpy check failed");
    }
  }
  std::vector<double> gibps;
  for (double s : seconds) {
    gibps.push_back(bytes / s / (1 << 30));
  }
  nlohmann::json j;
  j["block_bytes"] = block_bytes;
  j["batch"] = batch;
  j["bytes_per_transfer"] = bytes;
  j["iters"] = iters;
  j["gib_per_s_median"] = Percentile(gibps, 0.5);
  j["gib_per_s_p10"] = Percentile(gibps, 0.1);
  if (!copy_gibps.empty()) {
    j["memcpy_gib_per_s"] = Percentile(copy_gibps, 0.5);
  }
  j["memory"] = cuda ? "cuda" : "host";
  j["latency_us_p50"] = Percentile(seconds, 0.5) * 1e6;
  j["latency_us_p90"] = Percentile(seconds, 0.9) * 1e6;
  j["latency_us_p99"] = Percentile(seconds, 0.99) * 1e6;
  return j;
}

int Main() {
  nlohmann::json out;
  out["backend"] = absl::GetFlag(FLAGS_backend);
  out["ucx_tls"] = absl::GetFlag(FLAGS_ucx_tls);
  out["ucx_data_path"] = absl::GetFlag(FLAGS_ucx_data_path);
  out["results"] = nlohmann::json::array();
  for (const std::string& kib : absl::GetFlag(FLAGS_block_kib)) {
    for (const std::string& b : absl::GetFlag(FLAGS_batches)) {
      uint64_t block_kib = 0;
      uint32_t batch = 0;
      if (!absl::SimpleAtoi(kib, &block_kib) || !absl::SimpleAtoi(b, &batch) || batch == 0 ||
          batch > 64 || block_kib == 0) {
        std::fprintf(stderr, "bad --block_kib/--batches value (batches 1..64)\n");
        return 2;
      }
      absl::StatusOr<nlohmann::json> r = RunPoint(block_kib << 10, batch);
      if (!r.ok()) {
        std::fprintf(stderr, "%s KiB x %s: %s\n", kib.c_str(), b.c_str(),
                     r.status().ToString().c_str());
        return 1;
      }
      out["results"].push_back(*r);
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace pd::transport

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "pd-kvbench: KV block transfer bandwidth/latency between two processes (JSON output)");
  absl::ParseCommandLine(argc, argv);
  return pd::transport::Main();
}
