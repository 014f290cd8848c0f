// SPDX-License-Identifier: MIT
#include "weightmap/placement_rules.hpp"

#include <regex>
#include <unordered_map>

#include <fmt/format.h>

#include "formats/byte_reader.hpp"

namespace wm {

struct PlacementRules::Compiled {
    std::regex regex;
};

PlacementRules::PlacementRules() = default;
PlacementRules::~PlacementRules() = default;
PlacementRules::PlacementRules(const PlacementRules&) = default;
PlacementRules& PlacementRules::operator=(const PlacementRules&) = default;
PlacementRules::PlacementRules(PlacementRules&&) noexcept = default;
PlacementRules& PlacementRules::operator=(PlacementRules&&) noexcept = default;

Status PlacementRules::add(std::string pattern, std::string target) {
    if (target.empty())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("rule '{}': empty target", pattern));
    if (pattern.empty())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("rule for target '{}': empty pattern", target));
    try {
        auto compiled =
            std::make_shared<Compiled>(Compiled{std::regex(pattern, std::regex::ECMAScript)});
        compiled_.push_back(std::move(compiled));
    } catch (const std::regex_error& e) {
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("rule '{}={}': bad regular expression: {}", pattern, target,
                                      e.what()));
    }
    rules_.push_back(OverrideRule{std::move(pattern), std::move(target)});
    return {};
}

Status PlacementRules::add_override(std::string_view spec) {
    // llama.cpp's list form splits at every comma; do so only when each piece is a rule, so a
    // regex such as `a{1,2}` keeps its comma.
    std::vector<std::string_view> pieces;
    bool list = spec.find(',') != std::string_view::npos;
    for (std::size_t start = 0; list;) {
        std::size_t comma = spec.find(',', start);
        std::string_view piece = spec.substr(start, comma == std::string_view::npos
                                                        ? std::string_view::npos
                                                        : comma - start);
        if (piece.find('=') == std::string_view::npos) list = false;
        pieces.push_back(piece);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    if (!list) pieces = {spec};

    PlacementRules staged = *this;
    for (std::string_view piece : pieces) {
        std::size_t eq = piece.rfind('=');
        if (eq == std::string_view::npos)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("override '{}': expected REGEX=TARGET", piece));
        if (Status s =
                staged.add(std::string(piece.substr(0, eq)), std::string(piece.substr(eq + 1)));
            !s)
            return s;
    }
    *this = std::move(staged);
    return {};
}

void PlacementRules::add_cpu_moe() {
    // The pattern is a compile-time constant that std::regex accepts (tested).
    (void)add(std::string(cpu_moe_pattern), std::string(cpu_target_name));
}

std::string_view PlacementRules::target_for(std::string_view tensor_name) const {
    for (std::size_t i = 0; i < rules_.size(); ++i)
        if (std::regex_search(tensor_name.begin(), tensor_name.end(), compiled_[i]->regex))
            return rules_[i].target;
    return default_target_name;
}

Result<ModelDesc> to_model_desc(const ModelInfo& model, const PlacementRules& rules,
                                const TargetFactory& make_target) {
    ModelDesc desc;
    desc.files.reserve(model.files.size());
    for (const ModelFile& f : model.files) desc.files.push_back(FileDesc{f.path, f.size});

    // Target name per tensor, then the targets in order of first use with the CPU last.
    std::vector<std::string_view> names;
    names.reserve(model.tensors.size());
    std::vector<std::string_view> order;
    std::unordered_map<std::string_view, std::uint32_t> index;
    bool uses_cpu = false;
    for (const TensorInfo& t : model.tensors) {
        if (t.file >= model.files.size())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("tensor {}: file index {} out of range ({} files)",
                                          formats::quote_name(t.name), t.file, model.files.size()));
        std::string_view target = rules.target_for(t.name);
        names.push_back(target);
        if (target == cpu_target_name) {
            uses_cpu = true;
        } else if (index.emplace(target, 0).second) {
            order.push_back(target);
        }
    }
    if (uses_cpu) order.push_back(cpu_target_name);
    for (std::uint32_t i = 0; i < order.size(); ++i) {
        index[order[i]] = i;
        auto target = make_target(order[i]);
        if (!target) return std::move(target).error();
        const bool is_cpu = order[i] == cpu_target_name;
        if (target->caps.is_cpu != is_cpu)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("target '{}': the factory returned a {} target; \"{}\" "
                                          "is the CPU and only it", order[i],
                                          target->caps.is_cpu ? "CPU" : "non-CPU",
                                          cpu_target_name));
        target->name = std::string(order[i]);
        desc.targets.push_back(std::move(target).value());
    }
    desc.tensors.reserve(model.tensors.size());
    for (std::size_t i = 0; i < model.tensors.size(); ++i) {
        const TensorInfo& t = model.tensors[i];
        desc.tensors.push_back(TensorDesc{t.name, t.file, t.offset, t.size, index.at(names[i])});
    }
    return desc;
}

} // namespace wm
