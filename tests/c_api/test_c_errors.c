/* SPDX-License-Identifier: MIT */
/* Every caller mistake the C API contract names: NULL handles and out-parameters, out-of-range
 * indices, struct_size too small, bad enum values, a plan executed with the wrong model or the
 * wrong number of files or importers. Each must be WM_ERROR_INVALID_ARGUMENT (never an abort),
 * leave the out-parameter untouched and leave a wm_last_error() naming the function. Also: the
 * last error is thread-local, every status has a name, the registry and importer creation
 * errors, and the version. */
#include "c_check.h"

#include <pthread.h>

#include "c_fake_importer.h"
#include "weightmap/backends/hsa.h" /* links in every build, HSA or not */

#define KiB UINT64_C(1024)
#define MiB (UINT64_C(1024) * 1024)

static char c_sentinel_;
#define SENTINEL(T) ((T*)(void*)&c_sentinel_)

/* A failing call that must not write its out-parameter `obj` (compared bytewise). */
#define CHECK_INVALID_OUT(expr, function, obj)                                                \
    do {                                                                                      \
        unsigned char c_before_[sizeof(obj)];                                                 \
        memcpy(c_before_, &(obj), sizeof(obj));                                               \
        CHECK_INVALID(expr, function);                                                        \
        CHECK_MSG(memcmp(c_before_, &(obj), sizeof(obj)) == 0, "%s",                          \
                  "the out-parameter was written by a failing call: " #expr);                 \
    } while (0)

/* Fills an out struct with a recognisable pattern and sets its struct_size. */
#define FILL(obj, size)                                                                       \
    do {                                                                                      \
        memset(&(obj), 0x5A, sizeof(obj));                                                    \
        (obj).struct_size = (uint32_t)(size);                                                 \
    } while (0)

/* wm_mapped_model_open must fail with WM_ERROR_INVALID_ARGUMENT and not write `out`. */
#define CHECK_OPEN_INVALID(paths, count, access, options)                                     \
    do {                                                                                      \
        wm_mapped_model* c_out_ = SENTINEL(wm_mapped_model);                                  \
        CHECK_INVALID(wm_mapped_model_open((paths), (count), (access), (options), &c_out_),   \
                      "wm_mapped_model_open");                                                \
        if (c_out_ != SENTINEL(wm_mapped_model)) {                                            \
            CHECK_MSG(false, "%s", "out was written");                                        \
            wm_mapped_model_destroy(c_out_);                                                  \
        }                                                                                     \
    } while (0)

static void case_status_names(void) {
    static const struct {
        wm_status status;
        const char* name;
    } names[] = {
        {WM_OK, "ok"},
        {WM_ERROR_INVALID_ARGUMENT, "invalid_argument"},
        {WM_ERROR_IO, "io"},
        {WM_ERROR_FORMAT, "format"},
        {WM_ERROR_UNSUPPORTED, "unsupported"},
        {WM_ERROR_IMPORT_FAILED, "import_failed"},
        {WM_ERROR_LIMIT, "limit"},
        {WM_ERROR_ABORTED, "aborted"},
        {WM_ERROR_INTERNAL, "internal"},
        {WM_ERROR_OUT_OF_MEMORY, "out_of_memory"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
        CHECK_STR_EQ(wm_status_name(names[i].status), names[i].name);
    CHECK_STR_EQ(wm_status_name((wm_status)10), "unknown");
    CHECK_STR_EQ(wm_status_name((wm_status)-1), "unknown");
    CHECK_STR_EQ(wm_status_name((wm_status)12345), "unknown");
}

static void case_version_matches_the_headers(void) {
    CHECK_EQ(wm_version(), WM_VERSION_NUMBER);
    CHECK_STR_EQ(wm_version_string(), WM_VERSION_STRING);
    unsigned major = 999, minor = 999, patch = 999;
    char tail = 0;
    CHECK_EQ(sscanf(wm_version_string(), "%u.%u.%u%c", &major, &minor, &patch, &tail), 3);
    CHECK_EQ(wm_version(), (major << 16) | (minor << 8) | patch);
    CHECK_EQ(major, WM_VERSION_MAJOR);
    CHECK_EQ(minor, WM_VERSION_MINOR);
    CHECK_EQ(patch, WM_VERSION_PATCH);
}

/* --- the last error is thread-local -------------------------------------------------------- */

typedef struct thread_report {
    char initial[256];
    char after[1024];
    int mismatches;
    int which;
} thread_report;

static void* fail_on_another_thread(void* arg) {
    thread_report* r = (thread_report*)arg;
    snprintf(r->initial, sizeof r->initial, "%s", c_str_(wm_last_error()));
    wm_registry_entry e;
    FILL(e, sizeof e);
    (void)wm_registry_get(999, &e);
    snprintf(r->after, sizeof r->after, "%s", c_str_(wm_last_error()));
    return NULL;
}

/* Each thread fails its own way, over and over, and must always read its own message. */
static void* fail_in_a_loop(void* arg) {
    thread_report* r = (thread_report*)arg;
    for (int i = 0; i < 2000; ++i) {
        const char* expect;
        if (r->which == 0) {
            (void)wm_model_create(NULL);
            expect = "wm_model_create";
        } else if (r->which == 1) {
            wm_plan_totals t = {.struct_size = sizeof t};
            (void)wm_plan_get_totals(NULL, &t);
            expect = "wm_plan_get_totals";
        } else if (r->which == 2) {
            wm_memstat m = {.struct_size = 0};
            (void)wm_memstat_read(&m);
            expect = "wm_memstat_read";
        } else {
            (void)wm_split_sync_create(NULL, NULL);
            expect = "wm_split_sync_create";
        }
        if (strstr(c_str_(wm_last_error()), expect) == NULL) ++r->mismatches;
    }
    return NULL;
}

static void case_last_error_is_thread_local_and_kept_until_the_next_failure(void) {
    CHECK_STR_EQ(wm_last_error(), ""); /* nothing failed on this thread yet */
    wm_plan_region region;
    FILL(region, sizeof region);
    CHECK_INVALID(wm_plan_get_region(NULL, 0, &region), "wm_plan_get_region");
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", c_str_(wm_last_error()));

    thread_report other;
    memset(&other, 0, sizeof other);
    pthread_t thread;
    REQUIRE(pthread_create(&thread, NULL, fail_on_another_thread, &other) == 0);
    pthread_join(thread, NULL);
    CHECK_STR_EQ(other.initial, ""); /* a new thread starts with no error */
    CHECK_CONTAINS(other.after, "wm_registry_get");
    CHECK_STR_EQ(wm_last_error(), mine); /* its failure did not touch this thread's */

    /* A successful call does not clear it: it is the last call that failed. */
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    CHECK_STR_EQ(wm_last_error(), mine);
    wm_model_destroy(model);

    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    thread_report reports[THREADS];
    for (int k = 0; k < THREADS; ++k) {
        memset(&reports[k], 0, sizeof reports[k]);
        reports[k].which = k;
        REQUIRE(pthread_create(&threads[k], NULL, fail_in_a_loop, &reports[k]) == 0);
    }
    for (int k = 0; k < THREADS; ++k) {
        pthread_join(threads[k], NULL);
        CHECK_EQ(reports[k].mismatches, 0);
    }
    CHECK_STR_EQ(wm_last_error(), mine);
}

/* --- registry and importers ------------------------------------------------------------------- */

static void case_registry_entries_and_bad_indices(void) {
    const uint32_t count = wm_registry_count();
    REQUIRE(count >= 1);
    bool seen_cpu = false;
    for (uint32_t i = 0; i < count; ++i) {
        wm_registry_entry e;
        FILL(e, sizeof e);
        REQUIRE_OK(wm_registry_get(i, &e));
        CHECK_EQ(e.struct_size, sizeof e);
        REQUIRE(e.name != NULL);
        REQUIRE(e.build_note != NULL);
        CHECK(strcmp(e.name, "hsa") == 0 || strcmp(e.name, "cuda") == 0 ||
              strcmp(e.name, "vulkan") == 0 || strcmp(e.name, "cpu") == 0);
        if (e.built) CHECK_STR_EQ(e.build_note, "");
        else CHECK(e.build_note[0] != '\0');
        if (i + 1 == count) { /* CPU last, always built */
            CHECK_STR_EQ(e.name, "cpu");
            CHECK(e.built);
            seen_cpu = true;
        }
        for (uint32_t j = 0; j < i; ++j) {
            wm_registry_entry earlier = {.struct_size = sizeof earlier};
            REQUIRE_OK(wm_registry_get(j, &earlier));
            CHECK(strcmp(earlier.name, e.name) != 0);
        }
    }
    CHECK(seen_cpu);
    wm_registry_entry e;
    FILL(e, sizeof e);
    CHECK_INVALID_OUT(wm_registry_get(count, &e), "wm_registry_get", e);
    CHECK_INVALID_OUT(wm_registry_get(WM_NO_INDEX, &e), "wm_registry_get", e);
    CHECK_INVALID(wm_registry_get(0, NULL), "wm_registry_get");
    FILL(e, 0);
    CHECK_INVALID_OUT(wm_registry_get(0, &e), "wm_registry_get", e);
    FILL(e, sizeof e - 1);
    CHECK_INVALID_OUT(wm_registry_get(0, &e), "wm_registry_get", e);
}

static void case_importer_creation_errors(void) {
    wm_importer* out = SENTINEL(wm_importer);
    CHECK_INVALID(wm_importer_create("nonsense", &out), "wm_importer_create");
    CHECK_CONTAINS(wm_last_error(), "nonsense");
    CHECK(out == SENTINEL(wm_importer));
    CHECK_INVALID(wm_importer_create(NULL, &out), "wm_importer_create");
    CHECK(out == SENTINEL(wm_importer));
    CHECK_INVALID(wm_importer_create("cpu", NULL), "wm_importer_create");
    CHECK_INVALID(wm_importer_create_cpu(NULL), "wm_importer_create_cpu");

    if (access("/dev/kfd", F_OK) != 0) {
        /* No HSA device here: built or not, "hsa" is unsupported, with the reason. */
        CHECK_STATUS(wm_importer_create("hsa", &out), WM_ERROR_UNSUPPORTED);
        CHECK(out == SENTINEL(wm_importer));
        CHECK(strlen(wm_last_error()) > strlen("hsa"));
        CHECK_CONTAINS(wm_last_error(), "hsa");
        /* backends/hsa.h: built without HSA, creating fails; built with it, the importer exists
         * but is unavailable, and the agent count says so. Either way: unsupported. */
        wm_importer* hsa = NULL;
        const wm_status made = wm_importer_create_hsa(NULL, &hsa);
        CHECK(made == WM_OK || made == WM_ERROR_UNSUPPORTED);
        uint32_t agents = 7;
        if (made == WM_OK) {
            CHECK(!wm_importer_available(hsa, NULL));
            CHECK_STATUS(wm_hsa_gpu_agent_count(hsa, &agents), WM_ERROR_UNSUPPORTED);
            CHECK_CONTAINS(wm_last_error(), "not available");
            wm_importer_destroy(hsa);
        } else {
            CHECK_CONTAINS(wm_last_error(), "built without HSA support");
            CHECK(hsa == NULL);
        }
        CHECK_EQ(agents, 7);
    } else {
        printf("note: /dev/kfd exists, the 'hsa' unsupported check is skipped\n");
    }

    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create("cpu", &cpu));
    CHECK_STR_EQ(wm_importer_name(cpu), "cpu");
    wm_importer_caps caps = {.struct_size = sizeof caps};
    REQUIRE_OK(wm_importer_get_caps(cpu, &caps));
    CHECK(caps.is_cpu);
    CHECK(!caps.needs_writable_mapping);
    CHECK(caps.survives_read_only_reprotect);
    wm_importer_destroy(cpu);
    wm_importer_destroy(NULL);
}

static void case_custom_importer_vtable_errors(void) {
    c_fake fake;
    c_fake_init(&fake);
    wm_importer* out = SENTINEL(wm_importer);
    wm_importer_vtable v = c_fake_vtable("fake");
    CHECK_INVALID(wm_importer_create_custom(NULL, &fake, &out), "wm_importer_create_custom");
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, NULL), "wm_importer_create_custom");
    v.struct_size = 0;
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, &out), "wm_importer_create_custom");
    v.struct_size = sizeof v - 1;
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, &out), "wm_importer_create_custom");
    v = c_fake_vtable(NULL);
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, &out), "wm_importer_create_custom");
    CHECK_CONTAINS(wm_last_error(), "name");
    v = c_fake_vtable("fake");
    v.caps = NULL;
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, &out), "wm_importer_create_custom");
    CHECK_CONTAINS(wm_last_error(), "caps");
    v = c_fake_vtable("fake");
    v.import = NULL;
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, &out), "wm_importer_create_custom");
    CHECK_CONTAINS(wm_last_error(), "import");
    v = c_fake_vtable("fake");
    v.release = NULL;
    CHECK_INVALID(wm_importer_create_custom(&v, &fake, &out), "wm_importer_create_custom");
    CHECK_CONTAINS(wm_last_error(), "release");
    CHECK(out == SENTINEL(wm_importer));
    CHECK_EQ(fake.destroy_calls, 0); /* a refused vtable owns nothing */
    CHECK_EQ(fake.import_calls, 0);

    /* The optional entries may be NULL. */
    v = c_fake_vtable("fake-minimal");
    v.available = NULL;
    v.read_back = NULL;
    v.destroy = NULL;
    out = NULL;
    REQUIRE_OK(wm_importer_create_custom(&v, &fake, &out));
    REQUIRE(out != NULL);
    wm_importer_destroy(out);
    CHECK_EQ(fake.destroy_calls, 0);
}

typedef struct small_world {
    char path[512];
    wm_mapped_model* mapped;
    wm_importer* cpu;
    wm_importer* gpu; /* a fake */
    c_fake fake;
    wm_model* model;
    wm_plan* plan;
    wm_placement* placement;
} small_world;

/* One 1 MiB file, targets GPU (fake) and CPU, tensors 0 (GPU) and 1 (CPU), executed. */
static bool small_world_open(small_world* w) {
    memset(w, 0, sizeof *w);
    c_fake_init(&w->fake);
    wm_importer_vtable v = c_fake_vtable("fake");
    const char* paths[1] = {w->path};
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    wm_importer* importers[2];
    if (!c_temp_file(MiB, 7, w->path) ||
        wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &w->mapped) != WM_OK ||
        wm_importer_create_cpu(&w->cpu) != WM_OK ||
        wm_importer_create_custom(&v, &w->fake, &w->gpu) != WM_OK ||
        wm_model_create(&w->model) != WM_OK ||
        wm_model_add_file(w->model, w->path, MiB, NULL) != WM_OK ||
        wm_model_add_target(w->model, "GPU", w->gpu, NULL) != WM_OK ||
        wm_model_add_target(w->model, "CPU", w->cpu, NULL) != WM_OK ||
        wm_model_add_tensor(w->model, "gpu.weight", 0, 8192, 100000, 0, NULL) != WM_OK ||
        wm_model_add_tensor(w->model, "cpu.weight", 0, 300000, 200000, 1, NULL) != WM_OK ||
        wm_plan_create(w->model, &o, &w->plan) != WM_OK)
        goto fail;
    importers[0] = w->gpu;
    importers[1] = w->cpu;
    if (wm_execute(w->model, w->plan, wm_mapped_model_files(w->mapped), 1, importers, 2, NULL,
                   &w->placement) != WM_OK)
        goto fail;
    return true;
fail:
    fprintf(stderr, "small_world_open: %s\n", wm_last_error());
    return false;
}

static void small_world_close(small_world* w) {
    wm_placement_destroy(w->placement);
    wm_plan_destroy(w->plan);
    wm_model_destroy(w->model);
    wm_importer_destroy(w->gpu);
    wm_importer_destroy(w->cpu);
    wm_mapped_model_destroy(w->mapped);
}

static void case_importer_handle_errors(void) {
    small_world w;
    REQUIRE(small_world_open(&w));
    CHECK(wm_importer_name(NULL) == NULL);
    wm_importer_caps caps;
    FILL(caps, sizeof caps);
    CHECK_INVALID_OUT(wm_importer_get_caps(NULL, &caps), "wm_importer_get_caps", caps);
    CHECK_INVALID(wm_importer_get_caps(w.cpu, NULL), "wm_importer_get_caps");
    FILL(caps, 0);
    CHECK_INVALID_OUT(wm_importer_get_caps(w.cpu, &caps), "wm_importer_get_caps", caps);
    /* The first version ended before device_memory: one byte less than that is no version. */
    FILL(caps, offsetof(wm_importer_caps, device_memory) - 1);
    CHECK_INVALID_OUT(wm_importer_get_caps(w.cpu, &caps), "wm_importer_get_caps", caps);
    const char* reason = "untouched";
    CHECK(!wm_importer_available(NULL, &reason));
    CHECK(!wm_importer_available(NULL, NULL));

    /* read_back: NULL importer, buffer or destination; a range outside the buffer. */
    wm_placement_import imp = {.struct_size = sizeof imp};
    REQUIRE_EQ(wm_placement_import_count(w.placement), 2);
    REQUIRE_OK(wm_placement_get_import(w.placement, 1, &imp)); /* the CPU's */
    CHECK_EQ(imp.target, 1);
    unsigned char dst[64];
    memset(dst, 0xEE, sizeof dst);
    CHECK_INVALID(wm_importer_read_back(NULL, &imp.buffer, 0, 16, dst), "wm_importer_read_back");
    CHECK_INVALID(wm_importer_read_back(w.cpu, NULL, 0, 16, dst), "wm_importer_read_back");
    CHECK_INVALID(wm_importer_read_back(w.cpu, &imp.buffer, 0, 16, NULL), "wm_importer_read_back");
    CHECK_INVALID(wm_importer_read_back(w.cpu, &imp.buffer, imp.buffer.size - 8, 16, dst),
                  "wm_importer_read_back");
    CHECK_INVALID(wm_importer_read_back(w.cpu, &imp.buffer, imp.buffer.size + 1, 1, dst),
                  "wm_importer_read_back");
    CHECK_INVALID(wm_importer_read_back(w.cpu, &imp.buffer, UINT64_MAX - 3, 8, dst),
                  "wm_importer_read_back");
    CHECK_INVALID(wm_importer_read_back(w.cpu, &imp.buffer, 0, UINT64_MAX, dst),
                  "wm_importer_read_back");
    for (size_t i = 0; i < sizeof dst; ++i) CHECK_EQ(dst[i], 0xEE); /* nothing copied */
    /* the same through a custom importer's read_back (the check must not depend on it) */
    REQUIRE_OK(wm_placement_get_import(w.placement, 0, &imp));
    CHECK_INVALID(wm_importer_read_back(w.gpu, &imp.buffer, imp.buffer.size - 8, 16, dst),
                  "wm_importer_read_back");
    CHECK_OK(wm_importer_read_back(w.gpu, &imp.buffer, imp.buffer.size - 16, 16, dst));
    CHECK_PATTERN(dst, 16, 7, imp.extent_offset + imp.buffer.size - 16);
    small_world_close(&w);
}

/* --- model, plan -------------------------------------------------------------------------- */

static void case_model_errors(void) {
    wm_model* out = SENTINEL(wm_model);
    CHECK_INVALID(wm_model_create(NULL), "wm_model_create");
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    (void)out;

    uint32_t index = 0xDEADBEEF;
    CHECK_INVALID(wm_model_add_file(NULL, "f", 100, &index), "wm_model_add_file");
    CHECK_EQ(index, 0xDEADBEEF);
    REQUIRE_OK(wm_model_add_file(model, "f", MiB, NULL));

    CHECK_INVALID(wm_model_add_target(NULL, "CPU", cpu, &index), "wm_model_add_target");
    CHECK_INVALID(wm_model_add_target(model, "CPU", NULL, &index), "wm_model_add_target");
    CHECK_EQ(index, 0xDEADBEEF);
    wm_importer_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    caps.alignment = 1;
    CHECK_INVALID(wm_model_add_target_caps(NULL, "GPU", NULL, &caps, &index), "wm_model_add_target_caps");
    CHECK_INVALID(wm_model_add_target_caps(model, "GPU", NULL, NULL, &index), "wm_model_add_target_caps");
    caps.struct_size = 0;
    CHECK_INVALID(wm_model_add_target_caps(model, "GPU", NULL, &caps, &index), "wm_model_add_target_caps");
    caps.struct_size = (uint32_t)offsetof(wm_importer_caps, device_memory) - 1;
    CHECK_INVALID(wm_model_add_target_caps(model, "GPU", NULL, &caps, &index), "wm_model_add_target_caps");
    caps.struct_size = sizeof caps;
    caps.device_memory = (wm_device_memory)7;
    CHECK_INVALID(wm_model_add_target_caps(model, "GPU", NULL, &caps, &index), "wm_model_add_target_caps");
    caps.device_memory = WM_DEVICE_MEMORY_UNIFIED;
    CHECK_EQ(index, 0xDEADBEEF);
    caps.struct_size = sizeof caps;
    REQUIRE_OK(wm_model_add_target(model, "CPU", cpu, NULL));

    CHECK_INVALID(wm_model_add_tensor(NULL, "t", 0, 0, 1, 0, &index), "wm_model_add_tensor");
    CHECK_INVALID(wm_model_add_tensor(model, "t", 1, 0, 1, 0, &index), "wm_model_add_tensor");
    CHECK_CONTAINS(wm_last_error(), "file");
    CHECK_INVALID(wm_model_add_tensor(model, "t", 0, 0, 1, 1, &index), "wm_model_add_tensor");
    CHECK_CONTAINS(wm_last_error(), "target");
    CHECK_INVALID(wm_model_add_tensor(model, "t", WM_NO_INDEX, 0, 1, WM_NO_INDEX, &index), "wm_model_add_tensor");
    CHECK_EQ(index, 0xDEADBEEF);

    /* Failed additions added nothing. */
    CHECK_EQ(wm_model_file_count(model), 1);
    CHECK_EQ(wm_model_target_count(model), 1);
    CHECK_EQ(wm_model_tensor_count(model), 0);
    CHECK_EQ(wm_model_file_count(NULL), 0);
    CHECK_EQ(wm_model_target_count(NULL), 0);
    CHECK_EQ(wm_model_tensor_count(NULL), 0);

    /* An alignment that is not a power of two: refused when added or when planned. */
    caps.alignment = 3000;
    wm_status added = wm_model_add_target_caps(model, "GPU-bad", NULL, &caps, NULL);
    if (added == WM_OK) {
        REQUIRE_OK(wm_model_add_tensor(model, "t", 0, 0, 1, 1, NULL));
        wm_plan* plan = SENTINEL(wm_plan);
        CHECK_INVALID(wm_plan_create(model, NULL, &plan), "wm_plan_create");
        CHECK_CONTAINS(wm_last_error(), "3000");
        CHECK(plan == SENTINEL(wm_plan));
    } else {
        CHECK_STATUS(added, WM_ERROR_INVALID_ARGUMENT);
        CHECK_CONTAINS(wm_last_error(), "wm_model_add_target_caps");
    }
    wm_model_destroy(model);
    wm_model_destroy(NULL);
    wm_importer_destroy(cpu);
}

static wm_model* plan_model(uint64_t file_size, uint64_t offset, uint64_t size, const char* name) {
    wm_model* model = NULL;
    wm_importer_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    caps.alignment = 1;
    caps.device_memory = WM_DEVICE_MEMORY_UNIFIED;
    if (wm_model_create(&model) != WM_OK) return NULL;
    if (wm_model_add_file(model, "model.gguf", file_size, NULL) != WM_OK ||
        wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL) != WM_OK ||
        wm_model_add_tensor(model, "first", 0, 0, 4096, 0, NULL) != WM_OK ||
        wm_model_add_tensor(model, name, 0, offset, size, 0, NULL) != WM_OK) {
        wm_model_destroy(model);
        return NULL;
    }
    return model;
}

static void case_plan_create_errors(void) {
    wm_plan* plan = SENTINEL(wm_plan);
    wm_model* model = plan_model(MiB, 8192, 1000, "blk.7.ffn_down.weight");
    REQUIRE(model != NULL);
    wm_plan_options o;
    wm_plan_options_init(&o);
    CHECK_INVALID(wm_plan_create(NULL, &o, &plan), "wm_plan_create");
    CHECK_INVALID(wm_plan_create(model, &o, NULL), "wm_plan_create");
    o.struct_size = 0;
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    /* The first version ended before import_policy: one byte less is no version at all. */
    o.struct_size = (uint32_t)offsetof(wm_plan_options, import_policy) - 1;
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    wm_plan_options_init(&o);
    o.import_policy = (wm_import_policy)3;
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    CHECK_CONTAINS(wm_last_error(), "import_policy 3");
    o.import_policy = WM_IMPORT_POLICY_FROM_OPTIONS; /* only for a target */
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    wm_plan_options_init(&o);
    o.page_size = 3000;
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    CHECK_CONTAINS(wm_last_error(), "3000");
    wm_plan_options_init(&o);
    o.import_enabled = 2; /* -1, 0 or 1 */
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    CHECK(plan == SENTINEL(wm_plan));
    wm_model_destroy(model);

    /* Inconsistent descriptions name the tensor. */
    model = plan_model(MiB, MiB - 100, 101, "blk.7.ffn_down.weight"); /* one byte past the end */
    REQUIRE(model != NULL);
    CHECK_INVALID(wm_plan_create(model, NULL, &plan), "wm_plan_create");
    CHECK_CONTAINS(wm_last_error(), "blk.7.ffn_down.weight");
    CHECK(plan == SENTINEL(wm_plan));
    wm_model_destroy(model);
    model = plan_model(UINT64_MAX, UINT64_MAX - 10, 20, "wraps"); /* offset + size overflows */
    REQUIRE(model != NULL);
    CHECK_INVALID(wm_plan_create(model, NULL, &plan), "wm_plan_create");
    CHECK_CONTAINS(wm_last_error(), "wraps");
    CHECK(plan == SENTINEL(wm_plan));
    wm_model_destroy(model);
    model = plan_model(MiB, MiB - 100, 100, "ends.at.eof"); /* fine */
    REQUIRE(model != NULL);
    plan = NULL;
    CHECK_OK(wm_plan_create(model, NULL, &plan));
    wm_plan_destroy(plan);
    wm_plan_destroy(NULL);
    wm_model_destroy(model);
}

static void case_plan_getter_errors(void) {
    wm_model* model = plan_model(64 * MiB, 32 * MiB, 1000, "far"); /* fails the gate: 2 runs */
    REQUIRE(model != NULL);
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    wm_plan* plan = NULL;
    REQUIRE_OK(wm_plan_create(model, &o, &plan));
    o.mode = WM_PLAN_GATE; /* and a plan where that region falls back */
    wm_plan* fallback = NULL;
    REQUIRE_OK(wm_plan_create(model, &o, &fallback));
    const uint32_t tensors = wm_model_tensor_count(model);
    wm_model_destroy(model);

    wm_plan_totals totals;
    FILL(totals, sizeof totals);
    CHECK_INVALID_OUT(wm_plan_get_totals(NULL, &totals), "wm_plan_get_totals", totals);
    CHECK_INVALID(wm_plan_get_totals(plan, NULL), "wm_plan_get_totals");
    FILL(totals, 0);
    CHECK_INVALID_OUT(wm_plan_get_totals(plan, &totals), "wm_plan_get_totals", totals);
    FILL(totals, sizeof totals - 1);
    CHECK_INVALID_OUT(wm_plan_get_totals(plan, &totals), "wm_plan_get_totals", totals);

    CHECK_EQ(wm_plan_region_count(NULL), 0);
    const uint32_t regions = wm_plan_region_count(plan);
    REQUIRE_EQ(regions, 1);
    wm_plan_region region;
    FILL(region, sizeof region);
    CHECK_INVALID_OUT(wm_plan_get_region(NULL, 0, &region), "wm_plan_get_region", region);
    CHECK_INVALID_OUT(wm_plan_get_region(plan, regions, &region), "wm_plan_get_region", region);
    CHECK_INVALID_OUT(wm_plan_get_region(plan, WM_NO_INDEX, &region), "wm_plan_get_region", region);
    CHECK_INVALID(wm_plan_get_region(plan, 0, NULL), "wm_plan_get_region");
    FILL(region, 0);
    CHECK_INVALID_OUT(wm_plan_get_region(plan, 0, &region), "wm_plan_get_region", region);
    FILL(region, sizeof region - 1);
    CHECK_INVALID_OUT(wm_plan_get_region(plan, 0, &region), "wm_plan_get_region", region);

    wm_plan_region good = {.struct_size = sizeof good};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &good));
    REQUIRE_EQ(good.run_count, 2);
    wm_plan_run run;
    FILL(run, sizeof run);
    CHECK_INVALID_OUT(wm_plan_get_run(NULL, 0, 0, &run), "wm_plan_get_run", run);
    CHECK_INVALID_OUT(wm_plan_get_run(plan, regions, 0, &run), "wm_plan_get_run", run);
    CHECK_INVALID_OUT(wm_plan_get_run(plan, 0, good.run_count, &run), "wm_plan_get_run", run);
    CHECK_INVALID_OUT(wm_plan_get_run(plan, 0, WM_NO_INDEX, &run), "wm_plan_get_run", run);
    CHECK_INVALID(wm_plan_get_run(plan, 0, 0, NULL), "wm_plan_get_run");
    FILL(run, 0);
    CHECK_INVALID_OUT(wm_plan_get_run(plan, 0, 0, &run), "wm_plan_get_run", run);
    FILL(run, sizeof run - 1);
    CHECK_INVALID_OUT(wm_plan_get_run(plan, 0, 0, &run), "wm_plan_get_run", run);
    FILL(run, sizeof run);
    CHECK_INVALID_OUT(wm_plan_get_run(fallback, 0, 0, &run), "wm_plan_get_run", run); /* run_count 0 */

    wm_tensor_placement tp;
    FILL(tp, sizeof tp);
    CHECK_INVALID_OUT(wm_plan_get_tensor(NULL, 0, &tp), "wm_plan_get_tensor", tp);
    CHECK_INVALID_OUT(wm_plan_get_tensor(plan, tensors, &tp), "wm_plan_get_tensor", tp);
    CHECK_INVALID_OUT(wm_plan_get_tensor(plan, WM_NO_INDEX, &tp), "wm_plan_get_tensor", tp);
    CHECK_INVALID(wm_plan_get_tensor(plan, 0, NULL), "wm_plan_get_tensor");
    FILL(tp, 0);
    CHECK_INVALID_OUT(wm_plan_get_tensor(plan, 0, &tp), "wm_plan_get_tensor", tp);
    FILL(tp, sizeof tp - 1);
    CHECK_INVALID_OUT(wm_plan_get_tensor(plan, 0, &tp), "wm_plan_get_tensor", tp);
    /* the index in the message */
    FILL(tp, sizeof tp);
    CHECK_INVALID(wm_plan_get_tensor(plan, 1234567, &tp), "wm_plan_get_tensor");
    CHECK_CONTAINS(wm_last_error(), "1234567");
    wm_plan_destroy(plan);
    wm_plan_destroy(fallback);
}

/* --- execute, placement ------------------------------------------------------------------------ */

static void case_execute_wrong_calls_import_nothing(void) {
    small_world w;
    REQUIRE(small_world_open(&w));
    wm_placement_destroy(w.placement);
    w.placement = NULL;
    const int calls_before = w.fake.import_calls;
    CHECK_EQ(c_fake_live(&w.fake), 0);
    const wm_mapped_file* files = wm_mapped_model_files(w.mapped);
    wm_mapped_file two[2] = {files[0], files[0]};
    wm_mapped_file unmapped[1] = {{NULL, files[0].length}};
    wm_importer* importers[3] = {w.gpu, w.cpu, w.cpu};
    wm_execute_options o;
    wm_execute_options_init(&o);
    wm_placement* out = SENTINEL(wm_placement);

    CHECK_INVALID(wm_execute(NULL, w.plan, files, 1, importers, 2, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, NULL, files, 1, importers, 2, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, importers, 2, &o, NULL), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, NULL, 1, importers, 2, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 0, importers, 2, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, two, 2, importers, 2, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, NULL, 2, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, importers, 1, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, importers, 3, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, importers, 0, &o, &out), "wm_execute");
    CHECK_INVALID(wm_execute(w.model, w.plan, unmapped, 1, importers, 2, &o, &out), "wm_execute");
    o.struct_size = 0;
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, importers, 2, &o, &out), "wm_execute");
    o.struct_size = sizeof o - 1;
    CHECK_INVALID(wm_execute(w.model, w.plan, files, 1, importers, 2, &o, &out), "wm_execute");
    wm_execute_options_init(&o);

    /* A plan of another model: more tensors ... */
    wm_model* bigger = NULL;
    REQUIRE_OK(wm_model_create(&bigger));
    REQUIRE_OK(wm_model_add_file(bigger, w.path, MiB, NULL));
    REQUIRE_OK(wm_model_add_target(bigger, "GPU", w.gpu, NULL));
    REQUIRE_OK(wm_model_add_target(bigger, "CPU", w.cpu, NULL));
    for (uint32_t i = 0; i < 3; ++i) REQUIRE_OK(wm_model_add_tensor(bigger, "t", 0, i * 4096, 4096, i % 2, NULL));
    CHECK_INVALID(wm_execute(bigger, w.plan, files, 1, importers, 2, &o, &out), "wm_execute");
    wm_model_destroy(bigger);

    CHECK(out == SENTINEL(wm_placement));
    CHECK_EQ(w.fake.import_calls, calls_before); /* a wrong call imports nothing */
    CHECK_EQ(c_fake_live(&w.fake), 0);
    small_world_close(&w);
}

/* A plan of another model with as many tensors but more targets than the model given: the
 * plan's regions name target 1, which neither the model nor the importer array has. */
static void case_execute_plan_of_a_model_with_fewer_targets(void) {
    small_world w;
    REQUIRE(small_world_open(&w));
    wm_placement_destroy(w.placement);
    w.placement = NULL;
    const int calls_before = w.fake.import_calls;
    const wm_mapped_file* files = wm_mapped_model_files(w.mapped);
    wm_placement* out = SENTINEL(wm_placement);
    wm_model* fewer = NULL;
    REQUIRE_OK(wm_model_create(&fewer));
    REQUIRE_OK(wm_model_add_file(fewer, w.path, MiB, NULL));
    REQUIRE_OK(wm_model_add_target(fewer, "GPU", w.gpu, NULL));
    REQUIRE_OK(wm_model_add_tensor(fewer, "a", 0, 8192, 100000, 0, NULL));
    REQUIRE_OK(wm_model_add_tensor(fewer, "b", 0, 300000, 200000, 0, NULL));
    wm_importer* only_gpu[1] = {w.gpu};
    CHECK_INVALID(wm_execute(fewer, w.plan, files, 1, only_gpu, 1, NULL, &out), "wm_execute");
    wm_model_destroy(fewer);
    CHECK(out == SENTINEL(wm_placement));
    CHECK_EQ(w.fake.import_calls, calls_before);
    small_world_close(&w);
}

static void case_placement_errors(void) {
    small_world w;
    REQUIRE(small_world_open(&w));
    wm_tensor_location loc;
    FILL(loc, sizeof loc);
    CHECK_INVALID_OUT(wm_placement_locate(NULL, 0, &loc), "wm_placement_locate", loc);
    CHECK_INVALID_OUT(wm_placement_locate(w.placement, 2, &loc), "wm_placement_locate", loc);
    CHECK_INVALID_OUT(wm_placement_locate(w.placement, WM_NO_INDEX, &loc), "wm_placement_locate", loc);
    CHECK_INVALID(wm_placement_locate(w.placement, 0, NULL), "wm_placement_locate");
    FILL(loc, 0);
    CHECK_INVALID_OUT(wm_placement_locate(w.placement, 0, &loc), "wm_placement_locate", loc);
    FILL(loc, sizeof loc - 1);
    CHECK_INVALID_OUT(wm_placement_locate(w.placement, 0, &loc), "wm_placement_locate", loc);

    wm_placement_import imp;
    FILL(imp, sizeof imp);
    const uint32_t count = wm_placement_import_count(w.placement);
    REQUIRE_EQ(count, 2);
    CHECK_INVALID_OUT(wm_placement_get_import(NULL, 0, &imp), "wm_placement_get_import", imp);
    CHECK_INVALID_OUT(wm_placement_get_import(w.placement, count, &imp), "wm_placement_get_import", imp);
    CHECK_INVALID(wm_placement_get_import(w.placement, 0, NULL), "wm_placement_get_import");
    FILL(imp, 0);
    CHECK_INVALID_OUT(wm_placement_get_import(w.placement, 0, &imp), "wm_placement_get_import", imp);
    FILL(imp, sizeof imp - 1);
    CHECK_INVALID_OUT(wm_placement_get_import(w.placement, 0, &imp), "wm_placement_get_import", imp);

    CHECK_EQ(wm_placement_import_count(NULL), 0);
    CHECK(wm_placement_plan(NULL) == NULL);
    wm_placement_release_all(NULL);
    wm_placement_destroy(NULL);

    wm_placement_release_all(w.placement);
    FILL(imp, sizeof imp);
    CHECK_INVALID_OUT(wm_placement_get_import(w.placement, 0, &imp), "wm_placement_get_import", imp);
    CHECK_EQ(w.fake.release_calls, 1);
    small_world_close(&w);
    CHECK_EQ(w.fake.release_calls, 1);
}

/* --- mapping, memstat, split sync --------------------------------------------------------------- */

static bool mapped_in_this_process(const char* path) {
    FILE* maps = fopen("/proc/self/maps", "r");
    if (maps == NULL) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, maps) != NULL) found = strstr(line, path) != NULL;
    fclose(maps);
    return found;
}

static void case_mapping_errors(void) {
    char path[512], empty[512], missing[600];
    REQUIRE(c_temp_file(64 * KiB, 3, path));
    REQUIRE(c_temp_file(0, 3, empty));
    snprintf(missing, sizeof missing, "%s.does-not-exist", path);
    const char* good[1] = {path};
    const char* null_path[1] = {NULL};
    wm_mapped_model* out = SENTINEL(wm_mapped_model);
    wm_mapping_options mo;
    wm_mapping_options_init(&mo);
    CHECK_EQ(mo.struct_size, sizeof mo);

    CHECK_OPEN_INVALID(NULL, 1, WM_MAPPING_READ_ONLY, NULL);
    CHECK_OPEN_INVALID(null_path, 1, WM_MAPPING_READ_ONLY, NULL);
    CHECK_INVALID(wm_mapped_model_open(good, 1, WM_MAPPING_READ_ONLY, NULL, NULL), "wm_mapped_model_open");
    mo.struct_size = 0;
    CHECK_OPEN_INVALID(good, 1, WM_MAPPING_READ_ONLY, &mo);
    mo.struct_size = sizeof mo - 1;
    CHECK_OPEN_INVALID(good, 1, WM_MAPPING_READ_ONLY, &mo);
    wm_mapping_options_init(&mo);
    mo.base_alignment = 3 * 4096; /* not a power of two */
    CHECK_OPEN_INVALID(good, 1, WM_MAPPING_READ_ONLY, &mo);
    CHECK(out == SENTINEL(wm_mapped_model));

    /* System errors name the file; a failure of file k leaves files 0..k-1 unmapped. */
    const char* with_missing[2] = {path, missing};
    CHECK_STATUS(wm_mapped_model_open(with_missing, 2, WM_MAPPING_READ_ONLY, NULL, &out), WM_ERROR_IO);
    CHECK_CONTAINS(wm_last_error(), missing);
    CHECK_CONTAINS(wm_last_error(), "open");
    CHECK(out == SENTINEL(wm_mapped_model));
    CHECK(!mapped_in_this_process(path));
    const char* with_empty[2] = {path, empty};
    const wm_status e = wm_mapped_model_open(with_empty, 2, WM_MAPPING_READ_ONLY, NULL, &out);
    CHECK(e == WM_ERROR_IO || e == WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), empty);
    CHECK(!mapped_in_this_process(path));
    const char* dir[1] = {"/"};
    const wm_status d = wm_mapped_model_open(dir, 1, WM_MAPPING_READ_ONLY, NULL, &out);
    CHECK(d == WM_ERROR_IO || d == WM_ERROR_INVALID_ARGUMENT);
    CHECK(out == SENTINEL(wm_mapped_model));

    CHECK_EQ(wm_mapped_model_file_count(NULL), 0);
    CHECK(wm_mapped_model_files(NULL) == NULL);
    CHECK_EQ(wm_mapped_model_file_size(NULL, 0), 0);
    CHECK_INVALID(wm_mapped_model_make_read_only(NULL), "wm_mapped_model_make_read_only");
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(good, 1, WM_MAPPING_READ_ONLY, NULL, &mapped));
    CHECK(mapped_in_this_process(path));
    CHECK_EQ(wm_mapped_model_file_size(mapped, 0), 64 * KiB);
    CHECK_EQ(wm_mapped_model_file_size(mapped, 1), 0);
    CHECK_EQ(wm_mapped_model_file_size(mapped, WM_NO_INDEX), 0);
    wm_mapped_model_destroy(mapped);
    CHECK(!mapped_in_this_process(path));
    wm_mapped_model_destroy(NULL);

    /* The decision. */
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    wm_importer* importers[1] = {cpu};
    wm_mapping_decision* decision = SENTINEL(wm_mapping_decision);
    CHECK_INVALID(wm_decide_mapping(NULL, 1, importers, 1, &decision), "wm_decide_mapping");
    CHECK_INVALID(wm_decide_mapping(null_path, 1, importers, 1, &decision), "wm_decide_mapping");
    CHECK_INVALID(wm_decide_mapping(good, 1, NULL, 1, &decision), "wm_decide_mapping");
    CHECK_INVALID(wm_decide_mapping(good, 1, importers, 1, NULL), "wm_decide_mapping");
    CHECK(decision == SENTINEL(wm_mapping_decision));
    wm_mapping_decision_destroy(NULL);
    (void)wm_mapping_decision_access(NULL); /* must not crash */
    (void)wm_mapping_decision_reason(NULL);
    (void)wm_mapping_decision_unwritable_path(NULL);
    wm_importer_destroy(cpu);
}

/* --- values outside an enum ------------------------------------------------------------------
 * Each in its own case: C may pass any value of the enum's integer type, and the library must
 * refuse it (reading it as a C++ enum first is undefined behaviour, which UBSan reports). */

static void case_bad_plan_mode(void) {
    wm_model* model = plan_model(MiB, 8192, 1000, "t");
    REQUIRE(model != NULL);
    wm_plan* plan = SENTINEL(wm_plan);
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.mode = (wm_plan_mode)3;
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    o.mode = (wm_plan_mode)-1;
    CHECK_INVALID(wm_plan_create(model, &o, &plan), "wm_plan_create");
    CHECK(plan == SENTINEL(wm_plan));
    wm_model_destroy(model);
}

static void case_bad_mapping_access(void) {
    char path[512];
    REQUIRE(c_temp_file(64 * KiB, 3, path));
    const char* good[1] = {path};
    CHECK_OPEN_INVALID(good, 1, (wm_mapping_access)2, NULL);
    CHECK_OPEN_INVALID(good, 1, (wm_mapping_access)-1, NULL);
}

static void case_bad_access_hint(void) {
    char path[512];
    REQUIRE(c_temp_file(64 * KiB, 3, path));
    const char* good[1] = {path};
    wm_mapping_options mo;
    wm_mapping_options_init(&mo);
    mo.hint = (wm_access_hint)3;
    CHECK_OPEN_INVALID(good, 1, WM_MAPPING_READ_ONLY, &mo);
    mo.hint = (wm_access_hint)9;
    CHECK_OPEN_INVALID(good, 1, WM_MAPPING_READ_ONLY, &mo);
}

/* weightmap.h: base_alignment is "a power of two >= the page size; 0: the page size". */
static void case_base_alignment_below_the_page_size_means_the_page(void) {
    /* Documented: a power of two below the page size (like 0) means the page size. */
    char path[512];
    REQUIRE(c_temp_file(64 * KiB, 3, path));
    const char* good[1] = {path};
    wm_mapping_options mo;
    wm_mapping_options_init(&mo);
    mo.base_alignment = c_page_size() / 2;
    wm_mapped_model* mapped = NULL;
    REQUIRE(wm_mapped_model_open(good, 1, WM_MAPPING_READ_ONLY, &mo, &mapped) == WM_OK);
    REQUIRE(wm_mapped_model_file_count(mapped) == 1);
    CHECK((uintptr_t)wm_mapped_model_files(mapped)[0].base % c_page_size() == 0);
    wm_mapped_model_destroy(mapped);
}

static void case_memstat_errors(void) {
    CHECK_INVALID(wm_memstat_read(NULL), "wm_memstat_read");
    wm_memstat m;
    FILL(m, 0);
    CHECK_INVALID_OUT(wm_memstat_read(&m), "wm_memstat_read", m);
    FILL(m, sizeof m - 1);
    CHECK_INVALID_OUT(wm_memstat_read(&m), "wm_memstat_read", m);
}

static void case_split_sync_errors(void) {
    wm_split_sync* out = SENTINEL(wm_split_sync);
    wm_split_sync_params p;
    wm_split_sync_params_init(&p);
    CHECK_EQ(p.struct_size, sizeof p);
    CHECK_INVALID(wm_split_sync_create(NULL, &out), "wm_split_sync_create");
    p.n_backends = 2;
    CHECK_INVALID(wm_split_sync_create(&p, NULL), "wm_split_sync_create");
    p.n_backends = 0;
    CHECK_INVALID(wm_split_sync_create(&p, &out), "wm_split_sync_create");
    CHECK_CONTAINS(wm_last_error(), "n_backends");
    p.n_backends = 65;
    CHECK_INVALID(wm_split_sync_create(&p, &out), "wm_split_sync_create");
    CHECK_CONTAINS(wm_last_error(), "65");
    p.n_backends = 2;
    p.struct_size = 0;
    CHECK_INVALID(wm_split_sync_create(&p, &out), "wm_split_sync_create");
    p.struct_size = sizeof p - 1;
    CHECK_INVALID(wm_split_sync_create(&p, &out), "wm_split_sync_create");
    CHECK(out == SENTINEL(wm_split_sync));

    wm_split_sync_params_init(&p);
    p.n_backends = 2;
    wm_split_sync* sync = NULL;
    REQUIRE_OK(wm_split_sync_create(&p, &sync));
    wm_split_desc d;
    wm_split_desc_init(&d);
    wm_split_sync_decision dec;
    FILL(dec, sizeof dec);
    CHECK_INVALID_OUT(wm_split_sync_next(NULL, &d, &dec), "wm_split_sync_next", dec);
    CHECK_INVALID_OUT(wm_split_sync_next(sync, NULL, &dec), "wm_split_sync_next", dec);
    CHECK_INVALID(wm_split_sync_next(sync, &d, NULL), "wm_split_sync_next");
    d.struct_size = 0;
    CHECK_INVALID_OUT(wm_split_sync_next(sync, &d, &dec), "wm_split_sync_next", dec);
    d.struct_size = sizeof d - 1;
    CHECK_INVALID_OUT(wm_split_sync_next(sync, &d, &dec), "wm_split_sync_next", dec);
    wm_split_desc_init(&d);
    d.backend = 2;
    CHECK_INVALID_OUT(wm_split_sync_next(sync, &d, &dec), "wm_split_sync_next", dec);
    CHECK_CONTAINS(wm_last_error(), "backend");
    wm_split_desc_init(&d);
    FILL(dec, 0);
    CHECK_INVALID_OUT(wm_split_sync_next(sync, &d, &dec), "wm_split_sync_next", dec);
    FILL(dec, sizeof dec - 1);
    CHECK_INVALID_OUT(wm_split_sync_next(sync, &d, &dec), "wm_split_sync_next", dec);
    CHECK_EQ(wm_split_sync_finish(NULL), 0);
    wm_split_sync_reset(NULL);
    wm_split_sync_destroy(NULL);
    wm_split_sync_destroy(sync);
}

int main(void) {
    C_RUN(case_status_names);
    C_RUN(case_version_matches_the_headers);
    C_RUN(case_last_error_is_thread_local_and_kept_until_the_next_failure);
    C_RUN(case_registry_entries_and_bad_indices);
    C_RUN(case_importer_creation_errors);
    C_RUN(case_custom_importer_vtable_errors);
    C_RUN(case_importer_handle_errors);
    C_RUN(case_model_errors);
    C_RUN(case_plan_create_errors);
    C_RUN(case_plan_getter_errors);
    C_RUN(case_execute_wrong_calls_import_nothing);
    C_RUN(case_execute_plan_of_a_model_with_fewer_targets);
    C_RUN(case_placement_errors);
    C_RUN(case_mapping_errors);
    C_RUN(case_bad_plan_mode);
    C_RUN(case_bad_mapping_access);
    C_RUN(case_bad_access_hint);
    C_RUN(case_base_alignment_below_the_page_size_means_the_page);
    C_RUN(case_memstat_errors);
    C_RUN(case_split_sync_errors);
    return c_check_finish();
}
