// Runs a fuzz target over files (its corpus, and any crash a fuzzing run found), without
// libFuzzer: `fuzz_replay FILE_OR_DIR...`. A test of CI, under the sanitizers.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int files = 0;
  auto run = [&](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    ++files;
  };
  for (int i = 1; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) run(e.path());
    } else if (fs::is_regular_file(argv[i])) {
      run(argv[i]);
    } else {
      std::cerr << "fuzz_replay: " << argv[i] << " not found\n";
      return 1;
    }
  }
  std::cout << "fuzz_replay: " << files << " inputs, no crash\n";
  return files > 0 ? 0 : 1;
}
