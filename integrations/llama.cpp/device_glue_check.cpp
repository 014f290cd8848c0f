// The llama.cpp glue's importing half (src/llama-weightmap-device.cpp of the patched tree) on the
// fake CUDA driver and the fake HSA runtime, with a stand-in for ggml-cuda's
// "ggml_backend_dev_buffer_from_device_ptr" that checks every pointer it is handed against the
// mapping: which host page it names (the fakes' device pointers are the host address plus an
// aperture of their own, so the method shows in the address), that the whole range lies in the
// model's mapping, and that the bytes there are the file's (read with pread, not through the
// mapping the glue made).
//
//   device_glue_check cuda MODEL GGUF FAKE_CUDA_LIBRARY   (WEIGHTMAP_FAKE_CUDA_MODEL picks the device)
//   device_glue_check hsa CASE GGUF FAKE_HSA_LIBRARY      (CASE read-only | writable)
// Prints one summary line (run.sh checks it) and exits 0 unless the pointers, bytes or releases
// were wrong; the summary's numbers are judged by run.sh.

#include "llama-weightmap-device.h"

#include "ggml-backend-impl.h"
#include "gguf.h"

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
    uint64_t size;
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

ggml_backend_buffer_type test_buft = {
    /* .iface = */ { test_buft_name, nullptr, test_buft_alignment, nullptr, nullptr, nullptr },
    /* .device  = */ nullptr,
    /* .context = */ nullptr,
};

// The stand-in for ggml_backend_cuda_buffer_from_ptr.
ggml_backend_buffer_t test_wrap(ggml_backend_dev_t /*dev*/, void * ptr, size_t size) {
    seen.wraps++;
    bool writable = false;
    const char * host = nullptr;
    const long long at = resolve(ptr, size, writable, host);
    if (at < 0) {
        complain("a pointer to no shared mapping of the model file, nor its registered alias", ptr, size);
    } else if (!same_as_file(host, at, size)) {
        complain("bytes that differ from the file", ptr, size);
    }
    seen.writable += writable;
    ggml_backend_buffer_i iface = {};
    iface.free_buffer = test_free;
    iface.get_base    = test_get_base;
    return ggml_backend_buffer_init(&test_buft, iface, ptr, size);
}

std::vector<tensor_ref> read_tensors(const char * path) {
    ggml_context * meta = nullptr;
    gguf_init_params params = { true, &meta };
    gguf_context * gguf = gguf_init_from_file(path, params);
    std::vector<tensor_ref> out;
    if (gguf == nullptr) {
        return out;
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf); i++) {
        const char * name = gguf_get_tensor_name(gguf, i);
        out.push_back({ name, gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, i), ggml_nbytes(ggml_get_tensor(meta, name)) });
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
    double imported_fraction = 0;
    size_t wrapped_live = 0;
};

// Plans every tensor onto the device and imports; the placement is released before returning.
totals place(llama_weightmap_device_importer & importer, const std::vector<tensor_ref> & tensors, size_t file_size,
        const wm_mapped_file & file) {
    const char * path = "model";
    totals out;
    wm_model * model = nullptr;
    uint32_t target = 0;
    bool ok = wm_model_create(&model) == WM_OK && wm_model_add_file(model, path, file_size, nullptr) == WM_OK &&
        wm_model_add_target(model, "WRAP0", importer.handle(), &target) == WM_OK &&
        wm_model_set_target_import_policy(model, target, importer.policy()) == WM_OK;
    for (const tensor_ref & t : tensors) {
        ok = ok && wm_model_add_tensor(model, t.name.c_str(), 0, t.offset, t.size, target, nullptr) == WM_OK;
    }
    wm_plan_options options;
    wm_plan_options_init(&options);
    options.import_enabled = 1;
    wm_plan * plan = nullptr;
    wm_placement * placement = nullptr;
    wm_importer * importers[] = { importer.handle() };
    ok = ok && wm_plan_create(model, &options, &plan) == WM_OK &&
        wm_execute(model, plan, &file, 1, importers, 1, nullptr, &placement) == WM_OK;
    if (!ok) {
        fprintf(stderr, "device_glue_check: %s\n", wm_last_error());
        exit(2);
    }
    wm_plan_totals t = {};
    t.struct_size = sizeof(t);
    wm_plan_get_totals(wm_placement_plan(placement), &t);
    out.imported_fraction = t.device_bytes > 0 ? (double) t.imported_bytes / (double) t.device_bytes : 0.0;
    out.wrapped_live = importer.wrapped_buffers;
    wm_placement_destroy(placement);
    wm_plan_destroy(plan);
    wm_model_destroy(model);
    return out;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 5 || (strcmp(argv[1], "cuda") != 0 && strcmp(argv[1], "hsa") != 0)) {
        fprintf(stderr, "usage: device_glue_check cuda|hsa MODEL|CASE GGUF FAKE_LIBRARY\n");
        return 2;
    }
    const bool hsa = strcmp(argv[1], "hsa") == 0;
    const char * path = argv[3];
    void * fake = dlopen(argv[4], RTLD_NOW | RTLD_LOCAL); // the importer's dlopen gets this instance
    if (fake == nullptr) {
        fprintf(stderr, "device_glue_check: %s\n", dlerror());
        return 2;
    }
    seen.hsa = hsa;
    seen.aperture = hsa ? fake_fn<uint64_t (*)()>(fake, "fake_hsa_agent_aperture")()
                        : fake_fn<uint64_t (*)()>(fake, "fake_cuda_mapped_aperture")();
    const std::vector<tensor_ref> tensors = read_tensors(path);
    seen.fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st = {};
    const off_t file_size = seen.fd >= 0 && fstat(seen.fd, &st) == 0 ? st.st_size : -1;
    seen.inode = st.st_ino;
    if (tensors.empty() || file_size <= 0) {
        fprintf(stderr, "device_glue_check: cannot read %s\n", path);
        return 2;
    }

    llama_weightmap_device_params params;
    params.kind = hsa ? llama_weightmap_import_kind::hsa : llama_weightmap_import_kind::cuda;
    params.name = hsa ? "ROCm0" : "CUDA0";
    params.description = "fake";
    params.tensor_alignment = 128; // ggml-cuda's buffer type alignment
    params.wrap = test_wrap;
    params.library_path = argv[4];
    llama_weightmap_device_importer importer(params);
    std::string why;
    const bool available = importer.available(why);

    // the mapping the probe chooses, then the whole file mapped so
    const long page = sysconf(_SC_PAGESIZE);
    const size_t length = ((size_t) file_size + page - 1) / page * page;
    bool writable = false;
    if (available) {
        llama_weightmap_first_page first = importer.import_first_page(seen.fd, (size_t) page, path);
        writable = first.writable;
        importer.release_first_page(first);
    }
    const wm_mapped_file whole = llama_weightmap_map_file(seen.fd, length, writable, path);
    const totals t = available && whole.base ? place(importer, tensors, (size_t) file_size, whole) : totals{};

    const char * method = !available || t.imported_fraction == 0 ? "unavailable" :
        seen.direct > 0 && seen.mapped == 0 ? "direct" : seen.mapped > 0 && seen.direct == 0 ? (hsa ? "locked" : "register") : "mixed";
    if (hsa) {
        printf("llama.cpp hsa-glue case=%s imported_fraction=%.4f wrapped_buffers=%zu\n", writable ? "writable" : "read-only",
            t.imported_fraction, t.wrapped_live);
        fprintf(stderr, "device_glue_check: hsa %s: %s, mapping %s\n", argv[2], available ? "available" : why.c_str(),
            writable ? "writable" : "read-only");
    } else {
        printf("llama.cpp cuda-glue model=%s method=%s imported_fraction=%.4f wrapped_buffers=%zu\n", argv[2], method,
            t.imported_fraction, t.wrapped_live);
        fprintf(stderr, "device_glue_check: cuda %s: %s\n", argv[2], available ? "available" : why.c_str());
    }
    const long live = hsa ? fake_fn<long (*)()>(fake, "fake_hsa_live_locks")() : fake_fn<long (*)()>(fake, "fake_cuda_live_registrations")();
    if (seen.writable > 0 && !writable) {
        complain("writable pages where the probe chose a read-only mapping", nullptr, 0);
    }
    if (seen.bad > 0 || seen.wraps != seen.frees || live != 0 || importer.wrapped_buffers != 0) {
        fprintf(stderr, "device_glue_check: %ld bad pointers, %ld wraps, %ld frees, %ld live in the fake, %zu still wrapped\n",
            seen.bad, seen.wraps, seen.frees, live, importer.wrapped_buffers);
        return 1;
    }
    return 0;
}
