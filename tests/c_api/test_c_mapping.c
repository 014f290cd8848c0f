/* SPDX-License-Identifier: MIT */
/* The mapping policy through the C API: read-only unless an available non-CPU importer needs
 * writable pages and every file opens O_RDWR (probed here independently, also as nobody on a
 * 0444 shard), mapped files and sizes, MAP_SHARED writes reaching the file, make_read_only
 * making a stray store fault, the mapping options (populate, lock, base alignment) seen in the
 * process's own memory figures, and wm_memstat_read against /proc/self/status. */
#include "c_check.h"
#include "c_fake_importer.h"

#define KiB UINT64_C(1024)

/* AddressSanitizer intercepts mlock and makes it a no-op (its shadow memory). */
#if defined(__SANITIZE_ADDRESS__)
#define C_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define C_UNDER_ASAN 1
#endif
#endif
#ifndef C_UNDER_ASAN
#define C_UNDER_ASAN 0
#endif
#define MiB (UINT64_C(1024) * 1024)

/* A custom importer that needs writable pages (HSA-like). */
typedef struct writer {
    c_fake fake;
    wm_importer* importer;
} writer;

static bool writer_create(writer* w, bool available) {
    c_fake_init(&w->fake);
    w->fake.needs_writable_mapping = true;
    w->fake.unavailable = !available;
    w->fake.unavailable_reason = "writer asleep";
    wm_importer_vtable v = c_fake_vtable("fake-hsa");
    return wm_importer_create_custom(&v, &w->fake, &w->importer) == WM_OK;
}

/* What the policy must decide for `paths`, probed with open(2) like the policy does. */
/* The rule the library applies (wm_map_file_writable_shared): owned by our effective uid, with
 * the owner-write bit, and openable O_RDWR (a read-only mount is not). Not open(O_RDWR) alone:
 * root passes that on a 0444 file. */
static const char* first_unwritable(const char* const* paths, uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) {
        struct stat st;
        if (stat(paths[i], &st) != 0 || st.st_uid != geteuid() || (st.st_mode & S_IWUSR) == 0)
            return paths[i];
        const int fd = open(paths[i], O_RDWR);
        if (fd < 0) return paths[i];
        close(fd);
    }
    return NULL;
}

static void case_cpu_importer_alone_maps_read_only(void) {
    char path[512];
    REQUIRE(c_temp_file(MiB, 1, path));
    const char* paths[1] = {path};
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    wm_importer* importers[1] = {cpu};
    wm_mapping_decision* d = NULL;
    REQUIRE_OK(wm_decide_mapping(paths, 1, importers, 1, &d));
    CHECK(wm_mapping_decision_access(d) == WM_MAPPING_READ_ONLY);
    CHECK(wm_mapping_decision_reason(d) != NULL && wm_mapping_decision_reason(d)[0] != '\0');
    CHECK_STR_EQ(wm_mapping_decision_unwritable_path(d), "");
    wm_mapping_decision_destroy(d);
    wm_importer_destroy(cpu);
}

static void case_writable_when_an_available_importer_needs_it(void) {
    char a[512], b[512];
    REQUIRE(c_temp_file(MiB, 1, a));
    REQUIRE(c_temp_file(2 * MiB, 2, b));
    const char* paths[2] = {a, b};
    REQUIRE(first_unwritable(paths, 2) == NULL); /* we created them */
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    writer w;
    REQUIRE(writer_create(&w, true));
    wm_importer* importers[2] = {cpu, w.importer};
    wm_mapping_decision* d = NULL;
    REQUIRE_OK(wm_decide_mapping(paths, 2, importers, 2, &d));
    CHECK(wm_mapping_decision_access(d) == WM_MAPPING_WRITABLE);
    CHECK(wm_mapping_decision_reason(d) != NULL && wm_mapping_decision_reason(d)[0] != '\0');
    CHECK_STR_EQ(wm_mapping_decision_unwritable_path(d), "");
    wm_mapping_decision_destroy(d);
    CHECK(w.fake.caps_calls >= 1); /* the decision read the importer's caps */

    /* Unavailable, it asks for nothing. */
    writer asleep;
    REQUIRE(writer_create(&asleep, false));
    wm_importer* sleepy[2] = {cpu, asleep.importer};
    d = NULL;
    REQUIRE_OK(wm_decide_mapping(paths, 2, sleepy, 2, &d));
    CHECK(wm_mapping_decision_access(d) == WM_MAPPING_READ_ONLY);
    CHECK_STR_EQ(wm_mapping_decision_unwritable_path(d), "");
    wm_mapping_decision_destroy(d);

    /* The registry's defaults when no importer is given: without /dev/kfd, nothing available
     * needs writable pages (HSA is the only importer that does). */
    if (access("/dev/kfd", F_OK) != 0) {
        d = NULL;
        REQUIRE_OK(wm_decide_mapping(paths, 2, NULL, 0, &d));
        CHECK(wm_mapping_decision_access(d) == WM_MAPPING_READ_ONLY);
        wm_mapping_decision_destroy(d);
    }
    wm_importer_destroy(asleep.importer);
    wm_importer_destroy(w.importer);
    wm_importer_destroy(cpu);
}

typedef struct shard_check {
    const char* paths[2];
} shard_check;

/* In a child (as nobody when we are root): the decision against our own probe. */
static int decide_as_unprivileged(void* arg) {
    shard_check* s = (shard_check*)arg;
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) return 90;
    const char* expected = first_unwritable(s->paths, 2);
    if (expected == NULL) return 91; /* cannot make the case here */
    writer w;
    if (!writer_create(&w, true)) return 92;
    wm_importer* importers[1] = {w.importer};
    wm_mapping_decision* d = NULL;
    if (wm_decide_mapping(s->paths, 2, importers, 1, &d) != WM_OK) return 93;
    int result = 0;
    if (wm_mapping_decision_access(d) != WM_MAPPING_READ_ONLY) result |= 1;
    if (strcmp(c_str_(wm_mapping_decision_unwritable_path(d)), expected) != 0) {
        fprintf(stderr, "unwritable_path \"%s\", expected \"%s\"\n",
                c_str_(wm_mapping_decision_unwritable_path(d)), expected);
        result |= 2;
    }
    if (strstr(c_str_(wm_mapping_decision_reason(d)), expected) == NULL &&
        strstr(c_str_(wm_mapping_decision_reason(d)), "writ") == NULL)
        result |= 4;
    wm_mapping_decision_destroy(d);
    wm_importer_destroy(w.importer);
    return result;
}

static void case_one_unwritable_shard_keeps_the_whole_model_read_only(void) {
    char a[512], b[512];
    REQUIRE(c_temp_file(MiB, 1, a));
    REQUIRE(c_temp_file(MiB, 2, b));
    /* a: nobody's own file when we are root; b: 0444, which its owner made read-only. */
    if (geteuid() == 0) REQUIRE(chown(a, 65534, 65534) == 0);
    REQUIRE(chmod(a, 0644) == 0);
    REQUIRE(chmod(b, 0444) == 0);
    shard_check s = {{a, b}};
    const int status = c_in_child(decide_as_unprivileged, &s);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 90 || WEXITSTATUS(status) == 91)
        C_SKIP("cannot drop to nobody, or the 0444 shard is still writable here");
    CHECK_EQ(WEXITSTATUS(status), 0);
}

static void case_read_only_mapping_of_two_files(void) {
    char a[512], b[512];
    const uint64_t sizes[2] = {3 * MiB + 5, 100 * KiB + 1};
    REQUIRE(c_temp_file(sizes[0], 0x21, a));
    REQUIRE(c_temp_file(sizes[1], 0x42, b));
    const char* paths[2] = {a, b};
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(paths, 2, WM_MAPPING_READ_ONLY, NULL, &mapped));
    REQUIRE_EQ(wm_mapped_model_file_count(mapped), 2);
    const wm_mapped_file* files = wm_mapped_model_files(mapped);
    REQUIRE(files != NULL);
    for (uint32_t f = 0; f < 2; ++f) {
        CHECK_EQ((uintptr_t)files[f].base % c_page_size(), 0);
        CHECK_EQ(files[f].length, c_align_up(sizes[f], c_page_size()));
        CHECK_EQ(wm_mapped_model_file_size(mapped, f), sizes[f]);
        CHECK_PATTERN(files[f].base, sizes[f], f == 0 ? 0x21 : 0x42, 0);
    }
    CHECK(wm_mapped_model_access(mapped) == WM_MAPPING_READ_ONLY);
    CHECK(wm_mapped_model_is_read_only(mapped));
    CHECK_OK(wm_mapped_model_make_read_only(mapped)); /* idempotent */
    CHECK(wm_mapped_model_is_read_only(mapped));
    wm_mapped_model_destroy(mapped);
}

static void on_fault(int signal) {
    (void)signal;
    _exit(43);
}

/* In a child: stores into `arg`; exits 43 (or dies by a signal) when the store faults, 42 when
 * it went through. */
static int store_into(void* arg) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL); /* quiet; a sanitizer may keep its own handler */
    sigaction(SIGBUS, &sa, NULL);
    volatile unsigned char* p = (volatile unsigned char*)arg;
    *p = (unsigned char)(*p ^ 0xFF);
    return 42;
}

static bool faulted(int status) {
    return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 42);
}

static uint8_t file_byte(const char* path, uint64_t offset) {
    uint8_t byte = 0;
    const int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        if (pread(fd, &byte, 1, (off_t)offset) != 1) byte = 0;
        close(fd);
    }
    return byte;
}

static void case_writable_mapping_is_shared_and_read_only_after_reprotect(void) {
    char path[512];
    const uint64_t size = 2 * MiB + 3, at = 1234567;
    REQUIRE(c_temp_file(size, 0x33, path));
    const char* paths[1] = {path};
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_WRITABLE, NULL, &mapped));
    CHECK(wm_mapped_model_access(mapped) == WM_MAPPING_WRITABLE);
    CHECK(!wm_mapped_model_is_read_only(mapped));
    unsigned char* base = (unsigned char*)wm_mapped_model_files(mapped)[0].base;
    const uint8_t original = c_pattern_byte(0x33, at);
    REQUIRE_EQ(base[at], original);

    /* MAP_SHARED: a store reaches the file (a private mapping would keep it to itself). */
    base[at] = (unsigned char)(original ^ 0x5A);
    CHECK_EQ(file_byte(path, at), original ^ 0x5A);
    base[at] = original;
    CHECK_EQ(file_byte(path, at), original);

    CHECK_OK(wm_mapped_model_make_read_only(mapped));
    CHECK(wm_mapped_model_is_read_only(mapped));
    CHECK(wm_mapped_model_access(mapped) == WM_MAPPING_WRITABLE); /* how it was opened */
    const int status = c_in_child(store_into, base + at);
    CHECK(faulted(status)); /* the store faulted */
    CHECK_EQ(file_byte(path, at), original);
    CHECK_EQ(base[at], original);
    CHECK_OK(wm_mapped_model_make_read_only(mapped));
    wm_mapped_model_destroy(mapped);

    /* A read-only mapping faults too. */
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &mapped));
    base = (unsigned char*)wm_mapped_model_files(mapped)[0].base;
    const int ro = c_in_child(store_into, base + at);
    CHECK(faulted(ro));
    CHECK_EQ(file_byte(path, at), original);
    wm_mapped_model_destroy(mapped);
}

static bool memstat(wm_memstat* m) {
    memset(m, 0, sizeof *m);
    m->struct_size = sizeof *m;
    return wm_memstat_read(m) == WM_OK;
}

static void case_mapping_options_reach_the_mapping(void) {
    char path[512];
    const uint64_t size = 8 * MiB + 11;
    REQUIRE(c_temp_file(size, 0x44, path));
    const char* paths[1] = {path};
    wm_mapping_options mo;
    wm_mapping_options_init(&mo);
    CHECK(!mo.populate && !mo.will_need && !mo.lock);
    CHECK(mo.hint == WM_ACCESS_NORMAL);
    CHECK_EQ(mo.base_alignment, 0);

    /* base_alignment: 2 MiB aligned bases. */
    mo.base_alignment = 2 * MiB;
    mo.hint = WM_ACCESS_RANDOM;
    mo.will_need = true;
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, &mo, &mapped));
    CHECK_EQ((uintptr_t)wm_mapped_model_files(mapped)[0].base % (2 * MiB), 0);
    CHECK_PATTERN(wm_mapped_model_files(mapped)[0].base, size, 0x44, 0);
    wm_mapped_model_destroy(mapped);

    /* populate: the whole file is resident in this process's RssFile right away; writable
     * shared, it adds no anonymous memory (no private copy). */
    wm_memstat before, after;
    wm_mapping_options_init(&mo);
    mo.populate = true;
    mo.hint = WM_ACCESS_SEQUENTIAL;
    REQUIRE(memstat(&before));
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_WRITABLE, &mo, &mapped));
    REQUIRE(memstat(&after));
    if (before.rss_file >= 0 && after.rss_file >= 0)
        CHECK_MSG(after.rss_file - before.rss_file >= (int64_t)(size - 512 * KiB),
                  "RssFile grew by %" PRId64 " bytes for a populated %" PRIu64 "-byte file",
                  after.rss_file - before.rss_file, size);
    if (before.rss_anon >= 0 && after.rss_anon >= 0)
        CHECK_MSG(after.rss_anon - before.rss_anon < (int64_t)(2 * MiB),
                  "RssAnon grew by %" PRId64 " bytes", after.rss_anon - before.rss_anon);
    wm_mapped_model_destroy(mapped);

    /* lock: VmLck covers the mapping (where mlock is permitted). */
    wm_mapping_options_init(&mo);
    mo.lock = true;
    REQUIRE(memstat(&before));
    const wm_status locked = wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, &mo, &mapped);
    if (locked != WM_OK) {
        CHECK_STATUS(locked, WM_ERROR_IO);
        CHECK_CONTAINS(wm_last_error(), "mlock");
        printf("note: mlock not permitted here: %s\n", wm_last_error());
        return;
    }
    REQUIRE(memstat(&after));
#if C_UNDER_ASAN
    printf("note: AddressSanitizer makes mlock a no-op: the VmLck check is skipped\n");
    before.vm_lck = after.vm_lck = -1;
#endif
    if (before.vm_lck >= 0 && after.vm_lck >= 0)
        CHECK_MSG(after.vm_lck - before.vm_lck >= (int64_t)c_align_up(size, c_page_size()),
                  "VmLck grew by %" PRId64 " bytes", after.vm_lck - before.vm_lck);
    wm_mapped_model_destroy(mapped);
    REQUIRE(memstat(&after));
    if (before.vm_lck >= 0 && after.vm_lck >= 0) CHECK_EQ(after.vm_lck, before.vm_lck); /* unlocked */
}

/* A /proc/self/status field in bytes, or -1 when absent. */
static int64_t status_field(const char* name) {
    FILE* f = fopen("/proc/self/status", "r");
    if (f == NULL) return -1;
    char line[256];
    int64_t value = -1;
    const size_t n = strlen(name);
    while (fgets(line, sizeof line, f) != NULL) {
        long long kb = 0;
        if (strncmp(line, name, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%lld", &kb) == 1) {
            value = (int64_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return value;
}

static bool has_drm_client(void) {
    for (int fd = 0; fd < 1024; ++fd) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
        FILE* f = fopen(path, "r");
        if (f == NULL) continue;
        bool drm = false;
        while (!drm && fgets(line, sizeof line, f) != NULL) drm = strncmp(line, "drm-", 4) == 0;
        fclose(f);
        if (drm) return true;
    }
    return false;
}

static void case_memstat_reads_this_process(void) {
    const int64_t lck = status_field("VmLck"), pin = status_field("VmPin");
    const int64_t file = status_field("RssFile"), anon = status_field("RssAnon");
    const int64_t shmem = status_field("RssShmem");
    wm_memstat m;
    memset(&m, 0x5A, sizeof m);
    m.struct_size = sizeof m;
    REQUIRE_OK(wm_memstat_read(&m));
    CHECK_EQ(m.struct_size, sizeof m);
    /* Known wherever the kernel reports it (Linux >= 4.5 for the Rss* split). */
    if (file >= 0) {
        CHECK(m.rss_file >= 0);
        CHECK_MSG(m.rss_file > file - (int64_t)(8 * MiB) && m.rss_file < file + (int64_t)(8 * MiB),
                  "rss_file %" PRId64 ", /proc says %" PRId64, m.rss_file, file);
    }
    if (anon >= 0) {
        CHECK(m.rss_anon > 0);
        CHECK_MSG(m.rss_anon > anon - (int64_t)(16 * MiB) && m.rss_anon < anon + (int64_t)(16 * MiB),
                  "rss_anon %" PRId64 ", /proc says %" PRId64, m.rss_anon, anon);
    }
    if (shmem >= 0) CHECK(m.rss_shmem >= 0);
    if (lck >= 0) CHECK_EQ(m.vm_lck, lck);
    if (pin >= 0) CHECK_EQ(m.vm_pin, pin);
    CHECK(file >= 0 && anon >= 0 && lck >= 0); /* this is Linux: the fields exist */
    if (!has_drm_client()) {
        CHECK_EQ(m.drm_gtt_total, WM_MEMSTAT_UNKNOWN); /* unknown, never 0 */
        CHECK_EQ(m.drm_gtt_resident, WM_MEMSTAT_UNKNOWN);
        CHECK_EQ(m.drm_vram_total, WM_MEMSTAT_UNKNOWN);
        CHECK_EQ(m.drm_vram_resident, WM_MEMSTAT_UNKNOWN);
    }
}

int main(void) {
    C_RUN(case_cpu_importer_alone_maps_read_only);
    C_RUN(case_writable_when_an_available_importer_needs_it);
    C_RUN(case_one_unwritable_shard_keeps_the_whole_model_read_only);
    C_RUN(case_read_only_mapping_of_two_files);
    C_RUN(case_writable_mapping_is_shared_and_read_only_after_reprotect);
    C_RUN(case_mapping_options_reach_the_mapping);
    C_RUN(case_memstat_reads_this_process);
    return c_check_finish();
}
