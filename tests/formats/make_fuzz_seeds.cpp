// SPDX-License-Identifier: MIT
// Writes the fuzz seeds (small valid files from sample_models.cpp) into DIR/gguf and
// DIR/safetensors, or with --check compares them with what is there (the test that keeps the
// checked-in corpus in step with the writers). Regenerate with:
//   build/tests/formats/make_fuzz_seeds tests/fuzz/corpus
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "formats/sample_models.hpp"

int main(int argc, char** argv) {
    const bool check = argc == 3 && std::string(argv[1]) == "--check";
    if (argc != 2 && !check) {
        std::fprintf(stderr, "usage: make_fuzz_seeds [--check] DIR\n");
        return 2;
    }
    const std::filesystem::path root = argv[argc - 1];
    int stale = 0, written = 0;
    auto handle = [&](const char* sub, const auto& seeds) {
        const std::filesystem::path dir = root / sub;
        if (!check) std::filesystem::create_directories(dir);
        for (const auto& [name, bytes] : seeds) {
            const std::filesystem::path p = dir / name;
            if (check) {
                std::ifstream f(p, std::ios::binary);
                std::string have((std::istreambuf_iterator<char>(f)),
                                 std::istreambuf_iterator<char>());
                if (have.size() != bytes.size() ||
                    !std::equal(have.begin(), have.end(),
                                reinterpret_cast<const char*>(bytes.data()))) {
                    std::fprintf(stderr, "stale or missing seed: %s\n", p.c_str());
                    ++stale;
                }
            } else {
                std::ofstream f(p, std::ios::binary | std::ios::trunc);
                f.write(reinterpret_cast<const char*>(bytes.data()),
                        static_cast<std::streamsize>(bytes.size()));
                ++written;
            }
        }
    };
    handle("gguf", wm::test::gguf_fuzz_seeds());
    handle("safetensors", wm::test::safetensors_fuzz_seeds());
    if (check && stale > 0)
        std::fprintf(stderr, "regenerate with: make_fuzz_seeds %s\n", root.c_str());
    if (!check) std::printf("wrote %d seeds under %s\n", written, root.c_str());
    return stale > 0 ? 1 : 0;
}
