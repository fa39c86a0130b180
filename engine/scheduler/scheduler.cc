#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/scheduler/ngram_proposer.h"
#include "engine/scheduler/request_checks.h"
#include "engine/scheduler/sequence.h"
#include "engine/scheduler/tier_restore.h"
#include "engine/scheduler/token_sampling.h"

namespace pd::engine {

Scheduler::Scheduler(SchedulerConfig config, WindowPolicy window, CompressPolicy compress,
                     LlamaForward* forward, kvcache::KvCacheManager* kv_cache,
                     const Tokenizer* tokenizer, std::string fingerprint, Clock* clock)
    : config_(std::move(config)),
      window_(window),
      compress_(compress),
      forward_(forward),
      kv_(kv_cache),
      tokenizer_(tokenizer),
      fingerprint_(std::move(fingerprint)),
      clock_(clock),
      score_buffers_(std::make_shared<ScoreBufferPool>(forward->device())),
      handoffs_(kv_cache, forward->vocab_size()) {}

Scheduler::~Scheduler() {
  for (MaskThread& t : mask_threads_) t.thread.join();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    SchedulerConfig config, LlamaForward* forward, kvcache::KvCacheManager* kv_cache,
    const Tokenizer* tokenizer, std::string model_fingerprint, Clock* clock) {
  PD_RETURN_IF_ERROR(config.Validate());
  if (forward == nullptr || kv_cache == nullptr || tokenizer == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError(
        "scheduler: forward, kv cache, tokenizer and clock are required");
  }
  if (config.max_batch_tokens > forward->options().max_batch_tokens ||
      config.max_running > forward->options().max_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: max_batch_tokens ", config.max_batch_tokens, " / max_running ",
                     config.max_running, " exceed the forward pass's ",
                     forward->options().max_batch_tokens, " / ", forward->options().max_seqs));
  }
  PD_ASSIGN_OR_RETURN(WindowPolicy window,
                      WindowPolicy::Create(config.kv_sink_tokens, config.kv_window_tokens,
                                           kv_cache->block_size(), forward->config().seq_len));
  if (window.enabled() && forward->config().mla()) {
    return absl::UnimplementedError(
        "scheduler: the sink + window KV policy re-rotates cached keys, which a multi-head "
        "latent attention cache does not hold per head; not supported for MLA models");
  }
  PD_ASSIGN_OR_RETURN(
      CompressPolicy compress,
      CompressPolicy::Create(config.kv_policy, config.kv_budget_tokens, config.kv_recent_tokens,
                             kv_cache->block_size(), forward->config().seq_len));
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(config), window, compress, forward, kv_cache,
                                             tokenizer, std::move(model_fingerprint), clock));
  s->logits_.resize(forward->options().max_seqs * forward->vocab_size());
  return s;
}

absl::StatusOr<BlockHash> Scheduler::SeedFor(const std::string& cache_salt) {
  auto it = seeds_.find(cache_salt);
  if (it != seeds_.end()) {
    return it->second;
  }
  HashSeedInput in;
  in.model_fingerprint = fingerprint_;
  in.kv_dtype = config_.kv_dtype;
  in.block_size = static_cast<uint32_t>(kv_->block_size());
  in.cache_salt = cache_salt;
  PD_ASSIGN_OR_RETURN(BlockHash seed, ComputeHashSeed(in));
  seeds_.emplace(cache_salt, seed);
  return seed;
}

absl::StatusOr<CompressPolicy> Scheduler::PrefillPolicy(const GenerationRequest& request) const {
  const KvPolicySpec& spec = request.prefill_kv_policy;
  if (spec.policy.empty()) {
    return CompressPolicy();
  }
  const std::string id = request.id.ToString();
  if (spec.policy != "snapkv") {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": prefill kv_policy \"",
                                                   spec.policy, "\" (only snapkv compresses on "
                                                   "the prefill worker)"));
  }
  if (!request.resume.tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": prefill kv_policy snapkv with resumed tokens"));
  }
  if (window_.enabled()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", id, ": prefill kv_policy snapkv: this worker runs the sink + window policy"));
  }
  absl::StatusOr<CompressPolicy> policy =
      CompressPolicy::Create(spec.policy, spec.budget_tokens, spec.recent_tokens,
                             kv_->block_size(), forward_->config().seq_len);
  if (!policy.ok()) {
    return absl::Status(policy.status().code(),
                        absl::StrCat("request ", id, ": ", policy.status().message()));
  }
  return policy;
}

absl::Status Scheduler::Submit(GenerationRequest request) {
  const std::string id = request.id.ToString();
  PD_RETURN_IF_ERROR(CheckPrompt(request, forward_->config()));
  if (!evacuated_.ok() && request.on_prefilled == nullptr) {
    return evacuated_;
  }
  const auto resumed = static_cast<int64_t>(request.resume.tokens.size());
  if (resumed > 0 &&
      static_cast<int64_t>(request.prompt.size()) + resumed >= forward_->config().seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": prompt of ", request.prompt.size(), " tokens and ", resumed,
                     " resumed tokens do not fit the context of ", forward_->config().seq_len));
  }
  int64_t needed = window_.MaxBlocks(
      kv_->NumBlocksForTokens(static_cast<int64_t>(request.prompt.size()) + resumed + 1));
  // H2O / SnapKV govern every request but a prefill-only one, which runs the decode worker's
  // policy when it names one (SnapKV only: H2O's scores go on with decoding).
  CompressPolicy policy = compress_;
  if (request.on_prefilled != nullptr) {
    PD_RETURN_IF_ERROR(window_.CheckPrefillOnly(
        id, static_cast<int64_t>(request.prompt.size() + request.resume.tokens.size())));
    PD_ASSIGN_OR_RETURN(policy, PrefillPolicy(request));
  } else if (!request.prefill_kv_policy.policy.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": prefill_kv_policy is for prefill-only requests"));
  }
  needed = policy.MaxBlocks(needed);
  if (needed > kv_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": prompt needs ", needed,
                                                   " KV blocks, the pool has ", kv_->num_blocks()));
  }
  PD_RETURN_IF_ERROR(CheckOptions(request, forward_->config()));
  auto same = [&](const std::unique_ptr<Sequence>& s) { return s->request.id == request.id; };
  if (std::any_of(waiting_.begin(), waiting_.end(), same) ||
      std::any_of(running_.begin(), running_.end(), same) || handoffs_.Holds(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already queued or running"));
  }
  if (static_cast<int64_t>(waiting_.size()) >= config_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("scheduler queue full (", config_.max_waiting, " waiting)"));
  }
  auto seq = std::make_unique<Sequence>();
  PD_ASSIGN_OR_RETURN(seq->seed, SeedFor(request.cache_salt));
  seq->kv_id = kvcache::SequenceId(next_sequence_id_++);
  seq->tokens = request.prompt;
  seq->prompt_len = request.prompt.size();
  seq->compress = policy;
  seq->detok = std::make_unique<DecodeStream>(tokenizer_, request.prompt.back());
  if (request.sampling.grammar != nullptr) {
    seq->matcher = std::make_shared<grammar::Matcher>(request.sampling.grammar);
  }
  seq->submitted = clock_->Now();
  seq->request = std::move(request);
  PD_RETURN_IF_ERROR(ReplayResume(seq.get()));
  if (seq->num_resumed > 0) {
    // A migrated stream has a client waiting mid-stream: it is admitted before new requests
    // (after preempted ones and earlier migrated ones).
    auto first_new =
        std::find_if(waiting_.begin(), waiting_.end(), [](const std::unique_ptr<Sequence>& s) {
          return !s->admitted_once && s->num_resumed == 0;
        });
    waiting_.insert(first_new, std::move(seq));
  } else {
    waiting_.push_back(std::move(seq));
  }
  return absl::OkStatus();
}

// A migrated request's tokens (request.resume) become its first generated tokens, with the
// state generating them here would have left: text decoded, matcher moved on, nothing to emit.
// Tokens that could not have been streamed (one that ends generation, one the grammar refuses,
// more than max_tokens) or a text offset past their text are InvalidArgument.
absl::Status Scheduler::ReplayResume(Sequence* seq) {
  const ResumeState& resume = seq->request.resume;
  if (resume.tokens.empty()) {
    if (resume.text_offset != 0) {
      return absl::InvalidArgumentError(absl::StrCat("request ", seq->request.id.ToString(),
                                                     ": resume text offset ", resume.text_offset,
                                                     " without resumed tokens"));
    }
    return absl::OkStatus();
  }
  const ModelConfig& c = forward_->config();
  const SamplingOptions& so = seq->request.sampling;
  const std::string id = seq->request.id.ToString();
  if (so.max_tokens > 0 && resume.tokens.size() >= so.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": ", resume.tokens.size(),
                                                   " resumed tokens leave nothing of max_tokens ",
                                                   so.max_tokens));
  }
  for (size_t i = 0; i < resume.tokens.size(); ++i) {
    const uint32_t token = resume.tokens[i];
    if (token >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", id, ": resumed token id ", token,
                                                     " >= vocab size ", c.vocab_size));
    }
    if (i + 1 >= so.min_tokens && seq->IsStopToken(token, c.eos_ids)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": resumed token ", i, " (id ", token, ") ends generation"));
    }
    if (!AdvanceMatcher(seq, token)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": resumed token ", i, " (id ", token,
                       ") does not continue the structured output's grammar"));
    }
    PD_ASSIGN_OR_RETURN(std::string delta, seq->detok->Step(token));
    seq->text += delta;
    seq->tokens.push_back(token);
  }
  if (resume.text_offset > seq->text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": resume text offset ", resume.text_offset,
                     " is past the resumed tokens' text of ", seq->text.size(), " bytes"));
  }
  seq->num_resumed = resume.tokens.size();
  seq->text_sent = resume.text_offset;
  return absl::OkStatus();
}

absl::Status Scheduler::Cancel(RequestId id) {
  Sequence* seq = FindRunning(id);
  for (auto it = waiting_.begin(); seq == nullptr && it != waiting_.end(); ++it) {
    seq = (*it)->request.id == id ? it->get() : nullptr;
  }
  if (seq != nullptr) {
    seq->cancel_requested = true;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("request ", id.ToString(), " is not queued or running"));
}

void Scheduler::Evacuate(absl::Status why) {
  evacuated_ = std::move(why);
  auto evacuate = [this](const std::unique_ptr<Sequence>& s) {
    if (s->request.on_prefilled == nullptr) {
      Finish(s.get(), FinishReason::kAbort, evacuated_);
    }
  };
  std::for_each(waiting_.begin(), waiting_.end(), evacuate);
  std::for_each(running_.begin(), running_.end(), evacuate);
}

void Scheduler::ForEachRunningBlock(absl::FunctionRef<void(const BlockHash&, BlockId)> fn) const {
  for (const std::unique_ptr<Sequence>& s : running_) {
    if (s->request.on_prefilled != nullptr) {
      continue;
    }
    const kvcache::BlockTable* table = kv_->GetTable(s->kv_id);
    if (table == nullptr || table->windowed()) {
      continue;
    }
    const size_t n = std::min(s->chain.size(), table->blocks().size());
    for (size_t i = 0; i < n; ++i) {
      fn(s->chain[i], table->blocks()[i]);
    }
  }
}

void Scheduler::CancelAll() {
  for (auto& s : waiting_) s->cancel_requested = true;
  for (auto& s : running_) s->cancel_requested = true;
}

void Scheduler::Finish(Sequence* seq, FinishReason reason, absl::Status status) {
  if (seq->finished != FinishReason::kNone) {
    return;
  }
  seq->finished = reason;
  seq->status = std::move(status);
  GenerationOutput out = seq->TakeFinalOutput(clock_->Now());
  ++stats_.finished;
  if (seq->request.on_output) {
    seq->request.on_output(std::move(out));
  }
}

void Scheduler::ExpireAndCancel() {
  const absl::Time now = clock_->Now();
  auto check = [&](Sequence* s) {
    if (s->cancel_requested) {
      Finish(s, FinishReason::kAbort, absl::CancelledError("request cancelled"));
    } else if (s->request.deadline.has_value() && now >= *s->request.deadline) {
      Finish(s, FinishReason::kAbort, absl::DeadlineExceededError("request deadline passed"));
    }
  };
  for (auto& s : waiting_) check(s.get());
  for (auto& s : running_) check(s.get());
}

void Scheduler::SweepFinished() {
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->finished != FinishReason::kNone && !(*it)->remote_pending) {
      absl::Status s = kv_->Free((*it)->kv_id);
      CHECK(s.ok()) << s;  // the table exists for every running sequence
      if (draft_ != nullptr) draft_->Release((*it)->request.id.value());
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [this](const std::unique_ptr<Sequence>& s) {
                                  if (s->finished == FinishReason::kNone) return false;
                                  if (draft_ != nullptr) draft_->Release(s->request.id.value());
                                  return true;
                                }),
                 waiting_.end());
}

absl::Status Scheduler::UseDraftModel(LlamaForward* draft, int64_t num_blocks) {
  if (config_.speculative != "draft") {
    return absl::InvalidArgumentError(
        absl::StrCat("draft model: speculative is \"", config_.speculative, "\", not \"draft\""));
  }
  if (draft->vocab_size() != forward_->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model: its vocabulary has ", draft->vocab_size(), " tokens, the model's ",
        forward_->vocab_size(), ": a draft model must share the model's tokenizer"));
  }
  if (draft->device() != forward_->device()) {
    return absl::InvalidArgumentError("draft model: not on the model's device");
  }
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft model: its KV pool needs blocks, got ", num_blocks));
  }
  draft_ = std::make_unique<DraftProposer>(draft, num_blocks, kv_->block_size());
  spec_.UseDraft();
  return absl::OkStatus();
}

void Scheduler::Admit() {
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running) {
    Sequence* seq = waiting_.front().get();
    // Under the sink + window policy only the first CacheCapTokens() are allocated now; the
    // rest is allocated (and earlier blocks dropped) block by block as it is computed.
    const int64_t num_tokens = static_cast<int64_t>(seq->tokens.size());
    const bool governed = Governed(*seq);
    const int64_t to_allocate = std::min(num_tokens, CacheCap(*seq));
    std::vector<BlockHash> chain = ComputeBlockHashes(
        seq->seed, absl::MakeConstSpan(seq->tokens).first(static_cast<size_t>(to_allocate)),
        static_cast<uint32_t>(kv_->block_size()));
    // A remote prefill is tried once, at first admission; a preempted request recomputes here.
    // A prompt that needs a drop is computed here (the prefill worker would not drop).
    // Under H2O / SnapKV the prompt is computed in full, never taken from a cache: the scores
    // of a cached or restored prefix do not exist. SnapKV's is computed and compressed by the
    // prefill worker, which sends the kept tokens only (not a resumed stream's, which go on
    // after the compaction); H2O's here (its scores go on with decoding).
    const bool remote_snapkv = governed &&
                               seq->compress.kind() == CompressPolicy::Kind::kSnapKv &&
                               seq->num_resumed == 0;
    const bool remote = seq->request.remote_prefill != nullptr && !seq->remote_started &&
                        to_allocate == num_tokens && (!governed || remote_snapkv);
    if (governed) {
      seq->ReleaseTierPrefix();
    } else if (!seq->admitted_once && !seq->request.tier_prefix.chain.empty()) {
      RestoreTierPrefix(seq, chain);
    }
    std::optional<kvcache::ImportTarget> import;
    absl::StatusOr<int64_t> cached = 0;
    if (remote) {
      const int64_t keep = governed ? seq->compress.KeepTokens(num_tokens) : 0;
      absl::StatusOr<kvcache::ImportTarget> t =
          governed ? kv_->ImportCompressedBlocks(seq->kv_id, keep)
                   : kv_->ImportBlocks(seq->kv_id, chain, num_tokens);
      if (t.ok()) {
        cached = t->num_cached_tokens;
        import = *std::move(t);
        seq->remote_keep = keep;
      } else {
        cached = t.status();
      }
    } else {
      cached = kv_->AllocatePrompt(
          seq->kv_id, governed ? absl::Span<const BlockHash>() : absl::MakeConstSpan(chain),
          to_allocate);
    }
    if (absl::IsResourceExhausted(cached.status())) {
      if (running_.empty()) {
        // Nothing will free blocks for it: the pool cannot hold this sequence.
        Finish(seq, FinishReason::kError,
               absl::ResourceExhaustedError(absl::StrCat(
                   "request ", seq->request.id.ToString(), ": ", seq->tokens.size(),
                   " tokens do not fit the KV pool of ", kv_->num_blocks(), " blocks")));
        waiting_.pop_front();
        continue;
      }
      return;  // wait for running requests to free blocks
    }
    if (!cached.ok()) {
      Finish(seq, FinishReason::kError, cached.status());
      waiting_.pop_front();
      continue;
    }
    seq->num_computed = *cached;
    seq->num_allocated = to_allocate;
    if (seq->remote_keep > 0) {
      // Compressed remotely: the table holds the kept tokens; the prompt's others are dropped.
      seq->dropped = to_allocate - seq->remote_keep;
      seq->compressed = true;
      seq->scores.clear();
    } else if (governed) {
      const ModelConfig& mc = forward_->config();
      const int64_t floats =
          mc.n_layers * mc.kv_score_heads() * seq->compress.ScoreSlots(seq->prompt_len);
      seq->scores.host.assign(static_cast<size_t>(floats), 0.0f);
      if (forward_->staged()) {
        // Where the forward pass adds to them: zeroed (a new buffer, or one a sequence before
        // gave back, zeroed on the forward pass's stream).
        absl::StatusOr<kernels::DeviceBuffer> device =
            score_buffers_->Take(forward_->context(), floats * 4);
        if (!device.ok()) {
          CHECK(kv_->Free(seq->kv_id).ok());
          seq->num_computed = seq->num_allocated = 0;
          Finish(
              seq, FinishReason::kError,
              absl::Status(device.status().code(),
                           absl::StrCat("request ", seq->request.id.ToString(),
                                        ": its KV policy's scores: ", device.status().message())));
          waiting_.pop_front();
          continue;
        }
        seq->scores.device = *std::move(device);
        seq->scores.pool = score_buffers_;
      }
      seq->compressed = false;
    }
    seq->chain.assign(chain.begin(), chain.begin() + *cached / kv_->block_size());
    if (!seq->admitted_once) {
      seq->admitted_once = true;
      seq->cached_tokens = static_cast<uint32_t>(*cached);
      seq->first_scheduled = clock_->Now();
      if (seq->num_resumed > 0 && seq->request.on_prefilled == nullptr) {
        // Where a moved stream's KV came from (restored blocks are in the pool by now).
        const int64_t restored = std::min<int64_t>(*cached, seq->restored_tokens);
        stats_.resumed_tier_tokens += restored;
        stats_.resumed_pool_tokens += *cached - restored;
        stats_.resumed_computed_tokens += num_tokens - *cached;
      }
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    if (import.has_value()) {
      if (seq->remote_keep > 0) {
        chain.clear();  // (nothing of a compressed prompt is shared)
      }
      handoffs_.Start(seq, *std::move(import), std::move(chain));
    }
  }
}

void Scheduler::RestoreTierPrefix(Sequence* seq, absl::Span<const BlockHash> chain) {
  const absl::Time start = clock_->Now();
  const TierRestoreResult r =
      RestoreFromTiers(kv_, kvcache::SequenceId(next_sequence_id_++), seq->request.tier_prefix,
                       chain, static_cast<int64_t>(seq->tokens.size()));
  seq->ReleaseTierPrefix();
  stats_.tier_restored_blocks += r.restored_blocks;
  stats_.tier_restore_failures += r.copy_failed ? 1 : 0;
  seq->restored_tokens = static_cast<uint32_t>(r.restored_blocks * kv_->block_size());
  seq->restore_time = clock_->Now() - start;
}

Scheduler::Sequence* Scheduler::FindRunning(RequestId id) {
  for (auto& s : running_) {
    if (s->request.id == id) {
      return s.get();
    }
  }
  return nullptr;
}

absl::Status Scheduler::CompleteRemotePrefill(RequestId id, uint32_t first_token,
                                              std::optional<TokenLogprob> first_logprob,
                                              int64_t kept_tokens) {
  Sequence* seq = FindRunning(id);
  const absl::Status completed =
      handoffs_.Complete(id, seq, first_token, &first_logprob, kept_tokens);
  if (!completed.ok()) {
    if (absl::IsInvalidArgument(completed)) {
      PrefillLocallyAfterRemote(seq);  // (refused: no longer pending)
    }
    return completed;
  }
  if (seq->finished != FinishReason::kNone) {
    return absl::OkStatus();  // cancelled meanwhile: the next sweep frees its blocks
  }
  seq->prefill_done = clock_->Now();
  AcceptToken(seq, first_token, std::move(first_logprob));
  return absl::OkStatus();
}

absl::Status Scheduler::FailRemotePrefill(RequestId id) {
  Sequence* seq = FindRunning(id);
  PD_RETURN_IF_ERROR(handoffs_.Fail(id, seq));
  PrefillLocallyAfterRemote(seq);
  return absl::OkStatus();
}

void Scheduler::PrefillLocallyAfterRemote(Sequence* seq) {
  // A whole prompt's blocks are prefilled into where they are; a compressed prompt's hold only
  // the kept tokens, so it is admitted again (remote_started: here), in full.
  if (seq == nullptr || seq->remote_pending || seq->remote_keep == 0 ||
      seq->finished != FinishReason::kNone) {
    return;
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    if (running_[i].get() == seq) {
      Requeue(i);
      return;
    }
  }
}

absl::Status Scheduler::ReleasePrefilled(RequestId id) {
  PD_RETURN_IF_ERROR(handoffs_.Release(id));
  ++stats_.finished;
  return absl::OkStatus();
}

void Scheduler::CompactPrefilled() {
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* seq = running_[i].get();
    if (!seq->compact_first_token.has_value() || seq->finished != FinishReason::kNone) {
      continue;
    }
    const SlideOutcome compacted = Compact(i);
    if (compacted == SlideOutcome::kPreemptedSelf) {
      return;  // (the youngest: nothing after it)
    }
    if (compacted == SlideOutcome::kFailed) {
      continue;
    }
    const uint32_t token = *seq->compact_first_token;
    seq->compact_first_token.reset();
    handoffs_.Prefilled(seq, token, std::exchange(seq->compact_first_logprob, std::nullopt));
  }
}

void Scheduler::MoveHeld() {
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->held) {
      handoffs_.Hold(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

Scheduler::Sequence* Scheduler::Requeue(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  absl::Status s = kv_->Free(seq->kv_id);
  CHECK(s.ok()) << s;
  seq->num_computed = 0;
  seq->num_allocated = 0;
  seq->dropped = 0;
  seq->scores.clear();
  seq->compressed = false;
  seq->remote_keep = 0;
  seq->compact_first_token.reset();
  seq->compact_first_logprob.reset();
  seq->chain.clear();
  waiting_.push_front(std::move(seq));
  return waiting_.front().get();
}

void Scheduler::Preempt(size_t running_index) {
  Sequence* victim = Requeue(running_index);
  ++victim->num_preemptions;
  ++stats_.preemptions;
  VLOG(1) << "request_id=" << victim->request.id << " preempted (recompute later)";
}

Scheduler::SlideOutcome Scheduler::SlideWindow(size_t i) {
  Sequence* seq = running_[i].get();
  auto copy_sinks = [this](absl::Span<const int32_t> originals, absl::Span<const int32_t> live,
                           int64_t num_tokens, int64_t shift) {
    return forward_->CopyBlocksShifted(originals, live, num_tokens, shift);
  };
  absl::Status slid;
  while (
      absl::IsResourceExhausted(slid = window_.Slide(kv_, seq->kv_id, &seq->dropped, copy_sinks))) {
    if (running_.size() == 1) {
      break;
    }
    if (!PreemptYoungestFor(i)) {
      return SlideOutcome::kPreemptedSelf;
    }
  }
  if (!slid.ok()) {
    Finish(seq, FinishReason::kError, slid);
    return SlideOutcome::kFailed;
  }
  return SlideOutcome::kSlid;
}

bool Scheduler::Governed(const Sequence& seq) const {
  return seq.compress.enabled();
}

int64_t Scheduler::CacheCap(const Sequence& seq) const {
  if (Governed(seq)) {
    return seq.compress.CacheCapTokens(static_cast<int64_t>(seq.prompt_len), seq.compressed);
  }
  return window_.CacheCapTokens();
}

Scheduler::SlideOutcome Scheduler::Compact(size_t i) {
  Sequence* seq = running_[i].get();
  const ModelConfig& mc = forward_->config();
  const int64_t rows = mc.n_layers * mc.kv_score_heads();
  const int64_t stride = seq->compress.ScoreSlots(static_cast<int64_t>(seq->prompt_len));
  const int64_t held = seq->num_allocated - seq->dropped;
  const int64_t keep_n = seq->compress.KeepTokens(held);
  const bool snapkv = seq->compress.kind() == CompressPolicy::Kind::kSnapKv;
  if (keep_n < held) {
    std::vector<float>& scores = seq->scores.host;
    if (seq->scores.device.data() != nullptr) {
      // Staged: the forward pass added to the device copy; its steps are done (the tokens
      // were sampled), and the stream is synchronised before the host reads them.
      absl::Status down =
          kernels::CopyAsync(forward_->context(), scores.data(), seq->scores.device.data(),
                             static_cast<int64_t>(scores.size()) * 4);
      if (down.ok()) down = kernels::SynchronizeStream(forward_->context());
      if (!down.ok()) {
        Finish(seq, FinishReason::kError, down);
        return SlideOutcome::kFailed;
      }
    }
    std::vector<int32_t> keep;
    seq->compress.Select(scores.data(), stride, held, rows, &keep);
    auto fill = [&](absl::Span<const BlockId> old, absl::Span<const BlockId> fresh) {
      std::vector<int32_t> src, dst;
      for (BlockId b : old) src.push_back(static_cast<int32_t>(b.value()));
      for (BlockId b : fresh) dst.push_back(static_cast<int32_t>(b.value()));
      return forward_->GatherKvRows(src, dst, keep, keep_n);
    };
    absl::Status compacted;
    while (absl::IsResourceExhausted(compacted = kv_->ReplaceBlocks(seq->kv_id, keep_n, fill))) {
      if (running_.size() == 1) {
        break;
      }
      if (!PreemptYoungestFor(i)) {
        return SlideOutcome::kPreemptedSelf;
      }
    }
    if (!compacted.ok()) {
      Finish(seq, FinishReason::kError,
             absl::Status(
                 compacted.code(),
                 absl::StrCat("request ", seq->request.id.ToString(), ": kv_policy ",
                              snapkv ? "snapkv" : "h2o", ": compaction failed: ",
                              compacted.message())));
      return SlideOutcome::kFailed;
    }
    seq->dropped += held - keep_n;
    ++stats_.kv_compactions;
    stats_.kv_evicted_tokens += held - keep_n;
    if (!snapkv) {
      // The scores move with their tokens; the slots after them start again from zero.
      std::vector<float> moved(scores.size(), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < keep_n; ++j) {
          moved[r * stride + j] = scores[r * stride + keep[r * keep_n + j]];
        }
      }
      scores = std::move(moved);
      if (seq->scores.device.data() != nullptr) {
        absl::Status up =
            kernels::CopyAsync(forward_->context(), seq->scores.device.data(), scores.data(),
                               static_cast<int64_t>(scores.size()) * 4);
        if (up.ok()) up = kernels::SynchronizeStream(forward_->context());
        if (!up.ok()) {
          Finish(seq, FinishReason::kError, up);
          return SlideOutcome::kFailed;
        }
      }
    }
  }
  if (snapkv) {
    seq->compressed = true;
    seq->scores.clear();
  }
  return SlideOutcome::kSlid;
}

bool Scheduler::PreemptYoungestFor(size_t i) {
  // The youngest request not waiting for a remote prefill (its blocks may be being written);
  // `i` itself always qualifies.
  size_t victim = running_.size() - 1;
  while (victim > i && running_[victim]->remote_pending) {
    --victim;
  }
  Preempt(victim);
  return victim != i;
}

int64_t Scheduler::AllocateSlots(size_t i, int64_t num_tokens) {
  Sequence* seq = running_[i].get();
  while (true) {
    absl::Status s = kv_->AppendTokens(seq->kv_id, num_tokens);
    if (s.ok()) {
      seq->num_allocated += num_tokens;
      return num_tokens;
    }
    CHECK(absl::IsResourceExhausted(s)) << s;
    if (running_.size() == 1) {
      Finish(
          seq, FinishReason::kError,
          absl::ResourceExhaustedError(absl::StrCat(
              "request ", seq->request.id.ToString(), ": KV pool of ", kv_->num_blocks(),
              " blocks cannot hold ", seq->num_allocated - seq->dropped + num_tokens, " tokens")));
      return 0;
    }
    if (!PreemptYoungestFor(i)) {
      return 0;  // it preempted itself; it is waiting now
    }
  }
}

void Scheduler::EnsureSlots() {
  // Every running sequence needs a slot for each token it has not computed yet (a newly
  // sampled token, or under the sink + window policy the rest of a long prompt). Oldest
  // first; preempt the youngest when blocks run out. A sequence that preempts itself is the
  // youngest not waiting for a remote prefill, so every one after it waits for one.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* seq = running_[i].get();
    const int64_t missing = static_cast<int64_t>(seq->tokens.size()) - seq->num_allocated;
    if (missing <= 0 || seq->finished != FinishReason::kNone) {
      continue;
    }
    int64_t room = CacheCap(*seq) - (seq->num_allocated - seq->dropped);
    if (room == 0) {
      // Sink + window at its cap: once everything held is computed, drop the oldest window
      // block and go on one block at a time (until then the batch computes what is held).
      // H2O / SnapKV likewise compact, then go on to the next cap.
      if (seq->num_computed < seq->num_allocated) {
        continue;
      }
      const SlideOutcome slid = Governed(*seq) ? Compact(i) : SlideWindow(i);
      if (slid == SlideOutcome::kPreemptedSelf) {
        return;
      }
      if (slid == SlideOutcome::kFailed) {
        continue;
      }
      room = CacheCap(*seq) - (seq->num_allocated - seq->dropped);
    }
    if (AllocateSlots(i, std::min(missing, room)) == 0) {
      return;
    }
  }
}

void Scheduler::AcceptToken(Sequence* seq, uint32_t token, std::optional<TokenLogprob> logprob) {
  const ModelConfig& c = forward_->config();
  const SamplingOptions& so = seq->request.sampling;
  if (seq->num_generated() == seq->num_resumed) {
    seq->first_token = clock_->Now();
  }
  seq->AppendToken(token, std::move(logprob));
  ++stats_.decode_tokens;
  const size_t generated = seq->num_generated();
  // Every token, sampled here or (decode side) by the prefill worker, moves the matcher on.
  if (!AdvanceMatcher(seq, token)) {
    Finish(seq, FinishReason::kError,
           absl::InternalError(absl::StrCat("request ", seq->request.id.ToString(),
                                            ": structured output: token ", token,
                                            " does not continue the grammar")));
    return;
  }
  const bool may_stop = generated >= so.min_tokens;
  if (may_stop && seq->IsStopToken(token, c.eos_ids)) {
    Finish(seq, FinishReason::kStop, absl::OkStatus());  // a stop token adds no text
    return;
  }
  absl::StatusOr<std::string> delta = seq->detok->Step(token);
  if (!delta.ok()) {
    Finish(seq, FinishReason::kError, delta.status());
    return;
  }
  seq->text += *delta;
  // Stop strings: a match that ends in the new text finishes; a tail that could still grow
  // into one is held back.
  size_t hold = 0;
  if (may_stop && seq->CutAtStopString(&hold)) {
    Finish(seq, FinishReason::kStopString, absl::OkStatus());
    return;
  }
  // The context bounds the length unless the sink + window policy keeps the cache within it;
  // then only max_tokens does (0 = the context, as without the policy).
  const bool context_full = static_cast<int64_t>(seq->tokens.size()) >= c.seq_len &&
                            window_.ContextBoundsLength(so.max_tokens) &&
                            (!Governed(*seq) || seq->compress.ContextBoundsLength(so.max_tokens));
  if ((so.max_tokens > 0 && generated >= so.max_tokens) || context_full) {
    Finish(seq, FinishReason::kLength, absl::OkStatus());
    return;
  }
  GenerationOutput out = seq->TakeStreamOutput(hold);
  if (seq->request.on_output) {
    seq->request.on_output(std::move(out));
  }
}

// One batch: each member's tokens for this step and its block table.
struct Scheduler::Batch {
  std::vector<Sequence*> members;
  std::vector<ForwardSequence> rows;         // block_table set by ForwardBatch
  std::vector<std::vector<int32_t>> tables;  // [members] physical block ids
  // [members] set by ForwardBatch: the member's structured-output mask was late, it sits the
  // step out (ApplyBatch leaves its last token to compute again).
  std::vector<bool> late;
  // Speculative decoding, [rows]: a verify row holds the index of the decode row whose
  // proposal it checks (-1 for the others); a decode row with a proposal, its verify rows
  // (contiguous, in the proposal's order).
  std::vector<int64_t> verifies;
  std::vector<size_t> first_verify;
  std::vector<size_t> num_verify;
  // [rows] set by ForwardBatch: a verify row's logit edits (bias and penalties counted over the
  // proposed tokens before it, as plain decoding would count them); empty for the others.
  std::vector<std::vector<kernels::LogitEdit>> verify_edits;
  // [rows] set by ForwardBatch: a verify row's grammar mask (its matcher's position after the
  // proposed tokens before it); empty for the others and without a grammar.
  std::vector<std::vector<uint32_t>> verify_allowed;
};

bool Scheduler::Step() {
  ExpireAndCancel();
  SweepFinished();
  Admit();
  EnsureSlots();
  SweepFinished();
  Batch batch = CollectBatch();
  if (batch.members.empty()) {
    return false;  // nothing running, or everything running waits for a remote prefill
  }
  ++stats_.steps;
  std::vector<int32_t> sampled;
  const absl::Time started = absl::Now();
  absl::Status forward = ForwardBatch(&batch, &sampled);
  // Steps of one-token rows only (decodes and verify rows): the steps speculation happens in.
  // A prefill chunk's tokens cost another price (no classifier or sampling for most of them).
  if (config_.speculative != "off" &&
      std::all_of(batch.rows.begin(), batch.rows.end(),
                  [](const ForwardSequence& row) { return row.tokens.size() == 1; })) {
    spec_.ObserveStep(static_cast<int64_t>(batch.rows.size()),
                      absl::ToDoubleSeconds(absl::Now() - started));
  }
  if (forward.ok()) {
    ApplyBatch(batch, sampled);
  } else {
    FailBatch(batch, forward);
  }
  CompactPrefilled();
  MoveHeld();
  SweepFinished();
  return true;
}

namespace {

// Which pass of CollectBatch takes a sequence with `todo` tokens to compute: 0 = a decode (one
// token), 1 = the prefill of a migrated stream not yet resumed (its client waits mid-stream),
// 2 = any other prefill.
int BatchPass(const scheduler_internal::Sequence& seq, int64_t todo) {
  if (todo == 1) return 0;
  const bool resuming = seq.num_resumed > 0 && seq.num_generated() == seq.num_resumed;
  return resuming ? 1 : 2;
}

}  // namespace

Scheduler::Batch Scheduler::CollectBatch() {
  Batch batch;
  int64_t budget = config_.max_batch_tokens;
  // Pass 0: decodes (one token each); pass 1: prefills of migrated streams, whose clients wait
  // mid-stream; pass 2: the other prefills.
  for (int pass = 0; pass < 3 && budget > 0; ++pass) {
    for (auto& owned : running_) {
      Sequence* seq = owned.get();
      if (seq->remote_pending || seq->finished != FinishReason::kNone) {
        continue;
      }
      const int64_t todo = static_cast<int64_t>(seq->tokens.size()) - seq->num_computed;
      if (todo <= 0 || BatchPass(*seq, todo) != pass || budget <= 0) {
        continue;
      }
      // Under the sink + window policy the slots may cover only part of the todo.
      const int64_t n = std::min({todo, budget, seq->num_allocated - seq->num_computed});
      if (n <= 0) {
        continue;
      }
      budget -= n;
      batch.members.push_back(seq);
      batch.tables.push_back(TableIds(*seq));
      ForwardSequence row{absl::MakeConstSpan(seq->tokens).subspan(seq->num_computed, n),
                          seq->num_computed - seq->dropped,
                          {},
                          seq->dropped};
      if (!seq->scores.empty()) {
        // H2O / SnapKV: this row's queries add to the scores of the slots they attend.
        const int64_t from =
            seq->compress.ScoreFrom(static_cast<int64_t>(seq->prompt_len), seq->num_computed);
        if (from < n) {
          row.attention_mass = seq->scores.forward_data();
          row.mass_stride = seq->compress.ScoreSlots(static_cast<int64_t>(seq->prompt_len));
          row.mass_from = from;
        }
      }
      batch.rows.push_back(row);
    }
  }
  const size_t rows = batch.rows.size();
  batch.verifies.assign(rows, -1);
  batch.first_verify.assign(rows, 0);
  batch.num_verify.assign(rows, 0);
  if (config_.speculative == "off" || (config_.speculative == "draft" && draft_ == nullptr) ||
      !waiting_.empty() || window_.enabled() || compress_.enabled()) {
    return batch;
  }
  // Speculation only in steps with nothing to prefill: verify rows never take a prefill's
  // budget. Each decode with a proposal gets one row per proposed token, at the positions after
  // its last token; the forward pass writes every row's K/V before any attention, so row j
  // attends to the proposal's tokens before it, and its logits are those a plain decode would
  // compute there (docs/engine.md, "Speculative decoding").
  for (const auto& owned : running_) {
    const Sequence& s = *owned;
    if (s.finished == FinishReason::kNone && !s.remote_pending &&
        static_cast<int64_t>(s.tokens.size()) - s.num_computed > 1) {
      return batch;
    }
  }
  // How many each decode may propose (within the step's tokens and rows), then the proposals,
  // all at once (a draft model runs them as one batch), then their verify rows.
  const auto max_rows = static_cast<size_t>(forward_->options().max_seqs);
  const int64_t spare_rows =
      std::min<int64_t>(budget, static_cast<int64_t>(max_rows) - static_cast<int64_t>(rows));
  const int64_t step_k =
      config_.spec_adaptive
          ? spec_.MaxProposal(static_cast<int64_t>(rows), config_.spec_max_tokens, spare_rows)
          : config_.spec_max_tokens;
  if (step_k == 0) {
    ++stats_.spec_declined_steps;
    return batch;
  }
  std::vector<std::pair<size_t, int64_t>> wants;  // (decode row, most tokens)
  size_t planned_rows = batch.rows.size();
  for (size_t r = 0; r < rows && budget > 0 && planned_rows < max_rows; ++r) {
    const int64_t room = std::min<int64_t>(budget, static_cast<int64_t>(max_rows - planned_rows));
    const int64_t k = std::min(room, ProposalRoom(batch.members[r], step_k));
    if (k <= 0) continue;
    wants.emplace_back(r, k);
    budget -= k;
    planned_rows += static_cast<size_t>(k);
    // A draft model measures on one sequence: after steps it sat out, every sequence's draft
    // would first compute what it missed (a prefill's worth each), a price the measurement
    // is not worth.
    if (draft_ != nullptr && config_.spec_adaptive && spec_.exploring()) break;
  }
  if (wants.empty()) return batch;
  if (draft_ != nullptr) {
    std::vector<DraftProposer::Want> asks;
    for (const auto& [r, k] : wants) {
      Sequence* seq = batch.members[r];
      asks.push_back({seq->request.id.value(), seq->tokens, k});
    }
    const absl::Time started = absl::Now();
    const int64_t passes = draft_->stats().forward_passes;
    absl::StatusOr<std::vector<std::vector<uint32_t>>> drafts = draft_->Propose(asks);
    spec_.ObserveDraft(draft_->stats().forward_passes - passes, static_cast<int64_t>(asks.size()),
                       absl::ToDoubleSeconds(absl::Now() - started));
    if (!drafts.ok()) {
      // The target's step goes on without proposals; the draft's state was dropped.
      LOG_EVERY_N(WARNING, 100) << "draft model: " << drafts.status();
      return batch;
    }
    for (size_t w = 0; w < wants.size(); ++w) batch.members[wants[w].first]->draft = (*drafts)[w];
  } else {
    for (const auto& [r, k] : wants) {
      batch.members[r]->draft = ProposeNgram(batch.members[r]->tokens, static_cast<int>(k));
    }
  }
  for (const auto& [r, most] : wants) {
    Sequence* seq = batch.members[r];
    if (static_cast<int64_t>(seq->draft.size()) > most) {
      seq->draft.resize(static_cast<size_t>(most));
    }
    const auto k = static_cast<int64_t>(TakeProposal(seq));
    if (k <= 0) continue;
    const std::vector<int32_t> ids = TableIds(*seq);  // (TakeProposal may have added a block)
    batch.tables[r] = ids;
    batch.first_verify[r] = batch.rows.size();
    batch.num_verify[r] = static_cast<size_t>(k);
    for (int64_t j = 0; j < k; ++j) {
      batch.members.push_back(seq);
      batch.tables.push_back(ids);
      batch.rows.push_back({absl::MakeConstSpan(seq->draft).subspan(static_cast<size_t>(j), 1),
                            seq->num_computed + 1 + j,
                            {},
                            0});
      batch.verifies.push_back(static_cast<int64_t>(r));
      batch.first_verify.push_back(0);
      batch.num_verify.push_back(0);
    }
  }
  return batch;
}

std::vector<int32_t> Scheduler::TableIds(const Sequence& seq) const {
  const kvcache::BlockTable* table = kv_->GetTable(seq.kv_id);
  std::vector<int32_t> ids;
  ids.reserve(table->num_blocks());
  for (BlockId b : table->blocks()) {
    ids.push_back(static_cast<int32_t>(b.value()));
  }
  return ids;
}

int64_t Scheduler::ProposalRoom(Sequence* seq, int64_t max_k) {
  const SamplingOptions& so = seq->request.sampling;
  // Exact, greedy or sampled: a verify row samples with the draw of the step it stands for
  // (SamplingUniform(seed, step)), with the logit edits (bias, penalties) and the grammar's
  // mask of the tokens before it, so the tokens taken are the ones plain decoding takes, and a
  // proposal is accepted exactly when it is that token. Requests that are not decoded here,
  // and those whose matcher is still a late mask's, decode one token at a time.
  if (so.no_speculation || seq->mask_job != nullptr ||
      seq->num_generated() < so.forced_tokens.size() || seq->request.on_prefilled != nullptr ||
      seq->dropped != 0) {
    return 0;
  }
  const auto last = static_cast<int64_t>(seq->tokens.size()) - 1;  // its position
  int64_t k = std::min(max_k, seq->spec_k > 0 ? seq->spec_k : config_.spec_max_tokens);
  if (so.max_tokens > 0) {
    // The step yields up to k + 1 tokens: no more than max_tokens allows.
    k = std::min(
        k, static_cast<int64_t>(so.max_tokens) - static_cast<int64_t>(seq->num_generated()) - 1);
  }
  k = std::min<int64_t>(k, forward_->config().seq_len - 1 - last);  // inside the context
  return std::max<int64_t>(k, 0);
}

size_t Scheduler::TakeProposal(Sequence* seq) {
  const auto last = static_cast<int64_t>(seq->tokens.size()) - 1;  // its position
  if (seq->matcher != nullptr) {
    // Only the grammar's tokens can be accepted (the sampler takes no other): the proposal
    // ends before the first it refuses, and before an end token (which would end the
    // sequence: nothing after it is used). The matcher's position after each is kept for its
    // verify row's mask; the matcher itself stays where it was.
    const grammar::TokenTrie& trie = GrammarTrie();
    const grammar::Matcher::Position start = seq->matcher->position();
    seq->draft_positions.clear();
    for (const uint32_t token : seq->draft) {
      const auto t = static_cast<int32_t>(token);
      // (A draft model may propose a padded embedding's id, past the tokenizer's.)
      if (token >= trie.vocab_size() || trie.is_end_token(t) || trie.token_bytes(t).empty() ||
          !seq->matcher->AcceptBytes(trie.token_bytes(t))) {
        break;
      }
      seq->draft_positions.push_back(seq->matcher->position());
    }
    seq->matcher->Restore(start);
    seq->draft.resize(seq->draft_positions.size());
  }
  const auto proposed = static_cast<int64_t>(seq->draft.size());
  // Slots for the verify rows (positions last + 1 .. last + proposed), from free blocks only:
  // a proposal never preempts anyone.
  const int64_t missing = last + 1 + proposed - seq->num_allocated;
  if (proposed > 0 && missing > 0) {
    if (!kv_->AppendTokens(seq->kv_id, missing).ok()) {
      seq->draft.clear();
      return 0;
    }
    seq->num_allocated += missing;
  }
  return proposed;
}

absl::Status Scheduler::ForwardBatch(Batch* batch, std::vector<int32_t>* sampled) {
  for (size_t i = 0; i < batch->rows.size(); ++i) {
    batch->rows[i].block_table = batch->tables[i];
  }
  // Each sequence's next token is sampled where the logits are (on the GPU with --device
  // cuda); only rows whose request asked for logprobs come back as logits.
  std::vector<SampleSpec> specs;
  bool any_logits = false;
  const absl::Time start = absl::Now();
  std::vector<size_t> masked;  // members whose masks are computed while the forward pass runs
  batch->late.assign(batch->members.size(), false);
  const size_t mask_words = (static_cast<size_t>(forward_->vocab_size()) + 31) / 32;
  batch->verify_edits.assign(batch->members.size(), {});
  batch->verify_allowed.assign(batch->members.size(), {});
  size_t decode_rows = 0;  // members that are not verify rows
  for (size_t i = 0; i < batch->members.size(); ++i) {
    Sequence* seq = batch->members[i];
    if (batch->verifies[i] >= 0) {
      // A verify row: the token after proposed token j is generated token num_generated + j.
      const size_t j = i - batch->first_verify[static_cast<size_t>(batch->verifies[i])] + 1;
      specs.push_back(SampleSpecFor(seq->request.sampling, seq->num_generated() + j));
      any_logits = any_logits || specs.back().want_logits;
      if (HasLogitEdits(seq->request.sampling)) {
        // Its edits count the proposed tokens before it, as if plain decoding had taken them
        // (if it did not, the row's token is not used). A copy of the sequence's builder
        // (counted up to its tokens, by its decode row above) counts just those.
        std::vector<uint32_t> context = seq->tokens;
        context.insert(context.end(), seq->draft.begin(),
                       seq->draft.begin() + static_cast<std::ptrdiff_t>(j));
        LogitEditBuilder builder = seq->logit_edits;
        const absl::Span<const kernels::LogitEdit> edits =
            builder.Build(seq->request.sampling, context, seq->prompt_len);
        batch->verify_edits[i].assign(edits.begin(), edits.end());
        specs.back().edits = batch->verify_edits[i];
      }
      if (seq->matcher != nullptr) {
        // Filled with its decode row's job (ready, below).
        batch->verify_allowed[i].assign(mask_words, 0);
        specs.back().allowed = batch->verify_allowed[i].data();
      }
      continue;
    }
    ++decode_rows;
    specs.push_back(SampleSpecFor(seq->request.sampling, seq->num_generated()));
    any_logits = any_logits || specs.back().want_logits;
    // Structured output: the tokens that continue the grammar, for rows that end this step
    // with a sampled token (a prefill chunk short of the end samples nothing that is kept).
    const bool samples = seq->num_computed + static_cast<int64_t>(batch->rows[i].tokens.size()) ==
                         static_cast<int64_t>(seq->tokens.size());
    if (seq->matcher != nullptr && samples) {
      // Sized now (the pointer the forward pass reads stays put); filled once the mask is done.
      seq->allowed.assign(mask_words, 0);
      specs.back().allowed = seq->allowed.data();
      masked.push_back(i);
    }
    // Logit bias and penalties, from the prompt and the tokens generated so far (resumed ones
    // included): the same edits on every worker and after any preemption.
    if (samples && HasLogitEdits(seq->request.sampling)) {
      specs.back().edits =
          seq->logit_edits.Build(seq->request.sampling, seq->tokens, seq->prompt_len);
    }
  }
  sampled->assign(batch->members.size(), 0);
  if (masked.empty()) {
    return forward_->ForwardSample(batch->rows, specs, sampled->data(),
                                   any_logits ? logits_.data() : nullptr);
  }
  // Structured output: the masks are computed on a thread of their own while the layers run
  // (on the CPU; on a GPU the step waits for them before it is queued), one sequence after
  // another, each by its own matcher (nothing else touches it while its job runs). The forward
  // pass waits for them right before it applies them (`ready`), for at most the grace
  // (SchedulerConfig::mask_grace_us): a sequence whose mask is later sits the step out and
  // keeps its job, which goes on after the step; its token is computed again next step, where
  // the finished mask is used. The result is the same as computing every mask first.
  const grammar::TokenTrie& trie = GrammarTrie();
  std::vector<std::shared_ptr<scheduler_internal::MaskJob>> jobs;  // [masked]
  std::vector<std::shared_ptr<scheduler_internal::MaskJob>> fresh;
  for (const size_t i : masked) {
    Sequence* seq = batch->members[i];
    if (seq->mask_job == nullptr) {  // (else: late at an earlier step, done or still running)
      // (A late job's sequence proposes nothing: it has no verify rows.)
      const auto verify = static_cast<std::ptrdiff_t>(batch->num_verify[i]);
      seq->mask_job = std::make_shared<scheduler_internal::MaskJob>(
          seq->matcher, std::vector<grammar::Matcher::Position>(
                            seq->draft_positions.begin(), seq->draft_positions.begin() + verify));
      fresh.push_back(seq->mask_job);
    }
    jobs.push_back(seq->mask_job);
  }
  // Threads that finished a late mask are joined here.
  for (size_t t = 0; t < mask_threads_.size();) {
    if (mask_threads_[t].finished->load()) {
      mask_threads_[t].thread.join();
      mask_threads_.erase(mask_threads_.begin() + static_cast<std::ptrdiff_t>(t));
    } else {
      ++t;
    }
  }
  if (!fresh.empty()) {
    auto finished = std::make_shared<std::atomic<bool>>(false);
    std::thread thread([&trie, fresh, finished, hook = mask_hook_] {
      for (const auto& job : fresh) {
        if (hook) hook();
        job->Run(trie);
      }
      // Then the verify rows' masks, so that no sequence's own mask waits for another's.
      for (const auto& job : fresh) job->RunVerify(trie, hook);
      finished->store(true);
    });
    mask_threads_.push_back({std::move(thread), std::move(finished)});
  }
  bool waited = false;
  const std::function<void()> ready = [&] {
    if (waited) return;
    waited = true;
    const absl::Duration so_far = absl::Now() - start;
    const absl::Time deadline =
        absl::Now() + std::max(absl::Microseconds(config_.mask_grace_us), so_far / 4);
    size_t late = 0;
    for (const auto& job : jobs) late += job->WaitUntil(deadline) ? 0 : 1;
    absl::Time verify_deadline = deadline;
    if (late == decode_rows) {
      // Every sequence of the step waits on its mask: waiting holds no one else (nor does
      // waiting for the verify rows' masks, then or when the sequence is alone).
      for (const auto& job : jobs) job->Wait();
    }
    if (late == decode_rows || decode_rows == 1) verify_deadline = absl::InfiniteFuture();
    for (size_t m = 0; m < masked.size(); ++m) {
      Sequence* seq = batch->members[masked[m]];
      const size_t first = batch->first_verify[masked[m]];
      const size_t verify = batch->num_verify[masked[m]];
      if (!jobs[m]->WaitUntil(absl::InfinitePast())) {
        // Sits the step out: any mask will do for the tokens that are thrown away.
        std::fill(seq->allowed.begin(), seq->allowed.end(), ~0u);
        batch->late[masked[m]] = true;
        for (size_t v = first; v < first + verify; ++v) {
          std::fill(batch->verify_allowed[v].begin(), batch->verify_allowed[v].end(), ~0u);
          batch->late[v] = true;
        }
        jobs[m]->Abandon();
        continue;
      }
      // The forward pass reads a mask of the model's vocabulary, which can be larger than the
      // tokenizer's (padded embeddings): the ids past the tokenizer's are never allowed.
      const std::vector<uint32_t>& mask = jobs[m]->mask();
      std::copy_n(mask.begin(), std::min(mask.size(), mask_words), seq->allowed.begin());
      // Verify rows whose mask is late, and those after them, are not used (VerifyProposal
      // stops before the first): the proposal is cut there.
      bool cut = false;
      for (size_t j = 0; j < verify; ++j) {
        std::vector<uint32_t>& allowed = batch->verify_allowed[first + j];
        cut = cut || !jobs[m]->WaitVerifyUntil(j, verify_deadline);
        if (cut) {
          std::fill(allowed.begin(), allowed.end(), ~0u);
          batch->late[first + j] = true;
          continue;
        }
        const std::vector<uint32_t>& vmask = jobs[m]->verify_mask(j);
        std::copy_n(vmask.begin(), std::min(vmask.size(), mask_words), allowed.begin());
      }
      if (cut) {
        ++stats_.late_verify_masks;
        jobs[m]->Abandon();
      }
      seq->mask_job.reset();
    }
  };
  const absl::Status status = forward_->ForwardSample(batch->rows, specs, sampled->data(),
                                                      any_logits ? logits_.data() : nullptr, ready);
  ready();  // a call that failed before its compute never waited
  return status;
}

void Scheduler::FailBatch(const Batch& batch, const absl::Status& status) {
  LOG(ERROR) << "forward pass failed for a batch of " << batch.rows.size() << ": " << status;
  for (size_t i = 0; i < batch.members.size(); ++i) {
    if (batch.verifies[i] >= 0) continue;  // (its sequence is its decode row's)
    Sequence* seq = batch.members[i];
    Finish(seq, FinishReason::kError, status);
  }
}

void Scheduler::ApplyBatch(const Batch& batch, const std::vector<int32_t>& sampled) {
  for (size_t i = 0; i < batch.members.size(); ++i) {
    if (batch.verifies[i] >= 0) continue;  // taken with the decode row it verifies
    Sequence* seq = batch.members[i];
    if (batch.late[i]) {
      // Its mask was late: the last token is computed again next step (its KV slot is
      // rewritten with the same values), when the mask is there.
      ++stats_.late_masks;
      RecordComputed(seq, static_cast<int64_t>(batch.rows[i].tokens.size()) - 1);
      continue;
    }
    RecordComputed(seq, static_cast<int64_t>(batch.rows[i].tokens.size()));
    if (seq->num_computed < static_cast<int64_t>(seq->tokens.size())) {
      continue;  // a prefill chunk short of the end: no token yet
    }
    TakeSampledToken(seq, i, sampled[i]);
    if (batch.num_verify[i] > 0) {
      VerifyProposal(seq, batch, i, sampled);
    }
  }
}

void Scheduler::VerifyProposal(Sequence* seq, const Batch& batch, size_t decode_row,
                               const std::vector<int32_t>& sampled) {
  const size_t first_row = batch.first_verify[decode_row];
  const size_t num_rows = batch.num_verify[decode_row];
  // Proposed token j sits at position base + j - 1 (base: the tokens computed now), where the
  // verify row first_row + j - 1 computed it. It is accepted when the token the sequence took
  // there is the proposed one: its K/V is then the sequence's, and that row's sample is the
  // next token, exactly as a plain decode step would have computed it.
  const auto base = static_cast<size_t>(seq->num_computed);
  size_t accepted = 0;
  for (size_t j = 1; j <= num_rows; ++j) {
    if (seq->finished != FinishReason::kNone || seq->tokens.size() != base + j ||
        seq->tokens[base + j - 1] != seq->draft[j - 1] || batch.late[first_row + j - 1]) {
      break;
    }
    ++accepted;
    RecordComputed(seq, 1);
    if (seq->matcher != nullptr) {
      seq->allowed = batch.verify_allowed[first_row + j - 1];  // (its row's mask)
    }
    TakeSampledToken(seq, first_row + j - 1, sampled[first_row + j - 1]);
  }
  ++stats_.spec_verify_steps;
  spec_.ObserveVerify(static_cast<int64_t>(num_rows), static_cast<int64_t>(accepted));
  stats_.spec_proposed_tokens += static_cast<int64_t>(num_rows);
  stats_.spec_accepted_tokens += static_cast<int64_t>(accepted);
  // Next proposal: one more than accepted (all accepted: two more), up to the configured
  // bound.
  seq->spec_k = std::min<int64_t>(
      config_.spec_max_tokens, static_cast<int64_t>(accepted) + 1 + (accepted == num_rows ? 1 : 0));
  seq->draft.clear();
}

void Scheduler::RecordComputed(Sequence* seq, int64_t n) {
  seq->num_computed += n;
  if (seq->num_computed <= static_cast<int64_t>(seq->prompt_len)) {
    stats_.prefill_tokens += n;
  }
  if (!kv_->GetTable(seq->kv_id)->windowed()) {  // (after a drop nothing more is shared)
    ExtendBlockHashes(seq->seed, absl::MakeConstSpan(seq->tokens).first(seq->num_computed),
                      static_cast<uint32_t>(kv_->block_size()), &seq->chain);
    absl::Status commit = kv_->CommitBlocks(seq->kv_id, seq->chain);
    CHECK(commit.ok()) << commit;  // the chain hashes exactly the computed tokens
  }
}

void Scheduler::TakeSampledToken(Sequence* seq, size_t row, int32_t sampled) {
  if (seq->num_generated() == seq->num_resumed && seq->prefill_done == absl::Time()) {
    seq->prefill_done = clock_->Now();
  }
  const SamplingOptions& so = seq->request.sampling;
  const uint64_t step = seq->num_generated();
  int32_t token = sampled;
  if (step < so.forced_tokens.size()) {
    token = static_cast<int32_t>(so.forced_tokens[step]);  // teacher forcing
  }
  if (seq->matcher != nullptr) {
    // The sampler never picks a masked token while one is allowed: a token outside the mask
    // means none was (the grammar cannot go on from here, or it outgrew the matcher's bounds).
    const auto t = static_cast<size_t>(token);
    const bool allowed = t / 32 < seq->allowed.size() && ((seq->allowed[t / 32] >> (t % 32)) & 1);
    if (!allowed) {
      Finish(seq, FinishReason::kError,
             absl::InternalError(
                 absl::StrCat("request ", seq->request.id.ToString(),
                              ": structured output: no token of the "
                              "vocabulary continues the grammar after ",
                              seq->num_generated(), " generated tokens",
                              seq->matcher->overflowed()
                                  ? " (the grammar is too ambiguous for the matcher's bounds)"
                                  : "")));
      return;
    }
  }
  // Log-probabilities only for requests that asked, from the same host logits row.
  std::optional<TokenLogprob> logprob;
  if (so.logprobs >= 0) {
    const int64_t vocab = forward_->vocab_size();
    absl::StatusOr<TokenLogprob> lp = ComputeLogprob(logits_.data() + row * vocab, vocab, token,
                                                     so.logprobs, so.full_distribution);
    if (!lp.ok()) {
      Finish(seq, FinishReason::kError, lp.status());
      return;
    }
    logprob = *std::move(lp);
  }
  if (seq->request.on_prefilled != nullptr) {
    if (Governed(*seq) && !seq->compressed) {
      // SnapKV on the prefill worker: compressed first, in this step's CompactPrefilled.
      seq->compact_first_token = static_cast<uint32_t>(token);
      seq->compact_first_logprob = std::move(logprob);
      return;
    }
    handoffs_.Prefilled(seq, static_cast<uint32_t>(token), std::move(logprob));
    return;
  }
  AcceptToken(seq, static_cast<uint32_t>(token), std::move(logprob));
}

bool Scheduler::AdvanceMatcher(Sequence* seq, uint32_t token) {
  if (seq->matcher == nullptr) {
    return true;
  }
  if (seq->mask_job != nullptr) {
    seq->mask_job->Wait();  // (the matcher is the job's until then)
    seq->mask_job.reset();
  }
  const grammar::TokenTrie& trie = GrammarTrie();
  const auto t = static_cast<int32_t>(token);
  return trie.is_end_token(t)
             ? seq->matcher->CanEnd()
             : !trie.token_bytes(t).empty() && seq->matcher->AcceptBytes(trie.token_bytes(t));
}

const grammar::TokenTrie& Scheduler::GrammarTrie() {
  if (trie_ == nullptr) {
    // A token's bytes as they read after an ordinary token (a leading-space rule after BOS
    // does not apply mid-output); tokens without bytes (BOS) are never allowed. A special
    // token stands for its grammar bytes, which only a grammar naming it allows
    // (TokenGrammarBytes).
    const uint32_t n = tokenizer_->vocab_size();
    absl::StatusOr<std::vector<uint32_t>> a = tokenizer_->Encode("a", false, false);
    const uint32_t prev = a.ok() && !a->empty() ? a->front() : Tokenizer::kNoToken;
    std::vector<std::string> bytes(n);
    const std::vector<uint32_t>& eos = forward_->config().eos_ids;
    for (uint32_t t = 0; t < n; ++t) {
      if (t == tokenizer_->bos_id() || std::find(eos.begin(), eos.end(), t) != eos.end()) {
        continue;
      }
      absl::StatusOr<std::string> b = tokenizer_->DecodeToken(prev, t);
      if (b.ok()) {
        bytes[t] = grammar::TokenGrammarBytes(*std::move(b), tokenizer_->SpecialTokenText(t));
      }
    }
    std::vector<int32_t> end(eos.begin(), eos.end());
    trie_ = std::make_unique<grammar::TokenTrie>(bytes, std::move(end));
  }
  return *trie_;
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats s = stats_;
  const GraphStats graphs = forward_->graph_stats();
  s.decode_graph_captures = graphs.captures;
  s.decode_graph_replays = graphs.replays;
  s.decode_graphs_off = graphs.off;
  const ScoreBufferPool::Stats buffers = score_buffers_->stats();
  s.score_buffers_allocated = buffers.allocated;
  s.score_buffers_reused = buffers.reused;
  s.moe_experts = forward_->config().n_experts;
  s.moe_expert_tokens = forward_->expert_tokens();
  s.tp_wait_nanos = forward_->tp_wait_nanos();
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.running = static_cast<int64_t>(running_.size());
  s.held = handoffs_.num_held();
  s.remote_prefill_failures = handoffs_.num_failures();
  s.window_dropped_blocks = window_.num_dropped_blocks();
  if (draft_ != nullptr) {
    const DraftProposer::Stats d = draft_->stats();
    s.draft_forward_passes = d.forward_passes;
    s.draft_catch_up_tokens = d.catch_up_tokens;
    s.draft_evictions = d.evictions;
    s.draft_free_blocks = d.free_blocks;
  }
  for (const auto& q : waiting_) {
    s.pending_prefill_tokens += static_cast<int64_t>(q->prompt_len);
  }
  for (const auto& q : running_) {
    if (!q->remote_pending && q->num_computed < static_cast<int64_t>(q->prompt_len)) {
      s.pending_prefill_tokens += static_cast<int64_t>(q->prompt_len) - q->num_computed;
    }
  }
  s.remote_prefills = std::count_if(running_.begin(), running_.end(),
                                    [](const auto& q) { return q->remote_pending; });
  s.kv = kv_->Stats();
  return s;
}

}  // namespace pd::engine
