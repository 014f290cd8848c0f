// SPDX-License-Identifier: MIT
// Import vs copy of one 256 MiB region of a mapped weight file, on the registry's default Vulkan
// device (lavapipe where no GPU driver is installed), side by side in one run: the time of the
// call and the process's RssAnon growth across it (from /proc/self/status).
//
// Both arms read the same, already faulted-in pages of a MAP_SHARED read-only mapping, so neither
// pays the page-cache faults. Exits 77 (SKIP) when no Vulkan device can import host memory.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "weightmap/backends/vulkan.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/registry.hpp"

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint64_t region_size = 256 * MiB;
constexpr int repeats = 3;

struct Sample {
    double ms = 0;
    std::int64_t rss_anon_delta = 0;
};

std::int64_t rss_anon() {
    wm::MemStat stat = wm::read_memstat();
    return stat.rss_anon ? static_cast<std::int64_t>(*stat.rss_anon) : -1;
}

std::string flags_string(VkMemoryPropertyFlags flags) {
    std::string out;
    auto add = [&](VkMemoryPropertyFlags bit, const char* name) {
        if ((flags & bit) != 0) out += fmt::format("{}{}", out.empty() ? "" : "|", name);
    };
    add(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "DEVICE_LOCAL");
    add(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, "HOST_VISIBLE");
    add(VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, "HOST_COHERENT");
    add(VK_MEMORY_PROPERTY_HOST_CACHED_BIT, "HOST_CACHED");
    add(VK_MEMORY_PROPERTY_LAZILY_ALLOCATED_BIT, "LAZILY_ALLOCATED");
    return out.empty() ? "0" : out;
}

Sample median(std::vector<Sample> samples) {
    std::sort(samples.begin(), samples.end(),
              [](const Sample& a, const Sample& b) { return a.ms < b.ms; });
    Sample m = samples[samples.size() / 2];
    std::vector<std::int64_t> deltas;
    for (const Sample& s : samples)
        deltas.push_back(s.rss_anon_delta);
    std::sort(deltas.begin(), deltas.end());
    m.rss_anon_delta = deltas[deltas.size() / 2];
    return m;
}

// A file of `size` bytes with a position-dependent pattern, removed on destruction.
struct BenchFile {
    std::string path;
    explicit BenchFile(std::uint64_t size) {
        const char* dir = std::getenv("TMPDIR");
        path = fmt::format("{}/weightmap-bench-vulkan-XXXXXX",
                           dir != nullptr && *dir != '\0' ? dir : "/tmp");
        int fd = mkstemp(path.data());
        if (fd < 0) throw std::runtime_error("mkstemp failed for " + path);
        std::vector<std::uint32_t> chunk(MiB / 4);
        for (std::uint64_t done = 0; done < size; done += MiB) {
            for (std::size_t i = 0; i < chunk.size(); ++i)
                chunk[i] = static_cast<std::uint32_t>((done / 4 + i) * 2654435761u);
            if (write(fd, chunk.data(), MiB) != static_cast<ssize_t>(MiB)) {
                close(fd);
                throw std::runtime_error("write failed for " + path);
            }
        }
        close(fd);
    }
    ~BenchFile() { unlink(path.c_str()); }
};

} // namespace

int main() {
    auto created = wm::create_importer("vulkan");
    if (!created) {
        fmt::print("SKIP: {}\n", created.error().message);
        return 77;
    }
    wm::Importer& importer = *created.value();
    auto facts = wm::vulkan_importer_facts(importer);
    if (!facts) {
        fmt::print(stderr, "bench_vulkan_import: {}\n", facts.error().message);
        return 1;
    }

    BenchFile file(region_size);
    std::vector<std::string> paths{file.path};
    auto mapped = wm::MappedModel::open(paths, wm::MappingAccess::read_only);
    if (!mapped) {
        fmt::print(stderr, "bench_vulkan_import: {}\n", mapped.error().message);
        return 1;
    }
    std::byte* base = mapped->files()[0].base;
    // Fault every page in first (page cache, RssFile): neither arm should pay for it.
    volatile std::uint8_t sink = 0;
    for (std::uint64_t off = 0; off < region_size; off += 4096)
        sink = sink + static_cast<std::uint8_t>(base[off]);

    std::vector<Sample> import_samples, copy_samples;
    std::vector<std::uint8_t> probe(4096);
    for (int r = 0; r < repeats; ++r) {
        Sample s;
        const std::int64_t before = rss_anon();
        const auto t0 = std::chrono::steady_clock::now();
        auto imported = importer.import(base, region_size);
        const auto t1 = std::chrono::steady_clock::now();
        s.rss_anon_delta = rss_anon() - before;
        if (!imported) {
            fmt::print(stderr, "bench_vulkan_import: import failed: {}\n",
                       imported.error().message);
            return 1;
        }
        s.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        // Not timed: the device really sees the file (last page).
        if (!importer.read_back(imported.value(), region_size - 4096, 4096, probe.data()) ||
            !std::equal(probe.begin(), probe.end(),
                        reinterpret_cast<const std::uint8_t*>(base) + region_size - 4096)) {
            fmt::print(stderr, "bench_vulkan_import: the import does not read back as the file\n");
            return 1;
        }
        (void)importer.release(imported.value());
        import_samples.push_back(s);
    }
    for (int r = 0; r < repeats; ++r) {
        Sample s;
        const std::int64_t before = rss_anon();
        const auto t0 = std::chrono::steady_clock::now();
        auto copy = importer.allocate_copy(base, region_size);
        const auto t1 = std::chrono::steady_clock::now();
        s.rss_anon_delta = rss_anon() - before;
        if (!copy) {
            fmt::print(stderr, "bench_vulkan_import: allocate_copy failed: {}\n",
                       copy.error().message);
            return 1;
        }
        s.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        if (!importer.read_back(copy.value(), region_size - 4096, 4096, probe.data()) ||
            !std::equal(probe.begin(), probe.end(),
                        reinterpret_cast<const std::uint8_t*>(base) + region_size - 4096)) {
            fmt::print(stderr, "bench_vulkan_import: the copy does not read back as the file\n");
            return 1;
        }
        (void)importer.free_copy(copy.value());
        copy_samples.push_back(s);
    }

    const Sample imp = median(import_samples), cpy = median(copy_samples);
    facts = wm::vulkan_importer_facts(importer); // now with the imports' memoryTypeBits
    fmt::print("bench_vulkan_import: {} MiB region of a MAP_SHARED read-only mapping\n",
               region_size / MiB);
    fmt::print("device '{}' (VkDriverId {}), Vulkan {}.{}\n", facts->device_name,
               static_cast<int>(facts->driver_id), VK_API_VERSION_MAJOR(facts->api_version),
               VK_API_VERSION_MINOR(facts->api_version));
    fmt::print("  minImportedHostPointerAlignment {}, maxMemoryAllocationSize {}, "
               "maxStorageBufferRange {}\n",
               facts->min_imported_host_pointer_alignment, facts->max_memory_allocation_size,
               facts->max_storage_buffer_range);
    for (std::uint32_t i = 0; i < facts->memory_type_count; ++i)
        fmt::print("  memory type {}: {} (heap {} MiB)\n", i,
                   flags_string(facts->memory_type_flags[i]),
                   facts->memory_type_heap_size[i] / MiB);
    fmt::print("  vkGetMemoryHostPointerPropertiesEXT memoryTypeBits {:#x}\n",
               facts->last_host_pointer_memory_type_bits);
    fmt::print("\n{:<16} {:>18} {:>22}\n", "arm", "time ms (median 3)", "RssAnon delta MiB");
    fmt::print("{:<16} {:>18.3f} {:>22.1f}\n", "import", imp.ms,
               static_cast<double>(imp.rss_anon_delta) / MiB);
    fmt::print("{:<16} {:>18.3f} {:>22.1f}\n", "allocate_copy", cpy.ms,
               static_cast<double>(cpy.rss_anon_delta) / MiB);
    fmt::print(
        "{:<16} {:>17.0f}x {:>22}\n", "copy vs import", imp.ms > 0 ? cpy.ms / imp.ms : 0.0,
        fmt::format("{:+.1f}", static_cast<double>(cpy.rss_anon_delta - imp.rss_anon_delta) / MiB));
    return 0;
}
