// SPDX-License-Identifier: MIT
// The HSA runtime as the importer uses it: dlopened, its entry points resolved by name, hsa_init
// called once. Private to backends/hsa.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#include "weightmap/result.hpp"

namespace wm::hsa {

/// The entry points, typed from the HSA headers themselves so a signature can never drift.
struct Api {
    decltype(&::hsa_init) init = nullptr;
    decltype(&::hsa_shut_down) shut_down = nullptr;
    decltype(&::hsa_status_string) status_string = nullptr;
    decltype(&::hsa_iterate_agents) iterate_agents = nullptr;
    decltype(&::hsa_agent_get_info) agent_get_info = nullptr;
    decltype(&::hsa_amd_memory_lock) memory_lock = nullptr;
    decltype(&::hsa_amd_memory_unlock) memory_unlock = nullptr;
};

/// One loaded and initialised runtime. Destruction calls hsa_shut_down, then dlclose.
/// Callers must have unlocked everything first. The Api may be used from any thread.
class Runtime {
public:
    /// dlopens `path`, resolves every entry point and calls hsa_init. The error (kind
    /// `unsupported`) is the reason the importer gives for being unavailable: dlerror(), the
    /// missing symbol, or hsa_init's status string. Nothing stays loaded on failure.
    static Result<std::unique_ptr<Runtime>> open(const std::string& path);
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    const Api& api() const noexcept { return api_; }
    const std::string& path() const noexcept { return path_; }

    /// "HSA_STATUS_ERROR: A generic error has occurred." - the runtime's own string, or the
    /// status number when the runtime has none for it.
    std::string describe(hsa_status_t status) const;

    struct AgentInfo {
        std::uint64_t handle = 0;
        bool is_gpu = false;
        std::string name;  ///< HSA_AGENT_INFO_NAME, e.g. "gfx1151"; empty if the query failed
        /// HSA_AGENT_INFO_PROFILE is FULL: ROCr reports it for a KFD node with CPU cores (an APU
        /// of the Kaveri/Carrizo kind), and ROCclr then treats host memory as unified.
        bool full_profile = false;
        /// HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES' AGENT_IS_APU bit; nullopt when the runtime
        /// does not know the attribute (ROCm 5.2 does not).
        std::optional<bool> is_apu;
    };
    /// Every agent, in the runtime's order; an error names the failing status.
    Result<std::vector<AgentInfo>> agents() const;

private:
    Runtime() = default;
    void* handle_ = nullptr;
    bool initialized_ = false;
    std::string path_;
    Api api_;
};

} // namespace wm::hsa
