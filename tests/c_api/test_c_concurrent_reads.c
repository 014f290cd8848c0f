/* SPDX-License-Identifier: MIT */
/* weightmap.h lets several threads read one wm_importer at once: wm_importer_get_caps and
 * wm_importer_available hand out strings owned by the importer, valid until it is destroyed.
 * They once overwrote one per-handle string on every call, so a pointer an earlier caller still
 * held changed under it (and under ThreadSanitizer, four threads gave five data races). */
#include "c_check.h" /* first: it sets _POSIX_C_SOURCE */

#include <pthread.h>
#include <string.h>

/* An engine importer whose caps notes and unavailability reason change on every call: the
 * library reads the notes once, at creation, and keeps each reason it handed out. */
typedef struct {
    int caps_calls;
    int available_calls;
} changing;

static const char* const notes[2] = {"first note, long enough to live on the heap",
                                     "other note, long enough to live on the heap"};
static const char* const reasons[2] = {"first reason, long enough for the heap too",
                                       "other reason, long enough for the heap too"};

static void changing_caps(void* user, wm_importer_caps* caps) {
    changing* c = (changing*)user;
    caps->device_memory_note = notes[c->caps_calls++ % 2];
    caps->file_pages_note = notes[c->caps_calls % 2];
}
static bool changing_available(void* user, char* reason, size_t size) {
    changing* c = (changing*)user;
    snprintf(reason, size, "%s", reasons[c->available_calls++ % 2]);
    return false;
}
static wm_status refuse_import(void* user, void* host, uint64_t size, wm_imported_buffer* out,
                               char* reason, size_t reason_size) {
    (void)user, (void)host, (void)size, (void)out, (void)reason, (void)reason_size;
    return WM_ERROR_UNSUPPORTED;
}
static wm_status release_nothing(void* user, const wm_imported_buffer* buffer) {
    (void)user, (void)buffer;
    return WM_OK;
}

static wm_importer* create_changing(changing* c) {
    wm_importer_vtable vtable;
    wm_importer* importer = NULL;
    memset(&vtable, 0, sizeof vtable);
    vtable.struct_size = sizeof vtable;
    vtable.name = "changing";
    vtable.caps = changing_caps;
    vtable.available = changing_available;
    vtable.import = refuse_import;
    vtable.release = release_nothing;
    if (wm_importer_create_custom(&vtable, c, &importer) != WM_OK) return NULL;
    return importer;
}

/* One thread's calls: every string it was handed must still read as it did. */
static void case_strings_handed_out_stay_valid_for_the_importer(void) {
    changing c = {0, 0};
    wm_importer* importer = create_changing(&c);
    wm_importer_caps first, later;
    const char* first_reason = NULL;
    const char* later_reason = NULL;
    memset(&first, 0, sizeof first);
    memset(&later, 0, sizeof later);
    first.struct_size = later.struct_size = sizeof first;
    REQUIRE(importer != NULL);
    REQUIRE_OK(wm_importer_get_caps(importer, &first));
    CHECK(!wm_importer_available(importer, &first_reason));
    REQUIRE_OK(wm_importer_get_caps(importer, &later));
    CHECK(!wm_importer_available(importer, &later_reason));
    /* the notes are the caps callback's at creation, fixed from then on */
    CHECK_STR_EQ(first.device_memory_note, notes[0]);
    CHECK_STR_EQ(first.file_pages_note, notes[1]);
    CHECK_STR_EQ(later.device_memory_note, notes[0]);
    CHECK(first.device_memory_note == later.device_memory_note);
    /* each reason as it was given, the first one too */
    CHECK_STR_EQ(first_reason, reasons[0]);
    CHECK_STR_EQ(later_reason, reasons[1]);
    wm_importer_destroy(importer);
}

enum { THREADS = 4, CALLS = 2000 };

typedef struct {
    wm_importer* importer;
    const char* expect_note;   /* what device_memory_note must read */
    const char* expect_reason; /* what the reason must read; NULL: available */
    int wrong;
} reader;

static void* read_repeatedly(void* arg) {
    reader* r = (reader*)arg;
    for (int i = 0; i < CALLS; ++i) {
        wm_importer_caps caps;
        const char* reason = NULL;
        memset(&caps, 0, sizeof caps);
        caps.struct_size = sizeof caps;
        const bool available = wm_importer_available(r->importer, &reason);
        if (wm_importer_get_caps(r->importer, &caps) != WM_OK ||
            strcmp(caps.device_memory_note, r->expect_note) != 0)
            ++r->wrong;
        if (available != (r->expect_reason == NULL) ||
            strcmp(reason, r->expect_reason != NULL ? r->expect_reason : "") != 0)
            ++r->wrong;
    }
    return NULL;
}

/* Four threads read one importer's caps and availability; none sees another's string change. */
static void case_threads_read_one_importer_at_once(void) {
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    pthread_t threads[THREADS];
    reader readers[THREADS];
    for (int t = 0; t < THREADS; ++t) {
        readers[t].importer = cpu;
        readers[t].expect_note = "the CPU reads its own memory";
        readers[t].expect_reason = NULL;
        readers[t].wrong = 0;
        REQUIRE(pthread_create(&threads[t], NULL, read_repeatedly, &readers[t]) == 0);
    }
    for (int t = 0; t < THREADS; ++t) {
        pthread_join(threads[t], NULL);
        CHECK_EQ(readers[t].wrong, 0);
    }
    wm_importer_destroy(cpu);
}

int main(void) {
    C_RUN(case_strings_handed_out_stay_valid_for_the_importer);
    C_RUN(case_threads_read_one_importer_at_once);
    return c_check_finish();
}
