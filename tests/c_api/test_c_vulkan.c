/* SPDX-License-Identifier: MIT */
/* The registry's "vulkan" importer through the C API on a real device (lavapipe in CI): plan,
 * execute over a real file mapping, and read every imported tensor back *as the device sees
 * it* (a transfer) at offsets that are neither page- nor 256-periodic, against the file's
 * pattern computed here. SKIP (77) with the reason when no Vulkan device is available. */
#include "c_check.h"

#define KiB UINT64_C(1024)
#define MiB (UINT64_C(1024) * 1024)

static const uint8_t SEED = 0x6B;
enum { TENSORS = 5, T_GPU = 0, T_CPU = 1 };
/* Two device runs around CPU experts: g0 | c0 | g1 g2 | c1. */
static const uint64_t t_offset[TENSORS] = {5000, 1053579, 3150731, 3850732, 4150732};
static const uint64_t t_size[TENSORS] = {1048579, 2097152, 700001, 300000, 2000000};
static const uint32_t t_target[TENSORS] = {T_GPU, T_CPU, T_GPU, T_GPU, T_CPU};
static const uint64_t FILE_SIZE = 6 * MiB + 777;

/* The "vulkan" importer, or NULL after printing why (then the case skips). */
static wm_importer* vulkan_or_skip(const char** why) {
    wm_importer* importer = NULL;
    const wm_status s = wm_importer_create("vulkan", &importer);
    if (s == WM_OK) return importer;
    static char reason[1024];
    snprintf(reason, sizeof reason, "no Vulkan device: wm_importer_create(\"vulkan\"): %s: %s",
             wm_status_name(s), wm_last_error());
    *why = reason;
    if (s != WM_ERROR_UNSUPPORTED) {
        fprintf(stderr, "%s\n", reason);
        ++c_check_failures_; /* only "unsupported" means no device */
    }
    return NULL;
}

static bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

static void case_import_a_real_mapping_and_read_it_back_through_the_device(void) {
    const char* why = NULL;
    wm_importer* vk = vulkan_or_skip(&why);
    if (vk == NULL) C_SKIP(why);
    CHECK_STR_EQ(wm_importer_name(vk), "vulkan");
    const char* reason = "unset";
    CHECK(wm_importer_available(vk, &reason));
    CHECK_STR_EQ(reason, "");
    wm_importer_caps caps = {.struct_size = sizeof caps};
    REQUIRE_OK(wm_importer_get_caps(vk, &caps));
    CHECK(!caps.is_cpu);
    CHECK(!caps.needs_writable_mapping);
    CHECK(is_power_of_two(caps.alignment));
    CHECK(caps.alignment >= c_page_size());
    const uint64_t align = caps.alignment > c_page_size() ? caps.alignment : c_page_size();
    printf("vulkan importer: alignment %" PRIu64 ", max_import_size %" PRIu64
           ", survives_read_only_reprotect %d\n",
           caps.alignment, caps.max_import_size, (int)caps.survives_read_only_reprotect);

    char path[512];
    REQUIRE(c_temp_file(FILE_SIZE, SEED, path));
    const char* paths[1] = {path};
    wm_mapping_options mo;
    wm_mapping_options_init(&mo);
    mo.base_alignment = align;
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, &mo, &mapped));
    const wm_mapped_file* files = wm_mapped_model_files(mapped);
    CHECK_EQ((uintptr_t)files[0].base % align, 0);

    wm_importer* cpu = NULL;
    wm_model* model = NULL;
    wm_plan* plan = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    REQUIRE_OK(wm_model_create(&model));
    REQUIRE_OK(wm_model_add_file(model, path, FILE_SIZE, NULL));
    REQUIRE_OK(wm_model_add_target(model, "Vulkan0", vk, NULL));
    REQUIRE_OK(wm_model_add_target(model, "CPU", cpu, NULL));
    for (uint32_t i = 0; i < TENSORS; ++i)
        REQUIRE_OK(wm_model_add_tensor(model, "t", 0, t_offset[i], t_size[i], t_target[i], NULL));
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    REQUIRE_OK(wm_plan_create(model, &o, &plan));
    wm_importer* importers[2] = {vk, cpu};
    wm_placement* placement = NULL;
    REQUIRE_OK(wm_execute(model, plan, files, 1, importers, 2, NULL, &placement));
    wm_plan_destroy(plan);
    wm_model_destroy(model);

    /* Expected imports: g0 alone, then g1+g2, each the aligned superset; then the CPU's. */
    const uint64_t ext_off[2] = {c_align_down(t_offset[0], align), c_align_down(t_offset[2], align)};
    const uint64_t ext_end[2] = {c_align_up(t_offset[0] + t_size[0], align),
                                 c_align_up(t_offset[3] + t_size[3], align)};
    REQUIRE_EQ(wm_placement_import_count(placement), 3);
    for (uint32_t k = 0; k < 2; ++k) {
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, k, &imp));
        CHECK_EQ(imp.target, T_GPU);
        CHECK_EQ(imp.extent_offset, ext_off[k]);
        CHECK(imp.buffer.host_address == (void*)((char*)files[0].base + ext_off[k]));
        CHECK(imp.buffer.size >= ext_end[k] - ext_off[k]);
        CHECK(imp.buffer.native_memory != 0); /* the VkDeviceMemory */
        CHECK(imp.buffer.imported);
        REQUIRE_EQ(imp.tensor_count, k == 0 ? 1 : 2);

        /* Each tensor as the device sees it. */
        for (uint32_t j = 0; j < imp.tensor_count; ++j) {
            const uint32_t t = imp.tensors[j];
            REQUIRE(t < TENSORS);
            wm_tensor_location loc = {.struct_size = sizeof loc};
            REQUIRE_OK(wm_placement_locate(placement, t, &loc));
            CHECK(loc.imported);
            CHECK_EQ(loc.import_index, k);
            CHECK_EQ(loc.offset_in_buffer, t_offset[t] - ext_off[k]);
            CHECK(loc.host_address == (const void*)((const char*)files[0].base + t_offset[t]));
            if (imp.buffer.device_address == NULL) CHECK(loc.device_address == NULL);
            else CHECK(loc.device_address == (void*)((char*)imp.buffer.device_address + loc.offset_in_buffer));
            unsigned char* back = (unsigned char*)malloc((size_t)t_size[t]);
            REQUIRE(back != NULL);
            memset(back, 0, (size_t)t_size[t]);
            CHECK_OK(wm_importer_read_back(vk, &imp.buffer, loc.offset_in_buffer, t_size[t], back));
            CHECK_PATTERN(back, t_size[t], SEED, t_offset[t]);
            free(back);
        }
        /* Odd offsets inside the import, including its very end. */
        const uint64_t odd[] = {0, 1, 255, 4095, 4097, 65537, 1000003, imp.buffer.size - 333};
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; ++i) {
            if (odd[i] + 333 > imp.buffer.size) continue;
            unsigned char chunk[333];
            memset(chunk, 0, sizeof chunk);
            CHECK_OK(wm_importer_read_back(vk, &imp.buffer, odd[i], sizeof chunk, chunk));
            CHECK_PATTERN(chunk, sizeof chunk, SEED, imp.extent_offset + odd[i]);
        }
        unsigned char spill[32];
        CHECK(wm_importer_read_back(vk, &imp.buffer, imp.buffer.size - 16, sizeof spill, spill) != WM_OK);
    }
    wm_placement_import cpu_imp = {.struct_size = sizeof cpu_imp};
    REQUIRE_OK(wm_placement_get_import(placement, 2, &cpu_imp));
    CHECK_EQ(cpu_imp.target, T_CPU);

    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(wm_placement_plan(placement), &totals));
    CHECK_EQ(totals.device_bytes, t_size[0] + t_size[2] + t_size[3]);
    CHECK_EQ(totals.imported_bytes, totals.device_bytes);
    CHECK_EQ(totals.imports, 2);
    CHECK_EQ(totals.pinned_bytes, (ext_end[0] - ext_off[0]) + (ext_end[1] - ext_off[1]));

    wm_placement_destroy(placement);
    wm_importer_destroy(cpu);
    wm_importer_destroy(vk);
    wm_mapped_model_destroy(mapped);
}

static void case_auto_and_the_mapping_policy_with_vulkan(void) {
    const char* why = NULL;
    wm_importer* vk = vulkan_or_skip(&why);
    if (vk == NULL) C_SKIP(why);
    char path[512];
    REQUIRE(c_temp_file(MiB, SEED, path));
    const char* paths[1] = {path};
    wm_importer* importers[1] = {vk};
    wm_mapping_decision* d = NULL;
    REQUIRE_OK(wm_decide_mapping(paths, 1, importers, 1, &d));
    CHECK(wm_mapping_decision_access(d) == WM_MAPPING_READ_ONLY); /* it needs no writable pages */
    wm_mapping_decision_destroy(d);
    wm_importer_destroy(vk);

    /* "auto" is the first built and available importer: HSA cannot be without /dev/kfd. */
    if (access("/dev/kfd", F_OK) != 0) {
        wm_importer* chosen = NULL;
        REQUIRE_OK(wm_importer_create("auto", &chosen));
        CHECK_STR_EQ(wm_importer_name(chosen), "vulkan");
        wm_importer_destroy(chosen);
    }
}

int main(void) {
    C_RUN(case_import_a_real_mapping_and_read_it_back_through_the_device);
    C_RUN(case_auto_and_the_mapping_policy_with_vulkan);
    return c_check_finish();
}
