// CPU fake of the CUDA runtime and NCCL entry points the NCCL backend uses (see
// fake_cuda_nccl.h). Defines the C functions declared by cuda_runtime_api.h and nccl.h.
#include "transport/nccl/fake_cuda_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pd::transport::fake_cuda {
namespace {

struct OpState {
  bool done = false;
  bool send = false;
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  size_t bytes = 0;
  int from = 0;  // rank of the sender
  int to = 0;    // rank of the receiver
  // Collectives (engine/parallel/nccl_collective.h): 1 all-reduce (float sum), 2 all-gather
  // (floats); `count` elements (per rank for the all-gather).
  int coll = 0;
  size_t count = 0;
};

struct Pair {
  ncclComm_t ranks[2] = {nullptr, nullptr};
  int joined = 0;
  bool error = false;
  // Pending operations in issue order: sends[r] are rank r's sends, recvs[r] rank r's recvs.
  std::deque<std::shared_ptr<OpState>> sends[2];
  std::deque<std::shared_ptr<OpState>> recvs[2];
  std::deque<std::shared_ptr<OpState>> colls[2];  // collectives, in issue order
};

struct Allocation {
  size_t size = 0;
  int device = 0;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uintptr_t, Allocation> allocations;
  std::map<std::string, std::shared_ptr<Pair>> pairs;  // by unique id
  std::deque<std::pair<std::shared_ptr<OpState>, std::shared_ptr<OpState>>> to_copy;
  bool paused = false;
  int aborts = 0;
  size_t copied = 0;
  std::vector<std::weak_ptr<OpState>> issued;  // for PendingOps
  uint64_t next_id = 1;
  std::thread worker;

  State() {
    worker = std::thread([this] { Run(); });
    worker.detach();  // lives as long as the test process
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [this] { return !paused && !to_copy.empty(); });
      auto [s, r] = to_copy.front();
      to_copy.pop_front();
      lock.unlock();
      // Let pollers see the operation pending for a while, as on a GPU.
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      lock.lock();
      // When an abort ended one side, the other stays pending until its own communicator is
      // aborted: a real kernel whose peer vanished does not complete either.
      if (!s->done && !r->done) {
        std::memcpy(r->rbuf, s->sbuf, s->bytes);
        copied += s->bytes;
        s->done = true;
        r->done = true;
      }
    }
  }
};

State& S() {
  static State* s = new State();
  return *s;
}

thread_local int t_device = 0;

struct GroupEntry {
  bool send = false;
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  size_t bytes = 0;
  int peer = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};
thread_local int t_group_depth = 0;
thread_local std::vector<GroupEntry> t_group;

}  // namespace
}  // namespace pd::transport::fake_cuda

using pd::transport::fake_cuda::OpState;
using pd::transport::fake_cuda::S;

struct CUstream_st {
  int device = 0;
  std::vector<std::shared_ptr<OpState>> ops;  // guarded by S().mu
};

struct CUevent_st {
  std::vector<std::shared_ptr<OpState>> waits;  // guarded by S().mu
};

struct ncclComm {
  std::shared_ptr<pd::transport::fake_cuda::Pair> pair;
  int rank = 0;
  int device = 0;
  bool aborted = false;
  std::vector<std::shared_ptr<OpState>> ops;  // every op it issued (for abort)
};

namespace pd::transport::fake_cuda {
namespace {

// Matches heads of send/recv queues across the pair (caller holds S().mu).
void MatchLocked(Pair& p) {
  for (int from = 0; from < 2; ++from) {
    const int to = 1 - from;
    while (!p.sends[from].empty() && !p.recvs[to].empty()) {
      auto s = p.sends[from].front();
      auto r = p.recvs[to].front();
      p.sends[from].pop_front();
      p.recvs[to].pop_front();
      if (s->bytes != r->bytes) {
        p.error = true;  // reported by ncclCommGetAsyncError; both stay pending until abort
        continue;
      }
      S().to_copy.emplace_back(s, r);
    }
  }
  // Collectives complete when both ranks issued them (computed here, at once): the sum in
  // rank order, or both ranks' chunks in rank order.
  while (!p.colls[0].empty() && !p.colls[1].empty()) {
    auto a = p.colls[0].front(), b = p.colls[1].front();
    p.colls[0].pop_front();
    p.colls[1].pop_front();
    if (a->coll != b->coll || a->count != b->count) {
      p.error = true;  // mismatched collectives: both stay pending until abort
      continue;
    }
    const size_t n = a->count;
    if (a->coll == 1) {
      std::vector<float> sum(n);
      const auto* x = static_cast<const float*>(a->sbuf);
      const auto* y = static_cast<const float*>(b->sbuf);
      for (size_t i = 0; i < n; ++i) sum[i] = x[i] + y[i];
      std::memcpy(a->rbuf, sum.data(), n * sizeof(float));
      std::memcpy(b->rbuf, sum.data(), n * sizeof(float));
    } else {
      std::vector<float> all(2 * n);
      std::memcpy(all.data(), a->sbuf, n * sizeof(float));
      std::memcpy(all.data() + n, b->sbuf, n * sizeof(float));
      std::memcpy(a->rbuf, all.data(), 2 * n * sizeof(float));
      std::memcpy(b->rbuf, all.data(), 2 * n * sizeof(float));
    }
    a->done = b->done = true;
  }
  S().cv.notify_all();
}

}  // namespace

void PauseCopies(bool paused) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().paused = paused;
  S().cv.notify_all();
}

int AbortCount() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().aborts;
}

namespace {

int PendingOpsLocked() {
  int n = 0;
  std::vector<std::weak_ptr<OpState>> live;
  for (auto& w : S().issued) {
    if (auto op = w.lock(); op != nullptr && !op->done) {
      ++n;
      live.push_back(w);
    }
  }
  S().issued = std::move(live);
  return n;
}

}  // namespace

int PendingOps() {
  std::lock_guard<std::mutex> lock(S().mu);
  return PendingOpsLocked();
}

bool WaitForPendingOps(int n, int timeout_ms) {
  std::unique_lock<std::mutex> lock(S().mu);
  return S().cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [n] { return PendingOpsLocked() >= n; });
}

size_t CopiedBytes() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().copied;
}

}  // namespace pd::transport::fake_cuda

using pd::transport::fake_cuda::GroupEntry;
using pd::transport::fake_cuda::kFakeDeviceCount;
using pd::transport::fake_cuda::Pair;
using pd::transport::fake_cuda::t_device;
using pd::transport::fake_cuda::t_group;
using pd::transport::fake_cuda::t_group_depth;

namespace {

ncclResult_t Submit(const GroupEntry& e) {
  // Caller holds S().mu.
  if (e.comm->aborted) {
    return ncclInvalidUsage;
  }
  auto op = std::make_shared<OpState>();
  op->send = e.send;
  op->sbuf = e.sbuf;
  op->rbuf = e.rbuf;
  op->bytes = e.bytes;
  op->from = e.send ? e.comm->rank : e.peer;
  op->to = e.send ? e.peer : e.comm->rank;
  e.stream->ops.push_back(op);
  e.comm->ops.push_back(op);
  S().issued.push_back(op);
  Pair& p = *e.comm->pair;
  (e.send ? p.sends : p.recvs)[e.comm->rank].push_back(op);
  pd::transport::fake_cuda::MatchLocked(p);
  return ncclSuccess;
}

// A collective of `comm` on `stream` (caller does not hold S().mu).
ncclResult_t SubmitCollective(int kind, const void* sbuf, void* rbuf, size_t count,
                              ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat || stream == nullptr) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lock(S().mu);
  if (comm->aborted) return ncclInvalidUsage;
  auto op = std::make_shared<OpState>();
  op->coll = kind;
  op->sbuf = sbuf;
  op->rbuf = rbuf;
  op->count = count;
  stream->ops.push_back(op);
  comm->ops.push_back(op);
  S().issued.push_back(op);
  comm->pair->colls[comm->rank].push_back(op);
  pd::transport::fake_cuda::MatchLocked(*comm->pair);
  return ncclSuccess;
}

ncclResult_t Enqueue(GroupEntry e) {
  if (e.peer < 0 || e.peer > 1 || e.peer == e.comm->rank || e.stream == nullptr) {
    return ncclInvalidArgument;
  }
  if (t_group_depth > 0) {
    t_group.push_back(e);
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(S().mu);
  return Submit(e);
}

}  // namespace

extern "C" {

// ---- CUDA runtime

cudaError_t cudaGetDeviceCount(int* count) {
  *count = kFakeDeviceCount;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kFakeDeviceCount) {
    return cudaErrorInvalidDevice;
  }
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return cudaSuccess; }

const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error (fake)" : "fake cuda error";
}

cudaError_t cudaMalloc(void** p, size_t size) {
  *p = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (*p == nullptr) {
    return cudaErrorMemoryAllocation;
  }
  std::lock_guard<std::mutex> lock(S().mu);
  S().allocations[reinterpret_cast<uintptr_t>(*p)] = {size, t_device};
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  {
    std::lock_guard<std::mutex> lock(S().mu);
    S().allocations.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  std::memset(attr, 0, sizeof(*attr));
  attr->type = cudaMemoryTypeUnregistered;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(S().mu);
  auto it = S().allocations.upper_bound(p);
  if (it != S().allocations.begin()) {
    --it;
    if (p < it->first + it->second.size) {
      attr->type = cudaMemoryTypeDevice;
      attr->device = it->second.device;
      attr->devicePointer = const_cast<void*>(ptr);
    }
  }
  return cudaSuccess;
}

// Stream order: the copy waits for the stream's earlier operations, then runs.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (stream != nullptr) {
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return e;
  }
  for (size_t row = 0; row < height; ++row) {
    std::memmove(static_cast<char*>(dst) + row * dpitch,
                 static_cast<const char*>(src) + row * spitch, width);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new CUstream_st();
  (*stream)->device = t_device;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(S().mu);
      bool all = true;
      for (const auto& op : stream->ops) {
        all = all && op->done;
      }
      if (all) {
        stream->ops.clear();
        return cudaSuccess;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(S().mu);
  event->waits.clear();
  std::vector<std::shared_ptr<OpState>> still;
  for (const auto& op : stream->ops) {
    if (!op->done) {
      event->waits.push_back(op);
      still.push_back(op);
    }
  }
  stream->ops = std::move(still);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(S().mu);
  for (const auto& op : event->waits) {
    if (!op->done) {
      return cudaErrorNotReady;
    }
  }
  return cudaSuccess;
}

// ---- NCCL

ncclResult_t ncclGetVersion(int* version) {
  *version = 22800;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error (fake nccl)" : "fake nccl error";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::lock_guard<std::mutex> lock(S().mu);
  const uint64_t n = S().next_id++;
  std::memcpy(id->internal, &n, sizeof(n));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (nranks != 2 || rank < 0 || rank > 1 || config == nullptr || config->blocking != 0) {
    return ncclInvalidArgument;  // the backend always asks for a 2-rank non-blocking comm
  }
  std::lock_guard<std::mutex> lock(S().mu);
  std::shared_ptr<Pair>& pair = S().pairs[std::string(id.internal, sizeof(id.internal))];
  if (pair == nullptr) {
    pair = std::make_shared<Pair>();
  }
  if (pair->ranks[rank] != nullptr) {
    return ncclInvalidUsage;
  }
  auto* c = new ncclComm();
  c->pair = pair;
  c->rank = rank;
  c->device = t_device;
  pair->ranks[rank] = c;
  ++pair->joined;
  if (pair->joined == 2 && pair->ranks[0]->device == pair->ranks[1]->device) {
    pair->error = true;  // NCCL: "Duplicate GPU detected"
  }
  *comm = c;
  return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (comm->pair->error) {
    *state = ncclInvalidUsage;
  } else if (comm->pair->joined < 2) {
    *state = ncclInProgress;
  } else {
    *state = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(S().mu);
  comm->aborted = true;
  ++S().aborts;
  Pair& p = *comm->pair;
  for (auto& op : comm->ops) {
    op->done = true;  // aborted kernels exit
  }
  p.sends[comm->rank].clear();
  p.recvs[comm->rank].clear();
  p.colls[comm->rank].clear();
  // The comm object stays allocated (leaked): the fake's peer may still point at the pair.
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (type != ncclUint8) {
    return ncclInvalidArgument;  // the backend moves bytes
  }
  GroupEntry e;
  e.send = true;
  e.sbuf = buf;
  e.bytes = count;
  e.peer = peer;
  e.comm = comm;
  e.stream = stream;
  return Enqueue(e);
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (type != ncclUint8) {
    return ncclInvalidArgument;
  }
  GroupEntry e;
  e.rbuf = buf;
  e.bytes = count;
  e.peer = peer;
  e.comm = comm;
  e.stream = stream;
  return Enqueue(e);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (op != ncclSum) return ncclInvalidArgument;
  return SubmitCollective(1, sendbuff, recvbuff, count, datatype, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return SubmitCollective(2, sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) {
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0) {
    return ncclSuccess;
  }
  std::vector<GroupEntry> group = std::move(t_group);
  t_group.clear();
  std::lock_guard<std::mutex> lock(S().mu);
  for (const GroupEntry& e : group) {
    const ncclResult_t r = Submit(e);
    if (r != ncclSuccess) {
      return r;
    }
  }
  return ncclInProgress;  // non-blocking communicators: the caller polls GetAsyncError
}

}  // extern "C"
