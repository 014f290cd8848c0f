/* SPDX-License-Identifier: MIT */
/* An engine importer written in C (wm_importer_vtable, c_fake_importer.h) driven by wm_execute
 * over real mappings aligned to its 64 KiB import alignment: what it is asked to import, that
 * each import is released exactly once and in reverse order, that a refused import (an error
 * with a reason, a wrong address) makes exactly that run fall back with the reason in the plan,
 * the location and the log while the region's other runs stay imported, that unavailability
 * makes every region fall back, that release_all and an abort from the progress callback leave
 * nothing imported, read_back through the vtable and its default, the vtable's tensor alignment
 * reaching the plan, and that the destroy callback runs once. */
#include "c_check.h"
#include "c_fake_importer.h"

#define KiB UINT64_C(1024)
#define MiB (UINT64_C(1024) * 1024)
#define ALIGN (64 * KiB)

enum { FILES = 2, PER_FILE = 6, TENSORS = FILES * PER_FILE, T_GPU = 0, T_CPU = 1 };
static const uint64_t file_size[FILES] = {8 * MiB + 999, 6 * MiB + 5};
static const uint8_t file_seed[FILES] = {0x11, 0xC3};

/* Per file, tensor f * PER_FILE + k: two device tensors, CPU experts, two device tensors, CPU. */
static const uint64_t t_offset[PER_FILE] = {70001, 270001, 420001, 3041441, 3341441, 3464898};
static const uint64_t t_size[PER_FILE] = {200000, 150000, 2621440, 300000, 123457, 1000000};
static const uint32_t t_target[PER_FILE] = {T_GPU, T_GPU, T_CPU, T_GPU, T_GPU, T_CPU};
/* The device runs of a file: {first k, last k}. */
static const uint32_t run_tensors[2][2] = {{0, 1}, {3, 4}};

static uint64_t run_extent_offset(uint32_t run) {
    return c_align_down(t_offset[run_tensors[run][0]], ALIGN);
}
static uint64_t run_extent_size(uint32_t run) {
    const uint32_t last = run_tensors[run][1];
    return c_align_up(t_offset[last] + t_size[last], ALIGN) - run_extent_offset(run);
}
static uint64_t run_ctx(uint32_t run) {
    return t_size[run_tensors[run][0]] + t_size[run_tensors[run][1]];
}
static uint32_t run_of(uint32_t k) { return k < 2 ? 0 : 1; } /* for device tensors */

typedef struct world {
    char path[FILES][512];
    wm_mapped_model* mapped;
    const wm_mapped_file* files;
    c_fake fake;
    wm_importer_vtable vtable;
    wm_importer* gpu;
    wm_importer* cpu;
    wm_model* model;
    wm_plan* plan;
    c_log log;
} world;

/* Files and mappings; the fake is initialised with the 64 KiB alignment, to be configured. */
static bool world_open(world* w) {
    memset(w, 0, sizeof *w);
    c_fake_init(&w->fake);
    w->fake.alignment = ALIGN;
    w->vtable = c_fake_vtable("fake-gpu");
    for (int f = 0; f < FILES; ++f)
        if (!c_temp_file(file_size[f], file_seed[f], w->path[f])) return false;
    const char* paths[FILES] = {w->path[0], w->path[1]};
    wm_mapping_options mo;
    wm_mapping_options_init(&mo);
    mo.base_alignment = ALIGN; /* so file offsets aligned to 64 KiB are aligned addresses */
    if (wm_mapped_model_open(paths, FILES, WM_MAPPING_READ_ONLY, &mo, &w->mapped) != WM_OK) {
        fprintf(stderr, "wm_mapped_model_open: %s\n", wm_last_error());
        return false;
    }
    w->files = wm_mapped_model_files(w->mapped);
    return w->files != NULL;
}

/* Importers, model and plan (after the fake is configured). */
static bool world_build(world* w) {
    if (wm_importer_create_custom(&w->vtable, &w->fake, &w->gpu) != WM_OK ||
        wm_importer_create_cpu(&w->cpu) != WM_OK || wm_model_create(&w->model) != WM_OK) {
        fprintf(stderr, "world_build: %s\n", wm_last_error());
        return false;
    }
    bool ok = wm_model_add_file(w->model, w->path[0], file_size[0], NULL) == WM_OK &&
              wm_model_add_file(w->model, w->path[1], file_size[1], NULL) == WM_OK &&
              wm_model_add_target(w->model, "GPU", w->gpu, NULL) == WM_OK &&
              wm_model_add_target(w->model, "CPU", w->cpu, NULL) == WM_OK;
    for (uint32_t f = 0; ok && f < FILES; ++f)
        for (uint32_t k = 0; ok && k < PER_FILE; ++k)
            ok = wm_model_add_tensor(w->model, "t", f, t_offset[k], t_size[k], t_target[k], NULL) == WM_OK;
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    if (!ok || wm_plan_create(w->model, &o, &w->plan) != WM_OK) {
        fprintf(stderr, "world_build: %s\n", wm_last_error());
        return false;
    }
    return true;
}

static wm_status world_execute(world* w, wm_execute_options* options, wm_placement** out) {
    wm_importer* importers[2] = {w->gpu, w->cpu};
    return wm_execute(w->model, w->plan, w->files, FILES, importers, 2, options, out);
}

static void world_close(world* w) {
    wm_plan_destroy(w->plan);
    wm_model_destroy(w->model);
    wm_importer_destroy(w->gpu);
    wm_importer_destroy(w->cpu);
    wm_mapped_model_destroy(w->mapped);
}

static wm_execute_options logging(world* w) {
    wm_execute_options o;
    wm_execute_options_init(&o);
    o.log = c_log_fn;
    o.log_user = &w->log;
    return o;
}

/* The fake's record of the import of (file, run), or NULL. */
static const c_fake_record* record_of(const world* w, uint32_t file, uint32_t run) {
    const char* host = (const char*)w->files[file].base + run_extent_offset(run);
    for (int i = 0; i < w->fake.record_count; ++i)
        if (w->fake.records[i].host == (const void*)host) return &w->fake.records[i];
    return NULL;
}

/* The device tensors of run `run` of `file` are imported at the run's extent with the file's
 * bytes. */
static void check_run_imported(const world* w, const wm_placement* placement, uint32_t file,
                               uint32_t run) {
    for (uint32_t k = 0; k < PER_FILE; ++k) {
        if (t_target[k] != T_GPU || run_of(k) != run) continue;
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(placement, file * PER_FILE + k, &loc));
        CHECK(loc.imported);
        CHECK_STR_EQ(loc.reason, "");
        const char* host = (const char*)w->files[file].base + t_offset[k];
        CHECK(loc.host_address == (const void*)host);
        CHECK_EQ(loc.offset_in_buffer, t_offset[k] - run_extent_offset(run_of(k)));
        CHECK(loc.device_address == NULL); /* the fake has no device address */
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, loc.import_index, &imp));
        CHECK_EQ(imp.target, T_GPU);
        CHECK_EQ(imp.file, file);
        CHECK_EQ(imp.extent_offset, run_extent_offset(run_of(k)));
        CHECK(imp.buffer.host_address == (void*)((char*)w->files[file].base + imp.extent_offset));
        CHECK_EQ(imp.buffer.size, run_extent_size(run_of(k)));
        const c_fake_record* r = record_of(w, file, run_of(k));
        REQUIRE(r != NULL);
        CHECK_EQ(imp.buffer.native_memory, r->native_memory);
        CHECK_EQ(imp.buffer.native_buffer, r->native_memory - C_FAKE_NATIVE_MEMORY(0) + C_FAKE_NATIVE_BUFFER(0));
        CHECK_EQ(r->releases, 0);
        CHECK_PATTERN(loc.host_address, t_size[k], file_seed[file], t_offset[k]);
    }
}

static void check_file_imported(const world* w, const wm_placement* placement, uint32_t file) {
    for (uint32_t run = 0; run < 2; ++run) check_run_imported(w, placement, file, run);
}

/* The device tensors of run `run` of `file` fall back alone with a reason containing `why`. */
static void check_run_fell_back(const wm_placement* placement, uint32_t file, uint32_t run,
                                const char* why) {
    const wm_plan* executed = wm_placement_plan(placement);
    REQUIRE(executed != NULL);
    for (uint32_t k = 0; k < PER_FILE; ++k) {
        if (t_target[k] != T_GPU || run_of(k) != run) continue;
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(placement, file * PER_FILE + k, &loc));
        CHECK(!loc.imported);
        CHECK_EQ(loc.import_index, WM_NO_INDEX);
        CHECK(loc.reason != NULL && loc.reason[0] != '\0');
        if (why != NULL) CHECK_CONTAINS(loc.reason, why);
        wm_tensor_placement tp = {.struct_size = sizeof tp};
        REQUIRE_OK(wm_plan_get_tensor(executed, file * PER_FILE + k, &tp));
        CHECK_EQ(tp.run, WM_NO_INDEX);
        if (why != NULL) CHECK_CONTAINS(tp.reason, why);
    }
}

/* Region (GPU, file) of the executed plan still imports, with `runs` runs left. */
static void check_region_imports(const wm_placement* placement, uint32_t file, uint32_t runs) {
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(wm_placement_plan(placement), file, &region));
    CHECK_EQ(region.target, T_GPU);
    CHECK(region.decision == WM_DECISION_IMPORT);
    CHECK_EQ(region.run_count, runs);
}

/* The device tensors of `file` fall back with a reason containing `why`. */
static void check_file_fell_back(const wm_placement* placement, uint32_t file, const char* why) {
    const wm_plan* executed = wm_placement_plan(placement);
    REQUIRE(executed != NULL);
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(executed, file, &region)); /* regions (GPU, f0), (GPU, f1), ... */
    CHECK_EQ(region.target, T_GPU);
    CHECK_EQ(region.file, file);
    CHECK(region.decision == WM_DECISION_FALLBACK);
    CHECK_EQ(region.run_count, 0);
    if (why != NULL) CHECK_CONTAINS(region.reason, why);
    for (uint32_t run = 0; run < 2; ++run) check_run_fell_back(placement, file, run, why);
}

/* The CPU regions are imported whatever the fake does. */
static void check_cpu_imported(const wm_placement* placement) {
    for (uint32_t i = 0; i < TENSORS; ++i) {
        if (t_target[i % PER_FILE] != T_CPU) continue;
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(placement, i, &loc));
        CHECK(loc.imported);
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, loc.import_index, &imp));
        CHECK_EQ(imp.target, T_CPU);
    }
}

/* Totals when run r of file f is imported exactly where imported[f][r]. */
static void check_run_totals(const wm_placement* placement, const bool imported[FILES][2]) {
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(wm_placement_plan(placement), &totals));
    uint64_t ctx = 0, pinned = 0, imports = 0;
    for (uint32_t f = 0; f < FILES; ++f)
        for (uint32_t r = 0; r < 2; ++r) {
            if (!imported[f][r]) continue;
            ctx += run_ctx(r);
            pinned += run_extent_size(r);
            ++imports;
        }
    const uint64_t device = FILES * (run_ctx(0) + run_ctx(1));
    CHECK_EQ(totals.device_bytes, device);
    CHECK_EQ(totals.imported_bytes, ctx);
    CHECK_EQ(totals.fallback_bytes, device - ctx);
    CHECK_EQ(totals.pinned_bytes, pinned);
    CHECK_EQ(totals.imports, imports);
}

static void check_totals(const wm_placement* placement, bool f0_imported, bool f1_imported) {
    const bool imported[FILES][2] = {{f0_imported, f0_imported}, {f1_imported, f1_imported}};
    check_run_totals(placement, imported);
}

static void case_caps_name_and_availability_come_from_the_vtable(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.max_import_size = 64 * MiB;
    w.fake.survives_read_only_reprotect = true;
    char name[16];
    snprintf(name, sizeof name, "fake-gpu");
    w.vtable.name = name;
    REQUIRE(world_build(&w));
    snprintf(name, sizeof name, "overwritten"); /* the name was copied at creation */
    CHECK_STR_EQ(wm_importer_name(w.gpu), "fake-gpu");

    wm_importer_caps caps = {.struct_size = sizeof caps};
    REQUIRE_OK(wm_importer_get_caps(w.gpu, &caps));
    CHECK_EQ(caps.struct_size, sizeof caps);
    CHECK_EQ(caps.alignment, ALIGN);
    CHECK_EQ(caps.max_import_size, 64 * MiB);
    CHECK(caps.survives_read_only_reprotect);
    CHECK(!caps.needs_writable_mapping);
    CHECK(!caps.is_cpu);
    CHECK(w.fake.caps_calls >= 1);
    CHECK_EQ(w.fake.caps_not_default, 0); /* caps arrive holding the defaults */
    CHECK_EQ(w.fake.caps_struct_size, sizeof(wm_importer_caps));

    const char* reason = "not written";
    CHECK(wm_importer_available(w.gpu, &reason));
    CHECK_STR_EQ(reason, "");
    CHECK(wm_importer_available(w.gpu, NULL));
    w.fake.unavailable = true;
    w.fake.unavailable_reason = "fake device asleep";
    reason = NULL;
    CHECK(!wm_importer_available(w.gpu, &reason));
    CHECK_CONTAINS(reason, "fake device asleep");

    /* A vtable without `available` is always available. */
    wm_importer_vtable v = c_fake_vtable("fake-no-available");
    v.available = NULL;
    wm_importer* always = NULL;
    REQUIRE_OK(wm_importer_create_custom(&v, &w.fake, &always));
    reason = "not written";
    CHECK(wm_importer_available(always, &reason));
    CHECK_STR_EQ(reason, "");
    CHECK_STR_EQ(wm_importer_name(always), "fake-no-available");
    w.fake.destroy_calls = 0;
    wm_importer_destroy(always);
    CHECK_EQ(w.fake.destroy_calls, 1);
    w.fake.destroy_calls = 0;
    world_close(&w);
}

static void case_imports_every_run_and_releases_each_once_in_reverse(void) {
    world w;
    REQUIRE(world_open(&w));
    REQUIRE(world_build(&w));
    wm_execute_options o = logging(&w);
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, &o, &placement));
    REQUIRE(placement != NULL);

    /* Asked exactly the four extents, aligned, in (file, offset) order. */
    CHECK_EQ(w.fake.import_calls, 4);
    CHECK_EQ(w.fake.bad_import_args, 0);
    REQUIRE_EQ(w.fake.record_count, 4);
    for (uint32_t f = 0; f < FILES; ++f)
        for (uint32_t run = 0; run < 2; ++run) {
            const c_fake_record* r = &w.fake.records[f * 2 + run];
            CHECK(r->host == (void*)((char*)w.files[f].base + run_extent_offset(run)));
            CHECK_EQ(r->size, run_extent_size(run));
        }
    CHECK_EQ((uintptr_t)w.files[0].base % ALIGN, 0);
    CHECK_EQ((uintptr_t)w.files[1].base % ALIGN, 0);

    /* Six imports: the fake's four, then the CPU's two; each serves exactly its tensors. */
    REQUIRE_EQ(wm_placement_import_count(placement), 6);
    for (uint32_t k = 0; k < 4; ++k) {
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, k, &imp));
        CHECK_EQ(imp.buffer.native_memory, C_FAKE_NATIVE_MEMORY(k));
        CHECK_EQ(imp.target, T_GPU);
        CHECK_EQ(imp.file, k / 2);
        CHECK_EQ(imp.run, k % 2);
        REQUIRE_EQ(imp.tensor_count, 2);
        CHECK_EQ(imp.tensors[0], (k / 2) * PER_FILE + run_tensors[k % 2][0]);
        CHECK_EQ(imp.tensors[1], (k / 2) * PER_FILE + run_tensors[k % 2][1]);
    }
    for (uint32_t k = 4; k < 6; ++k) {
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, k, &imp));
        CHECK_EQ(imp.target, T_CPU);
        CHECK_EQ(imp.file, k - 4);
    }
    check_file_imported(&w, placement, 0);
    check_file_imported(&w, placement, 1);
    check_cpu_imported(placement);
    check_totals(placement, true, true);
    CHECK_EQ(w.log.warnings, 0);
    CHECK_EQ(w.fake.release_calls, 0);

    wm_placement_destroy(placement);
    CHECK_EQ(w.fake.release_calls, 4);
    CHECK_EQ(w.fake.bad_releases, 0);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    REQUIRE_EQ(w.fake.release_order_count, 4);
    for (int k = 0; k < 4; ++k) CHECK_EQ(w.fake.release_order[k], C_FAKE_NATIVE_MEMORY(3 - k));

    CHECK_EQ(w.fake.destroy_calls, 0);
    wm_importer_destroy(w.gpu);
    w.gpu = NULL;
    CHECK_EQ(w.fake.destroy_calls, 1);
    CHECK_EQ(w.fake.calls_after_destroy, 0);
    world_close(&w);
    CHECK_EQ(w.fake.destroy_calls, 1);
}

static void case_release_all_releases_now_and_destroy_releases_nothing_more(void) {
    world w;
    REQUIRE(world_open(&w));
    REQUIRE(world_build(&w));
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, NULL, &placement));
    wm_placement_release_all(placement);
    CHECK_EQ(wm_placement_import_count(placement), 0);
    CHECK_EQ(w.fake.release_calls, 4);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    REQUIRE_EQ(w.fake.release_order_count, 4);
    for (int k = 0; k < 4; ++k) CHECK_EQ(w.fake.release_order[k], C_FAKE_NATIVE_MEMORY(3 - k));
    wm_placement_release_all(placement); /* idempotent */
    wm_placement_destroy(placement);
    CHECK_EQ(w.fake.release_calls, 4);
    CHECK_EQ(w.fake.bad_releases, 0);
    world_close(&w);
}

static void case_refused_import_falls_back_that_run_alone_with_the_reason(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.refuse_at = 3; /* file 1, run 0 */
    w.fake.refuse_reason = "fake refuses #3: out of aperture";
    REQUIRE(world_build(&w));
    wm_execute_options o = logging(&w);
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, &o, &placement)); /* a refusal is not an error */
    REQUIRE(placement != NULL);

    check_file_imported(&w, placement, 0);
    check_run_fell_back(placement, 1, 0, "fake refuses #3: out of aperture");
    check_region_imports(placement, 1, 1); /* its run 1 is now run 0 */
    check_run_imported(&w, placement, 1, 1);
    check_cpu_imported(placement);
    const bool imported[FILES][2] = {{true, true}, {false, true}};
    check_run_totals(placement, imported);
    CHECK(c_log_has(&w.log, WM_LOG_WARNING, "fake refuses #3: out of aperture"));
    CHECK_EQ(w.log.warnings, 1);
    CHECK_EQ(c_fake_live(&w.fake), 3); /* file 0's two and file 1's run 1 */
    CHECK_EQ(wm_placement_import_count(placement), 5);
    wm_placement_import imp = {.struct_size = sizeof imp};
    REQUIRE_OK(wm_placement_get_import(placement, 2, &imp));
    CHECK_EQ(imp.file, 1);
    CHECK_EQ(imp.run, 0);
    CHECK_EQ(imp.extent_offset, run_extent_offset(1));

    /* The plan the caller made is unchanged: wm_execute worked on a copy. */
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(w.plan, 1, &region));
    CHECK(region.decision == WM_DECISION_IMPORT);
    CHECK_EQ(region.run_count, 2);

    wm_placement_destroy(placement);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    CHECK_EQ(w.fake.bad_releases, 0);
    CHECK_EQ(w.fake.release_calls, w.fake.record_count); /* each success released once */
    world_close(&w);
}

static void case_a_refusal_without_a_reason_still_has_one(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.refuse_at = 1;
    w.fake.refuse_reason = ""; /* leaves the buffer empty */
    w.fake.refuse_status = WM_ERROR_OUT_OF_MEMORY;
    REQUIRE(world_build(&w));
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, NULL, &placement));
    check_run_fell_back(placement, 0, 0, NULL); /* every tensor: a non-empty reason */
    check_run_imported(&w, placement, 0, 1);
    check_file_imported(&w, placement, 1);
    wm_placement_destroy(placement);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    world_close(&w);
}

static void case_refusal_inside_a_region_keeps_its_earlier_runs(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.refuse_at = 2; /* file 0, run 1: run 0 was already imported */
    w.fake.refuse_reason = "fake refuses the second run";
    REQUIRE(world_build(&w));
    wm_execute_options o = logging(&w);
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, &o, &placement));
    check_run_imported(&w, placement, 0, 0);
    check_run_fell_back(placement, 0, 1, "fake refuses the second run");
    check_region_imports(placement, 0, 1);
    check_file_imported(&w, placement, 1);
    const bool imported[FILES][2] = {{true, false}, {true, true}};
    check_run_totals(placement, imported);
    const c_fake_record* first = record_of(&w, 0, 0);
    REQUIRE(first != NULL);
    CHECK_EQ(first->releases, 0); /* the run that was imported stays imported */
    CHECK_EQ(c_fake_live(&w.fake), 3);
    CHECK_EQ(wm_placement_import_count(placement), 5);
    CHECK(c_log_has(&w.log, WM_LOG_WARNING, "fake refuses the second run"));
    wm_placement_destroy(placement);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    CHECK_EQ(w.fake.bad_releases, 0);
    world_close(&w);
}

static void case_an_importer_that_moves_the_range_is_refused_and_released(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.lie_at = 1; /* hands back host + 64 KiB for file 0, run 0 */
    REQUIRE(world_build(&w));
    wm_execute_options o = logging(&w);
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, &o, &placement));
    check_run_fell_back(placement, 0, 0, "fake-gpu importer returned");
    check_run_imported(&w, placement, 0, 1);
    check_file_imported(&w, placement, 1);
    REQUIRE(w.fake.record_count >= 1);
    CHECK_EQ(w.fake.records[0].releases, 1); /* the moved buffer was handed back */
    CHECK_EQ(c_fake_live(&w.fake), 3);
    CHECK(w.log.warnings >= 1);
    wm_placement_destroy(placement);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    CHECK_EQ(w.fake.bad_releases, 0);
    world_close(&w);
}

/* A region of six runs (one device tensor each, 1.375 MiB apart in file 0: too far to merge)
 * whose third import is refused: only that run falls back. */
enum { SIX = 6 };
static const uint64_t six_size = 100000, six_step = 1441792, six_base = 70001;

static void case_a_refused_run_of_six_falls_back_alone(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.refuse_at = 3;
    w.fake.refuse_reason = "fake refuses #3 of six";
    REQUIRE_OK(wm_importer_create_custom(&w.vtable, &w.fake, &w.gpu));
    REQUIRE_OK(wm_importer_create_cpu(&w.cpu));
    REQUIRE_OK(wm_model_create(&w.model));
    REQUIRE_OK(wm_model_add_file(w.model, w.path[0], file_size[0], NULL));
    REQUIRE_OK(wm_model_add_file(w.model, w.path[1], file_size[1], NULL));
    REQUIRE_OK(wm_model_add_target(w.model, "GPU", w.gpu, NULL));
    REQUIRE_OK(wm_model_add_target(w.model, "CPU", w.cpu, NULL));
    for (uint32_t k = 0; k < SIX; ++k)
        REQUIRE_OK(wm_model_add_tensor(w.model, "w", 0, six_base + k * six_step, six_size, T_GPU, NULL));
    wm_plan_options po;
    wm_plan_options_init(&po);
    po.import_enabled = 1;
    REQUIRE_OK(wm_plan_create(w.model, &po, &w.plan));
    wm_plan_region planned = {.struct_size = sizeof planned};
    REQUIRE_OK(wm_plan_get_region(w.plan, 0, &planned));
    REQUIRE_EQ(planned.run_count, SIX);

    wm_execute_options o = logging(&w);
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, &o, &placement));
    const wm_plan* executed = wm_placement_plan(placement);
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(executed, 0, &region));
    CHECK(region.decision == WM_DECISION_IMPORT);
    CHECK_EQ(region.run_count, SIX - 1);
    CHECK_CONTAINS(region.reason, "1 of its 6 imports refused when executed");
    REQUIRE_EQ(wm_placement_import_count(placement), SIX - 1);
    CHECK_EQ(c_fake_live(&w.fake), SIX - 1);
    CHECK_EQ(w.log.warnings, 1);
    for (uint32_t k = 0; k < SIX; ++k) {
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(placement, k, &loc));
        if (k == 2) {
            CHECK(!loc.imported);
            CHECK_CONTAINS(loc.reason, "fake refuses #3 of six");
            continue;
        }
        CHECK(loc.imported);
        const uint32_t index = k < 2 ? k : k - 1;
        CHECK_EQ(loc.import_index, index);
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(placement, index, &imp));
        CHECK_EQ(imp.run, index);
        REQUIRE_EQ(imp.tensor_count, 1);
        CHECK_EQ(imp.tensors[0], k);
        CHECK((const char*)imp.buffer.host_address + loc.offset_in_buffer ==
              (const char*)w.files[0].base + six_base + k * six_step);
        wm_tensor_placement tp = {.struct_size = sizeof tp};
        REQUIRE_OK(wm_plan_get_tensor(executed, k, &tp));
        CHECK_EQ(tp.run, index);
    }
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(executed, &totals));
    CHECK_EQ(totals.imported_bytes, (SIX - 1) * six_size);
    CHECK_EQ(totals.fallback_bytes, six_size);
    CHECK_EQ(totals.imports, SIX - 1);
    wm_placement_destroy(placement);
    CHECK_EQ(c_fake_live(&w.fake), 0);
    CHECK_EQ(w.fake.bad_releases, 0);
    CHECK_EQ(w.fake.release_calls, SIX - 1);
    world_close(&w);
}

/* The vtable's tensor alignment reaches the plan: every device tensor of the world sits at an
 * odd offset, so with 32 none is imported, each saying why, and nothing is asked of the fake. */
static void case_tensor_alignment_from_the_vtable_reaches_the_plan(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.tensor_alignment = 32;
    REQUIRE(world_build(&w));
    wm_importer_caps caps = {.struct_size = sizeof caps};
    REQUIRE_OK(wm_importer_get_caps(w.gpu, &caps));
    CHECK_EQ(caps.tensor_alignment, 32);
    wm_tensor_placement tp = {.struct_size = sizeof tp};
    REQUIRE_OK(wm_plan_get_tensor(w.plan, 0, &tp));
    CHECK_EQ(tp.run, WM_NO_INDEX);
    CHECK_CONTAINS(tp.reason, "offset 0x11171 is not a multiple of the importer's tensor "
                              "alignment 32 (target 'GPU', importer 'fake-gpu')");
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, NULL, &placement));
    CHECK_EQ(w.fake.import_calls, 0);
    check_file_fell_back(placement, 0, "tensor alignment 32");
    check_file_fell_back(placement, 1, "tensor alignment 32");
    wm_placement_destroy(placement);
    world_close(&w);
}

static void case_unavailable_importer_makes_every_region_fall_back(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.unavailable = true;
    w.fake.unavailable_reason = "fake device asleep";
    REQUIRE(world_build(&w));
    c_log global;
    memset(&global, 0, sizeof global);
    wm_set_log_callback(c_log_fn, &global); /* options without log: the process-wide sink */
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, NULL, &placement));
    wm_set_log_callback(NULL, NULL);
    CHECK_EQ(w.fake.import_calls, 0);
    check_file_fell_back(placement, 0, "fake device asleep");
    check_file_fell_back(placement, 1, "fake device asleep");
    check_cpu_imported(placement);
    check_totals(placement, false, false);
    CHECK_EQ(wm_placement_import_count(placement), 2);
    CHECK(c_log_has(&global, WM_LOG_WARNING, "fake device asleep"));
    wm_placement_destroy(placement);
    CHECK_EQ(w.fake.release_calls, 0);
    world_close(&w);
}

/* The policy reads the device kind the engine's importer reports: a discrete or unknown device
 * falls back under the default policy with the reason, WM_IMPORT_POLICY_ALWAYS imports it, and a
 * target set to NEVER falls back whatever the device. */
static void case_device_memory_and_policy_decide_the_import(void) {
    const struct {
        wm_device_memory memory;
        wm_import_policy options_policy;
        wm_import_policy target_policy;
        bool imports;
        const char* why;
    } cases[] = {
        {WM_DEVICE_MEMORY_UNIFIED, WM_IMPORT_POLICY_UNIFIED_ONLY, WM_IMPORT_POLICY_FROM_OPTIONS, true, NULL},
        {WM_DEVICE_MEMORY_DISCRETE, WM_IMPORT_POLICY_UNIFIED_ONLY, WM_IMPORT_POLICY_FROM_OPTIONS, false,
         "discrete device (fake PCIe card): imported weights would be read over the bus"},
        {WM_DEVICE_MEMORY_UNKNOWN, WM_IMPORT_POLICY_UNIFIED_ONLY, WM_IMPORT_POLICY_FROM_OPTIONS, false,
         "device memory unknown"},
        {WM_DEVICE_MEMORY_DISCRETE, WM_IMPORT_POLICY_ALWAYS, WM_IMPORT_POLICY_FROM_OPTIONS, true, NULL},
        {WM_DEVICE_MEMORY_DISCRETE, WM_IMPORT_POLICY_UNIFIED_ONLY, WM_IMPORT_POLICY_ALWAYS, true, NULL},
        {WM_DEVICE_MEMORY_UNIFIED, WM_IMPORT_POLICY_ALWAYS, WM_IMPORT_POLICY_NEVER, false,
         "import_policy=never"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        world w;
        REQUIRE(world_open(&w));
        w.fake.device_memory = cases[i].memory;
        w.fake.device_memory_note = "fake PCIe card";
        REQUIRE(world_build(&w));
        REQUIRE_OK(wm_model_set_target_import_policy(w.model, T_GPU, cases[i].target_policy));
        wm_plan_destroy(w.plan);
        w.plan = NULL;
        wm_plan_options o;
        wm_plan_options_init(&o);
        o.import_enabled = 1;
        o.import_policy = cases[i].options_policy;
        REQUIRE_OK(wm_plan_create(w.model, &o, &w.plan));
        wm_placement* placement = NULL;
        REQUIRE_OK(world_execute(&w, NULL, &placement));
        if (cases[i].imports) {
            check_file_imported(&w, placement, 0);
            check_file_imported(&w, placement, 1);
        } else {
            check_file_fell_back(placement, 0, cases[i].why);
            check_file_fell_back(placement, 1, cases[i].why);
            CHECK_EQ(w.fake.import_calls, 0);
        }
        check_cpu_imported(placement);
        check_totals(placement, cases[i].imports, cases[i].imports);
        wm_placement_destroy(placement);
        world_close(&w);
    }
}

/* A plan made while the importer said unified is executed after it says discrete (a plan from
 * what-if caps, say): the executor applies the plan's policy to the caps it sees now. */
static void case_executor_applies_the_policy_to_the_live_caps(void) {
    world w;
    REQUIRE(world_open(&w));
    REQUIRE(world_build(&w)); /* planned as unified: both device regions import */
    w.fake.device_memory = WM_DEVICE_MEMORY_DISCRETE;
    wm_execute_options o = logging(&w);
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, &o, &placement));
    CHECK_EQ(w.fake.import_calls, 0);
    check_file_fell_back(placement, 0, "fake-gpu importer: discrete device");
    check_file_fell_back(placement, 1, "fake-gpu importer: discrete device");
    check_cpu_imported(placement);
    CHECK(c_log_has(&w.log, WM_LOG_WARNING, "import_policy=always to import anyway"));
    wm_placement_destroy(placement);
    world_close(&w);
}

static void case_read_back_goes_through_the_vtable(void) {
    world w;
    REQUIRE(world_open(&w));
    REQUIRE(world_build(&w));
    wm_placement* placement = NULL;
    REQUIRE_OK(world_execute(&w, NULL, &placement));
    wm_placement_import imp = {.struct_size = sizeof imp};
    REQUIRE_OK(wm_placement_get_import(placement, 3, &imp)); /* file 1, run 1 */
    static const uint64_t at[] = {0, 1, 4095, 4097, 65537, 131071};
    unsigned char back[1000];
    for (size_t i = 0; i < sizeof at / sizeof at[0]; ++i) {
        const int calls = w.fake.read_back_calls;
        memset(back, 0, sizeof back);
        CHECK_OK(wm_importer_read_back(w.gpu, &imp.buffer, at[i], 777, back));
        CHECK_EQ(w.fake.read_back_calls, calls + 1);
        CHECK_EQ(w.fake.read_back_offset, at[i]);
        CHECK_EQ(w.fake.read_back_size, 777);
        CHECK(w.fake.read_back_host == imp.buffer.host_address);
        CHECK_PATTERN(back, 777, file_seed[1], imp.extent_offset + at[i]);
    }
    /* The callback's failure and its reason reach the caller. */
    w.fake.read_back_fails = true;
    CHECK_STATUS(wm_importer_read_back(w.gpu, &imp.buffer, 0, 16, back), WM_ERROR_IO);
    CHECK_CONTAINS(wm_last_error(), "fake read_back failed on purpose");
    static const wm_status passed_through[] = {WM_ERROR_LIMIT, WM_ERROR_UNSUPPORTED,
                                               WM_ERROR_OUT_OF_MEMORY, WM_ERROR_IMPORT_FAILED};
    for (size_t i = 0; i < sizeof passed_through / sizeof passed_through[0]; ++i) {
        w.fake.read_back_status = passed_through[i];
        CHECK_STATUS(wm_importer_read_back(w.gpu, &imp.buffer, 0, 16, back), passed_through[i]);
    }
    wm_placement_destroy(placement);
    world_close(&w);

    /* No read_back entry: memcpy from device_address when set, else unsupported. */
    REQUIRE(world_open(&w));
    w.vtable.read_back = NULL;
    w.fake.device_is_host = true;
    REQUIRE(world_build(&w));
    placement = NULL;
    REQUIRE_OK(world_execute(&w, NULL, &placement));
    REQUIRE_OK(wm_placement_get_import(placement, 1, &imp)); /* file 0, run 1 */
    CHECK(imp.buffer.device_address == imp.buffer.host_address);
    memset(back, 0, sizeof back);
    CHECK_OK(wm_importer_read_back(w.gpu, &imp.buffer, 4097, 999, back));
    CHECK_PATTERN(back, 999, file_seed[0], imp.extent_offset + 4097);
    CHECK_EQ(w.fake.read_back_calls, 0);
    wm_tensor_location loc = {.struct_size = sizeof loc};
    REQUIRE_OK(wm_placement_locate(placement, 3, &loc)); /* file 0, tensor k = 3 */
    CHECK(loc.device_address == (void*)((char*)imp.buffer.device_address + loc.offset_in_buffer));
    CHECK(loc.device_address == (const void*)loc.host_address);
    /* The live import with a field changed is not a live import: refused, never read */
    wm_imported_buffer no_device = imp.buffer;
    no_device.device_address = NULL;
    CHECK_STATUS(wm_importer_read_back(w.gpu, &no_device, 0, 16, back), WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "not a live import");
    wm_placement_destroy(placement);
    world_close(&w);
}

typedef struct abort_at {
    int calls, stop_at;
} abort_at;

static bool stop_progress(void* user, uint64_t done, uint64_t total) {
    abort_at* a = (abort_at*)user;
    (void)done;
    (void)total;
    return ++a->calls != a->stop_at;
}

static void case_abort_from_progress_leaves_nothing_imported(void) {
    for (int stop = 1; stop <= 3; stop += 2) {
        world w;
        REQUIRE(world_open(&w));
        REQUIRE(world_build(&w));
        abort_at a = {0, stop};
        wm_execute_options o;
        wm_execute_options_init(&o);
        o.progress = stop_progress;
        o.progress_user = &a;
        int sentinel = 0;
        wm_placement* placement = (wm_placement*)(void*)&sentinel;
        CHECK_STATUS(world_execute(&w, &o, &placement), WM_ERROR_ABORTED);
        CHECK(placement == (wm_placement*)(void*)&sentinel); /* out not written */
        CHECK(wm_last_error()[0] != '\0');
        CHECK_CONTAINS(wm_last_error(), "wm_execute");
        CHECK_EQ(a.calls, stop); /* no progress after the abort */
        CHECK_EQ(w.fake.import_calls, stop);
        CHECK_EQ(c_fake_live(&w.fake), 0);
        CHECK_EQ(w.fake.release_calls, stop);
        CHECK_EQ(w.fake.bad_releases, 0);
        REQUIRE_EQ(w.fake.release_order_count, stop);
        for (int k = 0; k < stop; ++k) CHECK_EQ(w.fake.release_order[k], C_FAKE_NATIVE_MEMORY(stop - 1 - k));
        /* and the same world executes fine afterwards */
        placement = NULL;
        CHECK_OK(world_execute(&w, NULL, &placement));
        CHECK_EQ(c_fake_live(&w.fake), 4);
        wm_placement_destroy(placement);
        CHECK_EQ(c_fake_live(&w.fake), 0);
        world_close(&w);
    }
}

/* wm_importer_import / wm_importer_release: an engine importer composing one of ours calls it
 * outside a plan; the preconditions and the refusal come back as the planner would see them. */
static void case_direct_import_and_release_go_through_the_importer(void) {
    world w;
    REQUIRE(world_open(&w));
    w.fake.device_is_host = true;
    w.fake.refuse_at = 2;
    w.fake.refuse_reason = "device says no";
    REQUIRE(world_build(&w));
    static char page[2 * ALIGN] __attribute__((aligned(ALIGN)));
    wm_imported_buffer buf;
    memset(&buf, 0, sizeof buf);
    REQUIRE_OK(wm_importer_import(w.gpu, page, ALIGN, &buf));
    CHECK(buf.host_address == (void*)page);
    CHECK_EQ(buf.size, (uint64_t)ALIGN);
    CHECK(buf.device_address == (void*)page);
    CHECK_EQ(buf.native_memory, C_FAKE_NATIVE_MEMORY(0));
    CHECK_EQ(c_fake_live(&w.fake), 1);
    /* the second call is refused with the backend's reason, nothing imported */
    wm_imported_buffer refused;
    CHECK_STATUS(wm_importer_import(w.gpu, page + ALIGN, ALIGN, &refused), WM_ERROR_IMPORT_FAILED);
    CHECK(strstr(wm_last_error(), "device says no") != NULL);
    CHECK_EQ(c_fake_live(&w.fake), 1);
    /* an unaligned range never reaches the importer */
    const int calls = w.fake.import_calls;
    CHECK_STATUS(wm_importer_import(w.gpu, page + 1, ALIGN, &refused), WM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(w.fake.import_calls, calls);
    CHECK_STATUS(wm_importer_import(w.gpu, page, ALIGN, NULL), WM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(wm_importer_release(w.gpu, &buf));
    CHECK_EQ(c_fake_live(&w.fake), 0);
    CHECK_EQ(w.fake.bad_releases, 0);
    CHECK_STATUS(wm_importer_release(NULL, &buf), WM_ERROR_INVALID_ARGUMENT);
    world_close(&w);
}

int main(void) {
    C_RUN(case_caps_name_and_availability_come_from_the_vtable);
    C_RUN(case_imports_every_run_and_releases_each_once_in_reverse);
    C_RUN(case_release_all_releases_now_and_destroy_releases_nothing_more);
    C_RUN(case_refused_import_falls_back_that_run_alone_with_the_reason);
    C_RUN(case_a_refusal_without_a_reason_still_has_one);
    C_RUN(case_refusal_inside_a_region_keeps_its_earlier_runs);
    C_RUN(case_an_importer_that_moves_the_range_is_refused_and_released);
    C_RUN(case_a_refused_run_of_six_falls_back_alone);
    C_RUN(case_tensor_alignment_from_the_vtable_reaches_the_plan);
    C_RUN(case_unavailable_importer_makes_every_region_fall_back);
    C_RUN(case_read_back_goes_through_the_vtable);
    C_RUN(case_device_memory_and_policy_decide_the_import);
    C_RUN(case_executor_applies_the_policy_to_the_live_caps);
    C_RUN(case_abort_from_progress_leaves_nothing_imported);
    C_RUN(case_direct_import_and_release_go_through_the_importer);
    return c_check_finish();
}
