// cuBLAS, opened at run time (dlopen) the first time a Blas is created,
// instead of being linked into every binary. Loading libcublas maps
// libcublasLt too, and the dynamic loader's relocations touch about 61 MB of
// its pages: resident memory that a CPU worker of a CUDA build paid without
// ever calling cuBLAS (its VmRSS, measured with /proc/PID/smaps). Internal to
// kernels/cuda.
#pragma once

#include <cublas_v2.h>

#include <type_traits>

#include "common/status.h"

namespace headway::cuda {

// The cuBLAS entry points Headway calls (cublas_v2.h names; the _v2 symbols
// are what its macros expand to). cublasGemmEx is overloaded in C++ (an
// inline cudaDataType compute-type shim), so its type is spelled out: the
// library's own symbol, the cublasComputeType_t form.
struct CublasLibrary {
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);

  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  GemmEx gemm_ex = nullptr;
  // Spelled out by hand, so checked against the header: overload resolution
  // picks the library's function over the shim (unevaluated: no link).
  static_assert(std::is_same_v<decltype(static_cast<GemmEx>(&cublasGemmEx)), GemmEx>);
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The library, opened once per process (thread-safe): libcublas.so.N, N the
// major version of the headers Headway was built with (CUBLAS_VER_MAJOR), from
// the loader's search path, else from the folder of the CUDA runtime this
// process uses. No GPU is needed to open it.
// Errors: Unavailable naming the library and the loader's reason (dlerror)
// when it cannot be opened or lacks one of the entry points; every later call
// returns the same error.
Result<const CublasLibrary*> OpenCublas();

}  // namespace headway::cuda
