// SPDX-License-Identifier: MIT
// Large sequential reads of the planned extents (populate) and of the fallback tensors (copy),
// split into chunks that several threads read in parallel with pread.
#include "weightmap/populate.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "internal/model_file.hpp"
#include "internal/sys_hooks.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 // Linux 5.14; older kernels answer EINVAL
#endif

namespace wm {
namespace {

// One read: `size` bytes at `offset` of `file`, for tensor `tensor` at `tensor_offset` (copy) or
// for the mapping (populate: tensor == no_index).
struct Job {
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::uint32_t tensor = no_index;
    std::uint64_t tensor_offset = 0;
    FileExtent extent{}; // populate: the planned extent this chunk is part of, for messages
};

// The model's files opened O_RDONLY (never written), with their sizes now; closed on destruction.
class OpenFiles {
public:
    ~OpenFiles() {
        for (int fd : fds_)
            if (fd >= 0) internal::syscalls().close_file(fd);
    }
    Status open(const ModelDesc& model) {
        fds_.reserve(model.files.size()); // no bad_alloc between an open and its push_back
        sizes_.reserve(model.files.size());
        for (const FileDesc& f : model.files) {
            auto file = internal::open_model_file(f.path);
            if (!file) return std::move(file).error();
            fds_.push_back(file->fd);
            sizes_.push_back(static_cast<std::uint64_t>(file->st.st_size));
        }
        return {};
    }
    int fd(std::uint32_t i) const { return fds_[i]; }
    std::uint64_t size(std::uint32_t i) const { return sizes_[i]; }

private:
    std::vector<int> fds_;
    std::vector<std::uint64_t> sizes_;
};

// The whole range or an error naming the file and where the data ended.
Status read_fully(int fd, void* dst, std::uint64_t size, std::uint64_t offset,
                  const std::string& path) {
    auto* out = static_cast<std::byte*>(dst);
    std::uint64_t done = 0;
    while (done < size) {
        const ssize_t n = internal::syscalls().read_at(fd, out + done, size - done,
                                                       static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return make_error(ErrorKind::io, fmt::format("'{}': read at offset {}: {}", path,
                                                         offset + done, std::strerror(errno)));
        if (n == 0)
            return make_error(ErrorKind::io,
                              fmt::format("'{}': the file ends at offset {}, before the {} bytes "
                                          "at offset {} the plan reads (truncated after "
                                          "planning?)", path, offset + done, size, offset));
        done += static_cast<std::uint64_t>(n);
    }
    return {};
}

// Checks every extent lies inside its file as it is now: within its last page, which is as far as
// the planner's page-aligned extents reach (reads stop at the end of the file).
Status check_extents(const ModelDesc& model, const OpenFiles& files,
                     Span<const FileExtent> extents) {
    for (const FileExtent& e : extents) {
        if (e.file >= model.files.size())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("extent names file {} of {}", e.file, model.files.size()));
        const std::uint64_t size = files.size(e.file);
        const std::uint64_t mapped = align_up_saturating(size, host_page_size());
        if (e.offset > size || e.size > mapped - e.offset)
            return make_error(ErrorKind::io,
                              fmt::format("'{}': the file ends at offset {}, before the extent "
                                          "[{}, +{}) (truncated after planning?)",
                                          model.files[e.file].path, size, e.offset, e.size));
    }
    return {};
}

// The model's files, opened by the first thread that needs them and checked against the
// extents then. Only a kernel before 5.14 needs them (pread): MADV_POPULATE_READ reads through
// the caller's mappings, and a path may by now name another file than the one mapped, whose
// size proves nothing (issue 44 item 7).
class FilesOnDemand {
public:
    FilesOnDemand(const ModelDesc& model, Span<const FileExtent> extents)
        : model_(model), extents_(extents) {}
    Status open() {
        std::lock_guard lock(mutex_);
        if (!tried_) {
            tried_ = true;
            status_ = files_.open(model_);
            if (status_) status_ = check_extents(model_, files_, extents_);
        }
        return status_;
    }
    int fd(std::uint32_t i) const { return files_.fd(i); }

private:
    const ModelDesc& model_;
    Span<const FileExtent> extents_;
    std::mutex mutex_;
    bool tried_ = false;
    Status status_;
    OpenFiles files_;
};

// Runs `work` over `jobs` on several threads, the caller's included; the first failure (or a
// cancel from the progress callback) stops the rest at their next job.
class JobRunner {
public:
    // `buffer()` returns this thread's chunk_size read buffer (made on first use), or null when
    // there is no memory for it.
    using Work = std::function<Status(const Job&, const std::function<std::byte*()>& buffer)>;

    JobRunner(const std::vector<Job>& jobs, const ReadOptions& options, std::uint64_t total)
        : jobs_(jobs), options_(options), total_(total) {}

    Status run(const Work& work) {
        // Default: one thread per file, at most 4 and the hardware's: two streams on one file
        // measured slower than one (1,548 against 1,947 MB/s for populate on a cold 1 GiB file).
        const std::uint32_t hardware = std::max(1u, std::thread::hardware_concurrency());
        std::vector<std::uint32_t> ids;
        for (const Job& job : jobs_) ids.push_back(job.file);
        std::sort(ids.begin(), ids.end());
        const auto files = static_cast<std::uint32_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
        std::uint32_t threads = options_.threads != 0 ? options_.threads
                                                      : std::min({4u, hardware, std::max(files, 1u)});
        threads = static_cast<std::uint32_t>(std::min<std::size_t>(threads, jobs_.size()));
        std::vector<std::thread> helpers;
        try {
            helpers.reserve(threads);
            for (std::uint32_t t = 1; t < threads; ++t)
                helpers.emplace_back([&] { guarded_loop(work, false); });
        } catch (...) {
            // system_error or bad_alloc: fewer threads than asked; the ones running share the work
        }
        guarded_loop(work, true);
        for (std::thread& h : helpers) h.join();
        report_completion();
        return std::move(outcome_);
    }

private:
    // A read buffer mapped for this call alone: malloc would keep a freed one resident (its
    // mmap threshold grows after the first free), and RssAnon must not grow.
    struct Buffer {
        explicit Buffer(std::uint64_t size) : size(std::max<std::uint64_t>(size, 1)) {
            void* p = ::mmap(nullptr, this->size, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            data = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
        }
        ~Buffer() {
            if (data != nullptr) ::munmap(data, size);
        }
        Buffer(const Buffer&) = delete;
        Buffer& operator=(const Buffer&) = delete;
        std::uint64_t size;
        std::byte* data;
    };

    // loop(), with nothing escaping: an exception that left a helper thread (an engine's sink
    // throwing, bad_alloc) would call std::terminate, and one that left the calling thread would
    // leave the helpers running on this frame. It becomes the call's error instead.
    void guarded_loop(const Work& work, bool calling_thread) noexcept {
        try {
            loop(work, calling_thread);
        } catch (const std::bad_alloc&) {
            fail(Error{ErrorKind::out_of_memory, "out of memory"});
        } catch (const std::exception& e) {
            fail(exception_error(e.what()));
        } catch (...) {
            fail(exception_error("an exception that is not a std::exception"));
        }
    }
    static Error exception_error(const char* what) noexcept {
        try {
            return make_error(ErrorKind::internal, fmt::format("a read threw: {}", what));
        } catch (...) {
            return Error{ErrorKind::out_of_memory, "out of memory"};
        }
    }

    void loop(const Work& work, bool calling_thread) {
        std::unique_ptr<Buffer> buffer; // made on the first job that asks for it
        const auto get_buffer = [&]() -> std::byte* {
            if (!buffer) buffer = std::make_unique<Buffer>(options_.chunk_size);
            return buffer->data;
        };
        for (std::size_t i; !stop_.load() && (i = next_.fetch_add(1)) < jobs_.size();) {
            if (Status s = work(jobs_[i], get_buffer); !s) return fail(std::move(s));
            const std::uint64_t done = done_.fetch_add(jobs_[i].size) + jobs_[i].size;
            if (!calling_thread || !options_.progress) continue;
            reported_ = done;
            if (!options_.progress(done, total_))
                return fail(make_error(ErrorKind::aborted,
                                       fmt::format("cancelled by the caller after {} of {} bytes",
                                                   done, total_)));
        }
    }
    // The helpers may have read every chunk before the calling thread took one (seen under
    // ThreadSanitizer, where starting a thread is slow), so a finished call reports the end
    // once more; nothing is left to cancel, so its answer is not asked.
    void report_completion() {
        const std::uint64_t done = done_.load();
        if (outcome_ && options_.progress && done != reported_) options_.progress(done, total_);
    }
    void fail(Status s) noexcept {
        std::lock_guard lock(mutex_);
        if (outcome_) outcome_ = std::move(s);
        stop_.store(true);
    }

    const std::vector<Job>& jobs_;
    const ReadOptions& options_;
    const std::uint64_t total_;
    std::atomic<std::size_t> next_{0};
    std::atomic<std::uint64_t> done_{0};
    std::atomic<bool> stop_{false};
    std::uint64_t reported_ = 0; // the last progress the calling thread reported
    std::mutex mutex_;
    Status outcome_; // ok until a job fails, then the first failure (later ones are dropped)
};

// Orders `jobs` (grouped by file) round-robin across files, so that threads take chunks of
// different files and each file is read as one sequential stream.
std::vector<Job> interleave_files(const std::vector<Job>& jobs) {
    std::map<std::uint32_t, std::vector<Job>> files; // each file's chunks, in their order
    for (const Job& job : jobs) files[job.file].push_back(job);
    std::vector<std::vector<Job>> by_file;
    for (auto& [file, list] : files) by_file.push_back(std::move(list));
    std::vector<Job> out;
    out.reserve(jobs.size());
    for (std::size_t k = 0; out.size() < jobs.size(); ++k)
        for (const std::vector<Job>& f : by_file)
            if (k < f.size()) out.push_back(f[k]);
    return out;
}

// Chunks of at most `chunk` bytes covering [offset, offset + size) of `file`.
void add_chunks(std::vector<Job>& jobs, Job job, std::uint64_t chunk) {
    chunk = std::max<std::uint64_t>(chunk, 1);
    for (std::uint64_t at = 0; at < job.size; at += chunk) {
        Job piece = job;
        piece.offset = job.offset + at;
        piece.tensor_offset = job.tensor_offset + at;
        piece.size = std::min(chunk, job.size - at);
        jobs.push_back(piece);
    }
}

// The page-aligned range of a mapping that [offset, offset + size) lies in.
std::pair<std::byte*, std::uint64_t> page_range(const MappedFile& file, std::uint64_t offset,
                                                std::uint64_t size) {
    const std::uint64_t page = host_page_size();
    const std::uint64_t begin = align_down(offset, page);
    const std::uint64_t end = std::min(align_up_saturating(offset + size, page), file.length);
    return {file.base + begin, end > begin ? end - begin : 0};
}

// Faults the range in (reading the file where it is not cached); false with errno on failure,
// EINVAL on a kernel before 5.14.
bool populate_pages(const MappedFile& file, std::uint64_t offset, std::uint64_t size) {
    const auto [base, length] = page_range(file, offset, size);
    return length == 0 || internal::syscalls().advise(base, length, MADV_POPULATE_READ) == 0;
}

// MADV_HUGEPAGE on every extent, before it is read. Why: a cold read of an advised range fills
// the page cache with PMD-sized folios, mapped with one entry per 2 MiB (Linux 6.18, a cold
// 162 MiB Q4_K_M: 100 % PMD-mapped vs 75 % with the default readahead, and reads from it 1.04x
// as fast: bench_weight_reads). Advice only: where THP is off the kernel refuses and nothing
// changes; pages already cached keep their size.
void advise_huge_pages(Span<const MappedFile> files, Span<const FileExtent> extents) {
    for (const FileExtent& e : extents) {
        const auto [base, length] = page_range(files[e.file], e.offset, e.size);
        if (length != 0) (void)internal::syscalls().advise(base, length, MADV_HUGEPAGE);
    }
}

// One load per page: maps pages that are already cached.
void touch_pages(const MappedFile& file, std::uint64_t offset, std::uint64_t size) {
    const auto [base, length] = page_range(file, offset, size);
    for (std::uint64_t at = 0; at < length; at += host_page_size())
        (void)*static_cast<volatile const std::byte*>(base + at);
}

// An extent names one of the model's files and lies inside the caller's mapping of it.
Status check_mapped(const ModelDesc& model, Span<const MappedFile> files, const FileExtent& e) {
    if (e.file >= model.files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("extent names file {} of {}", e.file, model.files.size()));
    if (e.offset > files[e.file].length || e.size > files[e.file].length - e.offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("'{}': extent [{}, +{}) passes the mapped length {}",
                                      model.files[e.file].path, e.offset, e.size,
                                      files[e.file].length));
    return {};
}

// The offset of the first page of [offset, offset + size) that cannot be populated, or the
// range's page-aligned end when every page can. A page wholly past the end of a shared file
// mapping answers EFAULT, and the pages before the end all read, so a binary search over single
// pages finds where a truncated file now ends, to a page, from the mapping alone.
std::uint64_t first_unreadable_page(const MappedFile& file, std::uint64_t offset,
                                    std::uint64_t size) {
    const std::uint64_t page = host_page_size();
    std::uint64_t low = align_down(offset, page);
    std::uint64_t high = std::min(align_up_saturating(offset + size, page), file.length);
    while (low < high) {
        const std::uint64_t mid = low + align_down((high - low) / 2, page);
        if (internal::syscalls().advise(file.base + mid, page, MADV_POPULATE_READ) == 0)
            low = mid + page;
        else
            high = mid;
    }
    return low;
}

// A failed MADV_POPULATE_READ of `job`: where the file now ends when it was truncated under the
// mapping (EFAULT: docs/testing.md promises the end and the extent), else the errno.
Error populate_error(const std::string& path, const MappedFile& file, const Job& job, int err) {
    const std::uint64_t end = job.offset + job.size;
    const std::uint64_t stop = err == EFAULT ? first_unreadable_page(file, job.offset, job.size)
                                             : end;
    if (stop < end)
        return make_error(ErrorKind::io,
                          fmt::format("'{}': the file now ends at offset {} or before (its page "
                                      "there cannot be read), inside the extent [{}, +{}) being "
                                      "populated (truncated after planning?): "
                                      "madvise(MADV_POPULATE_READ): {}", path, stop,
                                      job.extent.offset, job.extent.size, std::strerror(err)));
    return make_error(ErrorKind::io,
                      fmt::format("'{}': madvise(MADV_POPULATE_READ) at offset {} of the extent "
                                  "[{}, +{}): {}", path, job.offset, job.extent.offset,
                                  job.extent.size, std::strerror(err)));
}

} // namespace

std::vector<FileExtent> import_extents(const ModelDesc& model, const Plan& plan) {
    std::vector<FileExtent> extents;
    for (const PlanRegion& region : plan.regions) {
        if (region.target >= model.targets.size() || model.targets[region.target].caps.is_cpu ||
            region.decision != Decision::import)
            continue;
        for (const PlanRun& run : region.runs)
            extents.push_back({region.file, run.extent_offset, run.extent_size});
    }
    std::sort(extents.begin(), extents.end(), [](const FileExtent& a, const FileExtent& b) {
        return a.file != b.file ? a.file < b.file : a.offset < b.offset;
    });
    std::vector<FileExtent> merged;
    for (const FileExtent& e : extents) {
        if (!merged.empty() && merged.back().file == e.file &&
            e.offset <= merged.back().offset + merged.back().size) {
            FileExtent& last = merged.back();
            last.size = std::max(last.offset + last.size, e.offset + e.size) - last.offset;
        } else {
            merged.push_back(e);
        }
    }
    return merged;
}

Result<ReadReport> populate(const ModelDesc& model, Span<const MappedFile> files,
                            Span<const FileExtent> extents, const ReadOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    if (files.size() != model.files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("populate: {} mappings for {} files", files.size(),
                                      model.files.size()));
    std::vector<Job> jobs;
    std::uint64_t total = 0;
    for (const FileExtent& e : extents) {
        if (Status s = check_mapped(model, files, e); !s) return std::move(s).error();
        // the page-aligned tail past the end of the file has nothing to read
        const std::uint64_t size = model.files[e.file].size;
        const std::uint64_t readable = e.offset < size ? std::min(e.size, size - e.offset) : 0;
        add_chunks(jobs, {e.file, e.offset, readable, no_index, 0, e}, options.chunk_size);
        total += readable;
    }
    advise_huge_pages(files, extents);
    FilesOnDemand open(model, extents);
    std::atomic<bool> old_kernel{false};
    jobs = interleave_files(jobs);
    JobRunner runner(jobs, options, total);
    Status s = runner.run([&](const Job& job, const std::function<std::byte*()>& buffer) -> Status {
        // Measured on Linux 6.18 (docs/cold_load.md): MADV_POPULATE_READ of 8-64 MiB chunks
        // reads a cold file at or above read(2)'s 1 MiB-block speed, with no buffer and no copy;
        // pread first and then populate ran at 0.3-0.9 of it.
        // errno is read only right after this thread's own madvise: once another thread has
        // found an old kernel, this one never calls it, and errno is whatever it last was
        // (a sharded model on Linux < 5.14 failed with "...: Success").
        if (!old_kernel.load()) {
            if (populate_pages(files[job.file], job.offset, job.size)) return {};
            if (const int err = errno; err != EINVAL)
                return populate_error(model.files[job.file].path, files[job.file], job, err);
            old_kernel.store(true); // before 5.14: large preads fill the cache, then a load a page
        }
        if (Status opened = open.open(); !opened) return opened;
        std::byte* into = buffer();
        if (into == nullptr)
            return make_error(ErrorKind::out_of_memory,
                              fmt::format("no memory for a read buffer of {} bytes",
                                          options.chunk_size));
        if (Status r = read_fully(open.fd(job.file), into, job.size, job.offset,
                                  model.files[job.file].path); !r)
            return r;
        touch_pages(files[job.file], job.offset, job.size);
        return {};
    });
    if (!s) return std::move(s).error();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    return ReadReport{total, took.count(),
                      old_kernel.load() ? "pread + page touch" : "MADV_POPULATE_READ"};
}

Result<ReadReport> populate_imports(const ModelDesc& model, const Plan& plan,
                                    Span<const MappedFile> files, const ReadOptions& options) {
    const std::vector<FileExtent> extents = import_extents(model, plan);
    return populate(model, files, extents, options);
}

Result<ReadReport> copy_fallback_tensors(const ModelDesc& model, const Plan& plan,
                                         const CopyDestination& destination,
                                         const ReadOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    if (!destination.address == !destination.sink)
        return make_error(ErrorKind::invalid_argument,
                          "copy_fallback_tensors: set exactly one of address and sink");
    if (plan.tensors.size() != model.tensors.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("copy_fallback_tensors: plan has {} tensors, model has {}",
                                      plan.tensors.size(), model.tensors.size()));
    OpenFiles open;
    if (Status s = open.open(model); !s) return std::move(s).error();
    std::vector<Job> jobs;
    std::vector<std::byte*> address(model.tensors.size(), nullptr);
    std::uint64_t total = 0;
    for (std::uint32_t t = 0; t < model.tensors.size(); ++t) {
        const TensorDesc& tensor = model.tensors[t];
        if (plan.tensors[t].run != no_index || tensor.target >= model.targets.size() ||
            model.targets[tensor.target].caps.is_cpu || tensor.size == 0)
            continue;
        const FileExtent extent{tensor.file, tensor.offset, tensor.size};
        if (Status s = check_extents(model, open, {&extent, 1}); !s) return std::move(s).error();
        if (destination.address) {
            address[t] = static_cast<std::byte*>(destination.address(t));
            if (address[t] == nullptr)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("copy_fallback_tensors: no destination for tensor "
                                              "{} ('{}')", t, tensor.name));
        }
        add_chunks(jobs, {tensor.file, tensor.offset, tensor.size, t, 0}, options.chunk_size);
        total += tensor.size;
    }
    jobs = interleave_files(jobs);
    JobRunner runner(jobs, options, total);
    Status s = runner.run([&](const Job& job, const std::function<std::byte*()>& buffer) -> Status {
        const std::string& path = model.files[job.file].path;
        std::byte* into = address[job.tensor] != nullptr ? address[job.tensor] + job.tensor_offset
                                                         : buffer();
        if (into == nullptr)
            return make_error(ErrorKind::out_of_memory,
                              fmt::format("no memory for a read buffer of {} bytes",
                                          options.chunk_size));
        if (Status r = read_fully(open.fd(job.file), into, job.size, job.offset, path); !r)
            return r;
        return destination.sink ? destination.sink(job.tensor, job.tensor_offset, into, job.size)
                                : Status{};
    });
    if (!s) return std::move(s).error();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    return ReadReport{total, took.count(), "pread"};
}

} // namespace wm
