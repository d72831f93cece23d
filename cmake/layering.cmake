# The layering check: a build step that fails when a file includes a header
# against the dependency graph of the Headway libraries.
#
# Every target compiles with one include root (the source dir) so that
# `#include "comm/kv_transfer.h"` reads the same in every file; the compiler
# alone would therefore let common/ include a kernels/ or coordinator/ header.
# Per-library include roots would need a folder tree (or a link farm) per
# library; a check over the project's own `#include "..."` lines keeps the
# tree as it is and names the rule broken. The rule, per checked target:
#
#   a file may include `#include "dir/x.h"` only when dir is a folder of its
#   own target or one exported by a headway library the target links, where a
#   library exports its own folders and, transitively, those of its PUBLIC
#   dependencies (the usage requirements of CMake's PUBLIC/PRIVATE).
#
# Includes outside the project's folders (third-party, <...>) are not checked:
# the link line decides those. The check reads text: an include under #if
# counts in every build, so a library that includes an optional dependency's
# header must link that dependency whenever it exists or keep the header in
# its own folder. Executables' main.cc files are leaves (nothing includes
# them) and are not checked.
#
# headway_layering(TARGET OWNS folder... [PUBLIC dep...] [PRIVATE dep...]
#                  [FILES file...]): records TARGET's folders (`dir`: the files
# directly in dir; `dir/**`: also every subfolder), its dependencies (any
# link item; those that are not recorded targets are ignored) and the files
# to check (absolute paths; none: nothing is checked, e.g. generated code).
function(headway_layering target)
  cmake_parse_arguments(ARG "" "" "OWNS;PUBLIC;PRIVATE;FILES" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY HEADWAY_LAYERING_TARGETS ${target})
  set_property(GLOBAL PROPERTY HEADWAY_LAYERING_OWNS_${target} ${ARG_OWNS})
  set_property(GLOBAL PROPERTY HEADWAY_LAYERING_PUBLIC_${target} ${ARG_PUBLIC})
  set_property(GLOBAL PROPERTY HEADWAY_LAYERING_PRIVATE_${target} ${ARG_PRIVATE})
  set_property(GLOBAL PROPERTY HEADWAY_LAYERING_FILES_${target} ${ARG_FILES})
endfunction()

# The folders a consumer of `target` may include: its own and, recursively,
# those of its PUBLIC dependencies.
function(_headway_layering_exports target out)
  get_property(known GLOBAL PROPERTY HEADWAY_LAYERING_TARGETS)
  get_property(result GLOBAL PROPERTY HEADWAY_LAYERING_OWNS_${target})
  get_property(public GLOBAL PROPERTY HEADWAY_LAYERING_PUBLIC_${target})
  foreach(dep IN LISTS public)
    if(dep IN_LIST known)
      _headway_layering_exports(${dep} dep_exports)
      list(APPEND result ${dep_exports})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES result)
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# Adds, for every recorded target with files, a build step
# `<target>_layering` (part of ALL, and built before the target itself) that
# runs cmake/check_includes.cmake over the target's files. Call once, after
# every target is recorded.
function(headway_layering_add_checks)
  get_property(targets GLOBAL PROPERTY HEADWAY_LAYERING_TARGETS)
  set(owners)
  foreach(t IN LISTS targets)
    get_property(owns GLOBAL PROPERTY HEADWAY_LAYERING_OWNS_${t})
    foreach(folder IN LISTS owns)
      list(APPEND owners "${folder}=${t}")
    endforeach()
  endforeach()
  set(dir ${CMAKE_BINARY_DIR}/layering)
  set(script ${CMAKE_SOURCE_DIR}/cmake/check_includes.cmake)
  foreach(t IN LISTS targets)
    get_property(files GLOBAL PROPERTY HEADWAY_LAYERING_FILES_${t})
    if(NOT files OR NOT TARGET ${t})
      continue()
    endif()
    get_property(allowed GLOBAL PROPERTY HEADWAY_LAYERING_OWNS_${t})
    get_property(deps GLOBAL PROPERTY HEADWAY_LAYERING_PUBLIC_${t})
    get_property(private GLOBAL PROPERTY HEADWAY_LAYERING_PRIVATE_${t})
    set(linked)
    foreach(dep IN LISTS deps private)
      if(dep IN_LIST targets)
        list(APPEND linked ${dep})
        _headway_layering_exports(${dep} dep_exports)
        list(APPEND allowed ${dep_exports})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES allowed)
    # file(CONFIGURE) rewrites the rules only when they change, so an
    # unchanged target is not checked again after each configure.
    file(CONFIGURE OUTPUT ${dir}/${t}.cmake CONTENT
"set(HEADWAY_TARGET [[${t}]])
set(HEADWAY_SOURCE_DIR [[${CMAKE_SOURCE_DIR}]])
set(HEADWAY_LINKED [[${linked}]])
set(HEADWAY_ALLOWED [[${allowed}]])
set(HEADWAY_OWNERS [[${owners}]])
set(HEADWAY_FILES [[${files}]])
")
    add_custom_command(OUTPUT ${dir}/${t}.ok
      COMMAND ${CMAKE_COMMAND} -DRULES=${dir}/${t}.cmake -DSTAMP=${dir}/${t}.ok -P ${script}
      DEPENDS ${files} ${dir}/${t}.cmake ${script}
      COMMENT "Checking the includes of ${t} against its dependencies"
      VERBATIM)
    add_custom_target(${t}_layering ALL DEPENDS ${dir}/${t}.ok)
    add_dependencies(${t} ${t}_layering)
  endforeach()
endfunction()
