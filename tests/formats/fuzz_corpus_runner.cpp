// SPDX-License-Identifier: MIT
// Runs a libFuzzer target's LLVMFuzzerTestOneInput over every file of the given corpus
// directories, so the normal (gcc) test suite replays the checked-in corpus without libFuzzer.
// Fails when a directory holds no file, so the test cannot pass vacuously.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
    std::size_t total = 0;
    for (int i = 1; i < argc; ++i) {
        std::size_t count = 0;
        for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
            if (!entry.is_regular_file()) continue;
            std::ifstream f(entry.path(), std::ios::binary);
            std::vector<char> bytes((std::istreambuf_iterator<char>(f)),
                                    std::istreambuf_iterator<char>());
            LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                   bytes.size());
            ++count;
        }
        if (count == 0) {
            std::fprintf(stderr, "%s: no corpus files\n", argv[i]);
            return 1;
        }
        total += count;
    }
    std::printf("replayed %zu corpus files\n", total);
    return total > 0 ? 0 : 1;
}
