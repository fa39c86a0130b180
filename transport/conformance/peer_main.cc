// transport_conformance_peer: the other process of the two-process conformance tests (and of
// pd-kvbench's fork mode). It registers one pool (sentinel 0xEE, or the test pattern with
// --fill_pattern), connects to the test's control socket and answers one-line commands:
//
//   endpoint                          -> ok <hex endpoint>
//   expect <tag> <timeout_ms> <b,..>  -> ok <transfer id> <hex descriptor>
//   wait <id> <timeout_ms>            -> ok done | ok pending | ok failed <code> <message>
//   verify <seed> <src:dst,...>       -> ok | err <first mismatch>
//   sentinel <b,...>                  -> ok | err <block>   (blocks still hold 0xEE)
//   connect <hex endpoint>            -> ok <peer>
//   post <peer> <tag> <timeout_ms> <src:dst,...> <hex descriptor> -> ok <transfer id>
//   reregister                        -> ok
//   quit                              -> ok (then exits 0)
// Errors answer "err <message>". Test-only; talks to 127.0.0.1 only.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transport/conformance/conformance_suite.h"
#include "transport/registry.h"
#include "transport/testing/test_device_memory.h"

ABSL_FLAG(std::string, control, "", "host:port of the test's control socket");
ABSL_FLAG(std::string, backend, "tcp", "transport backend");
ABSL_FLAG(std::string, ucx_tls, "", "UCX TLS for the ucx backend (ucp_config_modify)");
ABSL_FLAG(std::string, ucx_data_path, "auto", "auto|rma|am");
ABSL_FLAG(uint64_t, block_bytes, 4096, "bytes per block");
ABSL_FLAG(uint64_t, num_blocks, 64, "blocks in the pool");
ABSL_FLAG(std::string, dtype, "bf16", "geometry dtype (for mismatch tests)");
ABSL_FLAG(bool, fill_pattern, false, "fill the pool with the test pattern (seed 42)");
ABSL_FLAG(std::string, pool_memory, "heap",
          "where a host pool lives: heap (new[]) | transport (KvTransport::AllocateHost)");
ABSL_FLAG(std::string, memory, "host", "pool memory: host | cuda (cudaMalloc, builds with NCCL)");
ABSL_FLAG(int, cuda_device, 0, "CUDA device of a cuda pool and of the nccl transport");

namespace pd::transport::conformance {
namespace {

class Peer {
 public:
  absl::Status Init() {
    TransportConfig c;
    c.backend = absl::GetFlag(FLAGS_backend);
    if (!absl::GetFlag(FLAGS_ucx_tls).empty()) {
      c.ucx_options.push_back({"TLS", absl::GetFlag(FLAGS_ucx_tls)});
    }
    const std::string path = absl::GetFlag(FLAGS_ucx_data_path);
    c.ucx_data_path = path == "rma"  ? UcxDataPath::kRma
                      : path == "am" ? UcxDataPath::kActiveMessage
                                     : UcxDataPath::kAuto;
    c.cuda_device = absl::GetFlag(FLAGS_cuda_device);
    absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateTransport(c);
    if (!t.ok()) {
      return t.status();
    }
    transport_ = *std::move(t);
    geometry_ = TestGeometry(absl::GetFlag(FLAGS_block_bytes), absl::GetFlag(FLAGS_num_blocks));
    geometry_.dtype = absl::GetFlag(FLAGS_dtype);
    const uint64_t size = geometry_.block_bytes * geometry_.num_blocks;
    const std::string where = absl::GetFlag(FLAGS_pool_memory);
    if (where == "transport") {
      absl::StatusOr<std::unique_ptr<HostAllocation>> a = transport_->AllocateHost(size);
      if (!a.ok()) {
        return a.status();
      }
      allocation_ = *std::move(a);
      base_ = static_cast<char*>(allocation_->data());
    } else if (where == "heap") {
      heap_.reset(new char[size]);
      base_ = heap_.get();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--pool_memory: unknown value ", where));
    }
    if (absl::GetFlag(FLAGS_fill_pattern)) {
      for (uint32_t b = 0; b < geometry_.num_blocks; ++b) {
        FillPattern(42, b, Block(b), geometry_.block_bytes);
      }
    } else {
      std::memset(base_, 0xEE, size);
    }
    if (absl::GetFlag(FLAGS_memory) == "cuda") {
      absl::StatusOr<TestDeviceBuffer> d =
          TestDeviceBuffer::Allocate(size, absl::GetFlag(FLAGS_cuda_device));
      if (!d.ok()) {
        return d.status();
      }
      dev_.emplace(*std::move(d));
      absl::Status s = dev_->CopyFromHost(0, base_, size);
      if (!s.ok()) {
        return s;
      }
    } else if (absl::GetFlag(FLAGS_memory) != "host") {
      return absl::InvalidArgumentError("--memory must be host or cuda");
    }
    return RegisterPool();
  }

  std::string Handle(const std::string& line) {
    std::vector<std::string> a = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (a.empty()) {
      return "err empty command";
    }
    const std::string& cmd = a[0];
    if (cmd == "endpoint") {
      return absl::StrCat("ok ", absl::BytesToHexString(transport_->LocalEndpoint()));
    }
    if (cmd == "expect" && a.size() == 4) {
      uint64_t tag = 0, ms = 0;
      absl::SimpleAtoi(a[1], &tag);
      absl::SimpleAtoi(a[2], &ms);
      std::vector<BlockId> blocks;
      for (absl::string_view b : absl::StrSplit(a[3], ',')) {
        uint32_t v = 0;
        absl::SimpleAtoi(b, &v);
        blocks.push_back(BlockId(v));
      }
      TransferOptions o;
      o.timeout = absl::Milliseconds(ms);
      absl::StatusOr<Expectation> e = transport_->ExpectTransfer(tag, region_, blocks, o);
      if (!e.ok()) {
        return absl::StrCat("err ", e.status().ToString());
      }
      return absl::StrCat("ok ", e->id.value(), " ", absl::BytesToHexString(e->descriptor));
    }
    if (cmd == "wait" && a.size() == 3) {
      uint64_t id = 0, ms = 0;
      absl::SimpleAtoi(a[1], &id);
      absl::SimpleAtoi(a[2], &ms);
      absl::StatusOr<TransferState> s = transport_->Wait(TransferId(id), absl::Milliseconds(ms));
      if (!s.ok()) {
        return absl::StrCat("err ", s.status().ToString());
      }
      if (s->phase == TransferPhase::kDone) {
        return "ok done";
      }
      if (s->phase == TransferPhase::kPending) {
        return "ok pending";
      }
      return absl::StrCat("ok failed ", static_cast<int>(s->status.code()), " ",
                          s->status.message());
    }
    if (cmd == "verify" && a.size() == 3) {
      uint64_t seed = 0;
      absl::SimpleAtoi(a[1], &seed);
      for (absl::string_view p : absl::StrSplit(a[2], ',')) {
        std::pair<std::string, std::string> sd = absl::StrSplit(p, ':');
        uint32_t src = 0, dst = 0;
        if (!absl::SimpleAtoi(sd.first, &src) || !absl::SimpleAtoi(sd.second, &dst) ||
            dst >= geometry_.num_blocks) {
          return "err bad pair";
        }
        const int64_t at = FirstPatternMismatch(seed, src, Block(dst), geometry_.block_bytes);
        if (at >= 0) {
          return absl::StrCat("err block ", dst, " (from ", src, ") differs at byte ", at);
        }
      }
      return "ok";
    }
    if (cmd == "sentinel" && a.size() == 2) {
      for (absl::string_view b : absl::StrSplit(a[1], ',')) {
        uint32_t v = 0;
        absl::SimpleAtoi(b, &v);
        const char* block = Block(v);
        for (uint64_t i = 0; i < geometry_.block_bytes; ++i) {
          if (block[i] != static_cast<char>(0xEE)) {
            return absl::StrCat("err block ", v, " was written");
          }
        }
      }
      return "ok";
    }
    if (cmd == "connect" && a.size() == 2) {
      absl::StatusOr<PeerHandle> p = transport_->Connect(absl::HexStringToBytes(a[1]));
      if (!p.ok()) {
        return absl::StrCat("err ", p.status().ToString());
      }
      return absl::StrCat("ok ", p->value());
    }
    if (cmd == "post" && a.size() == 6) {
      uint32_t peer = 0;
      uint64_t tag = 0, ms = 0;
      absl::SimpleAtoi(a[1], &peer);
      absl::SimpleAtoi(a[2], &tag);
      absl::SimpleAtoi(a[3], &ms);
      std::vector<BlockPair> pairs;
      for (absl::string_view p : absl::StrSplit(a[4], ',')) {
        std::pair<std::string, std::string> sd = absl::StrSplit(p, ':');
        uint32_t src = 0, dst = 0;
        absl::SimpleAtoi(sd.first, &src);
        absl::SimpleAtoi(sd.second, &dst);
        pairs.push_back({BlockId(src), BlockId(dst)});
      }
      TransferOptions o;
      o.timeout = absl::Milliseconds(ms);
      absl::StatusOr<TransferId> id = transport_->PostTransfer(
          PeerHandle(peer), tag, region_, pairs, absl::HexStringToBytes(a[5]), o);
      if (!id.ok()) {
        return absl::StrCat("err ", id.status().ToString());
      }
      return absl::StrCat("ok ", id->value());
    }
    if (cmd == "reregister") {
      absl::Status s = transport_->Deregister(region_);
      if (s.ok()) {
        s = RegisterPool();
      }
      return s.ok() ? "ok" : absl::StrCat("err ", s.ToString());
    }
    return absl::StrCat("err unknown command: ", line);
  }

 private:
  // Host view of block `b`; device pools are read back first.
  char* Block(uint32_t b) {
    const uint64_t off = uint64_t{b} * geometry_.block_bytes;
    if (dev_.has_value() && !dev_->CopyToHost(off, base_ + off, geometry_.block_bytes).ok()) {
      std::memset(base_ + off, 0, geometry_.block_bytes);  // fails verify and sentinel
    }
    return base_ + off;
  }

  absl::Status RegisterPool() {
    MemoryRegion r;
    r.base = dev_.has_value() ? dev_->data() : base_;
    if (dev_.has_value()) {
      r.kind = MemoryKind::kCuda;
      r.device = dev_->device();
    }
    r.size_bytes = geometry_.block_bytes * geometry_.num_blocks;
    r.geometry = geometry_;
    absl::StatusOr<RegionHandle> h = transport_->Register(r);
    if (!h.ok()) {
      return h.status();
    }
    region_ = *h;
    return absl::OkStatus();
  }

  // Declared before transport_: the allocation (which may come from it) is freed after it.
  std::unique_ptr<HostAllocation> allocation_;
  std::unique_ptr<char[]> heap_;
  char* base_ = nullptr;
  std::unique_ptr<KvTransport> transport_;
  PoolGeometry geometry_;
  std::optional<TestDeviceBuffer> dev_;  // a cuda pool; base_ is then its host mirror
  RegionHandle region_;
};

int Main() {
  Peer peer;
  absl::Status s = peer.Init();
  if (!s.ok()) {
    std::fprintf(stderr, "peer init: %s\n", s.ToString().c_str());
    return 2;
  }
  std::pair<std::string, std::string> hp = absl::StrSplit(absl::GetFlag(FLAGS_control), ':');
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (!absl::SimpleAtoi(hp.second, &port) ||
      ::inet_pton(AF_INET, hp.first.c_str(), &addr.sin_addr) != 1) {
    std::fprintf(stderr, "bad --control\n");
    return 2;
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("control connect");
    return 2;
  }
  std::string buf;
  char chunk[4096];
  while (true) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      return 0;  // the test went away
    }
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      const std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      const bool quit = line == "quit";
      const std::string reply = (quit ? std::string("ok") : peer.Handle(line)) + "\n";
      if (::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) {
        return 0;
      }
      if (quit) {
        ::close(fd);
        return 0;
      }
    }
  }
}

}  // namespace
}  // namespace pd::transport::conformance

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pd::transport::conformance::Main();
}
