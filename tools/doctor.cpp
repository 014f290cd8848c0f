// SPDX-License-Identifier: MIT
#include "doctor.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fmt/format.h>

#include "weightmap/backends/cuda.hpp"
#include "weightmap/file_guard.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/model.hpp"
#include "weightmap/registry.hpp"

namespace wm::doctor {
namespace {

// ggml-cuda's kernels read weights with loads of at most 16 bytes, and GGUF aligns tensor data to
// 32 by default: the series' tensor alignment on CUDA and HIP (patch 0016,
// LLAMA_WEIGHTMAP_KERNEL_ALIGNMENT), in place of the buffer type's 128 that only 6 of 19 real
// headers meet.
constexpr std::uint64_t llama_kernel_alignment = 32;
// ggml-cuda pads quantized rows to MATRIX_ROW_PADDING elements (ggml-cuda/common.cuh).
constexpr std::uint64_t cuda_row_padding = 512;

class Fd {
public:
    explicit Fd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }

private:
    int fd_;
};

struct FsName {
    decltype(statfs::f_type) magic;
    const char* name;
};

// linux/magic.h's values for the file systems models live on.
constexpr FsName fs_names[] = {
    {0xEF53, "ext4"},         {0x58465342, "xfs"},        {0x9123683E, "btrfs"},
    {0x01021994, "tmpfs"},    {0x6969, "nfs"},            {0x794c7630, "overlayfs"},
    {0x65735546, "fuse"},     {0x2fc12fc1, "zfs"},        {0x858458f6, "ramfs"},
    {0x73717368, "squashfs"}, {0xF2F52010, "f2fs"},       {0x01021997, "9p"},
    {0xFF534D42, "cifs"},     {0xFE534D42, "smb2"},       {0x00c36400, "ceph"},
    {0x5346544e, "ntfs"},     {0x4d44, "vfat"},           {0x2011BAB0, "exfat"},
};

std::string filesystem_of(int fd) {
    struct statfs fs {};
    if (::fstatfs(fd, &fs) != 0) return fmt::format("unknown (fstatfs: {})", std::strerror(errno));
    for (const FsName& f : fs_names)
        if (fs.f_type == f.magic) return f.name;
    return fmt::format("unknown (0x{:x})", static_cast<std::uint64_t>(fs.f_type));
}

// The mount of the file's device in /proc/self/mountinfo (the longest mount point that prefixes
// the file's real path), and whether it is mounted -o dax.
void find_mount(int fd, const std::string& path, FileFacts& facts) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return;
    char real[PATH_MAX];
    const std::string where = ::realpath(path.c_str(), real) ? real : path;
    const std::string dev = fmt::format("{}:{}", major(st.st_dev), minor(st.st_dev));
    std::ifstream in("/proc/self/mountinfo");
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string id, parent, majmin, root, point, options;
        fields >> id >> parent >> majmin >> root >> point >> options;
        if (majmin != dev || where.compare(0, point.size(), point) != 0) continue;
        if (point.size() < facts.mount_point.size()) continue;
        facts.mount_point = point;
        facts.dax = line.find(",dax") != std::string::npos || line.find(" dax") != std::string::npos;
    }
}

void check_lease(int fd, const std::string& path, FileFacts& facts) {
    FileGuardParams params;
    params.files.push_back({fd, path});
    params.log = [](LogLevel, std::string_view) {}; // the answer is reported, not logged
    auto guard = FileGuard::create(std::move(params));
    if (!guard) {
        facts.lease_reason = guard.error().message;
        facts.lease_advice = "the file cannot be guarded: a change of it under a running server "
                             "goes unnoticed";
        return;
    }
    auto status = guard->status(0);
    facts.lease = status && status->lease == FileLeaseState::held;
    if (status && !facts.lease) facts.lease_reason = status->reason;
    if (!facts.lease)
        facts.lease_advice = "without a lease no writer is held off: a change of the file's bytes "
                             "stops the model with an error naming the file (docs/file_guard.md); "
                             "run the server as the file's owner or give it CAP_LEASE";
    if (facts.lease && ::geteuid() == 0)
        facts.lease_reason = "taken as root: a server run as another user needs to own the file or "
                             "hold CAP_LEASE";
}

Result<FileFacts> file_facts(const std::string& path) {
    Fd fd(path);
    if (fd.get() < 0)
        return Error{ErrorKind::io, fmt::format("{}: open: {}", path, std::strerror(errno))};
    FileFacts facts;
    facts.path = path;
    facts.filesystem = filesystem_of(fd.get());
    find_mount(fd.get(), path, facts);
    check_lease(fd.get(), path, facts);
    return facts;
}

// "blk.12.ffn_up.weight" -> "blk.*.ffn_up.weight": a run of digits between dots is a layer.
std::string group_name(const std::string& tensor) {
    std::string out;
    for (std::size_t i = 0; i < tensor.size();) {
        std::size_t j = i;
        while (j < tensor.size() && std::isdigit(static_cast<unsigned char>(tensor[j]))) ++j;
        const bool layer = j > i && (i == 0 || tensor[i - 1] == '.') &&
                           (j == tensor.size() || tensor[j] == '.');
        if (layer) {
            out += '*';
            i = j;
        } else {
            out += tensor[i++];
        }
    }
    return out;
}

std::string method_of(Importer& importer) {
    if (importer.name() == "cuda") {
        auto state = cuda_importer_state(importer);
        return state ? fmt::format("cuda {}", to_string(state->method)) : "cuda";
    }
    if (importer.name() == "hsa") return "hsa lock";
    if (importer.name() == "vulkan") return "vulkan import";
    return std::string(importer.name());
}

struct Probe {
    bool ok = false;
    std::string reason;
};

// One import of [base, +length), read back as the device sees it and compared with the file.
Probe import_and_read_back(Importer& importer, void* base, std::uint64_t length, int fd) {
    auto imported = importer.import(base, length);
    if (!imported) return {false, imported.error().message};
    std::vector<unsigned char> seen(length), file(length);
    Status read = importer.read_back(*imported, 0, length, seen.data());
    Probe probe{true, "the first page imported and read back through the device"};
    if (!read && read.error().kind == ErrorKind::unsupported) {
        probe.reason = "the first page imported (this importer cannot read back through its device)";
    } else if (!read) {
        probe = {false, "read back: " + read.error().message};
    } else if (::pread(fd, file.data(), length, 0) != static_cast<ssize_t>(length) ||
               std::memcmp(seen.data(), file.data(), length) != 0) {
        probe = {false, "the device read bytes other than the file's first page"};
    }
    (void)importer.release(*imported);
    return probe;
}

// Imports the file's first import-sized piece, mapped as the load maps it, and reads it back
// through the device: what the load's first import meets.
Probe probe_first_page(Importer& importer, const std::string& path, MappingAccess access) {
    Fd fd(path);
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) return {false, path + ": " + std::strerror(errno)};
    const std::uint64_t length = std::max(host_page_size(), importer.caps().alignment);
    if (static_cast<std::uint64_t>(st.st_size) < length)
        return {false, fmt::format("{}: {} bytes, less than one import ({} bytes)", path,
                                   st.st_size, length)};
    void* base = nullptr;
    if (access == MappingAccess::writable) {
        auto mapped = map_file_writable_shared(fd.get(), length);
        if (!mapped) return {false, mapped.error().message};
        base = mapped->base;
    } else {
        base = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd.get(), 0);
        if (base == MAP_FAILED) return {false, path + ": mmap: " + std::strerror(errno)};
    }
    Probe probe = import_and_read_back(importer, base, length, fd.get());
    ::munmap(base, length);
    return probe;
}

// --- the plan ------------------------------------------------------------------------------------

PlacementRules engine_rules(const Options& o) {
    PlacementRules rules = o.rules;
    // llama.cpp keeps the input layer on the CPU whatever -ngl says (llama-model.cpp: dev_input).
    if (o.engine == Engine::llama_cpp) (void)rules.add("^token_embd\\.weight$", std::string(cpu_target_name));
    return rules;
}

std::uint64_t tensor_alignment_for(const Options& o, const Importer& importer) {
    if (o.tensor_alignment != 0) return o.tensor_alignment;
    std::uint64_t a = std::max<std::uint64_t>(importer.caps().tensor_alignment, 1);
    const bool kernels = importer.name() == "cuda" || importer.name() == "hsa";
    return o.engine == Engine::llama_cpp && kernels ? std::max(a, llama_kernel_alignment) : a;
}

// ggml-cuda allocates a quantized tensor whose rows are not a multiple of 512 elements with the
// rest of a row after it (get_alloc_size, TAG_ALLOC_SIZE_EXPAND), and its kernels read it: the
// series imports the file's next bytes as that padding (llama_weightmap_in_place_extent), or copies
// the tensor where the padding would end past the file's last page. 0: no padding.
std::uint64_t cuda_padding(const Options& o, const Importer& importer, const TensorInfo& t) {
    if (o.engine != Engine::llama_cpp || (importer.name() != "cuda" && importer.name() != "hsa"))
        return 0;
    const GgmlType* type = find_ggml_type(t.type);
    if (type == nullptr || type->block_size <= 1 || t.shape.empty() ||
        t.shape[0] % cuda_row_padding == 0)
        return 0;
    return (cuda_row_padding - t.shape[0] % cuda_row_padding) / type->block_size * type->type_size;
}

// The tensors the series describes with their padding, and those it copies alone (their own
// reason; empty for the rest). A copied one moves to a target that never imports.
std::vector<std::string> apply_padding(const Options& o, const ModelInfo& info, const Importer& importer,
                                       ModelDesc& desc, std::vector<bool>& padded) {
    std::vector<std::string> copied(desc.tensors.size());
    padded.assign(desc.tensors.size(), false);
    const std::uint32_t never = static_cast<std::uint32_t>(desc.targets.size());
    for (std::uint32_t i = 0; i < desc.tensors.size(); ++i) {
        TensorDesc& t = desc.tensors[i];
        const std::uint64_t pad = cuda_padding(o, importer, info.tensors[i]);
        if (pad == 0 || desc.targets[t.target].caps.is_cpu) continue;
        const std::uint64_t file_size = info.files[t.file].size, page = host_page_size();
        const std::uint64_t end = t.offset + t.size + pad;
        if (end > (file_size + page - 1) / page * page) {
            copied[i] = fmt::format("its padding ({} bytes) would end past the last page of the file",
                                    pad);
            if (desc.targets.size() == never) {
                desc.targets.push_back(desc.targets[t.target]);
                desc.targets.back().name += " (copied)";
                desc.targets.back().import_policy = ImportPolicy::never;
            }
            t.target = never;
        } else {
            t.size = std::min(end, file_size) - t.offset;
            padded[i] = true;
        }
    }
    return copied;
}

TensorGroup& group_of(std::vector<TensorGroup>& groups, const std::string& tensor) {
    const std::string name = group_name(tensor);
    for (TensorGroup& g : groups)
        if (g.name == name) return g;
    groups.push_back({});
    groups.back().name = name;
    return groups.back();
}

// Per tensor group, and the device's byte counts (tensor bytes, padding not included): on the CPU,
// imported, or copied and why. `blocked`: why every device tensor is copied (the probe refused,
// the mapping cannot be writable), empty when the plan decides.
void count_groups(const ModelInfo& info, const ModelDesc& desc, const Plan& plan,
                  const std::vector<std::string>& copied, const std::vector<bool>& padded,
                  const std::string& blocked, Device& d) {
    for (std::uint32_t i = 0; i < desc.tensors.size(); ++i) {
        const TensorDesc& t = desc.tensors[i];
        const std::uint64_t bytes = info.tensors[i].size;
        TensorGroup& g = group_of(d.groups, t.name);
        ++g.tensors;
        g.bytes += bytes;
        if (desc.targets[t.target].caps.is_cpu) {
            ++g.on_cpu;
            d.cpu_bytes += bytes;
            continue;
        }
        d.device_bytes += bytes;
        const TensorPlacement& place = plan.tensors[i];
        if (place.run == no_index || !blocked.empty()) {
            const std::string& why = !blocked.empty() ? blocked : !copied[i].empty() ? copied[i] : place.reason;
            if (g.fallbacks++ == 0) g.fallback_reason = why;
            d.copy_bytes += bytes;
            continue;
        }
        d.import_bytes += bytes;
        if (padded[i]) ++g.padded_rows;
    }
}

// Without an importer nothing is planned: the rules alone say which bytes the device gets, and
// all of them are copied.
void count_unplanned(const Options& o, const ModelInfo& info, Device& d) {
    const PlacementRules rules = engine_rules(o);
    for (const TensorInfo& t : info.tensors) {
        if (rules.target_for(t.name) == cpu_target_name) {
            d.cpu_bytes += t.size;
        } else {
            d.device_bytes += t.size;
            d.copy_bytes += t.size;
        }
    }
}

Status plan_device(const Options& o, const ModelInfo& info, Importer& importer,
                   const std::string& blocked, Device& d) {
    const auto cpu = make_cpu_importer();
    d.tensor_alignment = tensor_alignment_for(o, importer);
    TargetFactory factory = [&](std::string_view name) -> Result<TargetDesc> {
        if (name == cpu_target_name) return target_for(std::string(name), *cpu);
        TargetDesc target = target_for(std::string(name), importer);
        target.caps.tensor_alignment = d.tensor_alignment;
        return target;
    };
    auto desc = to_model_desc(info, engine_rules(o), factory);
    if (!desc) return std::move(desc).error();
    std::vector<bool> padded;
    const std::vector<std::string> copied = apply_padding(o, info, importer, *desc, padded);
    auto plan = make_plan(*desc, o.plan);
    if (!plan) return std::move(plan).error();
    d.pinned_bytes = blocked.empty() ? plan->totals.pinned_bytes : 0;
    d.imports = blocked.empty() ? plan->totals.imports : 0;
    count_groups(info, *desc, *plan, copied, padded, blocked, d);
    return {};
}

// --- one device ------------------------------------------------------------------------------------

// What to change where an importer cannot be used at all: its runtime is missing, or it found no
// device it can serve.
std::string unusable_advice(const std::string& backend, const std::string& reason) {
    if (reason.find("built without") != std::string::npos) return "rebuild libweightmap with it";
    const bool missing = reason.find("cannot load") != std::string::npos ||
                         reason.find("cannot open shared object") != std::string::npos;
    if (backend == "vulkan")
        return missing ? "install a Vulkan loader and driver (libvulkan1, mesa-vulkan-drivers or the "
                         "GPU vendor's driver)"
                       : "no Vulkan device with VK_EXT_external_memory_host: Mesa's RADV and ANV, "
                         "lavapipe and NVIDIA's driver have it";
    if (backend == "cuda")
        return missing ? "install the NVIDIA driver (libcuda.so.1)"
                       : "the CUDA driver offers no device this importer serves";
    if (backend == "hsa")
        return missing ? "install ROCm's HSA runtime (libhsa-runtime64.so.1)"
                       : "the HSA runtime found no usable GPU agent: check that /dev/kfd exists and "
                         "that this user may open it (groups render and video)";
    return "";
}

std::string policy_advice(const Device& d) {
    if (d.device_class == "discrete")
        return "nothing to change: a discrete GPU would read every imported weight over its bus, "
               "so the weights are copied as upstream copies them";
    if (d.device_class == "coherent")
        return "nothing to change for speed: this device has HBM of its own and would read an "
               "imported weight over NVLink-C2C; an engine that must fit a model larger than "
               "the HBM can set ImportPolicy::always";
    return "the importer cannot tell how this device reaches host memory: the weights are "
           "copied (ImportPolicy::always imports anyway)";
}

std::string blocked_advice(const std::string& reason, const FileFacts& file) {
    if (file.dax)
        return "the file system is mounted -o dax, where the kernel refuses long-term pins: "
               "keep the model on a file system without dax";
    if (reason.find(read_only_refusal_marker) != std::string::npos)
        return "this HSA runtime locks only writable pages (ROCm before 6.1); llama.cpp never "
               "maps a model writable for ROCm (each lock would write-fault and dirty the file): "
               "ROCm 6.1 or later imports it";
    if (reason.find("not writable") != std::string::npos)
        return "this importer needs a writable mapping: make the file writable by its owner, "
               "the user that loads it";
    return "the driver refused the file's pages: the weights are copied, as upstream copies them";
}

void conclude(Device& d, const FileFacts& file, const std::string& blocked) {
    auto mib = [](std::uint64_t b) { return fmt::format("{:.1f} MiB", b / 1048576.0); };
    if (!d.usable) {
        d.verdict = "copies everything: " + d.unusable_reason;
        if (std::string a = unusable_advice(d.backend, d.unusable_reason); !a.empty()) d.advice.push_back(a);
        return;
    }
    if (!d.policy_imports) {
        d.verdict = "copies everything: " + d.policy_reason;
        d.advice.push_back(policy_advice(d));
    } else if (!blocked.empty()) {
        d.verdict = "copies everything: " + blocked;
        d.advice.push_back(blocked_advice(blocked, file));
    } else {
        d.verdict = fmt::format("reads {} in place in {} import(s), copies {}", mib(d.import_bytes),
                                d.imports, mib(d.copy_bytes));
    }
    d.saves_bytes = d.import_bytes;
    for (const TensorGroup& g : d.groups)
        if (g.fallbacks > 0 && d.policy_imports && blocked.empty())
            d.advice.push_back(fmt::format("{} tensor(s) of {} are copied: {}", g.fallbacks, g.name,
                                           g.fallback_reason));
    std::uint32_t padded = 0;
    for (const TensorGroup& g : d.groups) padded += g.padded_rows;
    if (padded > 0)
        d.advice.push_back(fmt::format(
            "{} quantized tensor(s) with rows that are not a multiple of {} elements are imported "
            "with the file's next bytes as ggml-cuda's row padding: the load reads those bytes and "
            "copies a tensor alone where they do not decode to finite values, so the import above "
            "is the most",
            padded, cuda_row_padding));
}

Device diagnose_device(const std::string& name, const Options& o, const Diagnosis& diag) {
    Device d;
    d.backend = name;
    d.method = "none";
    auto importer = create_importer(name);
    if (!importer) {
        d.unusable_reason = importer.error().message;
    } else if (Availability a = (*importer)->available(); !a.available) {
        d.unusable_reason = a.reason;
    } else {
        d.usable = true;
    }
    if (!d.usable) {
        count_unplanned(o, diag.model, d);
        conclude(d, diag.file, {});
        return d;
    }
    Importer& imp = **importer;
    const ImporterCaps caps = imp.caps();
    d.method = method_of(imp);
    d.device_class = to_string(caps.device_memory);
    d.device_note = std::string(imp.notes().device_memory);
    d.policy_imports = import_allowed(o.plan.import_policy, caps.device_memory);
    d.policy_reason = d.policy_imports
                          ? fmt::format("{} memory: the policy ({}) imports",
                                        d.device_class, to_string(o.plan.import_policy))
                          : import_policy_refusal(caps, o.plan.import_policy, d.device_note);
    std::vector<std::string> paths;
    for (const ModelFile& f : diag.model.files) paths.push_back(f.path);
    Importer* const list[] = {&imp};
    const MappingDecision mapping = decide_mapping(paths, list, o.plan.import_policy);
    d.mapping = to_string(mapping.access);
    d.mapping_reason = mapping.reason;
    std::string blocked;
    if (d.policy_imports && caps.needs_writable_mapping && mapping.access == MappingAccess::read_only) {
        blocked = mapping.unwritable_path.empty() ? mapping.reason
                                                  : "weight file not writable: " + mapping.unwritable_path;
    } else if (d.policy_imports) {
        const Probe probe = probe_first_page(imp, paths[0], mapping.access);
        d.probe_ran = true;
        d.probe_ok = probe.ok;
        d.probe_reason = probe.reason;
        if (!probe.ok) blocked = "the first page's import: " + probe.reason;
    }
    if (Status s = plan_device(o, diag.model, imp, blocked, d); !s)
        d.verdict = "cannot plan: " + s.error().message;
    else
        conclude(d, diag.file, blocked);
    return d;
}

Result<std::vector<std::string>> backends_of(const Options& o) {
    std::vector<std::string> known;
    for (const ImporterEntry& e : importer_registry())
        if (e.name != "cpu") known.emplace_back(e.name);
    if (o.backends.empty()) return known;
    for (const std::string& b : o.backends)
        if (std::find(known.begin(), known.end(), b) == known.end())
            return Error{ErrorKind::invalid_argument,
                         fmt::format("--backend {}: no such importer (known: {})", b,
                                     fmt::join(known, ", "))};
    return o.backends;
}

} // namespace

const char* to_string(Engine engine) noexcept {
    return engine == Engine::llama_cpp ? "llama.cpp" : "library";
}

Result<Diagnosis> diagnose(const Options& o) {
    auto backends = backends_of(o);
    if (!backends) return std::move(backends).error();
    Diagnosis out;
    auto info = read_model(o.files);
    if (!info) return std::move(info).error();
    out.model = std::move(*info);
    auto facts = file_facts(out.model.files[0].path);
    if (!facts) return std::move(facts).error();
    out.file = std::move(*facts);
    for (const std::string& name : *backends) out.devices.push_back(diagnose_device(name, o, out));
    return out;
}

} // namespace wm::doctor
