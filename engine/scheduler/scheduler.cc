#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "kernels/logprobs.h"
#include "kernels/sampling.h"

namespace pd::engine {
namespace {

// The entry of `token` sampled from one logits row of `vocab` floats, with `top_n` alternatives.
absl::StatusOr<TokenLogprob> ComputeLogprob(const float* logits, int64_t vocab, int32_t token,
                                            int32_t top_n) {
  float token_logprob = 0.0f;
  int32_t ids[kernels::kMaxTopLogprobs];
  float logprobs[kernels::kMaxTopLogprobs];
  kernels::LogProbsParams p;
  p.logits = logits;
  p.num_seqs = 1;
  p.vocab_size = vocab;
  p.logits_stride = vocab;
  p.tokens = &token;
  p.out_token_logprobs = &token_logprob;
  p.top_n = top_n;
  p.out_top_ids = ids;
  p.out_top_logprobs = logprobs;
  PD_RETURN_IF_ERROR(kernels::LogProbs(kernels::OpContext{}, p));
  TokenLogprob out;
  out.logprob = token_logprob;
  for (int32_t j = 0; j < top_n && ids[j] >= 0; ++j) {
    out.top.emplace_back(static_cast<uint32_t>(ids[j]), logprobs[j]);
  }
  return out;
}

}  // namespace

struct Scheduler::Sequence {
  GenerationRequest request;
  kvcache::SequenceId kv_id;
  BlockHash seed;
  std::vector<uint32_t> tokens;  // prompt + generated
  size_t prompt_len = 0;
  std::vector<BlockHash> chain;  // hashes of the full blocks of tokens[0, num_computed)
  int64_t num_computed = 0;      // tokens whose KV is in the pool
  int64_t num_allocated = 0;     // tokens with a slot in the block table (dropped included)
  // Sink + window policy: text tokens dropped from the cache. Text position p >= the sinks
  // lives at cache slot p - dropped; RoPE uses the text position.
  int64_t dropped = 0;
  bool admitted_once = false;
  uint32_t cached_tokens = 0;  // at first admission
  uint32_t num_preemptions = 0;
  // Text: generated text so far and how much of it was sent (the rest is held back because it
  // could start a stop string).
  std::unique_ptr<DecodeStream> detok;
  std::string text;
  size_t text_sent = 0;
  std::vector<uint32_t> unsent_tokens;
  std::vector<TokenLogprob> unsent_logprobs;  // aligned with unsent_tokens when asked
  FinishReason finished = FinishReason::kNone;
  absl::Status status;
  bool cancel_requested = false;
  bool remote_started = false;  // remote_prefill was called (only at first admission)
  bool remote_pending = false;  // waiting for Complete/FailRemotePrefill
  bool prefilled_remotely = false;
  bool held = false;             // prefill-only: computed, blocks held for the transfer
  uint32_t restored_tokens = 0;  // restored from the node's tiers at first admission
  absl::Duration restore_time;
  absl::Time submitted, first_scheduled, prefill_done, first_token;

  // The tier prefix's sources are released exactly once, even when the request never runs.
  void ReleaseTierPrefix() {
    if (request.tier_prefix.release) {
      auto release = std::move(request.tier_prefix.release);
      request.tier_prefix = TierPrefix();
      release();
    }
  }
  ~Sequence() { ReleaseTierPrefix(); }

  size_t num_generated() const { return tokens.size() - prompt_len; }
};

absl::Status SchedulerConfig::Validate() const {
  if (max_batch_tokens <= 0 || max_running <= 0 || max_running > max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: need 0 < max_running <= max_batch_tokens, got ", max_running,
                     " and ", max_batch_tokens));
  }
  if (max_waiting <= 0) {
    return absl::InvalidArgumentError("scheduler: max_waiting must be > 0");
  }
  if (kv_dtype.empty()) {
    return absl::InvalidArgumentError("scheduler: kv_dtype is empty");
  }
  if (kv_sink_tokens < 0 || kv_window_tokens < 0 || (kv_sink_tokens > 0 && kv_window_tokens == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler: kv_sink_tokens (", kv_sink_tokens,
                                                   ") and kv_window_tokens (", kv_window_tokens,
                                                   ") must be >= 0, and sinks need a window > 0"));
  }
  return absl::OkStatus();
}

Scheduler::Scheduler(SchedulerConfig config, LlamaForward* forward,
                     kvcache::KvCacheManager* kv_cache, const Tokenizer* tokenizer,
                     std::string fingerprint, Clock* clock)
    : config_(std::move(config)),
      forward_(forward),
      kv_(kv_cache),
      tokenizer_(tokenizer),
      fingerprint_(std::move(fingerprint)),
      clock_(clock) {}

Scheduler::~Scheduler() = default;

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
  const int64_t block_size = kv_cache->block_size();
  const int64_t sink_blocks = (config.kv_sink_tokens + block_size - 1) / block_size;
  const int64_t window_blocks = (config.kv_window_tokens + block_size - 1) / block_size;
  if (window_blocks > 0) {
    const int64_t cap = (sink_blocks + window_blocks + 1) * block_size;
    if (cap > forward->config().seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler: the sink + window cache of ", sink_blocks, " + ", window_blocks,
                       " + 1 blocks (", cap, " tokens) exceeds the model's context of ",
                       forward->config().seq_len, " tokens"));
    }
  }
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(config), forward, kv_cache, tokenizer,
                                             std::move(model_fingerprint), clock));
  s->sink_blocks_ = sink_blocks;
  s->window_blocks_ = window_blocks;
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

absl::Status Scheduler::Submit(GenerationRequest request) {
  const ModelConfig& c = forward_->config();
  const std::string id = request.id.ToString();
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": empty prompt"));
  }
  for (uint32_t t : request.prompt) {
    if (t >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": token id ", t, " >= vocab size ", c.vocab_size));
    }
  }
  if (static_cast<int64_t>(request.prompt.size()) >= c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": prompt of ", request.prompt.size(),
                     " tokens does not fit the context of ", c.seq_len));
  }
  int64_t needed = kv_->NumBlocksForTokens(static_cast<int64_t>(request.prompt.size()) + 1);
  if (windowed()) {
    needed = std::min(needed, sink_blocks_ + window_blocks_ + 1 + sink_blocks_);
    if (request.on_prefilled != nullptr &&
        static_cast<int64_t>(request.prompt.size()) > CacheCapTokens()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": prefill-only prompt of ", request.prompt.size(),
                       " tokens exceeds the sink + window cache of ", CacheCapTokens(),
                       " tokens (its blocks would be dropped before the transfer)"));
    }
  }
  if (needed > kv_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": prompt needs ", needed,
                                                   " KV blocks, the pool has ", kv_->num_blocks()));
  }
  for (uint32_t t : request.sampling.forced_tokens) {
    if (t >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": forced token id ", t, " >= vocab size ", c.vocab_size));
    }
  }
  if (std::isnan(request.sampling.temperature) || !(request.sampling.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": temperature ", request.sampling.temperature, " and top_p ",
                     request.sampling.top_p, " (need a number, and top_p at most 1; 0 means 1)"));
  }
  if (request.sampling.logprobs < -1 || request.sampling.logprobs > kernels::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": logprobs ",
                                                   request.sampling.logprobs, " outside [-1, ",
                                                   kernels::kMaxTopLogprobs, "]"));
  }
  if (request.remote_prefill != nullptr && request.on_prefilled != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": remote_prefill and on_prefilled are exclusive"));
  }
  auto same = [&](const std::unique_ptr<Sequence>& s) { return s->request.id == request.id; };
  if (std::any_of(waiting_.begin(), waiting_.end(), same) ||
      std::any_of(running_.begin(), running_.end(), same) ||
      std::any_of(held_.begin(), held_.end(), same)) {
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
  seq->detok = std::make_unique<DecodeStream>(tokenizer_, request.prompt.back());
  seq->submitted = clock_->Now();
  seq->request = std::move(request);
  waiting_.push_back(std::move(seq));
  return absl::OkStatus();
}

absl::Status Scheduler::Cancel(RequestId id) {
  for (auto* list : {&running_}) {
    for (auto& s : *list) {
      if (s->request.id == id) {
        s->cancel_requested = true;
        return absl::OkStatus();
      }
    }
  }
  for (auto& s : waiting_) {
    if (s->request.id == id) {
      s->cancel_requested = true;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("request ", id.ToString(), " is not queued or running"));
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
  GenerationOutput out;
  out.id = seq->request.id;
  out.new_tokens = std::move(seq->unsent_tokens);
  seq->unsent_tokens.clear();
  out.logprobs = std::move(seq->unsent_logprobs);
  seq->unsent_logprobs.clear();
  // Held-back text is released (a stop string match was cut off already); an incomplete UTF-8
  // tail is flushed raw unless the text ended at a stop string.
  std::string tail = seq->detok->Flush();
  if (reason != FinishReason::kStopString) {
    seq->text += tail;
  }
  out.text = seq->text.substr(std::min(seq->text_sent, seq->text.size()));
  seq->text_sent = seq->text.size();
  out.finish_reason = reason;
  out.status = seq->status;
  out.prompt_tokens = static_cast<uint32_t>(seq->prompt_len);
  out.cached_tokens = seq->cached_tokens;
  out.restored_tokens = std::min(seq->restored_tokens, seq->cached_tokens);
  out.completion_tokens = static_cast<uint32_t>(seq->num_generated());
  out.num_preemptions = seq->num_preemptions;
  out.timings.restore = seq->restore_time;
  out.prefilled_remotely = seq->prefilled_remotely;
  const absl::Time now = clock_->Now();
  const absl::Time scheduled = seq->admitted_once ? seq->first_scheduled : now;
  out.timings.queue = scheduled - seq->submitted;
  out.timings.prefill =
      seq->prefill_done > scheduled ? seq->prefill_done - scheduled : absl::ZeroDuration();
  out.timings.first_token =
      seq->first_token > seq->submitted ? seq->first_token - seq->submitted : absl::ZeroDuration();
  out.timings.total = now - seq->submitted;
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
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [](const std::unique_ptr<Sequence>& s) {
                                  return s->finished != FinishReason::kNone;
                                }),
                 waiting_.end());
}

void Scheduler::Admit() {
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running) {
    Sequence* seq = waiting_.front().get();
    // Under the sink + window policy only the first CacheCapTokens() are allocated now; the
    // rest is allocated (and earlier blocks dropped) block by block as it is computed.
    const int64_t num_tokens = static_cast<int64_t>(seq->tokens.size());
    const int64_t to_allocate = std::min(num_tokens, CacheCapTokens());
    std::vector<BlockHash> chain = ComputeBlockHashes(
        seq->seed, absl::MakeConstSpan(seq->tokens).first(static_cast<size_t>(to_allocate)),
        static_cast<uint32_t>(kv_->block_size()));
    // A remote prefill is tried once, at first admission; a preempted request recomputes here.
    // A prompt that needs a drop is computed here (the prefill worker would not drop).
    const bool remote =
        seq->request.remote_prefill != nullptr && !seq->remote_started && to_allocate == num_tokens;
    if (!seq->admitted_once && !seq->request.tier_prefix.chain.empty()) {
      const absl::Time start = clock_->Now();
      seq->restored_tokens =
          static_cast<uint32_t>(RestoreFromTiers(seq, chain) * kv_->block_size());
      seq->restore_time = clock_->Now() - start;
    }
    std::optional<kvcache::ImportTarget> import;
    absl::StatusOr<int64_t> cached = 0;
    if (remote) {
      absl::StatusOr<kvcache::ImportTarget> t = kv_->ImportBlocks(seq->kv_id, chain, num_tokens);
      if (t.ok()) {
        cached = t->num_cached_tokens;
        import = *std::move(t);
      } else {
        cached = t.status();
      }
    } else {
      cached = kv_->AllocatePrompt(seq->kv_id, chain, to_allocate);
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
    seq->chain.assign(chain.begin(), chain.begin() + *cached / kv_->block_size());
    if (!seq->admitted_once) {
      seq->admitted_once = true;
      seq->cached_tokens = static_cast<uint32_t>(*cached);
      seq->first_scheduled = clock_->Now();
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    if (import.has_value()) {
      seq->remote_started = true;
      seq->remote_pending = true;
      RemotePrefillTarget target;
      target.id = seq->request.id;
      target.num_cached_tokens = import->num_cached_tokens;
      target.first_block = import->first_block;
      target.block_ids = std::move(import->block_ids);
      target.chain = std::move(chain);
      seq->request.remote_prefill(std::move(target));
    }
  }
}

int64_t Scheduler::RestoreFromTiers(Sequence* seq, absl::Span<const BlockHash> chain) {
  const TierPrefix& tp = seq->request.tier_prefix;
  const int64_t block_size = kv_->block_size();
  const int64_t local = kv_->Match(chain);
  // Blocks wholly before the last prompt token: that token's block is always computed.
  int64_t end = std::min<int64_t>({tp.first_block + static_cast<int64_t>(tp.chain.size()),
                                   static_cast<int64_t>(chain.size()),
                                   (static_cast<int64_t>(seq->tokens.size()) - 1) / block_size});
  for (int64_t i = std::max(local, tp.first_block); i < end; ++i) {
    if (tp.chain[static_cast<size_t>(i - tp.first_block)] != chain[static_cast<size_t>(i)]) {
      end = i;  // not this prompt's block (another salt or model): never use it
      break;
    }
  }
  int64_t restored = 0;
  if (local >= tp.first_block && local < end) {
    // A scratch sequence takes references on the cached prefix (so allocating the fresh
    // blocks cannot evict it) and owns the fresh blocks while they are filled.
    const kvcache::SequenceId scratch(next_sequence_id_++);
    absl::StatusOr<int64_t> cached =
        kv_->AllocatePrompt(scratch, chain.first(static_cast<size_t>(end)), end * block_size + 1);
    if (cached.ok() && *cached == local * block_size) {
      absl::StatusOr<std::vector<BlockId>> ids = kv_->ExportBlocks(scratch, local, end - local);
      CHECK(ids.ok()) << ids.status();
      int64_t k = local;
      while (k < end && tp.copy_in(k, (*ids)[static_cast<size_t>(k - local)])) {
        ++k;
      }
      if (k < end) {
        ++stats_.tier_restore_failures;
      }
      if (k > local) {
        absl::Status commit = kv_->CommitBlocks(scratch, chain.first(static_cast<size_t>(k)));
        CHECK(commit.ok()) << commit;  // fresh blocks of this chain
      }
      restored = k - local;
    }
    if (cached.ok()) {  // (a failed AllocatePrompt changed nothing: no room, compute instead)
      absl::Status freed = kv_->Free(scratch);
      CHECK(freed.ok()) << freed;
    }
  }
  stats_.tier_restored_blocks += restored;
  seq->ReleaseTierPrefix();
  return restored;
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
                                              std::optional<TokenLogprob> first_logprob) {
  Sequence* seq = FindRunning(id);
  if (seq == nullptr || !seq->remote_pending) {
    return absl::NotFoundError(
        absl::StrCat("request ", id.ToString(), " has no remote prefill outstanding"));
  }
  seq->remote_pending = false;
  if (seq->finished != FinishReason::kNone) {
    return absl::OkStatus();  // cancelled meanwhile: the next sweep frees its blocks
  }
  if (first_token >= static_cast<uint32_t>(forward_->vocab_size())) {
    ++stats_.remote_prefill_failures;
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id.ToString(), ": remote first token ", first_token,
                     " >= vocab size ", forward_->vocab_size(), "; prefilling locally"));
  }
  const int32_t asked = seq->request.sampling.logprobs;
  if (asked < 0) {
    first_logprob.reset();
  } else {
    const bool usable =
        first_logprob.has_value() && first_logprob->top.size() <= static_cast<size_t>(asked) &&
        std::all_of(first_logprob->top.begin(), first_logprob->top.end(), [&](const auto& t) {
          return t.first < static_cast<uint32_t>(forward_->vocab_size());
        });
    if (!usable) {
      ++stats_.remote_prefill_failures;
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", id.ToString(), ": asked for logprobs (", asked,
          " alternatives) but the remote first token's entry is ",
          first_logprob.has_value() ? "malformed" : "missing", "; prefilling locally"));
    }
  }
  const uint32_t block_size = static_cast<uint32_t>(kv_->block_size());
  seq->num_computed = static_cast<int64_t>(seq->tokens.size());
  seq->chain = ComputeBlockHashes(seq->seed, seq->tokens, block_size);
  absl::Status commit = kv_->CommitBlocks(seq->kv_id, seq->chain);
  CHECK(commit.ok()) << commit;  // the chain hashes exactly the prompt's full blocks
  seq->prefill_done = clock_->Now();
  seq->prefilled_remotely = true;
  AcceptToken(seq, first_token, std::move(first_logprob));
  return absl::OkStatus();
}

absl::Status Scheduler::FailRemotePrefill(RequestId id) {
  Sequence* seq = FindRunning(id);
  if (seq == nullptr || !seq->remote_pending) {
    return absl::NotFoundError(
        absl::StrCat("request ", id.ToString(), " has no remote prefill outstanding"));
  }
  seq->remote_pending = false;
  if (seq->finished == FinishReason::kNone) {
    ++stats_.remote_prefill_failures;
  }
  return absl::OkStatus();  // num_computed is still the cached prefix: Step prefills the rest
}

absl::Status Scheduler::ReleasePrefilled(RequestId id) {
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if ((*it)->request.id == id) {
      absl::Status s = kv_->Free((*it)->kv_id);
      CHECK(s.ok()) << s;
      held_.erase(it);
      ++stats_.finished;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("request ", id.ToString(), " holds no prefilled blocks"));
}

void Scheduler::OnPrefilled(Sequence* seq, uint32_t token, std::optional<TokenLogprob> logprob) {
  PrefilledBlocks out;
  out.id = seq->request.id;
  out.first_token = token;
  out.first_logprob = std::move(logprob);
  out.cached_tokens = seq->cached_tokens;
  out.restored_tokens = std::min(seq->restored_tokens, seq->cached_tokens);
  out.restore = seq->restore_time;
  const kvcache::BlockTable* table = kv_->GetTable(seq->kv_id);
  out.block_ids.assign(table->blocks().begin(), table->blocks().end());
  const absl::Time scheduled = seq->first_scheduled;
  out.queue = scheduled - seq->submitted;
  out.prefill = seq->prefill_done - scheduled;
  seq->held = true;
  seq->request.on_prefilled(std::move(out));
}

void Scheduler::MoveHeld() {
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->held) {
      held_.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::Preempt(size_t running_index) {
  std::unique_ptr<Sequence> victim = std::move(running_[running_index]);
  running_.erase(running_.begin() + running_index);
  absl::Status s = kv_->Free(victim->kv_id);
  CHECK(s.ok()) << s;
  victim->num_computed = 0;
  victim->num_allocated = 0;
  victim->dropped = 0;
  victim->chain.clear();
  ++victim->num_preemptions;
  ++stats_.preemptions;
  VLOG(1) << "request_id=" << victim->request.id << " preempted (recompute later)";
  waiting_.push_front(std::move(victim));
}

int64_t Scheduler::CacheCapTokens() const {
  return windowed() ? (sink_blocks_ + window_blocks_ + 1) * kv_->block_size()
                    : std::numeric_limits<int64_t>::max();
}

absl::Status Scheduler::SlideWindow(Sequence* seq) {
  if (sink_blocks_ > 0 && seq->dropped == 0) {
    PD_RETURN_IF_ERROR(kv_->ForkLeadingBlocks(seq->kv_id, sink_blocks_).status());
  }
  absl::Status dropped = kv_->DropBlock(seq->kv_id, sink_blocks_);
  CHECK(dropped.ok()) << dropped;  // S + W + 1 full blocks are held
  seq->dropped += kv_->block_size();
  ++stats_.window_dropped_blocks;
  if (sink_blocks_ == 0) {
    return absl::OkStatus();
  }
  const kvcache::BlockTable* table = kv_->GetTable(seq->kv_id);
  std::vector<int32_t> originals, live;
  for (int64_t i = 0; i < sink_blocks_; ++i) {
    originals.push_back(static_cast<int32_t>(table->set_aside()[i].value()));
    live.push_back(static_cast<int32_t>(table->blocks()[i].value()));
  }
  absl::Status copied =
      forward_->CopyBlocksShifted(originals, live, sink_blocks_ * kv_->block_size(), seq->dropped);
  if (!copied.ok()) {
    return absl::InternalError(
        absl::StrCat("sink + window: rebuilding the sinks failed: ", copied.message()));
  }
  return absl::OkStatus();
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
    int64_t room = CacheCapTokens() - (seq->num_allocated - seq->dropped);
    if (room == 0) {
      // Sink + window at its cap: once everything held is computed, drop the oldest window
      // block and go on one block at a time (until then the batch computes what is held).
      if (seq->num_computed < seq->num_allocated) {
        continue;
      }
      absl::Status slid;
      while (absl::IsResourceExhausted(slid = SlideWindow(seq))) {
        if (running_.size() == 1) {
          break;
        }
        if (!PreemptYoungestFor(i)) {
          return;
        }
      }
      if (!slid.ok()) {
        Finish(seq, FinishReason::kError, slid);
        continue;
      }
      room = kv_->block_size();
    }
    if (AllocateSlots(i, std::min(missing, room)) == 0) {
      return;
    }
  }
}

void Scheduler::AcceptToken(Sequence* seq, uint32_t token, std::optional<TokenLogprob> logprob) {
  const ModelConfig& c = forward_->config();
  const SamplingOptions& so = seq->request.sampling;
  if (seq->num_generated() == 0) {
    seq->first_token = clock_->Now();
  }
  seq->tokens.push_back(token);
  seq->unsent_tokens.push_back(token);
  if (logprob.has_value()) {
    seq->unsent_logprobs.push_back(*std::move(logprob));
  }
  ++stats_.decode_tokens;
  const size_t generated = seq->num_generated();
  const bool may_stop = generated >= so.min_tokens;
  const bool is_eos =
      !so.ignore_eos && std::find(c.eos_ids.begin(), c.eos_ids.end(), token) != c.eos_ids.end();
  const bool is_stop_id = std::find(so.stop_token_ids.begin(), so.stop_token_ids.end(), token) !=
                          so.stop_token_ids.end();
  if (may_stop && (is_eos || is_stop_id)) {
    Finish(seq, FinishReason::kStop, absl::OkStatus());  // a stop token adds no text
    return;
  }
  absl::StatusOr<std::string> delta = seq->detok->Step(token);
  if (!delta.ok()) {
    Finish(seq, FinishReason::kError, delta.status());
    return;
  }
  seq->text += *delta;
  // Stop strings: look for a match that ends in the new text; hold back any tail that could
  // still grow into one.
  size_t hold = 0;
  if (may_stop) {
    for (const std::string& stop : so.stop) {
      const size_t from = seq->text_sent >= stop.size() ? seq->text_sent - stop.size() + 1 : 0;
      const size_t at = seq->text.find(stop, from);
      if (at != std::string::npos) {
        // Text already sent stays sent (possible only when min_tokens delayed the check).
        seq->text.resize(std::max(at, seq->text_sent));
        Finish(seq, FinishReason::kStopString, absl::OkStatus());
        return;
      }
      for (size_t k = std::min(stop.size() - 1, seq->text.size()); k > hold; --k) {
        if (seq->text.compare(seq->text.size() - k, k, stop, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
  }
  // The context bounds the length unless the sink + window policy keeps the cache within it;
  // then only max_tokens does (0 = the context, as without the policy).
  const bool context_full =
      static_cast<int64_t>(seq->tokens.size()) >= c.seq_len && (!windowed() || so.max_tokens == 0);
  if ((so.max_tokens > 0 && generated >= so.max_tokens) || context_full) {
    Finish(seq, FinishReason::kLength, absl::OkStatus());
    return;
  }
  GenerationOutput out;
  out.id = seq->request.id;
  out.new_tokens = std::move(seq->unsent_tokens);
  seq->unsent_tokens.clear();
  out.logprobs = std::move(seq->unsent_logprobs);
  seq->unsent_logprobs.clear();
  const size_t sendable = std::max(seq->text.size() - hold, seq->text_sent);
  out.text = seq->text.substr(seq->text_sent, sendable - seq->text_sent);
  seq->text_sent = sendable;
  if (seq->request.on_output) {
    seq->request.on_output(std::move(out));
  }
}

bool Scheduler::Step() {
  ExpireAndCancel();
  SweepFinished();
  Admit();
  EnsureSlots();
  SweepFinished();
  if (running_.empty()) {
    return false;
  }

  // One token for each sequence with exactly one to compute (decode), then prefill chunks.
  std::vector<Sequence*> members;
  std::vector<ForwardSequence> batch;
  std::vector<std::vector<int32_t>> tables;
  int64_t budget = config_.max_batch_tokens;
  for (int pass = 0; pass < 2 && budget > 0; ++pass) {
    for (auto& owned : running_) {
      Sequence* seq = owned.get();
      if (seq->remote_pending || seq->finished != FinishReason::kNone) {
        continue;
      }
      const int64_t todo = static_cast<int64_t>(seq->tokens.size()) - seq->num_computed;
      if (todo <= 0 || (todo == 1) != (pass == 0) || budget <= 0) {
        continue;
      }
      // Under the sink + window policy the slots may cover only part of the todo.
      const int64_t n = std::min({todo, budget, seq->num_allocated - seq->num_computed});
      if (n <= 0) {
        continue;
      }
      budget -= n;
      members.push_back(seq);
      const kvcache::BlockTable* table = kv_->GetTable(seq->kv_id);
      std::vector<int32_t> ids;
      ids.reserve(table->num_blocks());
      for (BlockId b : table->blocks()) {
        ids.push_back(static_cast<int32_t>(b.value()));
      }
      tables.push_back(std::move(ids));
      batch.push_back({absl::MakeConstSpan(seq->tokens).subspan(seq->num_computed, n),
                       seq->num_computed - seq->dropped,
                       {},
                       seq->dropped});
    }
  }
  if (batch.empty()) {
    return false;  // everything running waits for a remote prefill
  }
  ++stats_.steps;
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].block_table = tables[i];
  }
  // Each sequence's next token is sampled where the logits are (on the GPU with --device
  // cuda); only rows whose request asked for logprobs come back as logits.
  std::vector<SampleSpec> specs(members.size());
  bool any_logits = false;
  for (size_t i = 0; i < members.size(); ++i) {
    const SamplingOptions& so = members[i]->request.sampling;
    SampleSpec& sp = specs[i];
    // Below kernels::kMinSamplingTemperature (1e-5, subnormals included) is greedy, as 0.
    sp.temperature = kernels::IsGreedyTemperature(so.temperature) ? 0.0f : so.temperature;
    sp.top_k = so.top_k;
    sp.top_p = so.top_p > 0 ? so.top_p : 1.0f;
    sp.seed = so.seed;
    sp.step = members[i]->num_generated();
    sp.want_logits = so.logprobs >= 0;
    any_logits = any_logits || sp.want_logits;
  }
  std::vector<int32_t> sampled(members.size(), 0);
  absl::Status status =
      forward_->ForwardSample(batch, specs, sampled.data(), any_logits ? logits_.data() : nullptr);
  if (!status.ok()) {
    LOG(ERROR) << "forward pass failed for a batch of " << batch.size() << ": " << status;
    for (Sequence* seq : members) {
      Finish(seq, FinishReason::kError, status);
    }
    SweepFinished();
    return true;
  }

  const int64_t vocab = forward_->vocab_size();
  const uint32_t block_size = static_cast<uint32_t>(kv_->block_size());
  for (size_t i = 0; i < members.size(); ++i) {
    Sequence* seq = members[i];
    const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
    seq->num_computed += n;
    if (seq->num_computed <= static_cast<int64_t>(seq->prompt_len)) {
      stats_.prefill_tokens += n;
    }
    if (!kv_->GetTable(seq->kv_id)->windowed()) {  // (after a drop nothing more is shared)
      ExtendBlockHashes(seq->seed, absl::MakeConstSpan(seq->tokens).first(seq->num_computed),
                        block_size, &seq->chain);
      absl::Status commit = kv_->CommitBlocks(seq->kv_id, seq->chain);
      CHECK(commit.ok()) << commit;  // the chain hashes exactly the computed tokens
    }
    if (seq->num_computed < static_cast<int64_t>(seq->tokens.size())) {
      continue;  // a prefill chunk short of the end: no token yet
    }
    if (seq->num_generated() == 0 && seq->prefill_done == absl::Time()) {
      seq->prefill_done = clock_->Now();
    }
    const SamplingOptions& so = seq->request.sampling;
    const uint64_t step = seq->num_generated();
    int32_t token = sampled[i];
    if (step < so.forced_tokens.size()) {
      token = static_cast<int32_t>(so.forced_tokens[step]);  // teacher forcing
    }
    // Log-probabilities only for requests that asked, from the same host logits row.
    std::optional<TokenLogprob> logprob;
    if (so.logprobs >= 0) {
      absl::StatusOr<TokenLogprob> lp =
          ComputeLogprob(logits_.data() + i * vocab, vocab, token, so.logprobs);
      if (!lp.ok()) {
        Finish(seq, FinishReason::kError, lp.status());
        continue;
      }
      logprob = *std::move(lp);
    }
    if (seq->request.on_prefilled != nullptr) {
      OnPrefilled(seq, static_cast<uint32_t>(token), std::move(logprob));
      continue;
    }
    AcceptToken(seq, static_cast<uint32_t>(token), std::move(logprob));
  }
  MoveHeld();
  SweepFinished();
  return true;
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats s = stats_;
  const GraphStats graphs = forward_->graph_stats();
  s.decode_graph_captures = graphs.captures;
  s.decode_graph_replays = graphs.replays;
  s.decode_graphs_off = graphs.off;
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.running = static_cast<int64_t>(running_.size());
  s.held = static_cast<int64_t>(held_.size());
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
