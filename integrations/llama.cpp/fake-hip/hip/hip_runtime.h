// The part of HIP's runtime API (hip/hip_runtime_api.h, ROCm 5.2 and later) that the series'
// buffer-from-ptr.cu uses, declared with HIP's names and signatures so that file compiles
// unchanged against fake_hip_runtime.cpp. hipcc's compile check (compile-check.sh) compiles the
// same file against the real header.
#pragma once

#include <cstddef>

typedef enum hipError_t {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
} hipError_t;

typedef enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4,
} hipMemcpyKind;

typedef struct ihipStream_t * hipStream_t;

hipError_t hipMalloc(void ** ptr, size_t size);
hipError_t hipFree(void * ptr);
hipError_t hipMemcpy(void * dst, const void * src, size_t size, hipMemcpyKind kind);
hipError_t hipMemcpyAsync(void * dst, const void * src, size_t size, hipMemcpyKind kind, hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
const char * hipGetErrorString(hipError_t error);
