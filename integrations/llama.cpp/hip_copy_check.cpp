// Copies out of a wrapped ggml-hip buffer, as ROCm performs them: the series' buffer-from-ptr.cu
// (compiled with GGML_USE_HIP) against fake-hip/ (ROCclr's copy semantics, each with its source)
// and libweightmap's HSA importer on the fake HSA runtime (an agent address other than the host
// one, as on an APU). Each copy ggml-cuda makes out of an unowned buffer (get_tensor, its 2d and
// async forms: to host memory; cpy_tensor: to device memory) must return the file's bytes; the
// same copies made as upstream ggml-cuda makes them (hipMemcpyAsync of the agent address) run as
// a control, each in a child, and must fail (a CPU read of a GPU address).
//
//   hip_copy_check MODEL FAKE_HSA_LIBRARY
// One line per case: llama.cpp hip-copy case=<name> result=<ok|sigsegv|...> bytes_equal=<yes|no|->
// Exit 0 when every wrapped case is ok with equal bytes, the wrap check refuses a missing host
// address, and every control fails; else 1.
#include "ggml-cuda/buffer-from-ptr.cuh"

#include <weightmap/backends/hsa.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct mapped_file {
    int fd = -1;
    const char * base = nullptr;
    size_t size = 0;
};

bool equal_to_file(const mapped_file & f, const void * bytes, size_t at, size_t size) {
    std::vector<char> want(size);
    return pread(f.fd, want.data(), size, (off_t) at) == (ssize_t) size && memcmp(want.data(), bytes, size) == 0;
}

int report(const char * name, const std::string & result, const char * equal) {
    printf("llama.cpp hip-copy case=%s result=%s bytes_equal=%s\n", name, result.c_str(), equal);
    return result == "ok" && strcmp(equal, "yes") == 0 ? 0 : 1;
}

// get_tensor and get_tensor_2d: rows of `width` bytes, `pitch` apart, from `at` in the buffer.
int read_to_host(const char * name, const ggml_cuda_wrapped_memory & mem, const mapped_file & f, size_t at,
                 size_t width, size_t pitch, size_t rows) {
    std::vector<char> out(width * rows);
    const hipError_t err = ggml_cuda_wrapped_read(mem, out.data(), width, mem.device + at, pitch, width, rows, false, nullptr);
    bool equal = err == hipSuccess;
    for (size_t r = 0; equal && r < rows; r++) {
        equal = equal_to_file(f, out.data() + r * width, at + r * pitch, width);
    }
    return report(name, hipGetErrorString(err) == std::string("hipSuccess") ? "ok" : hipGetErrorString(err), equal ? "yes" : "no");
}

// cpy_tensor: into memory the runtime allocated, then read back as ggml-cuda reads its own.
int read_to_device(const ggml_cuda_wrapped_memory & mem, const mapped_file & f, size_t at, size_t size) {
    void * dev = nullptr;
    std::vector<char> back(size);
    hipError_t err = hipMalloc(&dev, size);
    if (err == hipSuccess) {
        err = ggml_cuda_wrapped_read(mem, dev, size, mem.device + at, size, size, 1, true, nullptr);
    }
    if (err == hipSuccess) {
        err = hipMemcpy(back.data(), dev, size, hipMemcpyDeviceToHost);
    }
    hipFree(dev);
    const bool equal = err == hipSuccess && equal_to_file(f, back.data(), at, size);
    return report("cpy", err == hipSuccess ? "ok" : hipGetErrorString(err), equal ? "yes" : "no");
}

// Upstream's copy of the agent address, in a child: its fate is the line. 0 when it failed.
int control(const char * name, const ggml_cuda_wrapped_memory & mem, const mapped_file & f, size_t size, bool to_device) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        std::vector<char> out(size);
        void * dst = out.data();
        if (to_device && hipMalloc(&dst, size) != hipSuccess) {
            _exit(3);
        }
        const hipError_t err = hipMemcpyAsync(dst, mem.device, size, to_device ? hipMemcpyDeviceToDevice : hipMemcpyDeviceToHost, nullptr);
        if (to_device && err == hipSuccess) {
            hipMemcpy(out.data(), dst, size, hipMemcpyDeviceToHost);
        }
        _exit(err != hipSuccess ? 2 : equal_to_file(f, out.data(), 0, size) ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    const std::string result = WIFSIGNALED(status) ? (WTERMSIG(status) == SIGSEGV ? "sigsegv" : "signal") :
                               WEXITSTATUS(status) <= 1 ? "ok" : "error";
    report(name, result, WIFEXITED(status) && WEXITSTATUS(status) <= 1 ? (WEXITSTATUS(status) == 0 ? "yes" : "no") : "-");
    return result == "ok" && WEXITSTATUS(status) == 0 ? 1 : 0;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: hip_copy_check MODEL FAKE_HSA_LIBRARY\n");
        return 1;
    }
    mapped_file f;
    struct stat st = {};
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
    f.fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (f.fd < 0 || fstat(f.fd, &st) != 0 || (size_t) st.st_size < 4 * page) {
        fprintf(stderr, "hip_copy_check: %s: not a readable file of 4 pages or more\n", argv[1]);
        return 1;
    }
    f.size = (size_t) st.st_size / page * page;
    // read-only and shared, as the series maps a model for ROCm (0017)
    void * base = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
    if (base == MAP_FAILED) {
        perror("hip_copy_check: mmap");
        return 1;
    }
    f.base = (const char *) base;

    wm_hsa_importer_params params;
    wm_hsa_importer_params_init(&params);
    params.library_path = argv[2];
    wm_importer * hsa = nullptr;
    wm_imported_buffer got = {};
    if (wm_importer_create_hsa(&params, &hsa) != WM_OK || wm_importer_import(hsa, base, f.size, &got) != WM_OK) {
        fprintf(stderr, "hip_copy_check: the HSA import failed: %s\n", wm_last_error());
        return 1;
    }
    if (got.device_address == got.host_address) {
        fprintf(stderr, "hip_copy_check: the fake HSA runtime returned the host address: the controls would prove nothing\n");
        return 1;
    }
    const ggml_cuda_wrapped_memory mem = { (const char *) got.device_address, (const char *) got.host_address, f.size };

    int failed = 0;
    char why[256] = "";
    const bool refused = !ggml_cuda_device_can_read(0, mem.device, nullptr, f.size, 32, why, sizeof(why));
    printf("llama.cpp hip-copy case=wrap-without-host result=%s reason=\"%s\"\n", refused ? "refused" : "accepted", why);
    failed += !refused || !ggml_cuda_device_can_read(0, mem.device, mem.host, f.size, 32, why, sizeof(why));
    failed += read_to_host("get", mem, f, page + 96, 3000, 3000, 1);
    failed += read_to_host("get-2d", mem, f, 64, 100, page, 3);
    failed += read_to_device(mem, f, 2 * page + 32, page);
    std::vector<char> past(64);
    const bool bounded = ggml_cuda_wrapped_read(mem, past.data(), 64, mem.device + f.size - 32, 64, 64, 1, false, nullptr) != hipSuccess;
    printf("llama.cpp hip-copy case=past-the-end result=%s\n", bounded ? "refused" : "accepted");
    failed += !bounded;
    failed += control("upstream-get", mem, f, page, false);
    failed += control("upstream-cpy", mem, f, page, true);

    wm_importer_release(hsa, &got);
    wm_importer_destroy(hsa);
    munmap(base, f.size);
    close(f.fd);
    return failed == 0 ? 0 : 1;
}
