#include "engine/model/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/utf8/utf8.h"

namespace pd::engine {
namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_unicode{};
  std::array<uint8_t, 256> order{};
  std::array<int16_t, 512> from_unicode{};  // code point (< 512) -> byte, or -1
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables();
    t->from_unicode.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) {
        t->order[next++] = static_cast<uint8_t>(b);
        t->to_unicode[b] = static_cast<uint32_t>(b);
      }
    }
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      if (!printable(b)) {
        t->order[next++] = static_cast<uint8_t>(b);
        t->to_unicode[b] = static_cast<uint32_t>(256 + extra++);
      }
    }
    for (int b = 0; b < 256; ++b) {
      t->from_unicode[t->to_unicode[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

const std::array<uint32_t, 256>& ByteToUnicode() { return Tables().to_unicode; }

const std::array<uint8_t, 256>& ByteOrder() { return Tables().order; }

std::string ByteLevelEncode(absl::string_view bytes) {
  const ByteTables& t = Tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    utf8::Append(t.to_unicode[static_cast<unsigned char>(c)], &out);
  }
  return out;
}

std::optional<std::string> ByteLevelDecode(absl::string_view text) {
  const ByteTables& t = Tables();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    // Ill-formed UTF-8 is never in the image; neither is a 3- or 4-byte character (>= U+0800).
    const utf8::Char c = utf8::Decode(text, i);
    if (!c.valid()) {
      return std::nullopt;
    }
    const auto cp = static_cast<uint32_t>(c.code_point);
    i += c.length;
    if (cp >= t.from_unicode.size() || t.from_unicode[cp] < 0) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(t.from_unicode[cp]));
  }
  return out;
}

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::string pattern, SplitBehavior behavior,
                             std::unique_ptr<Compiled> compiled)
    : pattern_(std::move(pattern)), behavior_(behavior), compiled_(std::move(compiled)) {}
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;
RegexSplitter::~RegexSplitter() = default;

absl::StatusOr<RegexSplitter> RegexSplitter::Create(absl::string_view pattern,
                                                    SplitBehavior behavior) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", pattern, "\" does not compile: ", reinterpret_cast<const char*>(message),
        " at offset ", error_offset));
  }
  auto compiled = std::make_unique<Compiled>();
  compiled->code = code;
  // JIT is an optimisation: without it (unsupported CPU, no executable memory) pcre2_match
  // interprets the pattern with identical results.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return RegexSplitter(std::string(pattern), behavior, std::move(compiled));
}

absl::Status RegexSplitter::Split(absl::string_view text,
                                  std::vector<absl::string_view>* pieces) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  CHECK(md != nullptr) << "pcre2_match_data_create_from_pattern: out of memory";
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;   // where the next search starts
  size_t emitted = 0;  // end of the last piece emitted (start of the pending gap)
  absl::Status status;
  while (offset < text.size()) {
    int rc = pcre2_match(compiled_->code, subject, text.size(), offset, 0, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The 32 KiB default JIT stack is too small for this input; the interpreter uses heap.
      rc = pcre2_match(compiled_->code, subject, text.size(), offset, PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      const std::string why = absl::StrCat("regex split at byte ", offset, ": ",
                                           reinterpret_cast<const char*>(message));
      status = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
                       rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_NOMEMORY
                   ? absl::ResourceExhaustedError(why)
                   : absl::InternalError(why);
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {
      offset = start + utf8::ByteGroupLength(text, start);
      continue;
    }
    if (start > emitted) {
      pieces->push_back(text.substr(emitted, start - emitted));
    }
    if (behavior_ == SplitBehavior::kIsolated) {
      pieces->push_back(text.substr(start, end - start));
    }
    emitted = offset = end;
  }
  pcre2_match_data_free(md);
  if (status.ok() && emitted < text.size()) {
    pieces->push_back(text.substr(emitted));
  }
  return status;
}

}  // namespace pd::engine
