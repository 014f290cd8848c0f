// A fake HIP runtime: the copy semantics of ROCclr, the layer under HIP on ROCm, for the series'
// copies out of a wrapped buffer (hip_copy_check.cpp). Each behaviour and its source:
//   * a copy looks both pointers up in the runtime's own map of allocations and registrations
//     (ROCm/HIP rocclr/hip_memory.cpp: ihipMemcpy -> getMemoryObject -> amd::MemObjMap); memory
//     locked through HSA (hsa_amd_memory_lock) is not in it;
//   * with neither pointer known, the copy is a CPU memcpy after the stream finishes
//     (IsHtoHMemcpy / ihipHtoHMemcpy): an HSA agent address as the source is read by the CPU;
//   * with one pointer known, the unknown one is host memory that the runtime stages through
//     its pinned buffers (ihipMemcpyCommand: WriteMemoryCommand / ReadMemoryCommand): the CPU
//     reads or writes it, whatever the kind says;
//   * hipMalloc'd memory is in the map; here it is plain process memory standing in for VRAM
//     (an assumption of the fake: a real device's memory is not CPU-addressable).
// Where the HSA lock returned an agent address other than the host one (the fake HSA runtime
// returns host + 2^44, outside the process's address space) a CPU read of it faults, as a CPU
// read of a GPU virtual address does on an APU.
#include <hip/hip_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace {

std::mutex & allocations_mutex() {
    static std::mutex m;
    return m;
}

std::map<uintptr_t, size_t> & allocations() {
    static std::map<uintptr_t, size_t> a;
    return a;
}

} // namespace

hipError_t hipMalloc(void ** ptr, size_t size) {
    if (ptr == nullptr) {
        return hipErrorInvalidValue;
    }
    *ptr = malloc(size == 0 ? 1 : size);
    if (*ptr == nullptr) {
        return hipErrorOutOfMemory;
    }
    std::lock_guard<std::mutex> lock(allocations_mutex());
    allocations()[(uintptr_t) *ptr] = size;
    return hipSuccess;
}

hipError_t hipFree(void * ptr) {
    std::lock_guard<std::mutex> lock(allocations_mutex());
    if (ptr != nullptr && allocations().erase((uintptr_t) ptr) == 0) {
        return hipErrorInvalidValue;
    }
    free(ptr);
    return hipSuccess;
}

// Whichever pointers the map knows, every case ends in a CPU access of the unknown ones (see the
// top of the file), and known ones are the fake's process memory: one memcpy models all three.
hipError_t hipMemcpy(void * dst, const void * src, size_t size, hipMemcpyKind /*kind*/) {
    if (size == 0) {
        return hipSuccess;
    }
    if (dst == nullptr || src == nullptr) {
        return hipErrorInvalidValue; // ihipMemcpy_validate
    }
    memcpy(dst, src, size);
    return hipSuccess;
}

hipError_t hipMemcpyAsync(void * dst, const void * src, size_t size, hipMemcpyKind kind, hipStream_t /*stream*/) {
    return hipMemcpy(dst, src, size, kind);
}

hipError_t hipStreamSynchronize(hipStream_t /*stream*/) {
    return hipSuccess;
}

const char * hipGetErrorString(hipError_t error) {
    switch (error) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    }
    return "hipErrorUnknown";
}
