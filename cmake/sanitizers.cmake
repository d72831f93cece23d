# HEADWAY_SANITIZE=address|thread: instrument every C and C++ target (Headway's
# libraries, executables, tests and benchmarks) with GCC's sanitizers.
#   address: AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer;
#            undefined behaviour aborts instead of printing and going on, so
#            a finding fails the test that hit it.
#   thread:  ThreadSanitizer.
# CUDA device code is not instrumented (nvcc has no sanitizers; the CUDA
# tools have compute-sanitizer), so a sanitizer build turns CUDA off.
# deploy/test.sh --sanitize address|thread configures, builds and runs these
# builds (README "Tests" > "Sanitizers").
set(HEADWAY_SANITIZE "" CACHE STRING "sanitizer build: address (ASan+UBSan), thread (TSan) or empty")
set_property(CACHE HEADWAY_SANITIZE PROPERTY STRINGS "" address thread)

if(HEADWAY_SANITIZE STREQUAL "")
  return()
endif()
if(NOT HEADWAY_SANITIZE MATCHES "^(address|thread)$")
  message(FATAL_ERROR "HEADWAY_SANITIZE=${HEADWAY_SANITIZE}: allowed are address, thread or empty")
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  message(FATAL_ERROR "HEADWAY_SANITIZE: written for GCC, found ${CMAKE_CXX_COMPILER_ID}")
endif()

if(HEADWAY_SANITIZE STREQUAL "address")
  set(HEADWAY_SANITIZE_LINK -fsanitize=address,undefined)
  set(HEADWAY_SANITIZE_FLAGS ${HEADWAY_SANITIZE_LINK} -fno-sanitize-recover=undefined)
else()
  # -Wno-tsan: GCC warns that TSan does not model std::atomic_thread_fence;
  # libstdc++ and spdlog use fences, and the warning would drown the build.
  set(HEADWAY_SANITIZE_LINK -fsanitize=thread)
  set(HEADWAY_SANITIZE_FLAGS ${HEADWAY_SANITIZE_LINK} -Wno-tsan)
endif()
# Frame pointers keep the reports' stacks complete. -O1 and line tables
# (-g1) instead of RelWithDebInfo's -O2 -g, as the sanitizers' documentation
# advises: reports keep function, file and line, and the build takes far less
# time and memory. The kernels keep their -O3 (HEADWAY_CPU_FLAGS come later
# on the command line), so tests that run the model stay fast enough.
list(APPEND HEADWAY_SANITIZE_FLAGS -fno-omit-frame-pointer -O1 -g1)

add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${HEADWAY_SANITIZE_FLAGS}>")
add_link_options(${HEADWAY_SANITIZE_LINK})
set(HEADWAY_DISABLE_CUDA ON CACHE BOOL "no CUDA in a sanitizer build" FORCE)
message(STATUS "HEADWAY_SANITIZE=${HEADWAY_SANITIZE}: ${HEADWAY_SANITIZE_FLAGS} (CUDA off)")
