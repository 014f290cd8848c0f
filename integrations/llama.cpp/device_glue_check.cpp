// The llama.cpp glue's importing half (src/llama-weightmap-device.cpp of the patched tree) on the
// fake CUDA driver and the fake HSA runtime, with a stand-in for ggml-cuda's
// "ggml_backend_dev_buffer_from_device_ptr" that checks every pointer it is handed against the
// mapping: which host page it names (the fakes' device pointers are the host address plus an
// aperture of their own, so the method shows in the address), that the whole range lies in the
// model's mapping, and that the bytes there are the file's (read with pread, not through the
// mapping the glue made).
//
//   device_glue_check cuda MODEL GGUF FAKE_CUDA_LIBRARY [HEADER]  (WEIGHTMAP_FAKE_CUDA_MODEL picks the device)
//   device_glue_check hsa CASE GGUF FAKE_HSA_LIBRARY              (CASE read-only | refused)
//   device_glue_check real-header VOCAB_GGUF OUT [poison]         (writes the model below)
// Prints its summary lines (run.sh checks them) and exits 0 unless the pointers, bytes or releases
// were wrong; the summary's numbers are judged by run.sh. Every run also prints a dirty line: the
// model file's dirty pages (the kernel's smaps) while imported and whether its mtime moved.
//
// Tensors are sized as the glue sizes them (llama_weightmap_in_place_extent) against a stand-in
// for ggml-cuda's buffer type: alignment 128 and get_alloc_size's padding of quantized rows (both
// as ggml-cuda.cu at the pinned commit has them). With HEADER the summary is a cuda-real-header
// line for that file: a real tokenizer header (models/ggml-vocab-*.gguf of the pinned tree, whose
// length sets where the data starts) with tensors of popular models' shapes appended by
// real-header.

#include "llama-weightmap-device.h"

#include "ggml-backend-impl.h"
#include "gguf.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

struct tensor_ref {
    std::string name;
    uint64_t offset;
    uint64_t size;   // ggml_nbytes
    uint64_t extent; // what the glue imports: size plus the padding it reads; 0: copied
    uint64_t alloc;  // what the buffer type allocates (ggml_backend_tensor_alloc's bound)
};

// What the wrapper saw.
struct oracle {
    int fd = -1;
    ino_t inode = 0;
    uint64_t aperture = 0;        // the fake's device address - host address, for the registered method
    bool hsa = false;
    long wraps = 0, frees = 0, bad = 0, direct = 0, mapped = 0, writable = 0;
} seen;

void complain(const char * what, const void * ptr, size_t size) {
    fprintf(stderr, "device_glue_check: %s: %p, %zu bytes\n", what, ptr, size);
    seen.bad++;
}

// Where [host, host + size) lies in the model file, from the kernel's own list of this process's
// mappings (not from anything the glue says): -1 unless one shared mapping of the file's inode
// holds all of it. `writable`: that mapping's permissions.
long long file_offset_of(uintptr_t host, size_t size, bool & writable) {
    FILE * maps = fopen("/proc/self/maps", "r");
    char line[4096];
    long long found = -1;
    while (maps != nullptr && found < 0 && fgets(line, sizeof(line), maps) != nullptr) {
        unsigned long long start = 0, end = 0, offset = 0, inode = 0;
        char perms[8] = "", dev[32] = "";
        if (sscanf(line, "%llx-%llx %7s %llx %31s %llu", &start, &end, perms, &offset, dev, &inode) == 6 &&
            host >= start && host + size <= end && (ino_t) inode == seen.inode && perms[3] == 's') {
            found = (long long) (offset + (host - start));
            writable = perms[1] == 'w';
        }
    }
    if (maps != nullptr) {
        fclose(maps);
    }
    return found;
}

// The host address behind a device pointer the glue hands to the wrapper: the pointer itself
// (a device that reads the mapping directly), or the fake's alias of a registered or locked
// range; -1 when neither is in a mapping of the file.
long long resolve(const void * ptr, size_t size, bool & writable, const char *& host) {
    const auto p = (uintptr_t) ptr;
    long long at = seen.hsa ? -1 : file_offset_of(p, size, writable);
    if (at >= 0) {
        seen.direct++;
        host = (const char *) p;
        return at;
    }
    at = p >= seen.aperture ? file_offset_of(p - seen.aperture, size, writable) : -1;
    if (at >= 0) {
        seen.mapped++;
        host = (const char *) (p - seen.aperture);
    }
    return at;
}

// The file's bytes, and zeros past its end (the last page of a mapping).
bool same_as_file(const char * host, long long at, size_t size) {
    std::vector<char> bytes(size, 0);
    return pread(seen.fd, bytes.data(), size, (off_t) at) >= 0 && memcmp(bytes.data(), host, size) == 0;
}

void * test_get_base(ggml_backend_buffer_t buf) { return buf->context; }
void test_free(ggml_backend_buffer_t /*buf*/) { seen.frees++; }
const char * test_buft_name(ggml_backend_buffer_type_t /*buft*/) { return "WRAP"; }
size_t test_buft_alignment(ggml_backend_buffer_type_t /*buft*/) { return 128; }

// ggml_backend_cuda_buffer_type_get_alloc_size (ggml-cuda.cu, TAG_ALLOC_SIZE_EXPAND): a quantized
// tensor whose ne0 is not a multiple of MATRIX_ROW_PADDING (512, common.cuh) gets the rest of a row.
size_t test_buft_alloc_size(ggml_backend_buffer_type_t /*buft*/, const ggml_tensor * t) {
    size_t size = ggml_nbytes(t);
    if (ggml_is_quantized(t->type) && t->ne[0] % 512 != 0) {
        size += ggml_row_size(t->type, 512 - t->ne[0] % 512);
    }
    return size;
}

ggml_backend_buffer_type test_buft = {
    /* .iface = */ { test_buft_name, nullptr, test_buft_alignment, nullptr, test_buft_alloc_size, nullptr },
    /* .device  = */ nullptr,
    /* .context = */ nullptr,
};

// The stand-in for ggml_backend_cuda_buffer_from_ptr. The host address the glue passes must be
// the mapping behind the device pointer: ggml-hip copies out of the buffer through it.
ggml_backend_buffer_t test_wrap(ggml_backend_dev_t /*dev*/, void * ptr, const void * given_host, size_t size) {
    seen.wraps++;
    bool writable = false;
    const char * host = nullptr;
    const long long at = resolve(ptr, size, writable, host);
    if (at < 0) {
        complain("a pointer to no shared mapping of the model file, nor its registered alias", ptr, size);
    } else if (!same_as_file(host, at, size)) {
        complain("bytes that differ from the file", ptr, size);
    } else if (given_host != host) {
        complain("a host address that is not the mapping behind the device pointer", ptr, size);
    }
    seen.writable += writable;
    ggml_backend_buffer_i iface = {};
    iface.free_buffer = test_free;
    iface.get_base    = test_get_base;
    return ggml_backend_buffer_init(&test_buft, iface, ptr, size);
}

// Each tensor's place in the file and the extent the glue imports (0: the glue copies it).
std::vector<tensor_ref> read_tensors(const char * path, int fd, uint64_t file_size) {
    ggml_context * meta = nullptr;
    gguf_init_params params = { true, &meta };
    gguf_context * gguf = gguf_init_from_file(path, params);
    std::vector<tensor_ref> out;
    if (gguf == nullptr) {
        return out;
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf); i++) {
        const char * name = gguf_get_tensor_name(gguf, i);
        const uint64_t offset = gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, i);
        const ggml_tensor * t = ggml_get_tensor(meta, name);
        std::string why;
        const uint64_t extent = llama_weightmap_in_place_extent(&test_buft, t, fd, offset, file_size, why);
        if (extent == 0) {
            fprintf(stderr, "device_glue_check: %s copied: %s\n", name, why.c_str());
        }
        out.push_back({ name, offset, ggml_nbytes(t), extent, test_buft_alloc_size(&test_buft, t) });
    }
    gguf_free(gguf);
    ggml_free(meta);
    return out;
}

template <class F>
F fake_fn(void * fake, const char * name) {
    auto fn = (F) dlsym(fake, name);
    if (fn == nullptr) {
        fprintf(stderr, "device_glue_check: the fake has no %s\n", name);
        exit(2);
    }
    return fn;
}

struct totals {
    double imported_fraction = 0; // of every tensor's bytes, copied ones included
    uint64_t device_bytes = 0;
    uint64_t imported_bytes = 0;  // tensor bytes (padding not included) read in place
    uint64_t planned_bytes = 0;   // the plan's imports (wm_plan_totals::pinned_bytes)
    size_t wrapped_live = 0;      // buffers wrapped while the placement lived
    uint64_t dirty_kib = 0;       // the model file's dirty pages while imported
};

// Dirty KiB over this process's mappings of the model file (smaps: Shared_Dirty, and
// Private_Dirty, which is what a page cache page mapped by this process alone shows).
uint64_t dirty_kib() {
    FILE * smaps = fopen("/proc/self/smaps", "r");
    char line[4096];
    bool in_file = false;
    uint64_t kib = 0;
    while (smaps != nullptr && fgets(line, sizeof(line), smaps) != nullptr) {
        unsigned long long start = 0, end = 0, offset = 0, inode = 0, value = 0;
        char perms[8] = "", dev[32] = "";
        if (sscanf(line, "%llx-%llx %7s %llx %31s %llu", &start, &end, perms, &offset, dev, &inode) == 6) {
            in_file = (ino_t) inode == seen.inode;
        } else if (in_file && (sscanf(line, "Shared_Dirty: %llu kB", &value) == 1 || sscanf(line, "Private_Dirty: %llu kB", &value) == 1)) {
            kib += value;
        }
    }
    if (smaps != nullptr) {
        fclose(smaps);
    }
    return kib;
}

// Plans every tensor the glue would import onto the device and, unless `trial`, imports; the
// placement is released before returning. A trial is what 0018 makes of a -fit trial on the
// device's side: an importer of its own and a plan, nothing executed.
totals place(llama_weightmap_device_importer & importer, const std::vector<tensor_ref> & tensors, size_t file_size,
        const wm_mapped_file & file, bool trial = false) {
    const char * path = "model";
    totals out;
    wm_model * model = nullptr;
    uint32_t target = 0;
    bool ok = wm_model_create(&model) == WM_OK && wm_model_add_file(model, path, file_size, nullptr) == WM_OK &&
        wm_model_add_target(model, "WRAP0", importer.handle(), &target) == WM_OK &&
        wm_model_set_target_import_policy(model, target, importer.policy()) == WM_OK;
    std::vector<const tensor_ref *> added; // in order
    for (const tensor_ref & t : tensors) {
        out.device_bytes += t.size;
        if (t.extent > 0) {
            ok = ok && wm_model_add_tensor(model, t.name.c_str(), 0, t.offset, t.extent, target, nullptr) == WM_OK;
            added.push_back(&t);
        }
    }
    wm_plan_options options;
    wm_plan_options_init(&options);
    options.import_enabled = 1;
    wm_plan * plan = nullptr;
    wm_placement * placement = nullptr;
    wm_importer * importers[] = { importer.handle() };
    ok = ok && wm_plan_create(model, &options, &plan) == WM_OK;
    wm_plan_totals planned = {};
    planned.struct_size = sizeof(planned);
    ok = ok && wm_plan_get_totals(plan, &planned) == WM_OK;
    out.planned_bytes = planned.pinned_bytes;
    if (ok && trial) {
        wm_plan_destroy(plan);
        wm_model_destroy(model);
        return out;
    }
    ok = ok && wm_execute(model, plan, &file, 1, importers, 1, nullptr, &placement) == WM_OK;
    if (!ok) {
        fprintf(stderr, "device_glue_check: %s\n", wm_last_error());
        exit(2);
    }
    uint64_t imported = 0;
    for (uint32_t i = 0; i < added.size(); i++) {
        wm_tensor_location where = {};
        where.struct_size = sizeof(where);
        wm_placement_import imp = {};
        imp.struct_size = sizeof(imp);
        if (wm_placement_locate(placement, i, &where) != WM_OK || !where.imported) {
            continue;
        }
        imported += added[i]->size;
        // ggml_backend_tensor_alloc asserts that the tensor's allocation, padding included,
        // lies in its buffer; the glue copies the whole context where it would not
        if (wm_placement_get_import(placement, where.import_index, &imp) != WM_OK ||
            where.offset_in_buffer + added[i]->alloc > imp.buffer.size) {
            complain(("an import that does not hold " + added[i]->name + "'s padding").c_str(), where.host_address,
                (size_t) added[i]->alloc);
        }
    }
    out.imported_bytes = imported;
    out.imported_fraction = out.device_bytes > 0 ? (double) imported / (double) out.device_bytes : 0.0;
    out.wrapped_live = importer.wrapped_buffers;
    out.dirty_kib = dirty_kib();
    wm_placement_destroy(placement);
    wm_plan_destroy(plan);
    wm_model_destroy(model);
    return out;
}

// --- real-header: a real tokenizer header with tensors of popular models' shapes --------------

struct shape {
    const char * name;
    ggml_type type;
    int64_t ne0, ne1, ne2; // ne0 as the model has it; rows and experts cut down to keep files small
};

// Rows ggml-cuda pads (ne0 % 512 != 0, issue 43), each followed by a norm as in a real layer.
const shape popular[] = {
    { "blk.0.ffn_down_exps.weight", GGML_TYPE_MXFP4, 2880,  64, 4 }, // gpt-oss: every MXFP4 expert
    { "blk.0.ffn_norm.weight",      GGML_TYPE_F32,   2880,   1, 1 },
    { "blk.1.ffn_down.weight",      GGML_TYPE_Q4_K,  3840, 128, 1 }, // Gemma-3 12B
    { "blk.1.ffn_norm.weight",      GGML_TYPE_F32,   3840,   1, 1 },
    { "blk.2.ffn_down.weight",      GGML_TYPE_Q4_K,  5376,  96, 1 }, // Gemma-3 27B
    { "blk.2.ffn_norm.weight",      GGML_TYPE_F32,   5376,   1, 1 },
    { "blk.3.ffn_down.weight",      GGML_TYPE_Q4_K, 11008,  64, 1 }, // Llama-2-7B
    { "blk.3.ffn_norm.weight",      GGML_TYPE_F32,   4096,   1, 1 },
    { "blk.4.ffn_down_exps.weight", GGML_TYPE_Q4_K,   768,  64, 8 }, // Qwen3-30B-A3B expert down
    { "blk.4.ffn_norm.weight",      GGML_TYPE_F32,   2048,   1, 1 },
    { "blk.5.ffn_down_exps.weight", GGML_TYPE_Q8_0,  1408,  64, 4 }, // GLM-4.5-Air (not a multiple of 256)
    { "output_norm.weight",         GGML_TYPE_F32,   4096,   1, 1 },
};

// Weights ~N(0, 0.02) quantized as the model's type; norms near 1, as trained ones are.
void fill(ggml_tensor * t, uint32_t & seed) {
    const int64_t n = ggml_nelements(t);
    std::vector<float> values((size_t) n);
    for (float & v : values) {
        seed = seed * 1664525u + 1013904223u;
        const float u = (float) (seed >> 8) / (float) (1u << 24) - 0.5f;
        v = t->type == GGML_TYPE_F32 ? 1.0f + 0.2f * u : 0.07f * u;
    }
    if (t->type == GGML_TYPE_F32) {
        memcpy(t->data, values.data(), ggml_nbytes(t));
    } else {
        ggml_quantize_chunk(t->type, values.data(), t->data, 0, n / t->ne[0], t->ne[0], nullptr);
    }
}

// poison: the norm after the first padded tensor is all 0xFF bytes (NaN as F32, and as its
// neighbour's padding an MXFP4 scale of 0xFF, NaN): the case the glue must copy alone.
int write_real_header(const char * vocab_path, const char * out_path, bool poison) {
    gguf_init_params params = { true, nullptr };
    gguf_context * vocab = gguf_init_from_file(vocab_path, params);
    if (vocab == nullptr) {
        fprintf(stderr, "device_glue_check: cannot read %s\n", vocab_path);
        return 2;
    }
    size_t bytes = 0;
    for (const shape & sh : popular) {
        bytes += ggml_row_size(sh.type, sh.ne0) * sh.ne1 * sh.ne2 + ggml_tensor_overhead();
    }
    ggml_init_params init = { bytes + 4096, nullptr, false };
    ggml_context * data = ggml_init(init);
    gguf_context * out = gguf_init_empty();
    gguf_set_kv(out, vocab); // the header as the tokenizer's converter wrote it
    uint32_t seed = 43;
    for (const shape & sh : popular) {
        ggml_tensor * t = ggml_new_tensor_3d(data, sh.type, sh.ne0, sh.ne1, sh.ne2);
        ggml_set_name(t, sh.name);
        fill(t, seed);
        if (poison && &sh == &popular[1]) {
            memset(t->data, 0xFF, ggml_nbytes(t));
        }
        gguf_add_tensor(out, t);
    }
    const bool written = gguf_write_to_file(out, out_path, false);
    gguf_free(out);
    gguf_free(vocab);
    ggml_free(data);
    return written ? 0 : 2;
}

} // namespace

int main(int argc, char ** argv) {
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "real-header") == 0) {
        return write_real_header(argv[2], argv[3], argc == 5 && strcmp(argv[4], "poison") == 0);
    }
    if ((argc != 5 && argc != 6) || (strcmp(argv[1], "cuda") != 0 && strcmp(argv[1], "hsa") != 0)) {
        fprintf(stderr, "usage: device_glue_check cuda|hsa MODEL|CASE GGUF FAKE_LIBRARY [HEADER] | real-header VOCAB OUT\n");
        return 2;
    }
    const bool hsa = strcmp(argv[1], "hsa") == 0;
    const char * path = argv[3];
    const char * header = argc == 6 ? argv[5] : nullptr;
    void * fake = dlopen(argv[4], RTLD_NOW | RTLD_LOCAL); // the importer's dlopen gets this instance
    if (fake == nullptr) {
        fprintf(stderr, "device_glue_check: %s\n", dlerror());
        return 2;
    }
    seen.hsa = hsa;
    seen.aperture = hsa ? fake_fn<uint64_t (*)()>(fake, "fake_hsa_agent_aperture")()
                        : fake_fn<uint64_t (*)()>(fake, "fake_cuda_mapped_aperture")();
    seen.fd = open(path, O_RDONLY | O_CLOEXEC);
    // a file just written stays dirty in the page cache until writeback: from here on, every
    // dirty page is one this run made
    if (seen.fd >= 0 && fsync(seen.fd) != 0) {
        fprintf(stderr, "device_glue_check: fsync %s: %s\n", path, strerror(errno));
        return 2;
    }
    struct stat st = {};
    const off_t file_size = seen.fd >= 0 && fstat(seen.fd, &st) == 0 ? st.st_size : -1;
    seen.inode = st.st_ino;
    const struct timespec mtime_before = st.st_mtim;
    const std::vector<tensor_ref> tensors = read_tensors(path, seen.fd, (uint64_t) file_size);
    if (tensors.empty() || file_size <= 0) {
        fprintf(stderr, "device_glue_check: cannot read %s\n", path);
        return 2;
    }

    llama_weightmap_device_params params;
    params.kind = hsa ? llama_weightmap_import_kind::hsa : llama_weightmap_import_kind::cuda;
    params.name = hsa ? "ROCm0" : "CUDA0";
    params.description = "fake";
    params.tensor_alignment = LLAMA_WEIGHTMAP_KERNEL_ALIGNMENT; // what params_for gives ggml-cuda's 128
    params.wrap = test_wrap;
    params.library_path = argv[4];
    llama_weightmap_device_importer importer(params);
    std::string why;
    bool available = importer.available(why);

    // the probe's import of the first page, then the whole file mapped as the glue maps it
    const long page = sysconf(_SC_PAGESIZE);
    const size_t length = ((size_t) file_size + page - 1) / page * page;
    if (available) {
        llama_weightmap_first_page first = importer.import_first_page(seen.fd, (size_t) page, path);
        available = first.buf != nullptr;
        why = first.reason;
        importer.release_first_page(first);
    }
    const wm_mapped_file whole = llama_weightmap_map_file(seen.fd, length, path);
    // pinned from here on (the probe's one page is before): two -fit trials, then the load
    const auto pinned_total = hsa ? fake_fn<uint64_t (*)()>(fake, "fake_hsa_locked_bytes_total")
                                  : fake_fn<uint64_t (*)()>(fake, "fake_cuda_pinned_bytes_total");
    const uint64_t pinned_before = pinned_total();
    const int fit_trials = 2;
    // the control: trials that execute their plan, as they did before 0018, pin once more each
    const char * old_trials = getenv("DEVICE_GLUE_CHECK_TRIALS_IMPORT");
    for (int i = 0; available && whole.base && i < fit_trials; i++) {
        llama_weightmap_device_importer state(params);
        place(state, tensors, (size_t) file_size, whole, old_trials == nullptr || strcmp(old_trials, "1") != 0);
    }
    const totals t = available && whole.base ? place(importer, tensors, (size_t) file_size, whole) : totals{};
    const uint64_t pinned = pinned_total() - pinned_before;
    if (whole.base != nullptr) {
        munmap(whole.base, whole.length);
    }
    struct stat after = {};
    const bool mtime_unchanged = fstat(seen.fd, &after) == 0 && after.st_mtim.tv_sec == mtime_before.tv_sec &&
        after.st_mtim.tv_nsec == mtime_before.tv_nsec;

    const char * method = !available || t.imported_fraction == 0 ? "unavailable" :
        seen.direct > 0 && seen.mapped == 0 ? "direct" : seen.mapped > 0 && seen.direct == 0 ? (hsa ? "locked" : "register") : "mixed";
    if (hsa) {
        printf("llama.cpp hsa-glue case=%s imported_fraction=%.4f wrapped_buffers=%zu\n", argv[2], t.imported_fraction, t.wrapped_live);
    } else if (header != nullptr) {
        printf("llama.cpp cuda-real-header file=%s model=%s device_mib=%.2f imported_fraction=%.4f\n", header, argv[2],
            (double) t.device_bytes / (1024.0 * 1024.0), t.imported_fraction);
    } else {
        printf("llama.cpp cuda-glue model=%s method=%s imported_fraction=%.4f wrapped_buffers=%zu\n", argv[2], method,
            t.imported_fraction, t.wrapped_live);
    }
    if (header == nullptr) printf("llama.cpp dirty case=%s-%s importer=%s shared_dirty_kib=%llu mtime_unchanged=%s\n", argv[1], argv[2],
        hsa ? "hsa" : "cuda", (unsigned long long) t.dirty_kib, mtime_unchanged ? "yes" : "no");
    // the fake's own count of what its lock / registration pinned (none populated-only here)
    const bool pinning = hsa || strcmp(argv[2], "orin") == 0; // the importers that pin what they import
    if (header == nullptr && pinning && t.planned_bytes > 0) printf("llama.cpp pinned model=%s planned_mib=%.2f pinned_mib_total=%.2f fit_trials=%d\n",
        hsa ? "hsa" : argv[2], (double) t.planned_bytes / (1024.0 * 1024.0), (double) pinned / (1024.0 * 1024.0), fit_trials);
    fprintf(stderr, "device_glue_check: %s %s: %s\n", argv[1], argv[2], available ? "imports" : why.c_str());
    // what wm-doctor's answer is compared with (run.sh's run_doctor): every tensor is the device's,
    // imported or copied, whether or not the device imports at all
    uint64_t device_bytes = 0;
    for (const tensor_ref & ref : tensors) {
        device_bytes += ref.size;
    }
    fprintf(stderr, "device_glue_check: totals available=%s device_bytes=%llu imported_bytes=%llu\n", available ? "yes" : "no",
        (unsigned long long) device_bytes, (unsigned long long) t.imported_bytes);
    const long live = hsa ? fake_fn<long (*)()>(fake, "fake_hsa_live_locks")() : fake_fn<long (*)()>(fake, "fake_cuda_live_registrations")();
    if (seen.writable > 0) {
        complain("writable pages: the glue maps the model read-only", nullptr, 0);
    }
    if (seen.bad > 0 || seen.wraps != seen.frees || live != 0 || importer.wrapped_buffers != 0) {
        fprintf(stderr, "device_glue_check: %ld bad pointers, %ld wraps, %ld frees, %ld live in the fake, %zu still wrapped\n",
            seen.bad, seen.wraps, seen.frees, live, importer.wrapped_buffers);
        return 1;
    }
    return 0;
}
