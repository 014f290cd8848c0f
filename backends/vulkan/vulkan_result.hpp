// SPDX-License-Identifier: MIT
// Names of VkResult and VkDriverId values for error messages (Debian's Vulkan-Headers 1.3.239 has no
// vk_enum_string_helper.h).
#pragma once

#include <string>

#include <vulkan/vulkan_core.h>

namespace wm::vulkan {

/// "VK_ERROR_DEVICE_LOST", ...; "VkResult(<n>)" for a value these headers do not name.
std::string result_name(VkResult result);

/// "VK_DRIVER_ID_MESA_RADV", ...; "VkDriverId(<n>)" for a value these headers do not name.
std::string driver_id_name(VkDriverId id);

} // namespace wm::vulkan
