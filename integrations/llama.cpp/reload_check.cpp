// Load, free, load a model in one process (integrations/llama.cpp/run.sh, case reload): after each
// free, no mapping of the model file is left (libweightmap's own mapping included) and RssAnon
// and RssFile are back where the first free left them; each load decodes one batch, so imported
// buffers are used before they are freed. Prints one line per load and exits 1 on a leak.
//   reload_check MODEL [LOADS]
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <climits>
#include <unistd.h>

namespace {

long kib_of(const char * key) { // from /proc/self/status
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind(key, 0) == 0) {
            return atol(line.c_str() + strlen(key));
        }
    }
    return -1;
}

int mappings_of(const std::string & path) { // lines of /proc/self/maps naming the file
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) {
        n += line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    }
    return n;
}

bool load_and_decode(const char * path) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 99;
    llama_model * model = llama_model_load_from_file(path, mp);
    if (model == nullptr) {
        return false;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 32;
    llama_context * ctx = llama_init_from_model(model, cp);
    bool ok = ctx != nullptr;
    if (ok) {
        std::vector<llama_token> tokens(8, 1);
        ok = llama_decode(ctx, llama_batch_get_one(tokens.data(), (int32_t) tokens.size())) == 0;
        llama_free(ctx);
    }
    llama_model_free(model);
    return ok;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [LOADS]\n", argv[0]);
        return 2;
    }
    char real[PATH_MAX];
    if (realpath(argv[1], real) == nullptr) {
        perror(argv[1]);
        return 2;
    }
    const int loads = argc > 2 ? atoi(argv[2]) : 2;
    llama_backend_init();
    long anon_first = -1, file_first = -1;
    bool leak = false;
    for (int i = 1; i <= loads; i++) {
        if (!load_and_decode(real)) {
            fprintf(stderr, "reload_check: load %d failed\n", i);
            return 1;
        }
        const int left = mappings_of(real);
        const long anon = kib_of("RssAnon:"), file = kib_of("RssFile:");
        if (i == 1) {
            anon_first = anon;
            file_first = file;
        }
        // a leaked import or mapping would hold the model's pages (file) or a copy (anon): 16 MiB
        // of slack covers the allocator's and the Vulkan driver's own caches
        const bool back = anon <= anon_first + 16 * 1024 && file <= file_first + 16 * 1024;
        printf("reload load=%d mappings_after_free=%d rss_anon_mib=%ld rss_file_mib=%ld back=%s\n", i, left,
               anon / 1024, file / 1024, back ? "yes" : "no");
        leak = leak || left != 0 || !back;
    }
    llama_backend_free();
    return leak ? 1 : 0;
}
