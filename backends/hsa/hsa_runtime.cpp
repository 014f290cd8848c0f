// SPDX-License-Identifier: MIT
#include "hsa_runtime.hpp"

#include <array>
#include <cstring>

#include <dlfcn.h>

#include <fmt/format.h>

#include "internal/dl_resolve.hpp"

namespace wm::hsa {

using internal::resolve_symbol;

Result<std::unique_ptr<Runtime>> Runtime::open(const std::string& path) {
    std::unique_ptr<Runtime> runtime(new Runtime());
    runtime->path_ = path;
    dlerror();
    // RTLD_LOCAL: the runtime's symbols must not satisfy anyone else's lookups through us. If the
    // engine already loaded it, this returns the engine's instance (shared agents and locks).
    runtime->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (runtime->handle_ == nullptr) {
        const char* why = dlerror();
        return make_error(ErrorKind::unsupported,
                          fmt::format("cannot load the HSA runtime '{}': {}", path,
                                      why != nullptr ? why : "dlopen failed"));
    }
    Api& api = runtime->api_;
    std::string missing;
    void* h = runtime->handle_;
    if (!resolve_symbol(h, "hsa_init", api.init, missing) ||
        !resolve_symbol(h, "hsa_shut_down", api.shut_down, missing) ||
        !resolve_symbol(h, "hsa_status_string", api.status_string, missing) ||
        !resolve_symbol(h, "hsa_iterate_agents", api.iterate_agents, missing) ||
        !resolve_symbol(h, "hsa_agent_get_info", api.agent_get_info, missing) ||
        !resolve_symbol(h, "hsa_amd_memory_lock", api.memory_lock, missing) ||
        !resolve_symbol(h, "hsa_amd_memory_unlock", api.memory_unlock, missing))
        return make_error(ErrorKind::unsupported,
                          fmt::format("the HSA runtime '{}' lacks {}", path, missing));
    // Without /dev/kfd the Debian 12 runtime (ROCm 5.2) returns HSA_STATUS_ERROR_OUT_OF_RESOURCES
    // here within a millisecond and prints nothing (measured), so this is safe in any process.
    const hsa_status_t status = api.init();
    if (status != HSA_STATUS_SUCCESS)
        return make_error(ErrorKind::unsupported,
                          fmt::format("hsa_init failed in '{}': {}", path,
                                      runtime->describe(status)));
    runtime->initialized_ = true;
    return runtime;
}

Runtime::~Runtime() {
    // hsa_init/hsa_shut_down are reference counted by the runtime: this drops only our count,
    // and the library is closed last, after the runtime it holds has been shut down.
    if (initialized_) api_.shut_down();
    if (handle_ != nullptr) dlclose(handle_);
}

std::string Runtime::describe(hsa_status_t status) const {
    const char* text = nullptr;
    if (api_.status_string != nullptr && api_.status_string(status, &text) == HSA_STATUS_SUCCESS &&
        text != nullptr && *text != '\0')
        return text;
    return fmt::format("HSA status {:#x} (no status string)", static_cast<unsigned>(status));
}

namespace {

// Attribute and bit of runtimes after ROCm 5.2 (its headers lack them; its runtime answers
// HSA_STATUS_ERROR_INVALID_ARGUMENT): HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES, a uint8_t[8] bit set
// read with hsa_flag_isset64, and HSA_AMD_MEMORY_PROPERTY_AGENT_IS_APU, bit index 1.
constexpr int memory_properties_attribute = 0xA114;
constexpr unsigned is_apu_bit = 1;

// What the agent says about how it reaches host memory, into `info`.
void read_memory_facts(const Api& api, hsa_agent_t agent, Runtime::AgentInfo& info) {
    hsa_profile_t profile = HSA_PROFILE_BASE;
    info.full_profile = api.agent_get_info(agent, HSA_AGENT_INFO_PROFILE, &profile) ==
                            HSA_STATUS_SUCCESS && profile == HSA_PROFILE_FULL;
    std::array<std::uint8_t, 8> bits{};
    if (api.agent_get_info(agent, static_cast<hsa_agent_info_t>(memory_properties_attribute),
                           bits.data()) == HSA_STATUS_SUCCESS)
        info.is_apu = ((bits[is_apu_bit / 8] >> (is_apu_bit % 8)) & 1u) != 0;
}

} // namespace

Result<std::vector<Runtime::AgentInfo>> Runtime::agents() const {
    struct Collect {
        const Api* api;
        std::vector<AgentInfo> agents;
        hsa_status_t failed = HSA_STATUS_SUCCESS;
    } collect{&api_, {}};
    const hsa_status_t status = api_.iterate_agents(
        [](hsa_agent_t agent, void* data) -> hsa_status_t {
            auto& c = *static_cast<Collect*>(data);
            hsa_device_type_t type{};
            hsa_status_t s = c.api->agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &type);
            if (s != HSA_STATUS_SUCCESS) {
                c.failed = s;
                return s;
            }
            AgentInfo info;
            info.handle = agent.handle;
            info.is_gpu = type == HSA_DEVICE_TYPE_GPU;
            std::array<char, 64> name{}; // HSA_AGENT_INFO_NAME is a char[64]
            if (c.api->agent_get_info(agent, HSA_AGENT_INFO_NAME, name.data()) ==
                HSA_STATUS_SUCCESS)
                info.name.assign(name.data(), strnlen(name.data(), name.size()));
            read_memory_facts(*c.api, agent, info);
            c.agents.push_back(std::move(info));
            return HSA_STATUS_SUCCESS;
        },
        &collect);
    if (status != HSA_STATUS_SUCCESS)
        return make_error(ErrorKind::unsupported,
                          fmt::format("hsa_iterate_agents failed in '{}': {}{}", path_,
                                      describe(status),
                                      collect.failed != HSA_STATUS_SUCCESS
                                          ? " (hsa_agent_get_info(HSA_AGENT_INFO_DEVICE) refused "
                                            "an agent)"
                                          : ""));
    return std::move(collect.agents);
}

} // namespace wm::hsa
