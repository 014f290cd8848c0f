/* SPDX-License-Identifier: MIT */
/* The split-ordering helper through the C API (split_sync.hpp, docs/split_sync.md): the
 * upstream race (a Vulkan split copying `input_embed` asynchronously, then an input-less CPU
 * split reusing that buffer type, must sync Vulkan), the drain, deferral, three backends, a
 * chain of event waits, the HIP deferral shape, sync_deferred_before_reuse, a rejected
 * description leaving the state unchanged, reset, and a graph ended without a drain. Every expected mask is derived by hand
 * from the rule: no split starts while an unordered split on another backend touches a buffer
 * type it touches (its own, plus those its input copies read). */
#include "c_check.h"

#define BIT(b) (UINT64_C(1) << (b))

static wm_split_desc split(uint32_t backend, bool async, uint64_t buffer_types, uint32_t n_inputs,
                           uint64_t from, bool copies_async, bool writes_read_later) {
    wm_split_desc d;
    wm_split_desc_init(&d);
    d.backend = backend;
    d.backend_async = async;
    d.buffer_types = buffer_types;
    d.n_inputs = n_inputs;
    d.input_backends = from;
    d.input_copies_async = copies_async;
    d.writes_read_later = writes_read_later;
    return d;
}

static wm_split_sync* helper(uint32_t n_backends, bool sync_deferred_before_reuse) {
    wm_split_sync_params p;
    wm_split_sync_params_init(&p);
    p.n_backends = n_backends;
    p.sync_deferred_before_reuse = sync_deferred_before_reuse;
    wm_split_sync* s = NULL;
    if (wm_split_sync_create(&p, &s) != WM_OK) {
        fprintf(stderr, "wm_split_sync_create: %s\n", wm_last_error());
        return NULL;
    }
    return s;
}

typedef struct expect {
    uint64_t sync_now, deferred;
} expect;

/* Feeds `splits` and checks each decision, then the drain. */
static void run_graph(wm_split_sync* s, const wm_split_desc* splits, const expect* want,
                      size_t count, uint64_t drain, const char* graph) {
    for (size_t i = 0; i < count; ++i) {
        wm_split_sync_decision d;
        memset(&d, 0xA5, sizeof d);
        d.struct_size = sizeof d;
        REQUIRE_OK(wm_split_sync_next(s, &splits[i], &d));
        CHECK_MSG(d.sync_now == want[i].sync_now,
                  "%s, split %zu: sync_now %#" PRIx64 ", expected %#" PRIx64, graph, i,
                  d.sync_now, want[i].sync_now);
        CHECK_MSG(d.deferred == want[i].deferred,
                  "%s, split %zu: deferred %#" PRIx64 ", expected %#" PRIx64, graph, i,
                  d.deferred, want[i].deferred);
        CHECK_EQ(d.struct_size, sizeof d);
    }
    const uint64_t got = wm_split_sync_finish(s);
    CHECK_MSG(got == drain, "%s: drain %#" PRIx64 ", expected %#" PRIx64, graph, got, drain);
}

static void case_defaults(void) {
    wm_split_sync_params p;
    memset(&p, 0xA5, sizeof p);
    wm_split_sync_params_init(&p);
    CHECK_EQ(p.struct_size, sizeof p);
    CHECK(!p.sync_deferred_before_reuse);
    wm_split_desc d;
    memset(&d, 0xA5, sizeof d);
    wm_split_desc_init(&d);
    CHECK_EQ(d.struct_size, sizeof d);
    CHECK_EQ(d.backend, 0);
    CHECK(!d.backend_async);
    CHECK_EQ(d.n_inputs, 0);
    CHECK_EQ(d.input_backends, 0);
    CHECK(d.input_copies_async); /* the safe assumption */
    CHECK_EQ(d.buffer_types, 0);
    CHECK(!d.writes_read_later);
}

/* Upstream ggml #26040. Backends: Vulkan 0 (async), CPU 1. Buffer types: Vulkan's 0, CPU's 1. */
static void case_upstream_vulkan_input_embed_race(void) {
    enum { VULKAN = 0, CPU = 1 };
    const uint64_t vk_buf = BIT(0), cpu_buf = BIT(1);
    const wm_split_desc splits[4] = {
        split(CPU, false, cpu_buf, 0, 0, true, true),           /* get_rows -> input_embed */
        split(VULKAN, true, vk_buf, 1, BIT(CPU), true, true),   /* copies input_embed, async */
        split(CPU, false, cpu_buf, 0, 0, true, false),          /* no inputs, reuses the region */
        split(VULKAN, true, vk_buf, 1, BIT(CPU), true, false),
    };
    /* 0: nothing in flight. 1: its copy waits for the (finished) CPU; Vulkan is the split's own
     * backend. 2: Vulkan's copy still reads cpu_buf, unordered: sync Vulkan. 3: the CPU is
     * synchronous and done. Drain: Vulkan's last split. */
    const expect want[4] = {{0, 0}, {0, 0}, {BIT(VULKAN), 0}, {0, 0}};
    wm_split_sync* s = helper(2, false);
    REQUIRE(s != NULL);
    run_graph(s, splits, want, 4, BIT(VULKAN), "upstream input_embed");

    /* The same helper, next graph: after the drain nothing is in flight. */
    run_graph(s, splits, want, 4, BIT(VULKAN), "upstream input_embed, second graph");
    wm_split_sync_destroy(s);

    /* Without the copy reading CPU memory (no writes_read_later), nothing makes the CPU split
     * race with Vulkan: no sync, Vulkan deferred and drained at the end. */
    const wm_split_desc quiet[3] = {
        split(VULKAN, true, vk_buf, 0, 0, true, false),
        split(CPU, false, cpu_buf, 0, 0, true, false),
        split(CPU, false, cpu_buf, 0, 0, true, false),
    };
    const expect quiet_want[3] = {{0, 0}, {0, BIT(VULKAN)}, {0, BIT(VULKAN)}};
    s = helper(2, false);
    REQUIRE(s != NULL);
    run_graph(s, quiet, quiet_want, 3, BIT(VULKAN), "disjoint buffer types");
    wm_split_sync_destroy(s);

    /* And sharing the buffer type directly races too. */
    const wm_split_desc shared[2] = {
        split(VULKAN, true, cpu_buf, 1, 0, true, false), /* a graph input from the host */
        split(CPU, false, cpu_buf, 0, 0, true, false),
    };
    const expect shared_want[2] = {{0, 0}, {BIT(VULKAN), 0}};
    s = helper(2, false);
    REQUIRE(s != NULL);
    run_graph(s, shared, shared_want, 2, 0, "shared buffer type");
    wm_split_sync_destroy(s);
}

/* Vulkan 0 (async, its type and the host's), CUDA 1 (async, a host input copied by the host),
 * CPU 2 on the host type without inputs: only Vulkan conflicts; CUDA stays deferred. */
static void case_three_backends(void) {
    const uint64_t vk_buf = BIT(0), cuda_buf = BIT(1), host_buf = BIT(2);
    const wm_split_desc splits[3] = {
        split(0, true, vk_buf | host_buf, 0, 0, true, false),
        split(1, true, cuda_buf, 1, 0, false, false),
        split(2, false, host_buf, 0, 0, true, false),
    };
    const expect want[3] = {{0, 0}, {0, BIT(0)}, {BIT(0), BIT(1)}};
    wm_split_sync* s = helper(3, false);
    REQUIRE(s != NULL);
    run_graph(s, splits, want, 3, BIT(1), "three backends");
    wm_split_sync_destroy(s);
}

/* A writes `shared`; B copies it asynchronously (its copy waited for A, and reads `shared`);
 * the CPU split touches `shared`: both conflict, but syncing B finishes A too. */
static void case_one_sync_covers_a_chain_of_event_waits(void) {
    const uint64_t shared = BIT(2);
    const wm_split_desc splits[3] = {
        split(0, true, shared, 0, 0, true, true),
        split(1, true, BIT(1), 1, BIT(0), true, false),
        split(2, false, shared, 0, 0, true, false),
    };
    const expect want[3] = {{0, 0}, {0, 0}, {BIT(1), 0}};
    wm_split_sync* s = helper(3, false);
    REQUIRE(s != NULL);
    run_graph(s, splits, want, 3, 0, "chain");
    wm_split_sync_destroy(s);
}

/* HIP 0 (async), CPU 1: the WAIT split (CPU, no inputs, its own type) runs while the shared
 * expert FFN runs on HIP: deferred, then HIP's host copy orders the last split; drain HIP. */
static void case_hip_shared_expert_deferral(void) {
    const uint64_t hip_buf = BIT(0), cpu_buf = BIT(1);
    const wm_split_desc splits[5] = {
        split(0, true, hip_buf, 0, 0, true, true),
        split(1, false, cpu_buf, 1, BIT(0), true, true),
        split(0, true, hip_buf, 1, BIT(1), false, true),
        split(1, false, cpu_buf, 0, 0, true, true),
        split(0, true, hip_buf, 1, BIT(1), false, false),
    };
    const expect want[5] = {{0, 0}, {0, 0}, {0, 0}, {0, BIT(0)}, {0, 0}};
    wm_split_sync* s = helper(2, false);
    REQUIRE(s != NULL);
    run_graph(s, splits, want, 5, BIT(0), "HIP deferral");
    wm_split_sync_destroy(s);
}

static void case_sync_deferred_before_reuse(void) {
    const wm_split_desc splits[3] = {
        split(0, true, BIT(0), 0, 0, true, false),
        split(1, false, BIT(1), 0, 0, true, false),
        split(0, true, BIT(0), 0, 0, true, false),
    };
    const expect lazy[3] = {{0, 0}, {0, BIT(0)}, {0, 0}};
    const expect eager[3] = {{0, 0}, {0, BIT(0)}, {BIT(0), 0}};
    wm_split_sync* s = helper(2, false);
    REQUIRE(s != NULL);
    run_graph(s, splits, lazy, 3, BIT(0), "lazy");
    wm_split_sync_destroy(s);
    s = helper(2, true);
    REQUIRE(s != NULL);
    run_graph(s, splits, eager, 3, BIT(0), "eager");
    wm_split_sync_destroy(s);
}

static void case_rejected_description_leaves_the_state_unchanged(void) {
    wm_split_sync* s = helper(3, false);
    REQUIRE(s != NULL);
    wm_split_sync_decision d = {.struct_size = sizeof d};
    wm_split_desc first = split(0, true, BIT(0), 0, 0, true, false);
    REQUIRE_OK(wm_split_sync_next(s, &first, &d));
    CHECK_EQ(d.sync_now, 0);

    static const struct {
        uint32_t backend;
        bool async;
        uint32_t n_inputs;
        uint64_t from;
        const char* says;
    } bad[] = {
        {3, true, 0, 0, "backend = 3"},                    /* out of range */
        {1, true, 1, BIT(5), "input_backends"},             /* names backend 5 of 3 */
        {1, true, 0, BIT(0), "n_inputs = 0"},               /* inputs without n_inputs */
        {2, true, 1, BIT(0) | BIT(1), "n_inputs = 1"},      /* two sources, one input */
        {0, false, 0, 0, "backend_async"},                  /* backend 0 was async */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        wm_split_desc desc = split(bad[i].backend, bad[i].async, BIT(0), bad[i].n_inputs,
                                   bad[i].from, true, false);
        wm_split_sync_decision untouched;
        memset(&untouched, 0x77, sizeof untouched);
        untouched.struct_size = sizeof untouched;
        CHECK_STATUS(wm_split_sync_next(s, &desc, &untouched), WM_ERROR_INVALID_ARGUMENT);
        CHECK_CONTAINS(wm_last_error(), bad[i].says);
        CHECK_CONTAINS(wm_last_error(), "split 1"); /* the split's index in the graph */
        CHECK_EQ(untouched.sync_now, UINT64_C(0x7777777777777777));
    }
    /* As if the rejected splits never came: backend 1 on backend 0's buffer type syncs 0, and
     * the drain is backend 1 alone. */
    wm_split_desc follow = split(1, true, BIT(0), 0, 0, true, false);
    REQUIRE_OK(wm_split_sync_next(s, &follow, &d));
    CHECK_EQ(d.sync_now, BIT(0));
    CHECK_EQ(d.deferred, 0);
    CHECK_EQ(wm_split_sync_finish(s), BIT(1));

    /* reset: forgets everything. */
    REQUIRE_OK(wm_split_sync_next(s, &first, &d));
    wm_split_sync_reset(s);
    wm_split_desc cpu = split(2, false, BIT(0), 0, 0, true, false);
    REQUIRE_OK(wm_split_sync_next(s, &cpu, &d));
    CHECK_EQ(d.sync_now, 0); /* backend 0's split was forgotten */
    CHECK_EQ(wm_split_sync_finish(s), 0);
    wm_split_sync_destroy(s);
}

static void case_sixty_four_backends(void) {
    wm_split_sync* s = helper(64, false);
    REQUIRE(s != NULL);
    wm_split_sync_decision d = {.struct_size = sizeof d};
    for (uint32_t b = 0; b < 64; ++b) {
        wm_split_desc desc = split(b, true, BIT(b % 8), 0, 0, true, false);
        REQUIRE_OK(wm_split_sync_next(s, &desc, &d));
        /* backend b - 8 touched the same type and is still in flight */
        CHECK_EQ(d.sync_now, b >= 8 ? BIT(b - 8) : 0);
    }
    /* in flight at the end: the last eight (the others were synced) */
    CHECK_EQ(wm_split_sync_finish(s), UINT64_C(0xFF) << 56);
    wm_split_desc last = split(64, true, 0, 0, 0, true, false);
    CHECK_STATUS(wm_split_sync_next(s, &last, &d), WM_ERROR_INVALID_ARGUMENT);
    wm_split_sync_destroy(s);
}

/* A graph ended without a drain: the Vulkan split's work is carried into the next graph, where a
 * CPU split of its buffer type syncs it, unless the engine synchronized it in between. */
static void case_end_graph_carries_into_the_next_graph(void) {
    wm_split_sync* s = helper(2, false);
    REQUIRE(s != NULL);
    wm_split_sync_decision d = {.struct_size = sizeof d};
    wm_split_desc vulkan = split(0, true, BIT(0), 0, 0, true, false);
    wm_split_desc cpu = split(1, false, BIT(0), 0, 0, true, false);
    REQUIRE_OK(wm_split_sync_next(s, &vulkan, &d));
    wm_split_sync_end_graph(s);
    CHECK_EQ(wm_split_sync_in_flight(s), BIT(0));
    REQUIRE_OK(wm_split_sync_next(s, &cpu, &d));
    CHECK_EQ(d.sync_now, BIT(0));
    CHECK_EQ(wm_split_sync_in_flight(s), 0);

    REQUIRE_OK(wm_split_sync_next(s, &vulkan, &d));
    wm_split_sync_end_graph(s);
    wm_split_sync_synchronized(s, BIT(0));
    CHECK_EQ(wm_split_sync_in_flight(s), 0);
    REQUIRE_OK(wm_split_sync_next(s, &cpu, &d));
    CHECK_EQ(d.sync_now, 0);
    wm_split_sync_destroy(s);

    wm_split_sync_end_graph(NULL);
    wm_split_sync_synchronized(NULL, BIT(0));
    CHECK_EQ(wm_split_sync_in_flight(NULL), 0);
}

int main(void) {
    C_RUN(case_defaults);
    C_RUN(case_upstream_vulkan_input_embed_race);
    C_RUN(case_three_backends);
    C_RUN(case_one_sync_covers_a_chain_of_event_waits);
    C_RUN(case_hip_shared_expert_deferral);
    C_RUN(case_sync_deferred_before_reuse);
    C_RUN(case_rejected_description_leaves_the_state_unchanged);
    C_RUN(case_sixty_four_backends);
    C_RUN(case_end_graph_carries_into_the_next_graph);
    return c_check_finish();
}
