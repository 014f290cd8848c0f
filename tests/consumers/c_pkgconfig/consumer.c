/* SPDX-License-Identifier: MIT */
/* A C99 engine using libweightmap through weightmap.h (and backends/cuda.h), built from an
 * installed prefix with `pkg-config --cflags --libs weightmap`. Plans a small model, checks the
 * totals against its own arithmetic, executes the plan with CPU importers over an anonymous
 * mapping and checks where every tensor landed. Exits 1 on any failed check. The same model as
 * ../cpp/consumer.cpp. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, sysconf under -std=c99 */

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <weightmap/backends/cuda.h> /* a backend's own C entries: installed beside the core */
#include <weightmap/weightmap.h>

#define DEV 0u /* a device-like target, served by a CPU importer */
#define CPU 1u
#define TENSORS 5u

static int failures = 0;

static void check(int ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s (last error: %s)\n", what, wm_last_error());
        ++failures;
    }
}

typedef struct tensor {
    const char* name;
    uint64_t offset;
    uint64_t size;
    uint32_t target;
} tensor;

/* Five tensors in one 16-page file: three on the device in one tight cluster, two on the CPU. */
static void layout(uint64_t page, tensor* t) {
    const tensor list[TENSORS] = {
        {"blk.0.attn_q.weight", 0, page * 3 / 4, DEV},
        {"blk.0.attn_k.weight", page, page + 100, DEV},
        {"blk.0.ffn_up_exps.weight", 3 * page, page / 2, CPU},
        {"blk.1.attn_q.weight", 8 * page, 2 * page, DEV},
        {"blk.1.ffn_up_exps.weight", 12 * page + 64, 1000, CPU},
    };
    memcpy(t, list, sizeof list);
}

/* What the planner must report: the device tensors form one run from page 0 to the end of the
 * last one, rounded up to a page (the gaps are far below the 1 MiB merge gap). */
static wm_plan_totals expected_totals(const tensor* t, uint64_t page, int import) {
    wm_plan_totals want;
    uint64_t end = 0;
    uint32_t i;
    memset(&want, 0, sizeof want);
    for (i = 0; i < TENSORS; ++i) {
        if (t[i].target != DEV) continue;
        want.device_bytes += t[i].size;
        if (t[i].offset + t[i].size > end) end = t[i].offset + t[i].size;
    }
    if (!import) {
        want.fallback_bytes = want.device_bytes;
        return want;
    }
    want.imported_bytes = want.device_bytes;
    want.pinned_bytes = (end + page - 1) / page * page;
    want.imports = 1;
    return want;
}

static void check_totals(const wm_plan* plan, const wm_plan_totals* want, const char* which) {
    wm_plan_totals got;
    memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    check(wm_plan_get_totals(plan, &got) == WM_OK, "wm_plan_get_totals");
    printf("%s: device %llu imported %llu pinned %llu fallback %llu imports %llu\n", which,
           (unsigned long long)got.device_bytes, (unsigned long long)got.imported_bytes,
           (unsigned long long)got.pinned_bytes, (unsigned long long)got.fallback_bytes,
           (unsigned long long)got.imports);
    check(got.device_bytes == want->device_bytes, "device_bytes");
    check(got.imported_bytes == want->imported_bytes, "imported_bytes");
    check(got.pinned_bytes == want->pinned_bytes, "pinned_bytes");
    check(got.fallback_bytes == want->fallback_bytes, "fallback_bytes");
    check(got.imports == want->imports, "imports");
}

/* The model: file 0, target DEV (a non-CPU target described by caps, page-aligned), target CPU
 * (the CPU importer's own caps), then the tensors. */
static wm_model* make_model(uint64_t page, const tensor* t, wm_importer* cpu) {
    wm_model* model = NULL;
    wm_importer_caps caps;
    uint32_t i;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    check(wm_importer_get_caps(cpu, &caps) == WM_OK, "wm_importer_get_caps");
    caps.is_cpu = false;
    caps.alignment = page;
    if (wm_model_create(&model) != WM_OK) return NULL;
    check(wm_model_add_file(model, "consumer.gguf", 16 * page, NULL) == WM_OK, "add_file");
    check(wm_model_add_target_caps(model, "DEV", "dev", &caps, NULL) == WM_OK, "add_target_caps");
    check(wm_model_add_target(model, "CPU", cpu, NULL) == WM_OK, "add_target");
    for (i = 0; i < TENSORS; ++i)
        check(wm_model_add_tensor(model, t[i].name, 0, t[i].offset, t[i].size, t[i].target,
                                  NULL) == WM_OK, "add_tensor");
    check(wm_model_tensor_count(model) == TENSORS, "tensor count");
    return model;
}

static wm_plan* plan_model(const wm_model* model, int32_t import_enabled) {
    wm_plan_options options;
    wm_plan* plan = NULL;
    wm_plan_options_init(&options);
    options.import_enabled = import_enabled;
    check(wm_plan_create(model, &options, &plan) == WM_OK, "wm_plan_create");
    return plan;
}

/* Every tensor is imported in place: buffer + offset is the mapping + file offset, and the
 * device (the CPU here) reads the file's bytes there. */
static void check_locations(const wm_placement* placed, const tensor* t, const uint8_t* base) {
    uint32_t i;
    for (i = 0; i < TENSORS; ++i) {
        wm_tensor_location where;
        wm_placement_import imp;
        memset(&where, 0, sizeof where);
        where.struct_size = sizeof where;
        memset(&imp, 0, sizeof imp);
        imp.struct_size = sizeof imp;
        if (wm_placement_locate(placed, i, &where) != WM_OK) {
            check(0, "wm_placement_locate");
            continue;
        }
        check(where.imported, "tensor imported");
        check((const uint8_t*)where.host_address == base + t[i].offset,
              "host address == base + offset");
        check(where.device_address != NULL &&
                  memcmp(where.device_address, base + t[i].offset, t[i].size) == 0,
              "device bytes == file bytes");
        check(wm_placement_get_import(placed, where.import_index, &imp) == WM_OK,
              "wm_placement_get_import");
        check((const uint8_t*)imp.buffer.host_address + where.offset_in_buffer ==
                  base + t[i].offset, "import host address + offset_in_buffer == base + offset");
    }
}

/* The imports list every tensor exactly once, and the device import is the planned extent. */
static void check_imports(const wm_placement* placed, const uint8_t* base, uint64_t pinned) {
    int served[TENSORS] = {0};
    int device_imports = 0;
    uint32_t k, j;
    for (k = 0; k < wm_placement_import_count(placed); ++k) {
        wm_placement_import imp;
        memset(&imp, 0, sizeof imp);
        imp.struct_size = sizeof imp;
        if (wm_placement_get_import(placed, k, &imp) != WM_OK) {
            check(0, "wm_placement_get_import");
            continue;
        }
        check((const uint8_t*)imp.buffer.host_address == base + imp.extent_offset,
              "import host address == base + extent offset");
        for (j = 0; j < imp.tensor_count; ++j)
            if (imp.tensors[j] < TENSORS) ++served[imp.tensors[j]];
        if (imp.target != DEV) continue;
        ++device_imports;
        check(imp.extent_offset == 0 && imp.buffer.size == pinned, "device import extent");
    }
    check(device_imports == 1, "one device import");
    for (j = 0; j < TENSORS; ++j) check(served[j] == 1, "each tensor served by one import");
}

static void execute(const wm_model* model, const wm_plan* plan, wm_importer* const* importers,
                    const tensor* t, uint64_t length, const wm_plan_totals* want) {
    wm_mapped_file file;
    wm_placement* placed = NULL;
    uint64_t i;
    uint8_t* base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check(base != MAP_FAILED, "anonymous mmap");
    if (base == MAP_FAILED) return;
    for (i = 0; i < length; ++i) base[i] = (uint8_t)(i * 7 + 3);
    file.base = base;
    file.length = length;
    check(wm_execute(model, plan, &file, 1, importers, 2, NULL, &placed) == WM_OK, "wm_execute");
    if (placed != NULL) {
        check_totals(wm_placement_plan(placed), want, "executed");
        check_locations(placed, t, base);
        check_imports(placed, base, want->pinned_bytes);
    }
    wm_placement_destroy(placed); /* releases the imports before the mapping goes */
    munmap(base, length);
}

int main(void) {
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    tensor t[TENSORS];
    wm_importer* importers[2] = {NULL, NULL};
    wm_model* model;
    wm_plan* plan;
    wm_plan_totals want;

    layout(page, t);
    check(wm_version() == WM_VERSION_NUMBER, "wm_version() == WM_VERSION_NUMBER");
    {
        wm_cuda_importer_params cuda_params;
        wm_cuda_importer_params_init(&cuda_params);
        check(cuda_params.struct_size == sizeof cuda_params, "wm_cuda_importer_params_init");
    }
    check(wm_importer_create_cpu(&importers[DEV]) == WM_OK, "wm_importer_create_cpu (DEV)");
    check(wm_importer_create_cpu(&importers[CPU]) == WM_OK, "wm_importer_create_cpu (CPU)");
    model = importers[CPU] ? make_model(page, t, importers[CPU]) : NULL;
    check(model != NULL, "wm_model_create");
    if (model != NULL) {
        want = expected_totals(t, page, 0);
        plan = plan_model(model, 0);
        if (plan != NULL) check_totals(plan, &want, "control");
        wm_plan_destroy(plan);

        want = expected_totals(t, page, 1);
        plan = plan_model(model, 1);
        if (plan != NULL) {
            check_totals(plan, &want, "plan");
            execute(model, plan, importers, t, 16 * page, &want);
        }
        wm_plan_destroy(plan);
    }
    wm_model_destroy(model);
    wm_importer_destroy(importers[DEV]);
    wm_importer_destroy(importers[CPU]);
    printf("%s: %d failed checks\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
