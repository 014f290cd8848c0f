/* SPDX-License-Identifier: MIT */
/* The CUDA importer through the C API, on the fake driver (tests/cuda): its params and their
 * errors; an integrated device imports a read-only mapping in place and reads every tensor back
 * through the device; a discrete one falls back and wm_cuda_pin_fallbacks page-locks exactly the
 * fallback pages, released with the placement. Each case runs in its own child process, so the
 * fake starts fresh and its unload-time leak check judges each case. */
#include "c_check.h"

#include "c_fake_library.h" /* after c_check.h, which sets _POSIX_C_SOURCE */

#include "weightmap/backends/cuda.h" /* wm_cuda_*: not in the core weightmap.h */

#ifndef WEIGHTMAP_FAKE_CUDA_PATH
#error "tests/c_api/meson.build passes the fake driver's path"
#endif

#define MiB (UINT64_C(1024) * 1024)

static const uint8_t SEED = 0x3C;
enum { TENSORS = 3, T_GPU = 0, T_CPU = 1 };
static const uint64_t t_offset[TENSORS] = {5000, 2 * MiB, 3 * MiB + 11};
static const uint64_t t_size[TENSORS] = {MiB + 3, MiB, 700001};
static const uint32_t t_target[TENSORS] = {T_GPU, T_CPU, T_GPU};
static const uint64_t FILE_SIZE = 5 * MiB + 77;

/* The fake's own controls, looked up in the instance the importer loads. */
static void* fake_symbol(const char* name) { return c_fake_symbol(WEIGHTMAP_FAKE_CUDA_PATH, name); }
static long fake_live_registrations(void) {
    long (*fn)(void) = NULL;
    *(void**)&fn = fake_symbol("fake_cuda_live_registrations");
    return fn != NULL ? fn() : -1;
}

static wm_importer* cuda_on_fake(void) {
    wm_cuda_importer_params p;
    wm_cuda_importer_params_init(&p);
    p.library_path = WEIGHTMAP_FAKE_CUDA_PATH;
    wm_importer* cuda = NULL;
    CHECK_OK(wm_importer_create_cuda(&p, &cuda));
    return cuda;
}

static void case_params_defaults_and_errors(void) {
    wm_cuda_importer_params p;
    memset(&p, 0x5A, sizeof p);
    wm_cuda_importer_params_init(&p);
    CHECK_EQ(p.struct_size, sizeof p);
    CHECK(p.library_path == NULL);
    CHECK_EQ(p.context, 0);
    CHECK_EQ(p.device_ordinal, 0);
    CHECK(!p.allow_discrete);
    CHECK(p.device_memory == WM_DEVICE_MEMORY_UNKNOWN);

    wm_importer* cuda = NULL;
    CHECK_INVALID(wm_importer_create_cuda(&p, NULL), "wm_importer_create_cuda");
    p.struct_size = 3;
    CHECK_INVALID(wm_importer_create_cuda(&p, &cuda), "wm_importer_create_cuda");
    CHECK_CONTAINS(wm_last_error(), "params->struct_size is 3");
    wm_cuda_importer_params_init(&p);
    p.device_ordinal = -1;
    CHECK_STATUS(wm_importer_create_cuda(&p, &cuda), WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "device_ordinal is -1");
    CHECK(cuda == NULL);

    /* No driver is a reason, not an error. */
    wm_cuda_importer_params_init(&p);
    p.library_path = "/nonexistent/libcuda.so.1";
    REQUIRE_OK(wm_importer_create_cuda(&p, &cuda));
    const char* reason = NULL;
    CHECK(!wm_importer_available(cuda, &reason));
    CHECK_CONTAINS(reason, "cannot load the CUDA driver");
    wm_importer_destroy(cuda);
}

/* The model over one read-only mapping of a pattern file, planned and executed. */
typedef struct Loaded {
    char path[512];
    wm_mapped_model* mapped;
    const wm_mapped_file* files;
    wm_importer* cpu;
    wm_model* model;
    wm_placement* placement;
} Loaded;

static bool load(Loaded* l, wm_importer* cuda) {
    memset(l, 0, sizeof *l);
    if (!c_temp_file(FILE_SIZE, SEED, l->path)) return false;
    const char* paths[1] = {l->path};
    if (wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &l->mapped) != WM_OK)
        return false;
    l->files = wm_mapped_model_files(l->mapped);
    wm_plan* plan = NULL;
    bool ok = wm_importer_create_cpu(&l->cpu) == WM_OK && wm_model_create(&l->model) == WM_OK &&
              wm_model_add_file(l->model, l->path, FILE_SIZE, NULL) == WM_OK &&
              wm_model_add_target(l->model, "CUDA0", cuda, NULL) == WM_OK &&
              wm_model_add_target(l->model, "CPU", l->cpu, NULL) == WM_OK;
    for (uint32_t i = 0; ok && i < TENSORS; ++i)
        ok = wm_model_add_tensor(l->model, "t", 0, t_offset[i], t_size[i], t_target[i], NULL) ==
             WM_OK;
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    wm_importer* importers[2] = {cuda, l->cpu};
    ok = ok && wm_plan_create(l->model, &o, &plan) == WM_OK &&
         wm_execute(l->model, plan, l->files, 1, importers, 2, NULL, &l->placement) == WM_OK;
    wm_plan_destroy(plan);
    return ok;
}

static void unload(Loaded* l) {
    wm_placement_destroy(l->placement);
    wm_model_destroy(l->model);
    wm_importer_destroy(l->cpu);
    wm_mapped_model_destroy(l->mapped);
}

static void case_integrated_imports_in_place_and_reads_back(void) {
    wm_importer* cuda = cuda_on_fake();
    REQUIRE(cuda != NULL);
    CHECK_STR_EQ(wm_importer_name(cuda), "cuda");
    CHECK(wm_importer_available(cuda, NULL));
    wm_importer_caps caps = {.struct_size = sizeof caps};
    REQUIRE_OK(wm_importer_get_caps(cuda, &caps));
    CHECK(!caps.needs_writable_mapping);
    CHECK(caps.device_memory == WM_DEVICE_MEMORY_UNIFIED);
    CHECK_CONTAINS(caps.device_memory_note, "CU_DEVICE_ATTRIBUTE_INTEGRATED 1");

    Loaded l;
    REQUIRE(load(&l, cuda));
    for (uint32_t t = 0; t < TENSORS; t += 2) {
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(l.placement, t, &loc));
        CHECK(loc.imported);
        CHECK(loc.device_address != loc.host_address); /* the driver's pointer */
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(l.placement, loc.import_index, &imp));
        unsigned char* back = (unsigned char*)malloc((size_t)t_size[t]);
        REQUIRE(back != NULL);
        CHECK_OK(wm_importer_read_back(cuda, &imp.buffer, loc.offset_in_buffer, t_size[t], back));
        CHECK_PATTERN(back, t_size[t], SEED, t_offset[t]);
        free(back);
    }
    CHECK_EQ(fake_live_registrations(), 2);
    unload(&l);
    CHECK_EQ(fake_live_registrations(), 0);
    wm_importer_destroy(cuda);
}

static void case_discrete_falls_back_and_pins_the_fallbacks(void) {
    int (*set_model)(int, int) = NULL;
    *(void**)&set_model = fake_symbol("fake_cuda_set_device_model");
    REQUIRE(set_model != NULL && set_model(0, 2) == 0); /* an H200 */
    wm_importer* cuda = cuda_on_fake();
    REQUIRE(cuda != NULL);
    const char* reason = NULL;
    CHECK(!wm_importer_available(cuda, &reason));
    CHECK_CONTAINS(reason, "discrete GPU");

    Loaded l;
    REQUIRE(load(&l, cuda));
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(wm_placement_plan(l.placement), &totals));
    CHECK_EQ(totals.imports, 0);
    CHECK_EQ(totals.fallback_bytes, t_size[0] + t_size[2]);

    wm_cuda_pin_report report;
    memset(&report, 0x5A, sizeof report);
    report.struct_size = sizeof report;
    REQUIRE_OK(wm_cuda_pin_fallbacks(cuda, l.placement, l.model, l.files, 1, WM_NO_INDEX,
                                     &report));
    const uint64_t page = c_page_size();
    CHECK_EQ(report.tensors, 2);
    CHECK_EQ(report.ranges, 2);
    CHECK_EQ(report.refused_ranges, 0);
    CHECK_STR_EQ(report.first_refusal, "");
    CHECK_EQ(report.bytes, c_align_up(t_offset[0] + t_size[0], page) -
                               c_align_down(t_offset[0], page) +
                               c_align_up(t_offset[2] + t_size[2], page) -
                               c_align_down(t_offset[2], page));
    CHECK_EQ(fake_live_registrations(), 2);
    wm_placement_release_all(l.placement);
    CHECK_EQ(fake_live_registrations(), 0);

    CHECK_INVALID(wm_cuda_pin_fallbacks(l.cpu, l.placement, l.model, l.files, 1, WM_NO_INDEX,
                                        NULL),
                  "wm_cuda_pin_fallbacks");
    CHECK_CONTAINS(wm_last_error(), "was not made by make_cuda_importer");
    CHECK_INVALID(wm_cuda_pin_fallbacks(cuda, NULL, l.model, l.files, 1, WM_NO_INDEX, NULL),
                  "wm_cuda_pin_fallbacks");
    unload(&l);
    wm_importer_destroy(cuda);
}

int main(void) {
    C_RUN(case_params_defaults_and_errors);
    C_RUN(case_integrated_imports_in_place_and_reads_back);
    C_RUN(case_discrete_falls_back_and_pins_the_fallbacks);
    return c_check_finish();
}
