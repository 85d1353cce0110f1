// JSON text that Parasol writes (a shard's stats, worker and job summaries, model.json, the
// benchmark rows). Objects keep their keys in the order they were set; strings are escaped by
// nlohmann::json, and bytes that are not UTF-8 become U+FFFD instead of failing the dump.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace parasol {

using Json = nlohmann::ordered_json;

// One line without spaces: {"a":1,"b":[1,2]}.
inline std::string CompactJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace json_detail {
inline void AppendSpaced(const Json& j, std::string* out) {
  if (j.is_object()) {
    *out += '{';
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      if (!first) *out += ", ";
      first = false;
      *out += CompactJson(Json(key));
      *out += ": ";
      AppendSpaced(value, out);
    }
    *out += '}';
  } else if (j.is_array()) {
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) *out += ", ";
      AppendSpaced(j[i], out);
    }
    *out += ']';
  } else {
    *out += CompactJson(j);
  }
}
}  // namespace json_detail

// One line with a space after each comma and colon, as Python's json.dumps writes it:
// {"a": 1, "b": [1, 2]}. Scripts read summaries with patterns such as '"eval_auc": ...'.
inline std::string SpacedJson(const Json& j) {
  std::string out;
  json_detail::AppendSpaced(j, &out);
  return out;
}

}  // namespace parasol
