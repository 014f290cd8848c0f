/* SPDX-License-Identifier: MIT */
/* wm_execute over real file mappings (wm_mapped_model_open of two pattern files) through the CPU
 * importer: every tensor located at mapping base + offset with the file's bytes, every import
 * iterated with its extent and exactly the tensors it serves, a target without an importer
 * falling back, progress, release_all, and concurrent reads. The model and plan are destroyed
 * right after wm_execute: the placement must not need them. */
#include "c_check.h" /* first: it asks for POSIX */

#include <pthread.h>

#include "c_fake_importer.h" /* the log capture */

#define MiB (UINT64_C(1024) * 1024)

typedef struct tdesc {
    uint32_t file;
    uint64_t offset, size;
    uint32_t target;
} tdesc;

enum { T_CPU_A = 0, T_CPU_B = 1, T_ORPHAN = 2, TARGETS = 3, FILES = 2, TENSORS = 11 };

static const uint64_t file_size[FILES] = {5 * MiB + 321, 3 * MiB + 77};
static const uint8_t file_seed[FILES] = {0x00, 0x5A};

/* Odd offsets and sizes, targets interleaved, one tensor ending exactly at the end of file 0. */
static const tdesc layout[TENSORS] = {
    {0, 1001, 70000, T_CPU_A},      {0, 71001, 333333, T_CPU_B},   {0, 404334, 250000, T_ORPHAN},
    {0, 654334, 123456, T_ORPHAN},  {0, 777790, 1500000, T_CPU_A}, {0, 2277790, 2000000, T_CPU_B},
    {1, 17, 100000, T_CPU_B},       {1, 100017, 900000, T_CPU_A},  {1, 1000017, 54321, T_CPU_B},
    {1, 1054338, 2000000, T_CPU_A}, {0, 4277790, 965411, T_CPU_A},
};

typedef struct fixture {
    char path[FILES][512];
    wm_mapped_model* mapped;
    wm_importer* cpu_a;
    wm_importer* cpu_b;
} fixture;

static bool fixture_open(fixture* fx) {
    memset(fx, 0, sizeof *fx);
    for (int f = 0; f < FILES; ++f)
        if (!c_temp_file(file_size[f], file_seed[f], fx->path[f])) return false;
    const char* paths[FILES] = {fx->path[0], fx->path[1]};
    if (wm_mapped_model_open(paths, FILES, WM_MAPPING_READ_ONLY, NULL, &fx->mapped) != WM_OK) {
        fprintf(stderr, "wm_mapped_model_open: %s\n", wm_last_error());
        return false;
    }
    return wm_importer_create_cpu(&fx->cpu_a) == WM_OK && wm_importer_create_cpu(&fx->cpu_b) == WM_OK;
}

static void fixture_close(fixture* fx) {
    wm_mapped_model_destroy(fx->mapped);
    wm_importer_destroy(fx->cpu_a);
    wm_importer_destroy(fx->cpu_b);
}

/* The model of `layout`, tensors of T_ORPHAN moved to `orphan_target`. */
static wm_model* make_model(const fixture* fx, uint32_t orphan_target) {
    wm_model* model = NULL;
    if (wm_model_create(&model) != WM_OK) return NULL;
    wm_importer_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    caps.alignment = 1;
    caps.device_memory = WM_DEVICE_MEMORY_UNIFIED;
    bool ok = wm_model_add_file(model, fx->path[0], file_size[0], NULL) == WM_OK &&
              wm_model_add_file(model, fx->path[1], file_size[1], NULL) == WM_OK &&
              wm_model_add_target(model, "CPU-A", fx->cpu_a, NULL) == WM_OK &&
              wm_model_add_target(model, "CPU-B", fx->cpu_b, NULL) == WM_OK &&
              wm_model_add_target_caps(model, "GPU-orphan", NULL, &caps, NULL) == WM_OK;
    for (uint32_t i = 0; ok && i < TENSORS; ++i) {
        char name[32];
        snprintf(name, sizeof name, "tensor.%u", i);
        const uint32_t target = layout[i].target == T_ORPHAN ? orphan_target : layout[i].target;
        ok = wm_model_add_tensor(model, name, layout[i].file, layout[i].offset, layout[i].size,
                                 target, NULL) == WM_OK;
    }
    if (!ok) {
        fprintf(stderr, "building the model: %s\n", wm_last_error());
        wm_model_destroy(model);
        return NULL;
    }
    return model;
}

static uint32_t effective_target(uint32_t i, uint32_t orphan_target) {
    return layout[i].target == T_ORPHAN ? orphan_target : layout[i].target;
}

/* The aligned superset of the tensors of (target, file); false if there are none. */
static bool expected_extent(uint32_t target, uint32_t file, uint32_t orphan_target,
                            uint64_t* offset, uint64_t* size, uint32_t* count) {
    uint64_t lo = UINT64_MAX, hi = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < TENSORS; ++i) {
        if (effective_target(i, orphan_target) != target || layout[i].file != file) continue;
        if (layout[i].offset < lo) lo = layout[i].offset;
        if (layout[i].offset + layout[i].size > hi) hi = layout[i].offset + layout[i].size;
        ++n;
    }
    if (n == 0) return false;
    const uint64_t page = c_page_size();
    *offset = c_align_down(lo, page);
    *size = c_align_up(hi, page) - *offset;
    *count = n;
    return true;
}

static wm_placement* execute(const fixture* fx, uint32_t orphan_target, wm_importer* orphan_importer,
                             const wm_execute_options* options, wm_plan_totals* plan_totals) {
    wm_model* model = make_model(fx, orphan_target);
    wm_plan* plan = NULL;
    wm_placement* placement = NULL;
    if (model == NULL) return NULL;
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    if (wm_plan_create(model, &o, &plan) != WM_OK) {
        fprintf(stderr, "wm_plan_create: %s\n", wm_last_error());
    } else {
        if (plan_totals != NULL) wm_plan_get_totals(plan, plan_totals);
        wm_importer* importers[TARGETS] = {fx->cpu_a, fx->cpu_b, orphan_importer};
        if (wm_execute(model, plan, wm_mapped_model_files(fx->mapped), FILES, importers, TARGETS,
                       options, &placement) != WM_OK) {
            fprintf(stderr, "wm_execute: %s\n", wm_last_error());
            placement = NULL;
        }
    }
    /* "it is copied, so both may be destroyed afterwards" */
    wm_plan_destroy(plan);
    wm_model_destroy(model);
    return placement;
}

static void case_mapping_of_two_pattern_files(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    const uint64_t page = c_page_size();
    REQUIRE_EQ(wm_mapped_model_file_count(fx.mapped), FILES);
    const wm_mapped_file* files = wm_mapped_model_files(fx.mapped);
    REQUIRE(files != NULL);
    for (uint32_t f = 0; f < FILES; ++f) {
        REQUIRE(files[f].base != NULL);
        CHECK_EQ((uintptr_t)files[f].base % page, 0);
        CHECK_EQ(files[f].length, c_align_up(file_size[f], page));
        CHECK_EQ(wm_mapped_model_file_size(fx.mapped, f), file_size[f]);
        CHECK_PATTERN(files[f].base, file_size[f], file_seed[f], 0);
    }
    CHECK(wm_mapped_model_access(fx.mapped) == WM_MAPPING_READ_ONLY);
    CHECK(wm_mapped_model_is_read_only(fx.mapped));
    fixture_close(&fx);
}

static void case_every_tensor_located_in_the_mapping_with_its_bytes(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    const wm_mapped_file* files = wm_mapped_model_files(fx.mapped);
    c_log log;
    memset(&log, 0, sizeof log);
    wm_execute_options options;
    wm_execute_options_init(&options);
    options.log = c_log_fn;
    options.log_user = &log;
    wm_plan_totals before = {.struct_size = sizeof before};
    wm_placement* placement = execute(&fx, T_ORPHAN, NULL, &options, &before);
    REQUIRE(placement != NULL);

    /* Four CPU regions imported; the orphan target (no importer) falls back. */
    const uint32_t import_count = wm_placement_import_count(placement);
    CHECK_EQ(import_count, 4);
    for (uint32_t i = 0; i < TENSORS; ++i) {
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(placement, i, &loc));
        const char* expected_host = (const char*)files[layout[i].file].base + layout[i].offset;
        CHECK(loc.host_address == (const void*)expected_host);
        CHECK_PATTERN(loc.host_address, layout[i].size, file_seed[layout[i].file], layout[i].offset);
        if (layout[i].target == T_ORPHAN) {
            CHECK(!loc.imported);
            CHECK_EQ(loc.import_index, WM_NO_INDEX);
            CHECK(loc.reason != NULL && loc.reason[0] != '\0');
            continue;
        }
        CHECK(loc.imported);
        CHECK_STR_EQ(loc.reason, "");
        REQUIRE(loc.import_index < import_count);
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, loc.import_index, &imp));
        CHECK_EQ(imp.target, layout[i].target);
        CHECK_EQ(imp.file, layout[i].file);
        CHECK((const char*)imp.buffer.host_address + loc.offset_in_buffer == expected_host);
        CHECK_EQ(loc.offset_in_buffer, layout[i].offset - imp.extent_offset);
        CHECK(loc.offset_in_buffer + layout[i].size <= imp.buffer.size);
        /* CPU: the device address is the host address */
        CHECK(imp.buffer.device_address == imp.buffer.host_address);
        CHECK(loc.device_address == (void*)((char*)imp.buffer.device_address + loc.offset_in_buffer));
        /* read back through the importer, as the device sees it */
        unsigned char* back = (unsigned char*)malloc((size_t)layout[i].size);
        REQUIRE(back != NULL);
        wm_importer* importer = layout[i].target == T_CPU_A ? fx.cpu_a : fx.cpu_b;
        CHECK_OK(wm_importer_read_back(importer, &imp.buffer, loc.offset_in_buffer, layout[i].size, back));
        CHECK_PATTERN(back, layout[i].size, file_seed[layout[i].file], layout[i].offset);
        free(back);
    }

    /* Each import: its extent, and its tensor list is exactly its region's tensors by offset. */
    static const uint32_t order[4][2] = {{T_CPU_A, 0}, {T_CPU_A, 1}, {T_CPU_B, 0}, {T_CPU_B, 1}};
    uint32_t served[TENSORS] = {0};
    for (uint32_t k = 0; k < import_count && k < 4; ++k) {
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, k, &imp));
        CHECK_EQ(imp.target, order[k][0]); /* (target, file) order */
        CHECK_EQ(imp.file, order[k][1]);
        uint64_t offset = 0, size = 0;
        uint32_t count = 0;
        REQUIRE(expected_extent(imp.target, imp.file, T_ORPHAN, &offset, &size, &count));
        CHECK_EQ(imp.extent_offset, offset);
        CHECK(imp.buffer.host_address == (void*)((char*)files[imp.file].base + offset));
        CHECK(imp.buffer.size >= size);
        CHECK(imp.buffer.imported);
        REQUIRE_EQ(imp.tensor_count, count);
        for (uint32_t j = 0; j < imp.tensor_count; ++j) {
            const uint32_t t = imp.tensors[j];
            REQUIRE(t < TENSORS);
            CHECK_EQ(layout[t].target, imp.target);
            CHECK_EQ(layout[t].file, imp.file);
            if (j > 0) CHECK(layout[imp.tensors[j - 1]].offset <= layout[t].offset);
            CHECK(layout[t].offset >= offset && layout[t].offset + layout[t].size <= offset + size);
            ++served[t];
            wm_tensor_location loc = {.struct_size = sizeof loc};
            REQUIRE_OK(wm_placement_locate(placement, t, &loc));
            CHECK_EQ(loc.import_index, k); /* the location points into this import */
        }
        /* its region and run in the executed plan describe the same extent */
        const wm_plan* executed = wm_placement_plan(placement);
        wm_plan_region region = {.struct_size = sizeof region};
        REQUIRE_OK(wm_plan_get_region(executed, imp.region, &region));
        CHECK_EQ(region.target, imp.target);
        CHECK_EQ(region.file, imp.file);
        wm_plan_run run = {.struct_size = sizeof run};
        REQUIRE_OK(wm_plan_get_run(executed, imp.region, imp.run, &run));
        CHECK_EQ(run.extent_offset, offset);
        CHECK_EQ(run.extent_size, size);
    }
    for (uint32_t t = 0; t < TENSORS; ++t)
        CHECK_EQ(served[t], layout[t].target == T_ORPHAN ? 0 : 1); /* each imported tensor once */

    /* The executed plan: the orphan region fell back, totals recomputed. */
    const uint64_t orphan_bytes = layout[2].size + layout[3].size;
    uint64_t orphan_offset = 0, orphan_extent = 0;
    uint32_t orphan_count = 0;
    REQUIRE(expected_extent(T_ORPHAN, 0, T_ORPHAN, &orphan_offset, &orphan_extent, &orphan_count));
    CHECK_EQ(before.device_bytes, orphan_bytes);
    CHECK_EQ(before.imported_bytes, orphan_bytes);
    CHECK_EQ(before.imports, 1);
    CHECK_EQ(before.pinned_bytes, orphan_extent);
    const wm_plan* executed = wm_placement_plan(placement);
    REQUIRE(executed != NULL);
    REQUIRE_EQ(wm_plan_region_count(executed), 5);
    wm_plan_region orphan = {.struct_size = sizeof orphan};
    REQUIRE_OK(wm_plan_get_region(executed, 4, &orphan));
    CHECK_EQ(orphan.target, T_ORPHAN);
    CHECK(orphan.decision == WM_DECISION_FALLBACK);
    CHECK(orphan.reason != NULL && orphan.reason[0] != '\0');
    wm_plan_totals after = {.struct_size = sizeof after};
    REQUIRE_OK(wm_plan_get_totals(executed, &after));
    CHECK_EQ(after.device_bytes, orphan_bytes);
    CHECK_EQ(after.imported_bytes, 0);
    CHECK_EQ(after.fallback_bytes, orphan_bytes);
    CHECK_EQ(after.pinned_bytes, 0);
    CHECK_EQ(after.imports, 0);
    wm_tensor_placement tp = {.struct_size = sizeof tp};
    REQUIRE_OK(wm_plan_get_tensor(executed, 2, &tp));
    CHECK_EQ(tp.run, WM_NO_INDEX);
    CHECK(tp.reason != NULL && tp.reason[0] != '\0');
    CHECK_EQ(log.warnings, 0); /* nothing was refused */

    /* release_all: no imports, every tensor still has its host address; idempotent. */
    wm_placement_release_all(placement);
    CHECK_EQ(wm_placement_import_count(placement), 0);
    wm_placement_import imp = {.struct_size = sizeof imp};
    CHECK_INVALID(wm_placement_get_import(placement, 0, &imp), "wm_placement_get_import");
    for (uint32_t i = 0; i < TENSORS; ++i) {
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(placement, i, &loc));
        CHECK(!loc.imported);
        CHECK_EQ(loc.import_index, WM_NO_INDEX);
        CHECK(loc.host_address == (const void*)((const char*)files[layout[i].file].base + layout[i].offset));
        CHECK(loc.reason != NULL && loc.reason[0] != '\0');
    }
    wm_placement_release_all(placement);
    CHECK_EQ(wm_placement_import_count(placement), 0);
    wm_placement_destroy(placement);
    fixture_close(&fx);
}

typedef struct progress {
    int calls;
    uint64_t done[16], total[16];
} progress;

static bool on_progress(void* user, uint64_t done, uint64_t total) {
    progress* p = (progress*)user;
    if (p->calls < 16) {
        p->done[p->calls] = done;
        p->total[p->calls] = total;
    }
    ++p->calls;
    return true;
}

static void case_progress_reports_imported_bytes_of_the_total(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    progress p;
    memset(&p, 0, sizeof p);
    wm_execute_options options;
    wm_execute_options_init(&options);
    options.progress = on_progress;
    options.progress_user = &p;
    /* The orphan tensors go to CPU-A: four regions, every one imported. */
    wm_placement* placement = execute(&fx, T_CPU_A, NULL, &options, NULL);
    REQUIRE(placement != NULL);
    uint64_t total = 0;
    for (uint32_t t = 0; t < 2; ++t)
        for (uint32_t f = 0; f < FILES; ++f) {
            uint64_t offset = 0, size = 0;
            uint32_t count = 0;
            if (expected_extent(t, f, T_CPU_A, &offset, &size, &count)) total += size;
        }
    CHECK_EQ(wm_placement_import_count(placement), 4);
    REQUIRE_EQ(p.calls, 4);
    for (int k = 0; k < p.calls; ++k) {
        CHECK_EQ(p.total[k], total);
        if (k > 0) CHECK(p.done[k] > p.done[k - 1]);
    }
    CHECK_EQ(p.done[p.calls - 1], total);
    /* tensors 2 and 3 now served by CPU-A's import of file 0 */
    wm_tensor_location loc = {.struct_size = sizeof loc};
    REQUIRE_OK(wm_placement_locate(placement, 3, &loc));
    CHECK(loc.imported);
    wm_placement_import imp = {.struct_size = sizeof imp};
    REQUIRE_OK(wm_placement_get_import(placement, loc.import_index, &imp));
    CHECK_EQ(imp.target, T_CPU_A);
    CHECK_EQ(imp.file, 0);
    CHECK_EQ(imp.tensor_count, 5);
    wm_placement_destroy(placement);
    fixture_close(&fx);
}

typedef struct reader {
    const wm_placement* placement;
    const wm_mapped_file* files;
    int mismatches;
} reader;

static void* read_all(void* arg) {
    reader* r = (reader*)arg;
    for (int round = 0; round < 300; ++round)
        for (uint32_t i = 0; i < TENSORS; ++i) {
            wm_tensor_location loc = {.struct_size = sizeof loc};
            if (wm_placement_locate(r->placement, i, &loc) != WM_OK ||
                loc.host_address != (const void*)((const char*)r->files[layout[i].file].base + layout[i].offset) ||
                loc.imported != (layout[i].target != T_ORPHAN)) {
                ++r->mismatches;
                continue;
            }
            if (!loc.imported) continue;
            wm_placement_import imp = {.struct_size = sizeof imp};
            if (wm_placement_get_import(r->placement, loc.import_index, &imp) != WM_OK ||
                (const char*)imp.buffer.host_address + loc.offset_in_buffer != (const char*)loc.host_address)
                ++r->mismatches;
        }
    return NULL;
}

static void case_placement_is_readable_from_several_threads(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    wm_placement* placement = execute(&fx, T_ORPHAN, NULL, NULL, NULL);
    REQUIRE(placement != NULL);
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    reader readers[THREADS];
    int started = 0;
    for (int k = 0; k < THREADS; ++k) {
        readers[k].placement = placement;
        readers[k].files = wm_mapped_model_files(fx.mapped);
        readers[k].mismatches = 0;
        if (pthread_create(&threads[k], NULL, read_all, &readers[k]) == 0) ++started;
    }
    CHECK_EQ(started, THREADS);
    for (int k = 0; k < started; ++k) {
        pthread_join(threads[k], NULL);
        CHECK_EQ(readers[k].mismatches, 0);
    }
    wm_placement_destroy(placement);
    fixture_close(&fx);
}

int main(void) {
    C_RUN(case_mapping_of_two_pattern_files);
    C_RUN(case_every_tensor_located_in_the_mapping_with_its_bytes);
    C_RUN(case_progress_reports_imported_bytes_of_the_total);
    C_RUN(case_placement_is_readable_from_several_threads);
    return c_check_finish();
}
