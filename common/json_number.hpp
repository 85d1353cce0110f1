// Reads one number from a flat JSON object written by Parasol itself (stats, summaries),
// accepting `"key": value` and `"key":value`. Not a JSON parser: the first match wins.
#pragma once

#include <cstdlib>
#include <string>

namespace parasol {

// The number after `"key":`, or `missing` when the key is absent.
inline double JsonNumber(const std::string& json, const std::string& key, double missing = 0.0) {
  const std::string quoted = "\"" + key + "\":";
  size_t p = json.find(quoted);
  if (p == std::string::npos) return missing;
  p += quoted.size();
  while (p < json.size() && json[p] == ' ') ++p;
  return std::atof(json.c_str() + p);
}

}  // namespace parasol
