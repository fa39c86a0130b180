#include "services/router/openai/sibling_streams.h"

#include <utility>

#include "common/log/log.h"

namespace pd::router::openai {

namespace v1 = pdserve::v1;

SiblingStreams::SiblingStreams(std::unique_ptr<Doorbell> doorbell,
                               std::vector<std::unique_ptr<HttpStream>> streams,
                               HttpStreamOptions options)
    : doorbell_(std::move(doorbell)), streams_(std::move(streams)), options_(std::move(options)) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    streams_[i]->builder().set_choice_index(static_cast<int>(i));
    streams_[i]->builder().set_usage_chunk(false);
  }
}

absl::StatusOr<std::string> SiblingStreams::ReadBody(
    const std::vector<v1::GenerateResponse>& firsts) {
  for (size_t i = 0; i < streams_.size(); ++i) streams_[i]->AddFirst(firsts[i]);
  bool cancelled = false;
  for (;;) {
    const uint64_t seen = doorbell_->rings();
    bool all_ended = true;
    bool progressed = false;
    for (auto& s : streams_) {
      const HttpStream::Poll p = s->PollBody();
      if (p == HttpStream::Poll::kEnded) {
        // One failed choice fails the request; the others are cancelled when destroyed.
        if (!s->end_status().ok()) return s->end_status();
        continue;
      }
      all_ended = false;
      progressed |= p == HttpStream::Poll::kMessage;
    }
    if (all_ended) break;
    if (progressed) continue;
    doorbell_->WaitPast(seen, options_.client_check);
    if (!cancelled && options_.client_gone != nullptr && options_.client_gone()) {
      cancelled = true;
      VLOG(1) << "http: client hung up; cancelling its " << streams_.size() << " choices";
      for (auto& s : streams_) s->CancelForClient();
    }
  }
  std::vector<std::string> choices;
  std::vector<v1::Usage> usages;
  for (auto& s : streams_) {
    choices.push_back(s->builder().ChoiceJson());
    usages.push_back(s->builder().usage());
  }
  return streams_[0]->builder().BodyOf(choices, ResponseBuilder::CombinedUsage(usages));
}

void SiblingStreams::StartEvents(const std::vector<v1::GenerateResponse>& firsts) {
  for (size_t i = 0; i < streams_.size(); ++i) streams_[i]->StartEvents(firsts[i]);
}

bool SiblingStreams::WriteEvents(EventWriter& out) {
  if (done_) {
    out.Done();
    return true;
  }
  const uint64_t seen = doorbell_->rings();
  bool all_ended = true;
  for (size_t k = 0; k < streams_.size(); ++k) {
    HttpStream& s = *streams_[(next_ + k) % streams_.size()];
    std::string events;
    switch (s.PollEvents(&events)) {
      case HttpStream::Poll::kMessage: {
        next_ = (next_ + k + 1) % streams_.size();
        const bool ok = events.empty() || out.Write(events);
        s.Written(ok);
        if (!ok) {
          for (auto& other : streams_) other->CancelForClient();
        }
        return ok;
      }
      case HttpStream::Poll::kEnded:
        if (!s.end_status().ok()) {
          // One failed choice ends the response; the others are cancelled when destroyed.
          done_ = true;
          const bool ok = out.Write(ResponseBuilder::ErrorEvent(ErrorFromStatus(s.end_status())) +
                                    ResponseBuilder::DoneEvent());
          if (ok) out.Done();
          return ok;
        }
        break;
      case HttpStream::Poll::kNothing:
        all_ended = false;
        break;
    }
  }
  if (all_ended) {
    done_ = true;
    std::string tail;
    std::vector<v1::Usage> usages;
    for (auto& s : streams_) usages.push_back(s->builder().usage());
    ResponseBuilder& b = streams_[0]->builder();
    if (b.include_usage()) tail = b.UsageEvent(ResponseBuilder::CombinedUsage(usages));
    tail += ResponseBuilder::DoneEvent();
    const bool ok = out.Write(tail);
    if (ok) out.Done();
    return ok;
  }
  doorbell_->WaitPast(seen, options_.ping);
  if (doorbell_->rings() != seen) return true;  // something came: the next call writes it
  return out.Write(": ping\n\n");
}

}  // namespace pd::router::openai
