#include "transport/ucx/ucx_internal.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "transport/byte_codec.h"

namespace pd::transport::ucx_internal {

absl::Status UcsError(absl::string_view what, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(s)));
}

absl::StatusOr<std::string> InterfaceOwning(absl::string_view host) {
  in_addr want{};
  const std::string host_str(host);
  if (::inet_pton(AF_INET, host_str.c_str(), &want) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("ucx: not a numeric IPv4 address: ", host));
  }
  if (want.s_addr == htonl(INADDR_ANY)) {
    return std::string();
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("ucx: getifaddrs: ", std::strerror(errno)));
  }
  std::string exact, loopback;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || a->ifa_name == nullptr) {
      continue;
    }
    const std::string name(
        absl::string_view(a->ifa_name)
            .substr(0, absl::string_view(a->ifa_name).find(':')));  // "eth0:1" is an alias of eth0
    if (reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want.s_addr &&
        exact.empty()) {
      exact = name;
    }
    if ((a->ifa_flags & IFF_LOOPBACK) != 0 && loopback.empty()) {
      loopback = name;
    }
  }
  ::freeifaddrs(list);
  if (!exact.empty()) {
    return exact;
  }
  if ((ntohl(want.s_addr) >> 24) == 127 && !loopback.empty()) {
    return loopback;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("ucx: listen address ", host, " belongs to no network interface of this host"));
}

std::string PrintedConfigValue(absl::string_view printed, absl::string_view name) {
  const std::string key = absl::StrCat("UCX_", name, "=");
  for (absl::string_view line : absl::StrSplit(printed, '\n')) {
    if (absl::ConsumePrefix(&line, key)) {
      return std::string(line);
    }
  }
  return "";
}

std::string PrintConfig(const ucp_config_t* config) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) {
    return "";
  }
  ucp_config_print(config, f, nullptr, UCS_CONFIG_PRINT_CONFIG);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

std::string EpInfo(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) {
    return "";
  }
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

std::string LaneTransport(absl::string_view info, absl::string_view role) {
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    if (!absl::StrContains(line, "lane[") || !absl::StrContains(line, role)) {
      continue;
    }
    const size_t colon = line.find(':', line.find(']'));
    const size_t c2 = colon == absl::string_view::npos ? colon : line.find(':', colon + 1);
    if (c2 == absl::string_view::npos) {
      return "";
    }
    absl::string_view rest = line.substr(c2 + 1);
    return std::string(rest.substr(0, rest.find_first_of(" .")));
  }
  return "";
}

bool IsFastTransport(absl::string_view tl) {
  return !tl.empty() && !absl::StartsWith(tl, "tcp") && !absl::StartsWith(tl, "self");
}

bool IsGoodPutTransport(absl::string_view tl) {
  return absl::StartsWith(tl, "rc") || absl::StartsWith(tl, "dc") ||
         absl::StartsWith(tl, "cuda_ipc") || absl::StartsWith(tl, "gdr");
}

bool IsSharedMemoryTransport(absl::string_view tl) {
  return absl::StartsWith(tl, "sysv") || absl::StartsWith(tl, "posix") ||
         absl::StartsWith(tl, "xpmem");
}

std::string EncodeRegionBlob(uint64_t base, absl::string_view packed_rkey, MemoryKind kind,
                             bool mapped) {
  ByteWriter w;
  w.U64(base);
  w.Bytes(packed_rkey);
  w.U8(static_cast<uint8_t>(kind));
  w.U8(mapped ? 1 : 0);
  return w.Take();
}

namespace {

struct RegionBlob {
  uint8_t kind = 0;
  uint8_t mapped = 0;
  bool ok = false;
};

RegionBlob DecodeRegionBlob(absl::string_view blob) {
  ByteReader r(blob);
  r.U64();
  r.Bytes();
  RegionBlob b;
  b.kind = r.U8();
  b.mapped = r.U8();
  b.ok = r.ok();
  return b;
}

}  // namespace

bool DescriptorTargetsDevice(absl::string_view blob) {
  const RegionBlob b = DecodeRegionBlob(blob);
  return b.ok && b.kind == static_cast<uint8_t>(MemoryKind::kCuda);
}

bool DescriptorIsMapped(absl::string_view blob) {
  const RegionBlob b = DecodeRegionBlob(blob);
  return b.ok && b.mapped == 1;
}

}  // namespace pd::transport::ucx_internal
