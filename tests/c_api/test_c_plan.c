/* SPDX-License-Identifier: MIT */
/* The planner through the C API: the model description, plan options, totals, regions, runs and
 * tensor placements, the tightness gate on an interleaved (MoE-like) CPU/device layout in every
 * mode, the budget and merge gap, the size limit and the A/B switch. Every expected number is
 * computed here from the layout, not read back from the library. */
#include "c_check.h"

#define KiB UINT64_C(1024)
#define MiB (UINT64_C(1024) * 1024)
#define PAGE UINT64_C(4096) /* passed as page_size: the plans do not depend on the host */

/* The tightness gate as docs/planner.md states it: span <= ctx + ctx/8 + 1 MiB, saturating. */
static uint64_t gate_limit(uint64_t ctx) {
    uint64_t limit = ctx + ctx / 8;
    if (limit < ctx) return UINT64_MAX;
    if (limit + MiB < limit) return UINT64_MAX;
    return limit + MiB;
}

static wm_importer_caps device_caps(uint64_t alignment, uint64_t max_import_size) {
    wm_importer_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    caps.alignment = alignment;
    caps.max_import_size = max_import_size;
    caps.device_memory = WM_DEVICE_MEMORY_UNIFIED;
    return caps;
}

static wm_plan_options options(wm_plan_mode mode) {
    wm_plan_options o;
    wm_plan_options_init(&o);
    o.mode = mode;
    o.page_size = PAGE;
    o.import_enabled = 1; /* independent of WEIGHTMAP_IMPORT in the environment */
    return o;
}

static void case_model_description_counts_and_indices(void) {
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    REQUIRE(model != NULL);
    CHECK_EQ(wm_model_file_count(model), 0);
    CHECK_EQ(wm_model_target_count(model), 0);
    CHECK_EQ(wm_model_tensor_count(model), 0);

    uint32_t index = 77;
    CHECK_OK(wm_model_add_file(model, "a.gguf", 10 * MiB, &index));
    CHECK_EQ(index, 0);
    CHECK_OK(wm_model_add_file(model, "", 3 * MiB, &index));
    CHECK_EQ(index, 1);
    CHECK_OK(wm_model_add_file(model, "c.gguf", 1 * MiB, NULL));
    CHECK_EQ(wm_model_file_count(model), 3);

    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    const wm_importer_caps caps = device_caps(1, 0);
    CHECK_OK(wm_model_add_target_caps(model, "GPU0", NULL, &caps, &index));
    CHECK_EQ(index, 0);
    CHECK_OK(wm_model_add_target(model, "CPU", cpu, &index));
    CHECK_EQ(index, 1);
    CHECK_OK(wm_model_add_target_caps(model, "GPU1", "shared-key", &caps, NULL));
    CHECK_EQ(wm_model_target_count(model), 3);

    for (uint32_t i = 0; i < 20; ++i) {
        char name[32];
        snprintf(name, sizeof name, "blk.%u.weight", i);
        index = 12345;
        CHECK_OK(wm_model_add_tensor(model, name, i % 3, i * 1000, 1000, i % 3, &index));
        CHECK_EQ(index, i);
    }
    CHECK_OK(wm_model_add_tensor(model, "no.index", 0, 0, 1, 0, NULL));
    CHECK_EQ(wm_model_tensor_count(model), 21);
    CHECK_EQ(wm_model_file_count(model), 3);
    CHECK_EQ(wm_model_target_count(model), 3);

    /* The importer's caps were copied: the model plans after the importer is gone. */
    wm_importer_destroy(cpu);
    wm_plan_options o = options(WM_PLAN_RUNS);
    wm_plan* plan = NULL;
    CHECK_OK(wm_plan_create(model, &o, &plan));
    wm_model_destroy(model);
    if (plan != NULL) {
        /* targets x files with tensors: (0,0) (1,1) (2,2); regions ordered by (target, file) */
        REQUIRE_EQ(wm_plan_region_count(plan), 3);
        for (uint32_t r = 0; r < 3; ++r) {
            wm_plan_region region = {.struct_size = sizeof region};
            REQUIRE_OK(wm_plan_get_region(plan, r, &region));
            CHECK_EQ(region.target, r);
            CHECK_EQ(region.file, r);
            CHECK_EQ(region.tensor_count, r == 0 ? 8 : r == 1 ? 7 : 6);
        }
        wm_plan_region cpu_region = {.struct_size = sizeof cpu_region};
        REQUIRE_OK(wm_plan_get_region(plan, 1, &cpu_region));
        CHECK(cpu_region.decision == WM_DECISION_IMPORT); /* CPU passthrough: always */
        CHECK(cpu_region.reason != NULL && cpu_region.reason[0] != '\0');
        /* Tensors 1, 4, 7, 10, 13, 16, 19 at offsets 1000 * i. */
        for (uint32_t k = 0; k < cpu_region.tensor_count; ++k) CHECK_EQ(cpu_region.tensors[k], 1 + 3 * k);
    }
    wm_plan_destroy(plan);
}

static void case_plan_options_init_fills_the_defaults(void) {
    wm_plan_options o;
    memset(&o, 0xA5, sizeof o);
    wm_plan_options_init(&o);
    CHECK_EQ(o.struct_size, sizeof o);
    CHECK(o.mode == WM_PLAN_RUNS);
    CHECK_EQ(o.page_size, 0);
    CHECK_EQ(o.merge_gap, MiB);
    CHECK_EQ(o.max_imports_per_region, 256);
    CHECK_EQ((uint64_t)(int64_t)o.import_enabled, (uint64_t)(int64_t)-1);
    CHECK(o.import_policy == WM_IMPORT_POLICY_UNIFIED_ONLY);

    wm_execute_options e;
    memset(&e, 0xA5, sizeof e);
    wm_execute_options_init(&e);
    CHECK_EQ(e.struct_size, sizeof e);
    CHECK(e.log == NULL);
    CHECK(e.log_user == NULL);
    CHECK(e.progress == NULL);
    CHECK(e.progress_user == NULL);
}

/* A dense device region, tensors added out of offset order, page size and importer alignment
 * 64 KiB: one import, the aligned superset, every tensor at extent offset + offset_in_run. */
static void case_dense_region_is_one_aligned_import(void) {
    enum { N = 9 };
    const uint64_t base = 12345, align = 64 * KiB, file_size = 16 * MiB + 100;
    uint64_t size[N], offset[N];
    static const uint32_t position[N] = {4, 0, 8, 2, 6, 1, 7, 3, 5}; /* tensor i is the position[i]-th in the file */
    uint64_t at = base, ctx = 0;
    uint64_t offset_by_position[N];
    for (uint32_t p = 0; p < N; ++p) {
        offset_by_position[p] = at;
        at += 100000 + p * 3333;
    }
    const uint64_t last = at;
    for (uint32_t i = 0; i < N; ++i) {
        offset[i] = offset_by_position[position[i]];
        size[i] = 100000 + position[i] * 3333;
        ctx += size[i];
    }

    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    REQUIRE_OK(wm_model_add_file(model, "dense.gguf", file_size, NULL));
    const wm_importer_caps caps = device_caps(align, 0);
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL));
    for (uint32_t i = 0; i < N; ++i) {
        char name[16];
        snprintf(name, sizeof name, "t%u", i);
        REQUIRE_OK(wm_model_add_tensor(model, name, 0, offset[i], size[i], 0, NULL));
    }
    wm_plan_options o = options(WM_PLAN_RUNS);
    wm_plan* plan = NULL;
    REQUIRE_OK(wm_plan_create(model, &o, &plan));
    wm_model_destroy(model); /* the plan does not refer to it */

    REQUIRE_EQ(wm_plan_region_count(plan), 1);
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &region));
    CHECK_EQ(region.target, 0);
    CHECK_EQ(region.file, 0);
    CHECK_EQ(region.first, base);
    CHECK_EQ(region.last, last);
    CHECK_EQ(region.ctx_bytes, ctx);
    CHECK(region.gate);
    CHECK(region.decision == WM_DECISION_IMPORT);
    CHECK(region.reason != NULL && region.reason[0] != '\0');
    REQUIRE_EQ(region.tensor_count, N);
    for (uint32_t p = 0; p < N; ++p) CHECK_EQ(position[region.tensors[p]], p); /* by offset */
    REQUIRE_EQ(region.run_count, 1);

    wm_plan_run run = {.struct_size = sizeof run};
    REQUIRE_OK(wm_plan_get_run(plan, 0, 0, &run));
    const uint64_t extent_offset = c_align_down(base, align);
    const uint64_t extent_size = c_align_up(last, align) - extent_offset;
    CHECK_EQ(run.first, base);
    CHECK_EQ(run.last, last);
    CHECK_EQ(run.extent_offset, extent_offset);
    CHECK_EQ(run.extent_size, extent_size);
    CHECK_EQ(run.ctx_bytes, ctx);
    REQUIRE_EQ(run.tensor_count, N);
    for (uint32_t p = 0; p < N; ++p) CHECK_EQ(position[run.tensors[p]], p);

    for (uint32_t i = 0; i < N; ++i) {
        wm_tensor_placement t = {.struct_size = sizeof t};
        REQUIRE_OK(wm_plan_get_tensor(plan, i, &t));
        CHECK_EQ(t.region, 0);
        CHECK_EQ(t.run, 0);
        CHECK_EQ(t.offset_in_run, offset[i] - extent_offset);
        CHECK_STR_EQ(t.reason, "");
    }

    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.device_bytes, ctx);
    CHECK_EQ(totals.imported_bytes, ctx);
    CHECK_EQ(totals.pinned_bytes, extent_size);
    CHECK_EQ(totals.fallback_bytes, 0);
    CHECK_EQ(totals.imports, 1);
    wm_plan_destroy(plan);
}

/* The MoE shape: per layer a small device tensor (attention) then large CPU experts. The device
 * region spans the whole file for a fraction of its bytes: it fails the gate. */
enum { LAYERS = 6 };
static const uint64_t ATTN = 300000, EXPERTS = 3 * MiB + 17, MOE_BASE = 3 * 4096 + 7;

static uint64_t attn_offset(uint32_t layer) { return MOE_BASE + layer * (ATTN + EXPERTS); }
static uint64_t experts_offset(uint32_t layer) { return attn_offset(layer) + ATTN; }
static uint64_t moe_file_size(void) { return experts_offset(LAYERS - 1) + EXPERTS + 1000; }

/* Tensor 2l is layer l's attention (GPU, target 0), 2l+1 its experts (CPU, target 1). */
static wm_plan* plan_moe(wm_plan_options o) {
    wm_model* model = NULL;
    wm_importer* cpu = NULL;
    wm_plan* plan = NULL;
    if (wm_model_create(&model) != WM_OK || wm_importer_create_cpu(&cpu) != WM_OK) goto done;
    const wm_importer_caps caps = device_caps(1, 0);
    if (wm_model_add_file(model, "moe.gguf", moe_file_size(), NULL) != WM_OK ||
        wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL) != WM_OK ||
        wm_model_add_target(model, "CPU", cpu, NULL) != WM_OK)
        goto done;
    for (uint32_t l = 0; l < LAYERS; ++l) {
        char name[48];
        snprintf(name, sizeof name, "blk.%u.attn_q.weight", l);
        if (wm_model_add_tensor(model, name, 0, attn_offset(l), ATTN, 0, NULL) != WM_OK) goto done;
        snprintf(name, sizeof name, "blk.%u.ffn_up_exps.weight", l);
        if (wm_model_add_tensor(model, name, 0, experts_offset(l), EXPERTS, 1, NULL) != WM_OK) goto done;
    }
    if (wm_plan_create(model, &o, &plan) != WM_OK) {
        fprintf(stderr, "wm_plan_create: %s\n", wm_last_error());
        plan = NULL;
    }
done:
    wm_model_destroy(model);
    wm_importer_destroy(cpu);
    return plan;
}

static void check_moe_cpu_region(const wm_plan* plan) {
    wm_plan_region cpu = {.struct_size = sizeof cpu};
    REQUIRE_OK(wm_plan_get_region(plan, 1, &cpu));
    CHECK_EQ(cpu.target, 1);
    CHECK(cpu.decision == WM_DECISION_IMPORT);
    CHECK_EQ(cpu.first, experts_offset(0));
    CHECK_EQ(cpu.last, experts_offset(LAYERS - 1) + EXPERTS);
    CHECK_EQ(cpu.ctx_bytes, LAYERS * EXPERTS);
    REQUIRE_EQ(cpu.run_count, 1);
    wm_plan_run run = {.struct_size = sizeof run};
    REQUIRE_OK(wm_plan_get_run(plan, 1, 0, &run));
    CHECK_EQ(run.extent_offset, c_align_down(experts_offset(0), PAGE));
    for (uint32_t l = 0; l < LAYERS; ++l) {
        wm_tensor_placement t = {.struct_size = sizeof t};
        REQUIRE_OK(wm_plan_get_tensor(plan, 2 * l + 1, &t));
        CHECK_EQ(t.region, 1);
        CHECK_EQ(t.run, 0);
        CHECK_EQ(t.offset_in_run, experts_offset(l) - run.extent_offset);
        CHECK_STR_EQ(t.reason, "");
    }
}

static void case_interleaved_layout_gate_mode_falls_back_with_the_numbers(void) {
    const uint64_t first = attn_offset(0), last = attn_offset(LAYERS - 1) + ATTN;
    const uint64_t ctx = LAYERS * ATTN;
    REQUIRE(last - first > gate_limit(ctx)); /* the layout is what the case says */

    wm_plan* plan = plan_moe(options(WM_PLAN_GATE));
    REQUIRE(plan != NULL);
    REQUIRE_EQ(wm_plan_region_count(plan), 2);
    wm_plan_region gpu = {.struct_size = sizeof gpu};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK_EQ(gpu.target, 0);
    CHECK_EQ(gpu.first, first);
    CHECK_EQ(gpu.last, last);
    CHECK_EQ(gpu.ctx_bytes, ctx);
    CHECK(!gpu.gate);
    CHECK(gpu.decision == WM_DECISION_FALLBACK);
    CHECK_EQ(gpu.run_count, 0);
    char number[32];
    snprintf(number, sizeof number, "%" PRIu64, gate_limit(ctx));
    CHECK_CONTAINS(gpu.reason, number); /* the reason carries the gate's limit */
    snprintf(number, sizeof number, "%" PRIu64, last - first);
    CHECK_CONTAINS(gpu.reason, number); /* and the span */
    for (uint32_t l = 0; l < LAYERS; ++l) {
        wm_tensor_placement t = {.struct_size = sizeof t};
        REQUIRE_OK(wm_plan_get_tensor(plan, 2 * l, &t));
        CHECK_EQ(t.region, 0);
        CHECK_EQ(t.run, WM_NO_INDEX);
        CHECK_STR_EQ(t.reason, gpu.reason); /* the whole region falls back: its reason */
    }
    wm_plan_run run = {.struct_size = sizeof run};
    CHECK_INVALID(wm_plan_get_run(plan, 0, 0, &run), "wm_plan_get_run");
    check_moe_cpu_region(plan);

    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.device_bytes, ctx); /* CPU tensors are not counted */
    CHECK_EQ(totals.imported_bytes, 0);
    CHECK_EQ(totals.pinned_bytes, 0);
    CHECK_EQ(totals.fallback_bytes, ctx);
    CHECK_EQ(totals.imports, 0);
    wm_plan_destroy(plan);
}

static void case_interleaved_layout_span_mode_pins_the_whole_span(void) {
    const uint64_t first = attn_offset(0), last = attn_offset(LAYERS - 1) + ATTN;
    const uint64_t ctx = LAYERS * ATTN;
    wm_plan* plan = plan_moe(options(WM_PLAN_SPAN));
    REQUIRE(plan != NULL);
    wm_plan_region gpu = {.struct_size = sizeof gpu};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK(!gpu.gate);
    CHECK(gpu.decision == WM_DECISION_IMPORT);
    REQUIRE_EQ(gpu.run_count, 1);
    wm_plan_run run = {.struct_size = sizeof run};
    REQUIRE_OK(wm_plan_get_run(plan, 0, 0, &run));
    const uint64_t extent_offset = c_align_down(first, PAGE);
    const uint64_t extent_size = c_align_up(last, PAGE) - extent_offset;
    CHECK_EQ(run.extent_offset, extent_offset);
    CHECK_EQ(run.extent_size, extent_size);
    CHECK_EQ(run.ctx_bytes, ctx);
    CHECK_EQ(run.tensor_count, LAYERS);
    for (uint32_t l = 0; l < LAYERS; ++l) {
        CHECK_EQ(run.tensors[l], 2 * l);
        wm_tensor_placement t = {.struct_size = sizeof t};
        REQUIRE_OK(wm_plan_get_tensor(plan, 2 * l, &t));
        CHECK_EQ(t.run, 0);
        CHECK_EQ(t.offset_in_run, attn_offset(l) - extent_offset);
    }
    check_moe_cpu_region(plan);
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.device_bytes, ctx);
    CHECK_EQ(totals.imported_bytes, ctx);
    CHECK_EQ(totals.pinned_bytes, extent_size);
    CHECK_EQ(totals.fallback_bytes, 0);
    CHECK_EQ(totals.imports, 1);
    wm_plan_destroy(plan);
}

static void case_interleaved_layout_runs_mode_imports_each_tensor_alone(void) {
    const uint64_t ctx = LAYERS * ATTN;
    wm_plan* plan = plan_moe(options(WM_PLAN_RUNS));
    REQUIRE(plan != NULL);
    wm_plan_region gpu = {.struct_size = sizeof gpu};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK(!gpu.gate);
    CHECK(gpu.decision == WM_DECISION_IMPORT);
    CHECK(gpu.reason != NULL && gpu.reason[0] != '\0');
    REQUIRE_EQ(gpu.run_count, LAYERS); /* gaps of ~3 MiB > merge_gap: one run per tensor */
    uint64_t pinned = 0;
    for (uint32_t l = 0; l < LAYERS; ++l) {
        wm_plan_run run = {.struct_size = sizeof run};
        REQUIRE_OK(wm_plan_get_run(plan, 0, l, &run));
        const uint64_t extent_offset = c_align_down(attn_offset(l), PAGE);
        const uint64_t extent_size = c_align_up(attn_offset(l) + ATTN, PAGE) - extent_offset;
        CHECK_EQ(run.first, attn_offset(l));
        CHECK_EQ(run.last, attn_offset(l) + ATTN);
        CHECK_EQ(run.extent_offset, extent_offset);
        CHECK_EQ(run.extent_size, extent_size);
        CHECK_EQ(run.ctx_bytes, ATTN);
        REQUIRE_EQ(run.tensor_count, 1);
        CHECK_EQ(run.tensors[0], 2 * l);
        pinned += extent_size;
        wm_tensor_placement t = {.struct_size = sizeof t};
        REQUIRE_OK(wm_plan_get_tensor(plan, 2 * l, &t));
        CHECK_EQ(t.region, 0);
        CHECK_EQ(t.run, l);
        CHECK_EQ(t.offset_in_run, attn_offset(l) - extent_offset);
        CHECK_STR_EQ(t.reason, "");
    }
    wm_plan_run run = {.struct_size = sizeof run};
    CHECK_INVALID(wm_plan_get_run(plan, 0, LAYERS, &run), "wm_plan_get_run");
    check_moe_cpu_region(plan);
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.device_bytes, ctx);
    CHECK_EQ(totals.imported_bytes, ctx);
    CHECK_EQ(totals.pinned_bytes, pinned);
    CHECK_EQ(totals.fallback_bytes, 0);
    CHECK_EQ(totals.imports, LAYERS);
    wm_plan_destroy(plan);
}

/* Two 64 KiB device tensors around a CPU tensor of `gap` bytes, mode gate: is the region tight? */
static int gate_verdict(uint64_t gap, uint64_t* imports) {
    const uint64_t a = 4096, size = 64 * KiB;
    wm_model* model = NULL;
    wm_importer* cpu = NULL;
    wm_plan* plan = NULL;
    int verdict = -1;
    const wm_importer_caps caps = device_caps(1, 0);
    if (wm_model_create(&model) != WM_OK || wm_importer_create_cpu(&cpu) != WM_OK ||
        wm_model_add_file(model, "gate.gguf", a + 2 * size + gap + 4096, NULL) != WM_OK ||
        wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL) != WM_OK ||
        wm_model_add_target(model, "CPU", cpu, NULL) != WM_OK ||
        wm_model_add_tensor(model, "a", 0, a, size, 0, NULL) != WM_OK ||
        wm_model_add_tensor(model, "between", 0, a + size, gap, 1, NULL) != WM_OK ||
        wm_model_add_tensor(model, "b", 0, a + size + gap, size, 0, NULL) != WM_OK)
        goto done;
    wm_plan_options o = options(WM_PLAN_GATE);
    if (wm_plan_create(model, &o, &plan) != WM_OK) goto done;
    wm_plan_region region = {.struct_size = sizeof region};
    wm_plan_totals totals = {.struct_size = sizeof totals};
    if (wm_plan_get_region(plan, 0, &region) != WM_OK || region.ctx_bytes != 2 * size ||
        region.last - region.first != 2 * size + gap || wm_plan_get_totals(plan, &totals) != WM_OK)
        goto done;
    *imports = totals.imports;
    verdict = region.gate ? 1 : 0;
    if ((region.decision == WM_DECISION_IMPORT) != region.gate) verdict = -2;
done:
    wm_plan_destroy(plan);
    wm_model_destroy(model);
    wm_importer_destroy(cpu);
    return verdict;
}

static void case_tightness_gate_boundary_uses_one_mib_of_slack(void) {
    const uint64_t ctx = 128 * KiB;
    const uint64_t at_limit = gate_limit(ctx) - ctx; /* span == limit exactly */
    uint64_t imports = 99;
    CHECK_EQ(gate_verdict(at_limit, &imports), 1);
    CHECK_EQ(imports, 1);
    imports = 99;
    CHECK_EQ(gate_verdict(at_limit + 1, &imports), 0);
    CHECK_EQ(imports, 0);
    /* Upstream's ((ctx/8) + 1) << 20 would admit this region (16385 MiB of slack): */
    REQUIRE(at_limit + 1 + 2 * 64 * KiB <= ((ctx / 8) + 1) << 20);
    CHECK_EQ(gate_verdict(2 * MiB, &imports), 0);
}

static void case_tightness_gate_saturates_instead_of_wrapping(void) {
    /* ctx + ctx/8 + 1 MiB passes 2^64: saturating, every span is tight; wrapped, it is not. */
    const uint64_t half = UINT64_C(1) << 63, sixteenth = UINT64_C(1) << 60;
    const uint64_t a_size = half - sixteenth / 2, b_size = half - sixteenth / 2;
    /* b ends at the last page boundary below 2^64: a tensor whose end rounds up past 2^64
     * is refused (no mapping can hold it) */
    const uint64_t top = UINT64_MAX - (c_page_size() - 1);
    const uint64_t b_offset = top - b_size;
    const uint64_t ctx = a_size + b_size;
    REQUIRE(ctx + ctx / 8 + MiB < ctx); /* the unsaturated sum wraps around */
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    const wm_importer_caps caps = device_caps(1, 0);
    wm_plan* plan = NULL;
    wm_plan_options o = options(WM_PLAN_GATE);
    if (wm_model_add_file(model, "huge", UINT64_MAX, NULL) == WM_OK &&
        wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL) == WM_OK &&
        wm_model_add_tensor(model, "a", 0, 0, a_size, 0, NULL) == WM_OK &&
        wm_model_add_tensor(model, "b", 0, b_offset, b_size, 0, NULL) == WM_OK)
        CHECK_OK(wm_plan_create(model, &o, &plan));
    wm_model_destroy(model);
    REQUIRE(plan != NULL);
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &region));
    CHECK_EQ(region.first, 0);
    CHECK_EQ(region.last, top);
    CHECK_EQ(region.ctx_bytes, ctx);
    CHECK(region.gate);
    wm_plan_destroy(plan);
}

/* Four 1 MiB device tensors, page-aligned, 1.125 MiB of CPU tensor between neighbours: a pair
 * passes the gate (3.125 MiB <= 3.25 MiB), three do not (5.25 > 4.375). */
static wm_plan* plan_four(wm_plan_options o) {
    const uint64_t step = MiB + MiB / 8 + MiB;
    wm_model* model = NULL;
    wm_importer* cpu = NULL;
    wm_plan* plan = NULL;
    const wm_importer_caps caps = device_caps(1, 0);
    if (wm_model_create(&model) != WM_OK || wm_importer_create_cpu(&cpu) != WM_OK ||
        wm_model_add_file(model, "four.gguf", 16 * MiB, NULL) != WM_OK ||
        wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL) != WM_OK ||
        wm_model_add_target(model, "CPU", cpu, NULL) != WM_OK)
        goto done;
    for (uint32_t k = 0; k < 4; ++k) {
        if (wm_model_add_tensor(model, "dev", 0, MiB + k * step, MiB, 0, NULL) != WM_OK) goto done;
        if (k < 3 && wm_model_add_tensor(model, "cpu", 0, 2 * MiB + k * step, MiB + MiB / 8, 1,
                                         NULL) != WM_OK)
            goto done;
    }
    if (wm_plan_create(model, &o, &plan) != WM_OK) plan = NULL;
done:
    wm_model_destroy(model);
    wm_importer_destroy(cpu);
    return plan;
}

/* Device tensor k is model tensor 2k. Checks the runs are exactly `groups` (tensor counts). */
static void check_four_runs(const wm_plan* plan, uint32_t run_count, const uint32_t* sizes) {
    const uint64_t step = MiB + MiB / 8 + MiB;
    wm_plan_region gpu = {.struct_size = sizeof gpu};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    REQUIRE_EQ(gpu.run_count, run_count);
    uint32_t k = 0;
    uint64_t pinned = 0, imported = 0;
    for (uint32_t r = 0; r < run_count; ++r) {
        wm_plan_run run = {.struct_size = sizeof run};
        REQUIRE_OK(wm_plan_get_run(plan, 0, r, &run));
        REQUIRE_EQ(run.tensor_count, sizes[r]);
        CHECK_EQ(run.extent_offset, MiB + k * step);
        CHECK_EQ(run.extent_size, (sizes[r] - 1) * step + MiB);
        for (uint32_t i = 0; i < sizes[r]; ++i) CHECK_EQ(run.tensors[i], 2 * (k + i));
        pinned += run.extent_size;
        imported += run.ctx_bytes;
        k += sizes[r];
    }
    for (; k < 4; ++k) {
        wm_tensor_placement t = {.struct_size = sizeof t};
        REQUIRE_OK(wm_plan_get_tensor(plan, 2 * k, &t));
        CHECK_EQ(t.run, WM_NO_INDEX);
        CHECK(t.reason != NULL && t.reason[0] != '\0');
    }
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.imports, run_count);
    CHECK_EQ(totals.pinned_bytes, pinned);
    CHECK_EQ(totals.imported_bytes, imported);
    CHECK_EQ(totals.fallback_bytes, 4 * MiB - imported);
}

static void case_budget_and_merge_gap_reach_the_planner(void) {
    wm_plan_options o = options(WM_PLAN_RUNS);
    wm_plan* plan = plan_four(o);
    REQUIRE(plan != NULL);
    static const uint32_t ones[4] = {1, 1, 1, 1}, pairs[2] = {2, 2}, one_pair[1] = {2};
    check_four_runs(plan, 4, ones); /* gaps of 1.125 MiB >= merge_gap: separate */
    wm_plan_destroy(plan);

    o.max_imports_per_region = 2; /* merges the smallest gaps while each run stays tight */
    plan = plan_four(o);
    REQUIRE(plan != NULL);
    check_four_runs(plan, 2, pairs);
    wm_plan_destroy(plan);

    o.max_imports_per_region = 0; /* counts as 1: the second pair falls back */
    plan = plan_four(o);
    REQUIRE(plan != NULL);
    check_four_runs(plan, 1, one_pair);
    wm_plan_destroy(plan);

    o.max_imports_per_region = 256;
    o.merge_gap = 2 * MiB; /* gaps below it merge as far as the gate allows */
    plan = plan_four(o);
    REQUIRE(plan != NULL);
    check_four_runs(plan, 2, pairs);
    wm_plan_destroy(plan);
}

static void case_max_import_size_cuts_at_tensor_boundaries(void) {
    enum { N = 10 };
    const uint64_t size = 512 * KiB, limit = 2 * MiB;
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    const wm_importer_caps caps = device_caps(1, limit);
    REQUIRE_OK(wm_model_add_file(model, "big.gguf", 8 * MiB, NULL));
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL));
    for (uint32_t i = 0; i < N; ++i) REQUIRE_OK(wm_model_add_tensor(model, "t", 0, MiB + i * size, size, 0, NULL));
    wm_plan_options o = options(WM_PLAN_RUNS);
    wm_plan* plan = NULL;
    REQUIRE_OK(wm_plan_create(model, &o, &plan));
    wm_model_destroy(model);
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &region));
    CHECK(region.gate);
    REQUIRE_EQ(region.run_count, (N * size + limit - 1) / limit); /* the fewest imports: 3 */
    uint64_t served = 0, next = MiB;
    for (uint32_t r = 0; r < region.run_count; ++r) {
        wm_plan_run run = {.struct_size = sizeof run};
        REQUIRE_OK(wm_plan_get_run(plan, 0, r, &run));
        CHECK(run.extent_size <= limit);
        CHECK_EQ(run.extent_offset, next); /* contiguous cuts, in file order */
        CHECK_EQ(run.ctx_bytes, run.tensor_count * size);
        next = run.extent_offset + run.extent_size;
        served += run.ctx_bytes;
    }
    CHECK_EQ(served, N * size);
    wm_plan_destroy(plan);
}

static void case_import_switch_option_and_environment(void) {
    const uint64_t ctx = LAYERS * ATTN;
    wm_plan_options o = options(WM_PLAN_RUNS);
    o.import_enabled = 0;
    wm_plan* plan = plan_moe(o);
    REQUIRE(plan != NULL);
    wm_plan_region gpu = {.struct_size = sizeof gpu};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK(gpu.decision == WM_DECISION_FALLBACK);
    CHECK(gpu.reason != NULL && gpu.reason[0] != '\0');
    check_moe_cpu_region(plan); /* the CPU is passthrough either way */
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.imported_bytes, 0);
    CHECK_EQ(totals.fallback_bytes, ctx);
    wm_plan_destroy(plan);

    REQUIRE(setenv("WEIGHTMAP_IMPORT", "0", 1) == 0);
    o.import_enabled = -1; /* reads the environment */
    plan = plan_moe(o);
    REQUIRE(plan != NULL);
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK(gpu.decision == WM_DECISION_FALLBACK);
    CHECK_CONTAINS(gpu.reason, "WEIGHTMAP_IMPORT=0");
    wm_tensor_placement t = {.struct_size = sizeof t};
    REQUIRE_OK(wm_plan_get_tensor(plan, 0, &t));
    CHECK_CONTAINS(t.reason, "WEIGHTMAP_IMPORT=0");
    wm_plan_destroy(plan);

    o.import_enabled = 1; /* the option wins over the environment */
    plan = plan_moe(o);
    REQUIRE(plan != NULL);
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK(gpu.decision == WM_DECISION_IMPORT);
    wm_plan_destroy(plan);

    REQUIRE(unsetenv("WEIGHTMAP_IMPORT") == 0);
    o.import_enabled = -1;
    plan = plan_moe(o);
    REQUIRE(plan != NULL);
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK(gpu.decision == WM_DECISION_IMPORT);
    CHECK_EQ(gpu.run_count, LAYERS);
    wm_plan_destroy(plan);

    /* NULL options: the defaults (mode runs, the host page size). */
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    const wm_importer_caps caps = device_caps(1, 0);
    REQUIRE_OK(wm_model_add_file(model, "f", moe_file_size(), NULL));
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL));
    for (uint32_t l = 0; l < LAYERS; ++l) REQUIRE_OK(wm_model_add_tensor(model, "a", 0, attn_offset(l), ATTN, 0, NULL));
    plan = NULL;
    CHECK_OK(wm_plan_create(model, NULL, &plan));
    wm_model_destroy(model);
    REQUIRE(plan != NULL);
    REQUIRE_OK(wm_plan_get_region(plan, 0, &gpu));
    CHECK_EQ(gpu.run_count, LAYERS);
    wm_plan_run run = {.struct_size = sizeof run};
    REQUIRE_OK(wm_plan_get_run(plan, 0, 0, &run));
    CHECK_EQ(run.extent_offset, c_align_down(attn_offset(0), c_page_size()));
    wm_plan_destroy(plan);
}

/* Two files, two device targets and the CPU: regions ordered by (target, file). */
static void case_regions_are_ordered_by_target_then_file(void) {
    wm_model* model = NULL;
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_model_create(&model));
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    const wm_importer_caps caps = device_caps(1, 0);
    REQUIRE_OK(wm_model_add_file(model, "f0", 4 * MiB, NULL));
    REQUIRE_OK(wm_model_add_file(model, "f1", 4 * MiB, NULL));
    REQUIRE_OK(wm_model_add_target(model, "CPU", cpu, NULL));
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU0", NULL, &caps, NULL));
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU1", NULL, &caps, NULL));
    /* Added in the reverse of region order. */
    static const uint32_t target[6] = {2, 2, 1, 1, 0, 0}, file[6] = {1, 0, 1, 0, 1, 0};
    for (uint32_t i = 0; i < 6; ++i)
        REQUIRE_OK(wm_model_add_tensor(model, "t", file[i], 64 * KiB * (i + 1), 4 * KiB * (i + 1),
                                       target[i], NULL));
    wm_plan_options o = options(WM_PLAN_RUNS);
    wm_plan* plan = NULL;
    REQUIRE_OK(wm_plan_create(model, &o, &plan));
    wm_model_destroy(model);
    wm_importer_destroy(cpu);
    REQUIRE_EQ(wm_plan_region_count(plan), 6);
    for (uint32_t r = 0; r < 6; ++r) {
        wm_plan_region region = {.struct_size = sizeof region};
        REQUIRE_OK(wm_plan_get_region(plan, r, &region));
        CHECK_EQ(region.target, r / 2);
        CHECK_EQ(region.file, r % 2);
        REQUIRE_EQ(region.tensor_count, 1);
        const uint32_t t = region.tensors[0];
        CHECK_EQ(target[t], r / 2);
        CHECK_EQ(file[t], r % 2);
        CHECK_EQ(region.ctx_bytes, 4 * KiB * (t + 1));
        wm_tensor_placement place = {.struct_size = sizeof place};
        REQUIRE_OK(wm_plan_get_tensor(plan, t, &place));
        CHECK_EQ(place.region, r);
    }
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.device_bytes, 4 * KiB * (1 + 2 + 3 + 4)); /* tensors 0..3 */
    CHECK_EQ(totals.imports, 4);
    wm_plan_destroy(plan);
}

/* One dense region on a what-if target of `caps`: its decision and reason. */
static void plan_dense_into(const wm_importer_caps* caps, const wm_plan_options* o,
                            wm_import_policy target_policy, int* decision, char* reason,
                            size_t reason_size) {
    wm_model* model = NULL;
    wm_plan* plan = NULL;
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_model_create(&model));
    REQUIRE_OK(wm_model_add_file(model, "dense.gguf", 8 * MiB, NULL));
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU", NULL, caps, NULL));
    REQUIRE_OK(wm_model_set_target_import_policy(model, 0, target_policy));
    for (uint32_t i = 0; i < 8; ++i) REQUIRE_OK(wm_model_add_tensor(model, "t", 0, i * MiB, MiB, 0, NULL));
    REQUIRE_OK(wm_plan_create(model, o, &plan));
    REQUIRE_OK(wm_plan_get_region(plan, 0, &region));
    *decision = (int)region.decision;
    snprintf(reason, reason_size, "%s", region.reason);
    wm_plan_destroy(plan);
    wm_model_destroy(model);
}

/* The decision of plan_dense_into; -1 when it could not plan (it reported why). */
static int plan_dense(const wm_importer_caps* caps, const wm_plan_options* o,
                      wm_import_policy target_policy, char* reason, size_t reason_size) {
    int decision = -1;
    reason[0] = '\0';
    plan_dense_into(caps, o, target_policy, &decision, reason, reason_size);
    return decision;
}

/* What-if caps plan as the device kind says; a target's own policy overrides the options';
 * FROM_OPTIONS restores them. */
static void case_device_memory_and_policy_shape_the_plan(void) {
    wm_importer_caps caps = device_caps(1, 0);
    wm_plan_options o = options(WM_PLAN_RUNS);
    char reason[512];
    caps.device_memory = WM_DEVICE_MEMORY_DISCRETE;
    caps.device_memory_note = "what-if";
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_FALLBACK);
    CHECK_CONTAINS(reason, "discrete device (what-if): imported weights would be read over the bus "
                           "on every use; import_policy=always to import anyway");
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_ALWAYS, reason, sizeof reason) == (int)WM_DECISION_IMPORT);
    CHECK_CONTAINS(reason, "import_policy=always on a discrete device");
    o.import_policy = WM_IMPORT_POLICY_ALWAYS;
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_IMPORT);
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_NEVER, reason, sizeof reason) == (int)WM_DECISION_FALLBACK);
    CHECK_STR_EQ(reason, "import_policy=never");
    caps.device_memory = WM_DEVICE_MEMORY_UNIFIED;
    o.import_policy = WM_IMPORT_POLICY_NEVER;
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_FALLBACK);
    o.import_policy = WM_IMPORT_POLICY_UNIFIED_ONLY;
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_IMPORT);
    CHECK(strstr(reason, "import_policy") == NULL);
    caps.device_memory = WM_DEVICE_MEMORY_UNKNOWN;
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_FALLBACK);
    CHECK_CONTAINS(reason, "device memory unknown (what-if)");
}

/* A caller built against the first weightmap.h: its struct_size ends before the added fields,
 * which keep their defaults (unknown device memory, the unified_only policy). */
static void case_first_version_structs_get_the_new_defaults(void) {
    wm_importer_caps caps = device_caps(1, 0);
    caps.device_memory = WM_DEVICE_MEMORY_UNIFIED; /* past the old struct_size: not read */
    caps.struct_size = (uint32_t)offsetof(wm_importer_caps, device_memory);
    wm_plan_options o = options(WM_PLAN_RUNS);
    o.import_policy = WM_IMPORT_POLICY_ALWAYS; /* past the old struct_size: not read */
    o.struct_size = (uint32_t)offsetof(wm_plan_options, import_policy);
    char reason[512];
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_FALLBACK);
    CHECK_CONTAINS(reason, "device memory unknown");
    o.struct_size = sizeof o;
    CHECK(plan_dense(&caps, &o, WM_IMPORT_POLICY_FROM_OPTIONS, reason, sizeof reason) == (int)WM_DECISION_IMPORT);

    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    wm_importer_caps old = {.struct_size = (uint32_t)offsetof(wm_importer_caps, device_memory)};
    memset((char*)&old + old.struct_size, 0xA5, sizeof old - old.struct_size);
    REQUIRE_OK(wm_importer_get_caps(cpu, &old));
    CHECK_EQ(((unsigned char*)&old)[sizeof old - 1], 0xA5); /* nothing written past it */
    wm_importer_caps now = {.struct_size = sizeof now};
    REQUIRE_OK(wm_importer_get_caps(cpu, &now));
    CHECK(now.device_memory == WM_DEVICE_MEMORY_UNIFIED);
    CHECK(now.device_memory_note != NULL && now.device_memory_note[0] != '\0');
    wm_importer_destroy(cpu);
}

/* One region of three tensors on a what-if target of `caps`, the middle one at 64 KiB + 32:
 * `status` receives what wm_plan_create returned. */
static void plan_three_into(const wm_importer_caps* caps, wm_plan** plan, wm_status* status) {
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    REQUIRE_OK(wm_model_add_file(model, "three.gguf", 4 * MiB, NULL));
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU", NULL, caps, NULL));
    REQUIRE_OK(wm_model_add_tensor(model, "a", 0, 0, 64 * KiB, 0, NULL));
    REQUIRE_OK(wm_model_add_tensor(model, "b", 0, 64 * KiB + 32, 1000, 0, NULL));
    REQUIRE_OK(wm_model_add_tensor(model, "c", 0, 128 * KiB, 64 * KiB, 0, NULL));
    const wm_plan_options o = options(WM_PLAN_RUNS);
    *status = wm_plan_create(model, &o, plan);
    wm_model_destroy(model);
}

static wm_status plan_three(const wm_importer_caps* caps, wm_plan** plan) {
    wm_status status = WM_ERROR_INTERNAL; /* if plan_three_into stops at a REQUIRE */
    plan_three_into(caps, plan, &status);
    return status;
}

/* caps.tensor_alignment: a tensor off it falls back alone with the numbers, the others import
 * at offsets that are multiples of it; not a power of two is refused; a struct_size from before
 * the field keeps the default (none). */
static void case_tensor_alignment_makes_a_misaligned_tensor_fall_back_alone(void) {
    wm_importer_caps caps = device_caps(1, 0);
    caps.tensor_alignment = 256;
    wm_plan* plan = NULL;
    REQUIRE_OK(plan_three(&caps, &plan));
    wm_tensor_placement t = {.struct_size = sizeof t};
    for (uint32_t i = 0; i < 3; i += 2) {
        REQUIRE_OK(wm_plan_get_tensor(plan, i, &t));
        CHECK(t.run != WM_NO_INDEX);
        CHECK_EQ(t.offset_in_run % 256, 0);
    }
    REQUIRE_OK(wm_plan_get_tensor(plan, 1, &t));
    CHECK_EQ(t.run, WM_NO_INDEX);
    CHECK_STR_EQ(t.reason, "offset 0x10020 is not a multiple of the importer's tensor alignment "
                           "256 (target 'GPU', importer 'GPU'): no import can serve it where its "
                           "buffer needs it aligned");
    wm_plan_region region = {.struct_size = sizeof region};
    REQUIRE_OK(wm_plan_get_region(plan, 0, &region));
    CHECK(region.decision == WM_DECISION_IMPORT);
    CHECK_EQ(region.tensor_count, 3);
    CHECK_CONTAINS(region.reason, "1 tensor(s) (1000 bytes) left out: their offsets are not "
                                  "multiples of the importer's tensor alignment 256");
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.fallback_bytes, 1000);
    CHECK_EQ(totals.imported_bytes, 128 * KiB);
    wm_plan_destroy(plan);

    caps.tensor_alignment = 48;
    plan = NULL;
    CHECK(plan_three(&caps, &plan) == WM_ERROR_INVALID_ARGUMENT);
    CHECK(plan == NULL);
    CHECK_CONTAINS(wm_last_error(), "target 0 ('GPU'): tensor_alignment 48 is not a power of two");

    caps.struct_size = (uint32_t)offsetof(wm_importer_caps, tensor_alignment); /* 48: not read */
    REQUIRE_OK(plan_three(&caps, &plan));
    REQUIRE_OK(wm_plan_get_tensor(plan, 1, &t));
    CHECK(t.run != WM_NO_INDEX);
    REQUIRE_OK(wm_plan_get_totals(plan, &totals));
    CHECK_EQ(totals.fallback_bytes, 0);
    wm_plan_destroy(plan);

    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    wm_importer_caps now = {.struct_size = sizeof now};
    REQUIRE_OK(wm_importer_get_caps(cpu, &now));
    CHECK_EQ(now.tensor_alignment, 1); /* the default */
    wm_importer_destroy(cpu);
}

static void case_device_memory_and_policy_names(void) {
    CHECK_STR_EQ(wm_device_memory_name(WM_DEVICE_MEMORY_UNKNOWN), "unknown");
    CHECK_STR_EQ(wm_device_memory_name(WM_DEVICE_MEMORY_UNIFIED), "unified");
    CHECK_STR_EQ(wm_device_memory_name(WM_DEVICE_MEMORY_DISCRETE), "discrete");
    CHECK_STR_EQ(wm_device_memory_name((wm_device_memory)9), "?");
    CHECK_STR_EQ(wm_import_policy_name(WM_IMPORT_POLICY_UNIFIED_ONLY), "unified_only");
    CHECK_STR_EQ(wm_import_policy_name(WM_IMPORT_POLICY_ALWAYS), "always");
    CHECK_STR_EQ(wm_import_policy_name(WM_IMPORT_POLICY_NEVER), "never");
    CHECK_STR_EQ(wm_import_policy_name(WM_IMPORT_POLICY_FROM_OPTIONS), "from_options");
    CHECK_STR_EQ(wm_import_policy_name((wm_import_policy)5), "?");
    wm_model* model = NULL;
    REQUIRE_OK(wm_model_create(&model));
    CHECK(wm_model_set_target_import_policy(model, 0, WM_IMPORT_POLICY_NEVER) == WM_ERROR_INVALID_ARGUMENT);
    const wm_importer_caps caps = device_caps(1, 0);
    REQUIRE_OK(wm_model_add_target_caps(model, "GPU", NULL, &caps, NULL));
    CHECK(wm_model_set_target_import_policy(model, 0, (wm_import_policy)3) == WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "policy 3");
    CHECK(wm_model_set_target_import_policy(NULL, 0, WM_IMPORT_POLICY_NEVER) == WM_ERROR_INVALID_ARGUMENT);
    wm_model_destroy(model);
}

int main(void) {
    C_RUN(case_model_description_counts_and_indices);
    C_RUN(case_plan_options_init_fills_the_defaults);
    C_RUN(case_dense_region_is_one_aligned_import);
    C_RUN(case_interleaved_layout_gate_mode_falls_back_with_the_numbers);
    C_RUN(case_interleaved_layout_span_mode_pins_the_whole_span);
    C_RUN(case_interleaved_layout_runs_mode_imports_each_tensor_alone);
    C_RUN(case_tightness_gate_boundary_uses_one_mib_of_slack);
    C_RUN(case_tightness_gate_saturates_instead_of_wrapping);
    C_RUN(case_budget_and_merge_gap_reach_the_planner);
    C_RUN(case_max_import_size_cuts_at_tensor_boundaries);
    C_RUN(case_import_switch_option_and_environment);
    C_RUN(case_regions_are_ordered_by_target_then_file);
    C_RUN(case_device_memory_and_policy_shape_the_plan);
    C_RUN(case_first_version_structs_get_the_new_defaults);
    C_RUN(case_tensor_alignment_makes_a_misaligned_tensor_fall_back_alone);
    C_RUN(case_device_memory_and_policy_names);
    return c_check_finish();
}
