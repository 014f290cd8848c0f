/* SPDX-License-Identifier: MIT */
/* Bounds a careless engine gets wrong: mappings shorter than their files (issue 44 item 2: every
 * address wm_execute hands out must lie inside the mapping it came from, fallback tensors'
 * included) and descriptions near 2^64 (item 9: a plan either covers every tensor with its run's
 * extent or is refused; never a run that ends short of its tensor). */
#include "c_check.h" /* first: it asks for POSIX */

#include "attack_engine.h"

/* Every run of every region of `plan` covers its tensors: extent_offset <= first and last <=
 * extent_offset + extent_size, computed without wrapping. */
static void check_runs_cover_their_tensors(const wm_plan* plan) {
    for (uint32_t r = 0; r < wm_plan_region_count(plan); ++r) {
        wm_plan_region region = {.struct_size = sizeof region};
        REQUIRE_OK(wm_plan_get_region(plan, r, &region));
        for (uint32_t k = 0; k < region.run_count; ++k) {
            wm_plan_run run = {.struct_size = sizeof run};
            REQUIRE_OK(wm_plan_get_run(plan, r, k, &run));
            CHECK_MSG(run.extent_offset <= run.first &&
                          run.last - run.extent_offset <= run.extent_size,
                      "run %u of region %u: extent [%#" PRIx64 ", +%#" PRIx64
                      ") does not cover its tensors [%#" PRIx64 ", %#" PRIx64 ")",
                      k, r, run.extent_offset, run.extent_size, run.first, run.last);
        }
    }
}

/* A model of one file of `file_size` bytes with one tensor [offset, +size) on a unified device;
 * wm_plan_create's status. */
static wm_status plan_near_the_top(uint64_t file_size, uint64_t offset, uint64_t size) {
    engine_importer engine = {0};
    wm_importer* importer = NULL;
    wm_model* model = NULL;
    wm_plan* plan = NULL;
    if (!engine_create(&engine, &importer)) return WM_ERROR_INTERNAL;
    wm_status status = WM_ERROR_INTERNAL;
    if (engine_model("top.bin", file_size, offset, size, importer, &model)) {
        status = wm_plan_create(model, NULL, &plan);
        if (status == WM_OK) check_runs_cover_their_tensors(plan);
    }
    wm_plan_destroy(plan);
    wm_model_destroy(model);
    wm_importer_destroy(importer);
    return status;
}

/* issue 44 item 9: a tensor whose end is 2^64 - 1, in a file of UINT64_MAX bytes. */
static void case_a_tensor_ending_at_the_top_of_the_address_space_is_refused(void) {
    CHECK_STATUS(plan_near_the_top(UINT64_MAX, UINT64_MAX - 1, 1), WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "2^64");
    CHECK_CONTAINS(wm_last_error(), "top.bin");
}

/* issue 44 item 9: a tensor of UINT64_MAX bytes at 0 got a run one page short. */
static void case_a_tensor_of_uint64_max_bytes_is_refused(void) {
    CHECK_STATUS(plan_near_the_top(UINT64_MAX, 0, UINT64_MAX), WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "2^64");
}

/* The edge that still fits: a tensor ending at the last page boundary below 2^64 is planned,
 * its run covering it. */
static void case_a_tensor_ending_at_the_last_page_below_2_64_is_planned(void) {
    const uint64_t top = UINT64_MAX - (c_page_size() - 1); /* 2^64 - page */
    CHECK_OK(plan_near_the_top(top, top - 2 * c_page_size(), 2 * c_page_size()));
    CHECK_OK(plan_near_the_top(UINT64_MAX, UINT64_C(1) << 40, UINT64_C(1) << 20));
}

typedef struct short_mapping {
    char path[512];
    wm_mapped_model* mapped;
    wm_importer* importer;
    engine_importer engine;
    wm_model* model;
    wm_plan* plan;
    wm_mapped_file files[1]; /* the mapping as the engine passes it: {base, 4096} */
} short_mapping;

/* A 1 MiB file, mapped whole, with one 64 KiB tensor at `offset`, on the CPU or on a device
 * that never imports (so it falls back); files[0] says only the first page is mapped. */
static bool short_open(short_mapping* s, bool cpu, uint64_t offset) {
    memset(s, 0, sizeof *s);
    const char* paths[1] = {s->path};
    uint32_t target = 0;
    if (!c_temp_file(ATTACK_MiB, 0x29, s->path) ||
        wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &s->mapped) != WM_OK)
        return false;
    if (!(cpu ? wm_importer_create_cpu(&s->importer) == WM_OK : engine_create(&s->engine, &s->importer)))
        return false;
    s->files[0] = wm_mapped_model_files(s->mapped)[0];
    s->files[0].length = c_page_size();
    wm_plan_options options;
    wm_plan_options_init(&options);
    options.import_policy = WM_IMPORT_POLICY_NEVER;
    return wm_model_create(&s->model) == WM_OK &&
           wm_model_add_file(s->model, s->path, ATTACK_MiB, NULL) == WM_OK &&
           wm_model_add_target(s->model, cpu ? "CPU" : "device", s->importer, &target) == WM_OK &&
           wm_model_add_tensor(s->model, "w", 0, offset, 64 * 1024, target, NULL) == WM_OK &&
           wm_plan_create(s->model, &options, &s->plan) == WM_OK;
}

static void short_close(short_mapping* s) {
    wm_plan_destroy(s->plan);
    wm_model_destroy(s->model);
    wm_importer_destroy(s->importer);
    wm_mapped_model_destroy(s->mapped);
}

/* wm_execute over the short mapping fails, naming the tensor and the mapped length, and hands
 * out nothing. */
static void check_short_mapping_refused(bool cpu) {
    short_mapping s;
    REQUIRE(short_open(&s, cpu, 512 * 1024));
    wm_placement* placement = NULL;
    CHECK_STATUS(wm_execute(s.model, s.plan, s.files, 1, &s.importer, 1, NULL, &placement),
                 WM_ERROR_INVALID_ARGUMENT);
    CHECK(placement == NULL);
    CHECK_CONTAINS(wm_last_error(), "'w'");
    CHECK_CONTAINS(wm_last_error(), "mapped length");
    if (placement != NULL) {
        wm_tensor_location where = {.struct_size = sizeof where};
        if (wm_placement_locate(placement, 0, &where) == WM_OK)
            CHECK_MSG((const char*)where.host_address < (const char*)s.files[0].base + s.files[0].length,
                      "tensor 'w' handed out at %p, past the mapping [%p, +%#" PRIx64 ")",
                      where.host_address, s.files[0].base, s.files[0].length);
        wm_placement_destroy(placement);
    }
    short_close(&s);
}

/* issue 44 item 2: a CPU tensor at 512 KiB of a mapping that says 4096 bytes. */
static void case_a_cpu_tensor_past_a_short_mapping_is_refused(void) { check_short_mapping_refused(true); }

/* issue 44 item 2: a device tensor that falls back, past the short mapping. */
static void case_a_fallback_tensor_past_a_short_mapping_is_refused(void) {
    check_short_mapping_refused(false);
}

/* The edge that still fits: a tensor inside the first page of the short mapping executes. */
static void case_a_tensor_inside_a_short_mapping_executes(void) {
    short_mapping s;
    REQUIRE(short_open(&s, true, 0));
    wm_model_destroy(s.model);
    wm_plan_destroy(s.plan);
    uint32_t target = 0;
    REQUIRE_OK(wm_model_create(&s.model));
    REQUIRE_OK(wm_model_add_file(s.model, s.path, ATTACK_MiB, NULL));
    REQUIRE_OK(wm_model_add_target(s.model, "CPU", s.importer, &target));
    REQUIRE_OK(wm_model_add_tensor(s.model, "w", 0, 0, c_page_size(), target, NULL));
    REQUIRE_OK(wm_plan_create(s.model, NULL, &s.plan));
    wm_placement* placement = NULL;
    CHECK_OK(wm_execute(s.model, s.plan, s.files, 1, &s.importer, 1, NULL, &placement));
    wm_placement_destroy(placement);
    short_close(&s);
}

int main(void) {
    C_RUN(case_a_tensor_ending_at_the_top_of_the_address_space_is_refused);
    C_RUN(case_a_tensor_of_uint64_max_bytes_is_refused);
    C_RUN(case_a_tensor_ending_at_the_last_page_below_2_64_is_planned);
    C_RUN(case_a_cpu_tensor_past_a_short_mapping_is_refused);
    C_RUN(case_a_fallback_tensor_past_a_short_mapping_is_refused);
    C_RUN(case_a_tensor_inside_a_short_mapping_executes);
    return c_check_finish();
}
