// Writes valid data files as the seed corpus of data_reader_fuzzer: rows of the Criteo
// generator, the same rows without their labels (Criteo's test-file layout), and as libsvm
// rows, and binary copies of the first two. Usage: fuzz_data_reader_seeds FOLDER
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "worker/binary_data.hpp"
#include "worker/data_generator.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  parasol::GeneratorOptions g;
  g.rows = 4;
  g.seed = 3;
  if (!parasol::GenerateCriteo(dir + "/criteo", g).ok()) return 1;
  std::ifstream in(dir + "/criteo");
  std::ofstream unlabeled(dir + "/criteo-unlabeled"), libsvm(dir + "/libsvm");
  std::ofstream crlf(dir + "/libsvm-crlf", std::ios::binary);
  std::string line;
  for (int row = 0; std::getline(in, line); ++row) {
    unlabeled << line.substr(line.find('\t') + 1) << "\n";
    // The integer features as libsvm's index:value, the label as 0/1 or -1/+1.
    std::ostringstream s;
    s << (line[0] == '1' ? (row % 2 ? "+1" : "1") : (row % 2 ? "-1" : "0"));
    std::istringstream fields(line);
    std::string field;
    std::getline(fields, field, '\t');
    for (int i = 1; i <= 13 && std::getline(fields, field, '\t'); ++i) {
      if (!field.empty()) s << " " << i << ":" << field << (i % 3 ? "" : ".5");
    }
    libsvm << s.str() << "\n";
    crlf << s.str() << "\r\n";
  }
  unlabeled.close();
  // Binary copies (parasol convert): blocks of 3 rows, so the last one is short.
  const auto binary = parasol::ConvertCriteo(dir + "/criteo", dir + "/criteo.bin", true,
                                             parasol::DataOptions::OnBadRow::kFail, 3);
  const auto binary_unlabeled =
      parasol::ConvertCriteo(dir + "/criteo-unlabeled", dir + "/criteo-unlabeled.bin", false,
                             parasol::DataOptions::OnBadRow::kFail, 3);
  return unlabeled && libsvm && crlf && binary.ok() && binary_unlabeled.ok() ? 0 : 1;
}
