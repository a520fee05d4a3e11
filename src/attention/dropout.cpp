#include "attention/dropout.h"

#include <cmath>

#include "qkv/error.h"

namespace qkv {
namespace detail {

void validate_dropout(const Dropout& d, int64_t B, int64_t Hq, int64_t Tq, int64_t Tk,
                      const char* where) {
  check(std::isfinite(d.p) && d.p >= 0 && d.p <= 1, where, ": dropout p must be in [0, 1], got ",
        d.p);
  if (d.p == 0) return;
  constexpr int64_t kWords = int64_t{1} << 32;  // each counter word holds 32 bits
  check(d.batch_offset >= 0 && d.batch_offset <= kWords, where,
        ": dropout batch_offset must be in [0, 2^32], got ", d.batch_offset);
  check((B + d.batch_offset) * Hq <= kWords, where,
        ": dropout draws (batch + batch_offset) × heads = ", (B + d.batch_offset) * Hq,
        " masks, more than 2^32");
  check(Tq <= kWords && (Tk + kKeysPerCounter - 1) / kKeysPerCounter <= kWords, where,
        ": dropout takes at most 2^32 queries and 2^35 keys, got ", Tq, " and ", Tk);
}

}  // namespace detail

void dropout_mask(const Dropout& d, int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, uint8_t* keep) {
  check(B > 0 && Hq > 0 && Tq > 0 && Tk > 0, "dropout_mask: every size must be positive, got B ", B,
        ", Hq ", Hq, ", Tq ", Tq, ", Tk ", Tk);
  check(keep != nullptr, "dropout_mask: keep is null");
  detail::validate_dropout(d, B, Hq, Tq, Tk, "dropout_mask");
  const detail::DropoutRule rule(d, Hq);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        uint8_t* row = keep + ((b * Hq + h) * Tq + i) * Tk;
        for (int64_t j = 0; j < Tk; j += detail::kKeysPerCounter) {
          const auto w = rule.words(b, h, i, j / detail::kKeysPerCounter);
          for (int64_t r = j; r < j + detail::kKeysPerCounter && r < Tk; ++r)
            row[r] = !rule.on || detail::DropoutRule::half(w, r) >= rule.threshold;
        }
      }
}

}  // namespace qkv
