#include "kernels/cuda/cublas_library.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

namespace headway::cuda {
namespace {

const std::string& Soname() {
  static const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

// dlopen by soname, then beside libcudart: cuBLAS ships in the same folder
// of the toolkit, which the binary's RUNPATH may not name once nothing links
// cuBLAS.
void* OpenHandle(std::string* error) {
  if (void* h = dlopen(Soname().c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  *error = dlerror();
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) != 0 &&
      info.dli_fname != nullptr) {
    const std::string runtime = info.dli_fname;
    const size_t slash = runtime.rfind('/');
    if (slash != std::string::npos) {
      const std::string beside = runtime.substr(0, slash + 1) + Soname();
      if (void* h = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
      *error += "; " + std::string(dlerror());
    }
  }
  return nullptr;
}

template <class F>
bool Resolve(void* handle, const char* symbol, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, symbol));
  if (*out == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + symbol;
  return *out != nullptr;
}

Result<const CublasLibrary*> Open() {
  std::string error;
  void* handle = OpenHandle(&error);
  if (handle == nullptr) {
    return Status::Unavailable("cannot open cuBLAS (" + Soname() + "): " + error);
  }
  // Never closed: cuBLAS handles may live until exit.
  static CublasLibrary lib;
  std::string missing;
  Resolve(handle, "cublasCreate_v2", &lib.create, &missing);
  Resolve(handle, "cublasDestroy_v2", &lib.destroy, &missing);
  Resolve(handle, "cublasSetStream_v2", &lib.set_stream, &missing);
  Resolve(handle, "cublasSetMathMode", &lib.set_math_mode, &missing);
  Resolve(handle, "cublasGemmEx", &lib.gemm_ex, &missing);
  Resolve(handle, "cublasGetStatusName", &lib.status_name, &missing);
  Resolve(handle, "cublasGetStatusString", &lib.status_string, &missing);
  if (!missing.empty()) {
    return Status::Unavailable("cuBLAS (" + Soname() + ") lacks " + missing);
  }
  return &lib;
}

}  // namespace

Result<const CublasLibrary*> OpenCublas() {
  static const Result<const CublasLibrary*> opened = Open();
  return opened;
}

}  // namespace headway::cuda
