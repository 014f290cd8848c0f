// SPDX-License-Identifier: MIT
// wm-ab-table: prints two `wm-load --json` results side by side (import arm vs copy arm), with
// the ratio of each figure, so one run shows what the import saves.
//
//   wm-ab-table IMPORT.json COPY.json
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace {

nlohmann::json load(const char* path) {
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    return j;
}

std::string cell(const nlohmann::json& v, bool bytes) {
    if (v.is_null()) return "unknown";
    if (bytes) return fmt::format("{:.1f} MiB", v.get<double>() / 1048576.0);
    if (v.is_number_float()) return fmt::format("{:.3f}", v.get<double>());
    return v.dump();
}

std::string ratio(const nlohmann::json& a, const nlohmann::json& b) {
    if (!a.is_number() || !b.is_number()) return "-";
    double x = a.get<double>(), y = b.get<double>();
    if (y == 0) return x == 0 ? "=" : "-";
    return fmt::format("{:.3f}", x / y);
}

} // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        fmt::print(stderr, "usage: wm-ab-table IMPORT.json COPY.json\n");
        return 1;
    }
    nlohmann::json a = load(argv[1]), b = load(argv[2]);
    if (a.is_discarded() || b.is_discarded() || !a.is_object() || !b.is_object()) {
        fmt::print(stderr, "wm-ab-table: both files must hold one wm-load --json object\n");
        return 1;
    }
    struct Row {
        const char* key;
        bool bytes;
    };
    const Row rows[] = {
        {"importer", false},         {"mapping", false},          {"device_bytes", true},
        {"imported_bytes", true},    {"pinned_bytes", true},      {"imports", false},
        {"fallback_bytes", true},    {"copied_bytes", true},      {"tensors_verified", false},
        {"tensors_mismatched", false}, {"load_seconds", false},   {"rss_anon_delta", true},
        {"rss_anon_peak", true},     {"rss_file_delta", true},    {"vm_lck_delta", true},
        {"vm_pin_delta", true},
    };
    fmt::print("{:<20} {:>16} {:>16} {:>14}\n", "", "import arm", "copy arm", "import/copy");
    for (const Row& r : rows) {
        const nlohmann::json& x = a.contains(r.key) ? a[r.key] : nlohmann::json(nullptr);
        const nlohmann::json& y = b.contains(r.key) ? b[r.key] : nlohmann::json(nullptr);
        bool text = x.is_string() || y.is_string();
        fmt::print("{:<20} {:>16} {:>16} {:>14}\n", r.key,
                   text ? x.get<std::string>() : cell(x, r.bytes),
                   text ? y.get<std::string>() : cell(y, r.bytes), text ? "" : ratio(x, y));
    }
    return 0;
}
