# Included by the top-level CMakeLists.txt before any library when
# HEADWAY_FUZZ is ON. libFuzzer needs clang: -fsanitize=fuzzer-no-link adds
# the coverage instrumentation the fuzzer steers by to every library, without
# libFuzzer's main(); the fuzz targets alone link -fsanitize=fuzzer
# (tests/fuzz/CMakeLists.txt). ASan and UBSan turn silent memory errors and
# undefined behaviour into crashes the fuzzer reports; UBSan does not recover,
# so its reports stop the run like ASan's.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "HEADWAY_FUZZ=ON needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
endif()
set(HEADWAY_FUZZ_SANITIZERS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
add_compile_options(-fsanitize=fuzzer-no-link ${HEADWAY_FUZZ_SANITIZERS} -fno-omit-frame-pointer)
add_link_options(${HEADWAY_FUZZ_SANITIZERS})
