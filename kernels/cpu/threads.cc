#include "kernels/threads.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

namespace headway::cpu {

void SetNumThreads(int num_threads) {
  omp_set_num_threads(std::max(1, num_threads));
  openblas_set_num_threads(1);
}

}  // namespace headway::cpu
