/* SPDX-License-Identifier: MIT */
/* The HSA importer through the C API (backends/hsa.h), on the fake runtime (tests/hsa), which the
 * program also reaches with dlsym: its params and their errors; wm_hsa_gpu_agent_count; a
 * runtime that accepts read-only locks imports a read-only mapping in place; one that refuses
 * them says "refused a read-only lock", and the same plan then imports from the writable shared
 * mapping wm_map_file_writable_shared makes, whose rules refuse a 0444 file. Each case runs in
 * its own child process, so the fake starts fresh and its unload-time leak check judges it. */
#include "c_check.h"

#include "c_fake_library.h" /* after c_check.h, which sets _POSIX_C_SOURCE */
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weightmap/backends/hsa.h" /* wm_hsa_*: not in the core weightmap.h */

#ifndef WEIGHTMAP_FAKE_HSA_PATH
#error "tests/c_api/meson.build passes the fake runtime's path"
#endif

#define MiB (UINT64_C(1024) * 1024)

static const uint8_t SEED = 0x5D;
enum { TENSORS = 3, T_GPU = 0, T_CPU = 1 };
static const uint64_t t_offset[TENSORS] = {4096, 2 * MiB, 3 * MiB + 8192};
static const uint64_t t_size[TENSORS] = {MiB, MiB, 700000};
static const uint32_t t_target[TENSORS] = {T_GPU, T_CPU, T_GPU};
static const uint64_t FILE_SIZE = 4 * MiB + 33;

/* The fake's own controls, looked up in the instance the importer loads. */
static void* fake_symbol(const char* name) { return c_fake_symbol(WEIGHTMAP_FAKE_HSA_PATH, name); }
static long fake_live_locks(void) {
    long (*fn)(void) = NULL;
    *(void**)&fn = fake_symbol("fake_hsa_live_locks");
    return fn != NULL ? fn() : -1;
}
static bool fake_set_int(const char* name, int value) {
    void (*fn)(int) = NULL;
    *(void**)&fn = fake_symbol(name);
    if (fn != NULL) fn(value);
    return fn != NULL;
}
static uint64_t fake_agent_handle(int index) {
    uint64_t (*fn)(int) = NULL;
    *(void**)&fn = fake_symbol("fake_hsa_agent_handle");
    return fn != NULL ? fn(index) : 0;
}

static wm_importer* hsa_on_fake(void) {
    wm_hsa_importer_params p;
    wm_hsa_importer_params_init(&p);
    p.library_path = WEIGHTMAP_FAKE_HSA_PATH;
    wm_importer* hsa = NULL;
    CHECK_OK(wm_importer_create_hsa(&p, &hsa));
    return hsa;
}

static void case_params_defaults_and_errors(void) {
    wm_hsa_importer_params p;
    memset(&p, 0x5A, sizeof p);
    wm_hsa_importer_params_init(&p);
    CHECK_EQ(p.struct_size, sizeof p);
    CHECK(p.library_path == NULL);
    CHECK(p.agents == NULL);
    CHECK_EQ(p.agent_count, 0);
    CHECK_EQ(p.lock_budget_bytes, 0);
    CHECK(p.device_memory == WM_DEVICE_MEMORY_UNKNOWN);

    wm_importer* hsa = NULL;
    CHECK_INVALID(wm_importer_create_hsa(&p, NULL), "wm_importer_create_hsa");
    p.struct_size = 3;
    CHECK_INVALID(wm_importer_create_hsa(&p, &hsa), "wm_importer_create_hsa");
    CHECK_CONTAINS(wm_last_error(), "params->struct_size is 3");
    wm_hsa_importer_params_init(&p);
    p.library_path = WEIGHTMAP_FAKE_HSA_PATH;
    p.agent_count = 2;
    CHECK_INVALID(wm_importer_create_hsa(&p, &hsa), "wm_importer_create_hsa");
    CHECK_CONTAINS(wm_last_error(), "agents is NULL but agent_count is 2");
    const uint64_t unknown[1] = {0x7777};
    p.agents = unknown;
    p.agent_count = 1;
    CHECK_STATUS(wm_importer_create_hsa(&p, &hsa), WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "is not an agent of the HSA runtime");
    CHECK(hsa == NULL);

    /* No runtime is a reason, not an error. */
    wm_hsa_importer_params_init(&p);
    p.library_path = "/nonexistent/libhsa-runtime64.so.1";
    REQUIRE_OK(wm_importer_create_hsa(&p, &hsa));
    const char* reason = NULL;
    CHECK(!wm_importer_available(hsa, &reason));
    CHECK_CONTAINS(reason, "libhsa-runtime64.so.1");
    uint32_t count = 99;
    CHECK_STATUS(wm_hsa_gpu_agent_count(hsa, &count), WM_ERROR_UNSUPPORTED);
    CHECK_EQ(count, 99);
    wm_importer_destroy(hsa);
}

static void case_gpu_agent_count(void) {
    REQUIRE(fake_set_int("fake_hsa_set_gpu_agent_count", 3));
    wm_importer* all = hsa_on_fake();
    REQUIRE(all != NULL);
    uint32_t count = 0;
    CHECK_OK(wm_hsa_gpu_agent_count(all, &count));
    CHECK_EQ(count, 3);
    CHECK_INVALID(wm_hsa_gpu_agent_count(all, NULL), "wm_hsa_gpu_agent_count");

    wm_hsa_importer_params p;
    wm_hsa_importer_params_init(&p);
    p.library_path = WEIGHTMAP_FAKE_HSA_PATH;
    const uint64_t second[1] = {fake_agent_handle(2)};
    p.agents = second;
    p.agent_count = 1;
    wm_importer* one = NULL;
    REQUIRE_OK(wm_importer_create_hsa(&p, &one));
    CHECK_OK(wm_hsa_gpu_agent_count(one, &count));
    CHECK_EQ(count, 1);

    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    CHECK_INVALID(wm_hsa_gpu_agent_count(cpu, &count), "wm_hsa_gpu_agent_count");
    CHECK_CONTAINS(wm_last_error(), "was not made by make_hsa_importer");
    wm_importer_destroy(cpu);
    wm_importer_destroy(one);
    wm_importer_destroy(all);
}

/* The model over `files` (one file at `path`), planned and executed. */
typedef struct Loaded {
    wm_importer* cpu;
    wm_model* model;
    wm_placement* placement;
} Loaded;

static bool execute(Loaded* l, const char* path, wm_importer* hsa, const wm_mapped_file* files) {
    memset(l, 0, sizeof *l);
    wm_plan* plan = NULL;
    bool ok = wm_importer_create_cpu(&l->cpu) == WM_OK && wm_model_create(&l->model) == WM_OK &&
              wm_model_add_file(l->model, path, FILE_SIZE, NULL) == WM_OK &&
              wm_model_add_target(l->model, "ROCm0", hsa, NULL) == WM_OK &&
              wm_model_add_target(l->model, "CPU", l->cpu, NULL) == WM_OK;
    for (uint32_t i = 0; ok && i < TENSORS; ++i)
        ok = wm_model_add_tensor(l->model, "t", 0, t_offset[i], t_size[i], t_target[i], NULL) ==
             WM_OK;
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.import_enabled = 1;
    wm_importer* importers[2] = {hsa, l->cpu};
    ok = ok && wm_plan_create(l->model, &o, &plan) == WM_OK &&
         wm_execute(l->model, plan, files, 1, importers, 2, NULL, &l->placement) == WM_OK;
    wm_plan_destroy(plan);
    return ok;
}

static void release(Loaded* l) {
    wm_placement_destroy(l->placement);
    wm_model_destroy(l->model);
    wm_importer_destroy(l->cpu);
}

/* Tensor `t` is imported and reads back as the file's bytes (or falls back with `reason`). */
static void check_gpu_tensors(Loaded* l, wm_importer* hsa, bool imported, const char* reason) {
    for (uint32_t t = 0; t < TENSORS; t += 2) {
        wm_tensor_location loc = {.struct_size = sizeof loc};
        REQUIRE_OK(wm_placement_locate(l->placement, t, &loc));
        CHECK(loc.imported == imported);
        if (!imported) {
            CHECK_CONTAINS(loc.reason, reason);
            continue;
        }
        wm_placement_import imp = {.struct_size = sizeof imp};
        REQUIRE_OK(wm_placement_get_import(l->placement, loc.import_index, &imp));
        unsigned char* back = (unsigned char*)malloc((size_t)t_size[t]);
        REQUIRE(back != NULL);
        CHECK_OK(wm_importer_read_back(hsa, &imp.buffer, loc.offset_in_buffer, t_size[t], back));
        CHECK_PATTERN(back, t_size[t], SEED, t_offset[t]);
        free(back);
    }
}

static void case_accepting_runtime_imports_read_only(void) {
    char path[512];
    REQUIRE(c_temp_file(FILE_SIZE, SEED, path));
    wm_importer* hsa = hsa_on_fake();
    REQUIRE(hsa != NULL);
    wm_importer_caps caps = {.struct_size = sizeof caps};
    REQUIRE_OK(wm_importer_get_caps(hsa, &caps));
    CHECK(!caps.needs_writable_mapping); /* read-only first */
    const char* paths[1] = {path};
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &mapped));
    Loaded l;
    REQUIRE(execute(&l, path, hsa, wm_mapped_model_files(mapped)));
    check_gpu_tensors(&l, hsa, true, "");
    CHECK_EQ(fake_live_locks(), 2);
    release(&l);
    CHECK_EQ(fake_live_locks(), 0);
    wm_mapped_model_destroy(mapped);
    wm_importer_destroy(hsa);
}

static void case_refusing_runtime_then_writable_shared(void) {
    REQUIRE(fake_set_int("fake_hsa_set_refuse_read_only", 1));
    char path[512];
    REQUIRE(c_temp_file(FILE_SIZE, SEED, path));
    REQUIRE(chmod(path, 0600) == 0);
    wm_importer* hsa = hsa_on_fake();
    REQUIRE(hsa != NULL);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    wm_mapped_file ro = {NULL, 0};
    ro.length = c_align_up(FILE_SIZE, c_page_size());
    ro.base = mmap(NULL, (size_t)ro.length, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(ro.base != MAP_FAILED);
    Loaded l;
    REQUIRE(execute(&l, path, hsa, &ro));
    check_gpu_tensors(&l, hsa, false, "refused a read-only lock");
    release(&l);

    wm_mapped_file rw = {NULL, 0};
    CHECK_INVALID(wm_map_file_writable_shared(fd, 0, NULL), "wm_map_file_writable_shared");
    REQUIRE_OK(wm_map_file_writable_shared(fd, 0, &rw));
    CHECK_EQ(rw.length, ro.length);
    REQUIRE(execute(&l, path, hsa, &rw));
    check_gpu_tensors(&l, hsa, true, "");
    CHECK_EQ(fake_live_locks(), 2);
    release(&l);
    CHECK_EQ(fake_live_locks(), 0);
    munmap(rw.base, (size_t)rw.length); /* the caller's to unmap */
    munmap(ro.base, (size_t)ro.length);

    /* The owner made it read-only: refused for root too, and *out says nothing was mapped. */
    REQUIRE(chmod(path, 0444) == 0);
    memset(&rw, 0x5A, sizeof rw);
    CHECK_INVALID(wm_map_file_writable_shared(fd, 0, &rw), "wm_map_file_writable_shared");
    CHECK_CONTAINS(wm_last_error(), "owner-write");
    CHECK_CONTAINS(wm_last_error(), path);
    CHECK(rw.base == NULL);
    CHECK_EQ(rw.length, 0);
    close(fd);
    wm_importer_destroy(hsa);
}

int main(void) {
    /* The fake keeps its state in a static it never frees (its leak report runs after the exit
     * handlers): loaded here for the whole test, an importer's dlclose never unmaps it with the
     * state still allocated (LeakSanitizer's report in the asan stage). */
    if (dlopen(WEIGHTMAP_FAKE_HSA_PATH, RTLD_NOW | RTLD_LOCAL) == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", WEIGHTMAP_FAKE_HSA_PATH, dlerror());
        return 1;
    }
    C_RUN(case_params_defaults_and_errors);
    C_RUN(case_gpu_agent_count);
    C_RUN(case_accepting_runtime_imports_read_only);
    C_RUN(case_refusing_runtime_then_writable_shared);
    return c_check_finish();
}
