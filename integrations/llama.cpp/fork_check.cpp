// A model file overwritten while a fork()ed child of the importing process lives (run.sh, file-change
// case fork). A child inherits every descriptor, the file guard's leased one included, and a read
// lease belongs to the open file description: it lasts while any descriptor of it is open. So
// before libweightmap's pthread_atfork handler, once an importing server died (killed, or exiting
// without freeing its model) a writer waited for its pre-forked worker to exit, or for
// lease-break-time (45 s). Now the child closes its copies of every guard's descriptors.
//   fork_check MODEL NEW1 NEW2 CHILD_SECONDS [control]
// 1. a server process loads MODEL (every layer on the device), decodes, forks a worker that
//    sleeps CHILD_SECONDS, and is killed (SIGKILL: nothing is freed); then cp(1) copies NEW1 over
//    MODEL, timed (writer_wait_after_exit_s), while the worker lives (worker_alive_after_write);
// 2. this process loads MODEL, decodes a prompt, forks such a worker, copies NEW2 over MODEL
//    (writer_wait_s: the move, whatever the worker holds), decodes the prompt again and compares
//    the logits (answers_after); resident_*_mib: RssAnon plus the resident pages of its mappings
//    of MODEL, before and after the move.
// `control` makes each worker with a raw clone(2), which runs no atfork handler: the worker keeps
// the lease, as every fork did before, and step 1's writer must wait for it. One line:
//   fork child=<fork|clone> writer_wait_after_exit_s=<s> worker_alive_after_write=<yes|no>
//   writer_wait_s=<s> answers_after=<same|changed|error> resident_before_mib=<n> resident_after_move_mib=<n>
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <climits>
#include <csignal>
#include <fstream>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char ** environ;

namespace {

// The logits of the prompt's last token, from an empty context.
bool prompt_logits(llama_context * ctx, const llama_model * model, std::vector<float> & out) {
    llama_memory_clear(llama_get_memory(ctx), true);
    std::vector<llama_token> tokens = { 1, 2, 3, 4, 5, 6, 7, 8 };
    if (llama_decode(ctx, llama_batch_get_one(tokens.data(), (int32_t) tokens.size())) != 0) {
        return false;
    }
    const float * logits = llama_get_logits_ith(ctx, -1);
    const int n = llama_vocab_n_tokens(llama_model_get_vocab(model));
    out.assign(logits, logits + n);
    return true;
}

// The pre-forked worker: sleeps and exits, touching nothing of the parent's (after a raw clone
// only system calls are safe in the child).
pid_t spawn_child(int seconds, bool raw_clone) {
    const pid_t pid = raw_clone ? (pid_t) syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0) : fork();
    if (pid == 0) {
        struct timespec t = { seconds, 0 };
        syscall(SYS_nanosleep, &t, nullptr);
        syscall(SYS_exit_group, 0);
    }
    return pid;
}

// cp NEW MODEL: the writer, in a process of its own; seconds until it finished, -1 if it failed.
double overwrite(const char * from, const char * to) {
    const auto start = std::chrono::steady_clock::now();
    char * argv[] = { (char *) "cp", (char *) from, (char *) to, nullptr };
    pid_t pid = 0;
    int status = 0;
    if (posix_spawnp(&pid, "cp", nullptr, nullptr, argv, environ) != 0 || waitpid(pid, &status, 0) != pid ||
        !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return -1;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// RssAnon plus the Rss of this process's mappings of `path`, in MiB.
long resident_mib(const char * path) {
    char real[PATH_MAX];
    const std::string file = realpath(path, real) ? real : path;
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool in_file = false;
    long kib = 0;
    while (std::getline(smaps, line)) {
        if (!line.empty() && isxdigit((unsigned char) line[0]) && line.find('-') < line.find(' ')) {
            in_file = line.size() >= file.size() && line.compare(line.size() - file.size(), file.size(), file) == 0;
        } else if (in_file && line.rfind("Rss:", 0) == 0) {
            kib += atol(line.c_str() + 4);
        }
    }
    std::ifstream status("/proc/self/status");
    while (std::getline(status, line)) {
        if (line.rfind("RssAnon:", 0) == 0) {
            kib += atol(line.c_str() + 8);
        }
    }
    return kib / 1024;
}

struct loaded {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    ~loaded() {
        llama_free(ctx);
        llama_model_free(model);
    }
};

bool load(const char * path, loaded & out) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 99;
    out.model = llama_model_load_from_file(path, mp);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 32;
    out.ctx = out.model ? llama_init_from_model(out.model, cp) : nullptr;
    return out.ctx != nullptr;
}

} // namespace

// Step 1's server: loads, decodes, forks the worker, reports the worker's pid on `ready`, and
// waits to be killed.
[[noreturn]] void serve_and_die(const char * path, int child_s, bool control, int ready) {
    llama_backend_init();
    loaded l;
    std::vector<float> logits;
    pid_t worker = -1;
    if (load(path, l) && prompt_logits(l.ctx, l.model, logits)) {
        worker = spawn_child(child_s, control);
    }
    if (write(ready, &worker, sizeof(worker)) != (ssize_t) sizeof(worker)) {
        _exit(1);
    }
    for (;;) {
        pause();
    }
}

// Step 1: seconds the writer waited after the server died; `alive`: its worker still lived then.
double writer_after_server_died(const char * path, const char * next, int child_s, bool control, bool & alive) {
    int ready[2];
    pid_t worker = -1;
    if (pipe(ready) != 0) {
        return -1;
    }
    const pid_t server = fork();
    if (server == 0) {
        serve_and_die(path, child_s, control, ready[1]);
    }
    const bool up = server > 0 && read(ready[0], &worker, sizeof(worker)) == (ssize_t) sizeof(worker) && worker > 0;
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, nullptr, 0);
    }
    close(ready[0]);
    close(ready[1]);
    if (!up) {
        fprintf(stderr, "fork_check: the server did not load, decode and fork\n");
        return -1;
    }
    const double waited = overwrite(next, path);
    alive = waitpid(worker, nullptr, WNOHANG) == 0; // reparented to us: we are a subreaper
    waitpid(worker, nullptr, 0);
    return waited;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL NEW1 NEW2 CHILD_SECONDS [control]\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    const int child_s = atoi(argv[4]);
    const bool control = argc > 5 && strcmp(argv[5], "control") == 0;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    bool worker_alive = false;
    // 1. before anything of llama.cpp runs here: the server is a fork of a process without threads
    const double waited_after_exit = writer_after_server_died(path, argv[2], child_s, control, worker_alive);
    // 2. this process serves while a worker lives, and the file changes
    llama_backend_init();
    std::vector<float> before, after;
    loaded second;
    if (!load(path, second) || !prompt_logits(second.ctx, second.model, before)) {
        fprintf(stderr, "fork_check: the second load or decode failed\n");
        return 1;
    }
    const pid_t child2 = spawn_child(child_s, control);
    const long resident_before = resident_mib(path);
    const double waited = overwrite(argv[3], path);
    usleep(300 * 1000); // inotify's events after the fact: the guard hears them within a poll
    const char * answers = !prompt_logits(second.ctx, second.model, after) ? "error" : after == before ? "same" : "changed";
    printf("fork child=%s writer_wait_after_exit_s=%.2f worker_alive_after_write=%s writer_wait_s=%.2f answers_after=%s "
           "resident_before_mib=%ld resident_after_move_mib=%ld\n", control ? "clone" : "fork", waited_after_exit,
           worker_alive ? "yes" : "no", waited, answers, resident_before, resident_mib(path));
    waitpid(child2, nullptr, 0);
    return child2 < 0 || waited < 0 || waited_after_exit < 0 ? 1 : 0;
}
