// Every field of the job manifest in one table: its path, type, default and meaning.
//
// The table is the one description of the manifest: `parasol manifest explain KEY` prints an
// entry of it, `parasol manifest reference` the Markdown reference (docs/manifest.md) and
// `parasol manifest example` the commented example (examples/manifest.yaml); the parser's
// errors about a known key name the explain command. tests/common/manifest_fields_test.cc
// checks that the parser asks for exactly the fields listed here, that each default is what
// the parser leaves when the field is absent, and that the two files are what the generators
// print: a field added to the parser (common/manifest.cc) needs its entry here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace parasol {

struct ManifestField {
  // "training.batch_size", "tables[].optimizer.lr": a list's elements are written "[]".
  std::string path;
  // A mapping of further fields (`training`, `tables[].init`); they follow it in the table.
  bool section = false;
  // The type as a user reads it: "unsigned integer, 1 to 65536", "duration (e.g. 30s)".
  std::string type;
  // YAML text that means the same as leaving the field out ("30s", "[]", "\"\""); "required"
  // for a field without a default; empty where the default is derived from other fields
  // (default_note says from what) or cannot be written.
  std::string default_value;
  // What the default amounts to, where the YAML text alone does not say ("every listed
  // shard", "no checkpoints").
  std::string default_note;
  // One or two sentences; where a field applies only with another, it says so.
  std::string meaning;
  // The value examples/manifest.yaml gives the field, when not its default; one starting with
  // "# " is written as a comment (a field that does not apply to the example's job).
  std::string example;
};

// The table, in the order of the reference: each section before its fields.
const std::vector<ManifestField>& ManifestFields();

// `path` with each list index ("[3]") written "[]": "tables[0].dim" -> "tables[].dim".
std::string ManifestFieldKey(std::string_view path);

// The entry of `path`, or nullptr. Accepts "tables[].dim", "tables[0].dim" and "tables.dim",
// and an element of a list field ("cluster.servers[1]" is cluster.servers).
const ManifestField* FindManifestField(std::string_view path);

// Levenshtein distance between two keys (for "did you mean" suggestions).
size_t EditDistance(std::string_view a, std::string_view b);

// The known paths nearest to `path` (a typo of a path, or of its last component), at most
// `count`, nearest first; none that is far off.
std::vector<std::string> NearestManifestFields(std::string_view path, size_t count);

// " (parasol manifest explain training.batch_size)" for a known path, else "": the hint that
// ends the parser's errors about a known key.
std::string ManifestExplainHint(std::string_view path);

// `parasol manifest explain`: a field's path, type, default and meaning; for a section, one
// line per field under it.
std::string ExplainManifestField(const ManifestField& field);

// `parasol manifest reference`: docs/manifest.md.
std::string ManifestReferenceMarkdown();

// `parasol manifest example`: examples/manifest.yaml. The options are for tests: the example
// without the field `omit`, or with the field `at_default` set to its default.
struct ManifestExampleOptions {
  std::string omit;
  std::string at_default;
};
std::string ManifestExampleYaml(const ManifestExampleOptions& options = {});

}  // namespace parasol
