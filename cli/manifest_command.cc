// parasol manifest explain KEY | reference | example: the manifest's fields, from the one table
// in common/manifest_fields.cc.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "common/manifest_fields.hpp"

namespace parasol::cli {

int RunManifestExplain(const std::string& key) {
  if (const ManifestField* field = FindManifestField(key)) {
    std::fputs(ExplainManifestField(*field).c_str(), stdout);
    return 0;
  }
  std::string message = "no manifest field '" + key + "'";
  const std::vector<std::string> near = NearestManifestFields(key, 3);
  if (!near.empty()) {
    message += "; nearest:";
    for (const std::string& path : near) message += " " + path;
  } else {
    // Nothing near: the sections, from which `explain SECTION` lists the rest.
    message += "; the sections are:";
    for (const ManifestField& f : ManifestFields()) {
      if (f.section && f.path.find('.') == std::string::npos) message += " " + f.path;
    }
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}

int RunManifestReference() {
  std::fputs(ManifestReferenceMarkdown().c_str(), stdout);
  return 0;
}

int RunManifestExample() {
  std::fputs(ManifestExampleYaml().c_str(), stdout);
  return 0;
}

}  // namespace parasol::cli
