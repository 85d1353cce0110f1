// Validators for the numbers given on `parasol`'s command line.
//
// CLI11 converts an unsigned option with strtoull, which takes "-5" as 2^64 - 5, and a double
// option takes "nan". These run on the text before that conversion: a count is decimal digits
// only, within [lo, hi]; a number is finite, within [lo, hi]. CLI11 names the flag in the error
// ("--rows: ...").
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace parasol::cli {

// A count: digits only (no sign, no spaces, no hex), at most hi (which bounds the digits read,
// so no text overflows) and at least lo.
inline CLI::Validator Count(uint64_t lo, uint64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        if (text.empty()) return "expected a count in " + range + ", got an empty value";
        uint64_t v = 0;
        for (char c : text) {
          if (c < '0' || c > '9') {
            return "expected a count in " + range + " (digits only), got '" + text + "'";
          }
          const uint64_t digit = static_cast<uint64_t>(c - '0');
          if (digit > hi || v > (hi - digit) / 10) {
            return "value " + text + " is above the limit of " + std::to_string(hi);
          }
          v = v * 10 + digit;
        }
        if (v < lo) return "value " + text + " is below the least allowed, " + std::to_string(lo);
        return "";
      },
      "COUNT in " + range);
}

// A finite decimal number in [lo, hi] (not nan or inf).
inline CLI::Validator FiniteNumber(double lo, double hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v)) {
          return "expected a finite number, got '" + text + "'";
        }
        if (v < lo || v > hi) return "value " + text + " is outside " + range;
        return "";
      },
      "NUMBER in " + range);
}

}  // namespace parasol::cli
