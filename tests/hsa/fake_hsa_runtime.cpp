// SPDX-License-Identifier: MIT
// A fake HSA runtime, loaded by the HSA importer in place of libhsa-runtime64.so.1. It exports the
// entry points the importer uses with the real signatures (the HSA headers declare them, so a
// drift fails to compile) and enforces what the real runtime does, as measured upstream:
//   * hsa_amd_memory_lock of an address that is not page-aligned fails with HSA_STATUS_ERROR;
//   * so does a range whose pages are not all writable (checked in /proc/self/maps), when it is
//     told to behave like a runtime that locks read-write only (fake_hsa_set_refuse_read_only,
//     or WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY=1 at load and reset); by default it accepts
//     read-only pages, as KFD does for file-backed pages;
//   * a lock of writable pages write-faults every one of them, as KFD's userptr path does: it
//     faults the range in with write access unless the BO is read-only (amdgpu_ttm_tt_get_user_pages
//     / amdgpu_hmm_range_get_pages ask HMM_PFN_REQ_WRITE when !amdgpu_ttm_tt_is_readonly; ROCr's
//     hsa_amd_memory_lock registers without a read-only flag on ROCm 5.x). On a MAP_SHARED file
//     mapping that goes through page_mkwrite: the page is dirty and the file's mtime moves. The
//     fake writes each page's first byte back unchanged, which the kernel treats the same way.
//     Sourced from the kernel and ROCr sources, not measured on hardware;
//   * every lock needs an unlock: hsa_shut_down and library unload report live locks, and unload
//     ends the process with status 1 so a leak can never pass silently.
// It records, for every lock call that reaches the page checks, how many of the range's pages
// were in the page cache (mincore) and mapped in the process (/proc/self/pagemap), so a test
// can prove the importer populated the range before locking it.
// Tests steer it through the fake_hsa_* functions (looked up with dlsym).
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

namespace {

constexpr std::uint64_t cpu_agent_handle = 0x1000;
constexpr std::uint64_t first_gpu_handle = 0x2000;
// Agent pointers are host + this, so a test sees that the importer hands back the runtime's
// pointer and not the host one.
constexpr std::uintptr_t agent_aperture = std::uintptr_t{1} << 44;

// HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES (a uint8_t[8] bit set) and its AGENT_IS_APU bit, as
// runtimes after ROCm 5.2 define them; 5.2's headers lack both, and its runtime refuses the
// attribute with HSA_STATUS_ERROR_INVALID_ARGUMENT.
constexpr int memory_properties_attribute = 0xA114;
constexpr unsigned is_apu_bit = 1;

// What the GPU agents say about their memory (fake_hsa_set_memory_model).
enum MemoryModel {
    rocm52_base = 0,   // ROCm 5.2 on anything but an old APU: BASE profile, no memory properties
    newer_apu = 1,     // a newer runtime on an APU: AGENT_IS_APU set (the default)
    newer_dgpu = 2,    // a newer runtime on a discrete card: AGENT_IS_APU clear
    full_profile = 3,  // an APU whose KFD node has CPU cores (Kaveri, Carrizo): FULL profile
};

struct LiveLock {
    std::uintptr_t host;
    std::size_t size;
};

// One lock call as the runtime saw its pages.
struct LockRecord {
    std::uint64_t pages, resident, mapped;
};

bool refuse_read_only_from_env() {
    const char* v = std::getenv("WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY");
    return v != nullptr && std::strcmp(v, "1") == 0;
}

struct State {
    std::mutex mutex;
    // configuration
    hsa_status_t init_status = HSA_STATUS_SUCCESS;
    int gpu_agents = 1;
    MemoryModel memory_model = newer_apu;
    long fail_lock_at = 0; // 1-based count of lock calls from the last setting; 0: never
    hsa_status_t fail_lock_status = HSA_STATUS_ERROR_OUT_OF_RESOURCES;
    bool refuse_read_only = refuse_read_only_from_env();
    // observation
    int init_count = 0;
    long lock_calls = 0, lock_calls_since_fail_set = 0, unlock_calls = 0, bad_unlocks = 0;
    long leaked_at_shutdown = 0;
    std::vector<std::uint64_t> last_lock_agents;
    std::vector<LiveLock> locks;
    std::vector<LockRecord> records; // since the last reset
    std::uint64_t locked_bytes = 0; // by successful locks, since the last reset
};

// Never destroyed: report_leaks() runs after the exit handlers that destroy statics.
State& state() {
    static State* s = new State;
    return *s;
}

bool known_agent(const State& s, std::uint64_t handle) {
    if (handle == cpu_agent_handle) return true;
    return handle >= first_gpu_handle &&
           handle < first_gpu_handle + static_cast<std::uint64_t>(s.gpu_agents) * 0x10 &&
           (handle - first_gpu_handle) % 0x10 == 0;
}

// True when every byte of [begin, end) lies in mappings with 'w' permission.
bool range_writable(std::uintptr_t begin, std::uintptr_t end) {
    FILE* maps = std::fopen("/proc/self/maps", "r");
    if (maps == nullptr) return false;
    char line[512];
    std::uintptr_t covered = begin;
    while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
        std::uintptr_t lo = 0, hi = 0;
        char perms[8] = {};
        if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &lo, &hi, perms) != 3) continue;
        if (hi <= covered || lo > covered) continue; // lines are sorted by address
        if (perms[1] != 'w') break;
        covered = hi;
    }
    std::fclose(maps);
    return covered >= end;
}

// A write fault on every page, changing no byte: what a lock that asks write access does.
void write_fault(std::uintptr_t begin, std::uint64_t pages, std::uintptr_t page) {
    for (std::uint64_t i = 0; i < pages; ++i) {
        auto* byte = reinterpret_cast<volatile unsigned char*>(begin + i * page);
        *byte = *byte;
    }
}

// Pages of [begin, begin + pages * page) resident in the page cache, by mincore.
std::uint64_t resident_pages(std::uintptr_t begin, std::uint64_t pages, std::uintptr_t page) {
    std::vector<unsigned char> vec(pages);
    if (mincore(reinterpret_cast<void*>(begin), pages * page, vec.data()) != 0) return 0;
    std::uint64_t n = 0;
    for (unsigned char v : vec) n += v & 1u;
    return n;
}

// Pages of the range with a page-table entry in this process (/proc/self/pagemap bit 63).
std::uint64_t mapped_pages(std::uintptr_t begin, std::uint64_t pages, std::uintptr_t page) {
    const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    std::vector<std::uint64_t> entries(pages);
    const auto bytes = static_cast<ssize_t>(pages * sizeof(std::uint64_t));
    const bool ok = pread(fd, entries.data(), static_cast<std::size_t>(bytes),
                          static_cast<off_t>(begin / page * sizeof(std::uint64_t))) == bytes;
    close(fd);
    std::uint64_t n = 0;
    for (std::uint64_t e : entries) n += ok && (e >> 63) != 0;
    return n;
}

// Runs at library unload (process exit: the tests keep their own handle open).
__attribute__((destructor)) void report_leaks() {
    State& s = state();
    if (s.locks.empty() && s.leaked_at_shutdown == 0 && s.bad_unlocks == 0) {
        // unloaded by dlclose (an importer's in a tool, not a test holding its own handle): the
        // state goes with the library, or LeakSanitizer counts it as the caller's leak
        delete &s;
        return;
    }
    std::fprintf(stderr,
                 "fake HSA runtime: %zu lock(s) still live at unload, %ld leaked at hsa_shut_down, "
                 "%ld unlock(s) of pointers never locked\n",
                 s.locks.size(), s.leaked_at_shutdown, s.bad_unlocks);
    for (const LiveLock& l : s.locks)
        std::fprintf(stderr, "  live lock %#" PRIxPTR " +%#zx\n", l.host, l.size);
    std::fflush(nullptr); // _exit does not flush, and the test's own output explains the leak
    _exit(1);
}

} // namespace

// --- the HSA API ------------------------------------------------------------------------------

hsa_status_t HSA_API hsa_init() {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    if (s.init_status != HSA_STATUS_SUCCESS) return s.init_status;
    ++s.init_count;
    return HSA_STATUS_SUCCESS;
}

hsa_status_t HSA_API hsa_shut_down() {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    if (s.init_count == 0) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (--s.init_count == 0 && !s.locks.empty()) {
        std::fprintf(stderr, "fake HSA runtime: hsa_shut_down with %zu live lock(s)\n",
                     s.locks.size());
        s.leaked_at_shutdown += static_cast<long>(s.locks.size());
        s.locks.clear();
    }
    return HSA_STATUS_SUCCESS;
}

hsa_status_t HSA_API hsa_status_string(hsa_status_t status, const char** status_string) {
    if (status_string == nullptr) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    switch (status) { // the real runtime's strings (ROCm 5.2)
    case HSA_STATUS_SUCCESS:
        *status_string = "HSA_STATUS_SUCCESS: The function has been executed successfully.";
        return HSA_STATUS_SUCCESS;
    case HSA_STATUS_ERROR:
        *status_string = "HSA_STATUS_ERROR: A generic error has occurred.";
        return HSA_STATUS_SUCCESS;
    case HSA_STATUS_ERROR_INVALID_ARGUMENT:
        *status_string = "HSA_STATUS_ERROR_INVALID_ARGUMENT: One of the actual arguments does not "
                         "meet a precondition stated in the documentation of the corresponding "
                         "formal argument.";
        return HSA_STATUS_SUCCESS;
    case HSA_STATUS_ERROR_INVALID_AGENT:
        *status_string = "HSA_STATUS_ERROR_INVALID_AGENT: The agent is invalid.";
        return HSA_STATUS_SUCCESS;
    case HSA_STATUS_ERROR_OUT_OF_RESOURCES:
        *status_string = "HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the "
                         "necessary resources. This error may also occur when the core runtime "
                         "library needs to spawn threads or create internal OS-specific events.";
        return HSA_STATUS_SUCCESS;
    case HSA_STATUS_ERROR_NOT_INITIALIZED:
        *status_string = "HSA_STATUS_ERROR_NOT_INITIALIZED: An API other than hsa_init has been "
                         "invoked while the reference count of the HSA runtime is zero.";
        return HSA_STATUS_SUCCESS;
    default:
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
}

hsa_status_t HSA_API hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t agent, void* data),
                                        void* data) {
    State& s = state();
    int gpus = 0;
    {
        std::lock_guard<std::mutex> guard(s.mutex);
        if (s.init_count == 0) return HSA_STATUS_ERROR_NOT_INITIALIZED;
        gpus = s.gpu_agents;
    }
    if (callback == nullptr) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    // The callback may call back into the runtime, so no lock is held while it runs.
    if (hsa_status_t st = callback(hsa_agent_t{cpu_agent_handle}, data); st != HSA_STATUS_SUCCESS)
        return st;
    for (int i = 0; i < gpus; ++i) {
        const hsa_agent_t gpu{first_gpu_handle + static_cast<std::uint64_t>(i) * 0x10};
        if (hsa_status_t st = callback(gpu, data); st != HSA_STATUS_SUCCESS) return st;
    }
    return HSA_STATUS_SUCCESS;
}

hsa_status_t HSA_API hsa_agent_get_info(hsa_agent_t agent, hsa_agent_info_t attribute,
                                        void* value) {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    if (s.init_count == 0) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (!known_agent(s, agent.handle)) return HSA_STATUS_ERROR_INVALID_AGENT;
    if (value == nullptr) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    const bool gpu = agent.handle != cpu_agent_handle;
    switch (attribute) {
    case HSA_AGENT_INFO_DEVICE:
        *static_cast<hsa_device_type_t*>(value) = gpu ? HSA_DEVICE_TYPE_GPU : HSA_DEVICE_TYPE_CPU;
        return HSA_STATUS_SUCCESS;
    case HSA_AGENT_INFO_NAME: {
        char name[64] = {};
        std::snprintf(name, sizeof name, "%s", gpu ? "gfx1151" : "fake-cpu");
        std::memcpy(value, name, sizeof name);
        return HSA_STATUS_SUCCESS;
    }
    case HSA_AGENT_INFO_PROFILE:
        *static_cast<hsa_profile_t*>(value) =
            !gpu || s.memory_model == full_profile ? HSA_PROFILE_FULL : HSA_PROFILE_BASE;
        return HSA_STATUS_SUCCESS;
    default:
        if (static_cast<int>(attribute) == memory_properties_attribute &&
            s.memory_model != rocm52_base) {
            auto* bits = static_cast<std::uint8_t*>(value);
            std::memset(bits, 0, 8);
            if (gpu && s.memory_model == newer_apu) bits[is_apu_bit / 8] |= 1u << (is_apu_bit % 8);
            return HSA_STATUS_SUCCESS;
        }
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
}

hsa_status_t HSA_API hsa_amd_memory_lock(void* host_ptr, size_t size, hsa_agent_t* agents,
                                         int num_agent, void** agent_ptr) {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    if (s.init_count == 0) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    ++s.lock_calls;
    ++s.lock_calls_since_fail_set;
    if (host_ptr == nullptr || size == 0 || agent_ptr == nullptr || num_agent < 0 ||
        (agents == nullptr) != (num_agent == 0))
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    s.last_lock_agents.clear();
    for (int i = 0; i < num_agent; ++i) {
        if (!known_agent(s, agents[i].handle)) return HSA_STATUS_ERROR_INVALID_AGENT;
        s.last_lock_agents.push_back(agents[i].handle);
    }
    const auto host = reinterpret_cast<std::uintptr_t>(host_ptr);
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    // Both measured on the real runtime: a bare HSA_STATUS_ERROR, nothing more specific.
    if (host % page != 0) return HSA_STATUS_ERROR;
    if (size > UINTPTR_MAX - host) return HSA_STATUS_ERROR;
    const std::uint64_t pages = (size + page - 1) / page;
    s.records.push_back({pages, resident_pages(host, pages, page), mapped_pages(host, pages, page)});
    if (s.refuse_read_only && !range_writable(host, host + size)) return HSA_STATUS_ERROR;
    if (s.fail_lock_at != 0 && s.lock_calls_since_fail_set == s.fail_lock_at)
        return s.fail_lock_status;
    if (range_writable(host, host + size)) write_fault(host, pages, page);
    s.locks.push_back({host, size});
    s.locked_bytes += size;
    *agent_ptr = reinterpret_cast<void*>(host + agent_aperture);
    return HSA_STATUS_SUCCESS;
}

hsa_status_t HSA_API hsa_amd_memory_unlock(void* host_ptr) {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    if (s.init_count == 0) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    ++s.unlock_calls;
    const auto host = reinterpret_cast<std::uintptr_t>(host_ptr);
    for (auto it = s.locks.rbegin(); it != s.locks.rend(); ++it) {
        if (it->host != host) continue;
        s.locks.erase(std::next(it).base());
        return HSA_STATUS_SUCCESS;
    }
    // Undefined behaviour on the real runtime; the fake records it and fails the process.
    ++s.bad_unlocks;
    std::fprintf(stderr, "fake HSA runtime: unlock of %p, which is not locked\n", host_ptr);
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
}

// --- control, for tests -----------------------------------------------------------------------

extern "C" {

/// Restores the default configuration (one CPU and one GPU agent, hsa_init succeeds, no
/// injected failure) and zeroes the call counters. Live locks are kept: they are a test's leak.
void fake_hsa_reset() {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    s.init_status = HSA_STATUS_SUCCESS;
    s.gpu_agents = 1;
    s.memory_model = newer_apu;
    s.fail_lock_at = 0;
    s.fail_lock_status = HSA_STATUS_ERROR_OUT_OF_RESOURCES;
    s.refuse_read_only = refuse_read_only_from_env();
    s.lock_calls = s.lock_calls_since_fail_set = s.unlock_calls = 0;
    s.last_lock_agents.clear();
    s.records.clear();
    s.locked_bytes = 0;
}

/// 1: refuse (HSA_STATUS_ERROR) a lock of pages without 'w' in /proc/self/maps, as a runtime
/// that locks read-write only does; 0: accept them. Reset restores
/// $WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY (1: refuse; the default accepts).
void fake_hsa_set_refuse_read_only(int refuse) {
    std::lock_guard<std::mutex> guard(state().mutex);
    state().refuse_read_only = refuse != 0;
}

/// Lock calls recorded since the last reset (those past the argument and alignment checks).
long fake_hsa_lock_record_count() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return static_cast<long>(state().records.size());
}

/// Record `index` (0-based, since the last reset): the range's pages, and how many of them were
/// in the page cache (mincore) and mapped in the process (pagemap) when the lock was called.
/// Returns 0 for an index out of range.
int fake_hsa_lock_record(long index, std::uint64_t* pages, std::uint64_t* resident,
                         std::uint64_t* mapped) {
    std::lock_guard<std::mutex> guard(state().mutex);
    const auto& records = state().records;
    if (index < 0 || static_cast<std::size_t>(index) >= records.size()) return 0;
    const LockRecord& r = records[static_cast<std::size_t>(index)];
    *pages = r.pages;
    *resident = r.resident;
    *mapped = r.mapped;
    return 1;
}

/// Whether any byte of [host, host + size) lies in a live lock.
int fake_hsa_overlaps_lock(const void* host, std::uint64_t size) {
    std::lock_guard<std::mutex> guard(state().mutex);
    const auto begin = reinterpret_cast<std::uintptr_t>(host);
    for (const LiveLock& l : state().locks)
        if (l.host < begin + size && begin < l.host + l.size) return 1;
    return 0;
}

/// hsa_init returns `status` (an hsa_status_t) without initialising; HSA_STATUS_SUCCESS restores.
void fake_hsa_set_init_status(int status) {
    std::lock_guard<std::mutex> guard(state().mutex);
    state().init_status = static_cast<hsa_status_t>(status);
}

/// Number of GPU agents after the one CPU agent.
void fake_hsa_set_gpu_agent_count(int count) {
    std::lock_guard<std::mutex> guard(state().mutex);
    state().gpu_agents = count;
}

/// What the GPU agents report about their memory: 0 ROCm 5.2 (BASE profile, no memory
/// properties), 1 a newer runtime on an APU (the default), 2 a newer runtime on a discrete card,
/// 3 an APU with a FULL profile.
void fake_hsa_set_memory_model(int model) {
    std::lock_guard<std::mutex> guard(state().mutex);
    state().memory_model = static_cast<MemoryModel>(model);
}

/// The n-th hsa_amd_memory_lock call from now (1-based) fails with `status`; n = 0: never.
void fake_hsa_set_fail_lock_at(long n, int status) {
    std::lock_guard<std::mutex> guard(state().mutex);
    state().fail_lock_at = n;
    state().fail_lock_status = static_cast<hsa_status_t>(status);
    state().lock_calls_since_fail_set = 0;
}

/// Bytes locked (pinned: KFD's userptr BOs pin their pages) by successful locks since reset.
std::uint64_t fake_hsa_locked_bytes_total() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return state().locked_bytes;
}

long fake_hsa_live_locks() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return static_cast<long>(state().locks.size());
}

/// Total bytes of the live locks.
std::uint64_t fake_hsa_live_bytes() {
    std::lock_guard<std::mutex> guard(state().mutex);
    std::uint64_t bytes = 0;
    for (const LiveLock& l : state().locks) bytes += l.size;
    return bytes;
}

/// Whether [host, host + size) is exactly one live lock.
int fake_hsa_is_locked(const void* host, std::uint64_t size) {
    std::lock_guard<std::mutex> guard(state().mutex);
    for (const LiveLock& l : state().locks)
        if (l.host == reinterpret_cast<std::uintptr_t>(host) && l.size == size) return 1;
    return 0;
}

long fake_hsa_lock_calls() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return state().lock_calls;
}

long fake_hsa_unlock_calls() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return state().unlock_calls;
}

/// Current hsa_init reference count.
int fake_hsa_init_count() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return state().init_count;
}

/// Locks dropped by hsa_shut_down and unlocks of pointers never locked, since load.
long fake_hsa_misuse_count() {
    std::lock_guard<std::mutex> guard(state().mutex);
    return state().leaked_at_shutdown + state().bad_unlocks;
}

/// Copies the agent handles of the last hsa_amd_memory_lock call that got past argument checks
/// into out[0..max) and returns how many there were.
int fake_hsa_last_lock_agents(std::uint64_t* out, int max) {
    std::lock_guard<std::mutex> guard(state().mutex);
    const auto& agents = state().last_lock_agents;
    for (int i = 0; i < max && i < static_cast<int>(agents.size()); ++i)
        out[i] = agents[static_cast<std::size_t>(i)];
    return static_cast<int>(agents.size());
}

/// Handle of agent `index`: 0 is the CPU agent, 1.. the GPUs.
std::uint64_t fake_hsa_agent_handle(int index) {
    return index == 0 ? cpu_agent_handle
                      : first_gpu_handle + static_cast<std::uint64_t>(index - 1) * 0x10;
}

/// What the fake adds to a host address to make its agent pointer.
std::uint64_t fake_hsa_agent_aperture() {
    return agent_aperture;
}

} // extern "C"
