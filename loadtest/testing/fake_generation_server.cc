#include "loadtest/testing/fake_generation_server.h"

#include <grpcpp/alarm.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "pd/v1/generation.grpc.pb.h"

namespace pd::loadtest::testing {

namespace v1 = ::pdserve::v1;

absl::Status FakeGenerationServerOptions::Validate() const {
  if (vocab_size == 0 || block_size == 0 || max_context_tokens == 0) {
    return absl::InvalidArgumentError("vocab_size, block_size and max_context_tokens must be > 0");
  }
  if (tokens_per_message < 1 || default_output_tokens < 1) {
    return absl::InvalidArgumentError("tokens_per_message and default_output_tokens must be >= 1");
  }
  if (fail_every_n < 0 || first_token_delay < absl::ZeroDuration() ||
      token_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("fail_every_n and the delays must be >= 0");
  }
  if (fail_code == absl::StatusCode::kOk) {
    return absl::InvalidArgumentError("fail_code must not be OK");
  }
  if (num_threads < 1 || num_threads > 64) {
    return absl::InvalidArgumentError("num_threads must be in [1, 64]");
  }
  return absl::OkStatus();
}

namespace {

// A call in progress. Every call has exactly one operation pending on its completion queue at
// any time (accept, alarm, write or finish), so its events arrive one after another on one
// polling thread and it needs no lock; it deletes itself after its last event.
class CallBase {
 public:
  virtual ~CallBase() = default;
  // Handles the completion of the pending operation. `shutting_down`: the server is stopping
  // and no new operation may be started (the call must then delete itself).
  virtual void OnEvent(bool ok, bool shutting_down) = 0;
};

}  // namespace

class FakeGenerationServer::Impl {
 public:
  explicit Impl(const FakeGenerationServerOptions& o) : options_(o) {}

  // Leading full blocks of `ids` seen in earlier prompts, in tokens (then remembers all of
  // them). Blocks are identified by a hash chain over the prefix, as a prefix cache would.
  int64_t CachedTokens(const google::protobuf::RepeatedField<uint32_t>& ids) {
    const int64_t bs = options_.block_size;
    uint64_t h = 0xcbf29ce484222325ULL;
    int64_t cached = 0;
    bool hit = true;
    absl::MutexLock lock(&mu_);
    for (int64_t b = 0; (b + 1) * bs <= ids.size(); ++b) {
      for (int64_t i = b * bs; i < (b + 1) * bs; ++i) {
        h = (h ^ ids[static_cast<int>(i)]) * 0x100000001b3ULL;  // FNV-1a over the prefix
      }
      hit = hit && seen_blocks_.contains(h);
      cached += hit ? bs : 0;
      seen_blocks_.insert(h);
    }
    return cached;
  }

  void StreamStarted() {
    absl::MutexLock lock(&mu_);
    ++stats_.requests;
    ++stats_.active_streams;
    stats_.max_active_streams = std::max(stats_.max_active_streams, stats_.active_streams);
  }
  // The final status (or last message) is being issued.
  void StreamAnswered() {
    absl::MutexLock lock(&mu_);
    --stats_.active_streams;
  }
  enum class End { kOk, kFailed, kCancelled };
  void StreamEnded(End end, int64_t tokens) {
    absl::MutexLock lock(&mu_);
    stats_.tokens_sent += tokens;
    (end == End::kOk ? stats_.succeeded : end == End::kFailed ? stats_.failed : stats_.cancelled)++;
  }
  FakeGenerationServerStats Stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  bool WaitForActiveStreams(int64_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stats_.active_streams >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

  void Poll(grpc::ServerCompletionQueue* cq) {
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
      absl::ReaderMutexLock lock(&shutdown_mu_);
      static_cast<CallBase*>(tag)->OnEvent(ok, shutting_down_);
    }
  }

  // Stops starting operations (OnEvent sees shutting_down), then lets the queues drain.
  void StopQueues() {
    {
      absl::MutexLock lock(&shutdown_mu_);
      shutting_down_ = true;
    }
    for (auto& cq : cqs_) {
      cq->Shutdown();
    }
    for (std::thread& t : pollers_) {
      t.join();
    }
  }

  const FakeGenerationServerOptions options_;
  std::atomic<int64_t> arrivals_{0};
  v1::Generation::AsyncService service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  std::vector<std::thread> pollers_;

 private:
  mutable absl::Mutex mu_;
  FakeGenerationServerStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> seen_blocks_ ABSL_GUARDED_BY(mu_);
  // Held shared while an event is handled (operations may start), exclusively to stop that.
  absl::Mutex shutdown_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

namespace {

using Impl = FakeGenerationServer::Impl;

// One Generate stream: accept -> [alarm ->] write -> ... -> write-and-finish (or finish).
class GenerateCall final : public CallBase {
 public:
  GenerateCall(Impl* impl, grpc::ServerCompletionQueue* cq) : impl_(impl), cq_(cq), writer_(&ctx_) {
    impl_->service_.RequestGenerate(&ctx_, &request_, &writer_, cq_, cq_, this);
  }

  void OnEvent(bool ok, bool shutting_down) override {
    if (state_ == State::kAccepting) {
      if (!ok || shutting_down) {
        delete this;  // the server is shutting down: no call was accepted
        return;
      }
      new GenerateCall(impl_, cq_);  // accept the next call
      impl_->StreamStarted();
      Accept();
      return;
    }
    if (state_ == State::kFinishing || shutting_down) {
      if (state_ != State::kFinishing) {
        impl_->StreamAnswered();  // shutdown interrupted it
      }
      if (!ok && end_ == Impl::End::kOk) {
        end_ = Impl::End::kCancelled;  // the last message did not reach the client
      }
      impl_->StreamEnded(end_, sent_);
      delete this;
      return;
    }
    if (state_ == State::kWriting && !ok) {
      // The client went away (cancel, deadline). A cancellation during an alarm wait shows up
      // here too: the write after the alarm fails.
      end_ = Impl::End::kCancelled;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
      return;
    }
    // The alarm fired (write now) or a write completed (wait token_delay, if any, then write).
    WriteAfter(state_ == State::kWaiting ? absl::ZeroDuration() : impl_->options_.token_delay);
  }

 private:
  enum class State { kAccepting, kWaiting, kWriting, kFinishing };

  void Accept() {
    const FakeGenerationServerOptions& o = impl_->options_;
    const int64_t n = impl_->arrivals_.fetch_add(1) + 1;
    request_id_ = absl::StrCat("fake-", n);
    if (!request_.has_token_ids() || request_.token_ids().ids().empty()) {
      end_ = Impl::End::kFailed;
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "token_ids: empty prompt"));
      return;
    }
    for (uint32_t id : request_.token_ids().ids()) {
      if (id >= o.vocab_size) {
        end_ = Impl::End::kFailed;
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("token_ids: id ", id, " >= vocab_size ", o.vocab_size)));
        return;
      }
    }
    if (o.fail_every_n > 0 && n % o.fail_every_n == 0) {
      end_ = Impl::End::kFailed;
      Finish(grpc::Status(static_cast<grpc::StatusCode>(o.fail_code), "injected failure"));
      return;
    }
    prompt_tokens_ = request_.token_ids().ids_size();
    cached_tokens_ = o.simulate_prefix_cache ? impl_->CachedTokens(request_.token_ids().ids()) : 0;
    total_ = request_.sampling().max_tokens() > 0 ? request_.sampling().max_tokens()
                                                  : o.default_output_tokens;
    first_token_ = request_.token_ids().ids(0);
    WriteAfter(o.first_token_delay);
  }

  void WriteAfter(absl::Duration delay) {
    if (delay > absl::ZeroDuration()) {
      state_ = State::kWaiting;
      alarm_.Set(cq_, std::chrono::system_clock::now() + absl::ToChronoNanoseconds(delay), this);
      return;
    }
    const uint32_t vocab = impl_->options_.vocab_size;
    const int64_t k = std::min<int64_t>(impl_->options_.tokens_per_message, total_ - sent_);
    response_.Clear();
    for (int64_t i = 0; i < k; ++i) {
      response_.add_token_ids(static_cast<uint32_t>((first_token_ + sent_ + i) % vocab));
    }
    if (sent_ == 0) {
      response_.set_request_id(request_id_);  // on the first and the last message
    }
    sent_ += k;
    if (sent_ < total_) {
      state_ = State::kWriting;
      writer_.Write(response_, this);
      return;
    }
    response_.set_request_id(request_id_);
    response_.set_finish_reason(v1::FINISH_REASON_LENGTH);
    v1::Usage* u = response_.mutable_usage();
    u->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens_));
    u->set_cached_tokens(static_cast<uint32_t>(cached_tokens_));
    u->set_completion_tokens(static_cast<uint32_t>(total_));
    end_ = Impl::End::kOk;
    state_ = State::kFinishing;
    impl_->StreamAnswered();
    writer_.WriteAndFinish(response_, grpc::WriteOptions(), grpc::Status::OK, this);
  }

  void Finish(const grpc::Status& status) {
    state_ = State::kFinishing;
    impl_->StreamAnswered();
    writer_.Finish(status, this);
  }

  Impl* const impl_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext ctx_;
  v1::GenerateRequest request_;
  grpc::ServerAsyncWriter<v1::GenerateResponse> writer_;
  State state_ = State::kAccepting;
  Impl::End end_ = Impl::End::kCancelled;
  std::string request_id_;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t total_ = 0;
  int64_t sent_ = 0;
  uint32_t first_token_ = 0;
  grpc::Alarm alarm_;
  v1::GenerateResponse response_;
};

// One ListModels call: accept -> finish.
class ListModelsCall final : public CallBase {
 public:
  ListModelsCall(Impl* impl, grpc::ServerCompletionQueue* cq)
      : impl_(impl), cq_(cq), responder_(&ctx_) {
    impl_->service_.RequestListModels(&ctx_, &request_, &responder_, cq_, cq_, this);
  }

  void OnEvent(bool ok, bool shutting_down) override {
    if (!accepted_ && ok && !shutting_down) {
      accepted_ = true;
      new ListModelsCall(impl_, cq_);
      const FakeGenerationServerOptions& o = impl_->options_;
      v1::ListModelsResponse response;
      v1::ModelInfo* m = response.add_models();
      m->set_id(o.model_id);
      m->set_block_size(o.block_size);
      m->set_max_context_tokens(o.max_context_tokens);
      m->set_fingerprint("00");
      m->set_vocab_size(o.vocab_size);
      responder_.Finish(response, grpc::Status::OK, this);
      return;
    }
    delete this;  // finished, or not accepted because the server is shutting down
  }

 private:
  Impl* const impl_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext ctx_;
  v1::ListModelsRequest request_;
  grpc::ServerAsyncResponseWriter<v1::ListModelsResponse> responder_;
  bool accepted_ = false;
};

}  // namespace

FakeGenerationServer::FakeGenerationServer() = default;

absl::StatusOr<std::unique_ptr<FakeGenerationServer>> FakeGenerationServer::Start(
    const FakeGenerationServerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) {
    return s;
  }
  std::unique_ptr<FakeGenerationServer> server(new FakeGenerationServer());
  server->impl_ = std::make_unique<Impl>(options);
  Impl* impl = server->impl_.get();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(&impl->service_);
  for (int i = 0; i < options.num_threads; ++i) {
    impl->cqs_.push_back(builder.AddCompletionQueue());
  }
  impl->server_ = builder.BuildAndStart();
  if (impl->server_ == nullptr || server->port_ == 0) {
    for (auto& cq : impl->cqs_) {
      cq->Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) {
      }
    }
    return absl::UnavailableError(
        absl::StrCat("fake generation server: cannot listen on ", options.address));
  }
  for (auto& cq : impl->cqs_) {
    // Several pending accepts per queue, so bursts of new calls do not wait for re-arming.
    for (int i = 0; i < 4; ++i) {
      new GenerateCall(impl, cq.get());
    }
    new ListModelsCall(impl, cq.get());
    impl->pollers_.emplace_back([impl, q = cq.get()] { impl->Poll(q); });
  }
  return server;
}

FakeGenerationServer::~FakeGenerationServer() { Shutdown(); }

std::string FakeGenerationServer::address() const { return absl::StrCat("127.0.0.1:", port_); }

FakeGenerationServerStats FakeGenerationServer::stats() const { return impl_->Stats(); }

bool FakeGenerationServer::WaitForActiveStreams(int64_t n, absl::Duration timeout) const {
  return impl_->WaitForActiveStreams(n, timeout);
}

void FakeGenerationServer::Shutdown() {
  if (shut_down_.exchange(true) || impl_ == nullptr || impl_->server_ == nullptr) {
    return;
  }
  // Cancels every call: pending operations complete (writes fail), so each call reaches its
  // last event; then no new operation may start and the queues drain.
  impl_->server_->Shutdown(std::chrono::system_clock::now());
  impl_->StopQueues();
}

}  // namespace pd::loadtest::testing
