// The --kv-cache-dtypes flag the benchmarks share.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/kv_layout.h"

namespace headway::bench {

// The dtypes `names` names, in order (ParseKvCacheDtype); nullopt, after a
// message on stderr naming the bad one and the allowed names, if one is not
// a dtype.
inline std::optional<std::vector<KvCacheDtype>> ParseKvCacheDtypeFlag(
    const std::vector<std::string>& names) {
  std::vector<KvCacheDtype> dtypes;
  for (const std::string& name : names) {
    std::optional<KvCacheDtype> d = ParseKvCacheDtype(name);
    if (!d) {
      std::fprintf(stderr, "--kv-cache-dtypes: `%s` is not one of %s\n", name.c_str(),
                   KvCacheDtypeNames());
      return std::nullopt;
    }
    dtypes.push_back(*d);
  }
  return dtypes;
}

}  // namespace headway::bench
