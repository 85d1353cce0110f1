// Figures from JSON text that Parasol wrote (a shard's stats, a job summary), for tests.
#pragma once

#include <string>
#include <vector>

#include "common/json_text.hpp"

namespace parasol::testing {

// The parsed text, or a discarded value (is_discarded()) when it is not JSON.
inline Json ParseJson(const std::string& text) { return Json::parse(text, nullptr, false); }

// The number at `pointer`, a JSON pointer such as "/held_pulls" or "/tables/0/rows", or
// `missing` when the text is not JSON or holds no number there.
inline double JsonAt(const std::string& text, const std::string& pointer, double missing = 0) {
  const Json j = ParseJson(text);
  const Json::json_pointer at(pointer);
  if (j.is_discarded() || !j.contains(at) || !j.at(at).is_number()) return missing;
  return j.at(at).get<double>();
}

// The stats each shard logged as it stopped ("shard N stopping: {...}"), in the log's order; a
// line whose JSON does not parse gives a discarded value.
inline std::vector<Json> StoppingStats(const std::string& log) {
  const std::string mark = "stopping: {";
  std::vector<Json> out;
  for (size_t at = log.find(mark); at != std::string::npos; at = log.find(mark, at + 1)) {
    const size_t begin = at + mark.size() - 1;
    const size_t end = log.find('\n', begin);
    out.push_back(ParseJson(log.substr(begin, end == std::string::npos ? end : end - begin)));
  }
  return out;
}

}  // namespace parasol::testing
