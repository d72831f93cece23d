# cmake -DRULES=<rules.cmake> -DSTAMP=<file> -P check_includes.cmake
#
# One target's layering check (cmake/layering.cmake says the rule). RULES
# sets HEADWAY_TARGET, HEADWAY_SOURCE_DIR, HEADWAY_LINKED (the recorded
# targets it links), HEADWAY_ALLOWED (folder rules: `dir` or `dir/**`),
# HEADWAY_OWNERS (`rule=target` for every recorded target) and HEADWAY_FILES.
# Success touches STAMP; any include against the rule fails with the file,
# the line, the include and the rule broken.
include(${RULES})

# Whether folder `dir` (relative to the source dir) matches folder rule `rule`.
function(folder_matches dir rule out)
  set(${out} FALSE PARENT_SCOPE)
  if(rule MATCHES "^(.*)/\\*\\*$")
    string(FIND "${dir}/" "${CMAKE_MATCH_1}/" pos)
    if(pos EQUAL 0)
      set(${out} TRUE PARENT_SCOPE)
    endif()
  elseif(dir STREQUAL rule)
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# The recorded target owning folder `dir`: the one with the longest matching
# rule; empty when none does.
function(owner_of dir out)
  set(best "")
  set(best_length -1)
  foreach(entry IN LISTS HEADWAY_OWNERS)
    string(FIND "${entry}" "=" eq REVERSE)
    string(SUBSTRING "${entry}" 0 ${eq} rule)
    math(EXPR after "${eq} + 1")
    string(SUBSTRING "${entry}" ${after} -1 target)
    folder_matches("${dir}" "${rule}" match)
    string(LENGTH "${rule}" length)
    if(match AND length GREATER best_length)
      set(best ${target})
      set(best_length ${length})
    endif()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

set(include_regex "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
set(errors "")
foreach(file IN LISTS HEADWAY_FILES)
  file(RELATIVE_PATH rel_file ${HEADWAY_SOURCE_DIR} ${file})
  file(STRINGS ${file} lines REGEX "${include_regex}")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "${include_regex}" _ "${line}")
    set(inc "${CMAKE_MATCH_1}")
    # A name without a folder is the including file's neighbour.
    if(NOT inc MATCHES "^([^/]+)/")
      continue()
    endif()
    # Only the project's folders (proto/*.pb.h is generated from proto/).
    if(NOT IS_DIRECTORY ${HEADWAY_SOURCE_DIR}/${CMAKE_MATCH_1})
      continue()
    endif()
    get_filename_component(inc_dir "${inc}" DIRECTORY)
    set(ok FALSE)
    foreach(rule IN LISTS HEADWAY_ALLOWED)
      folder_matches("${inc_dir}" "${rule}" match)
      if(match)
        set(ok TRUE)
        break()
      endif()
    endforeach()
    if(ok)
      continue()
    endif()
    # Where the offending line is, for the message.
    file(READ ${file} text)
    string(FIND "${text}" "${line}" at)
    string(SUBSTRING "${text}" 0 ${at} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines line_number)
    math(EXPR line_number "${line_number} + 1")
    owner_of("${inc_dir}" owner)
    if(owner)
      set(why "${inc_dir}/ belongs to ${owner}, which ${HEADWAY_TARGET} does not link (directly, or PUBLIC through what it links)")
      set(fix "move what both need to a folder ${HEADWAY_TARGET} may include, or, if ${HEADWAY_TARGET} really depends on ${owner} (and ${owner} not on it), add ${owner} to ${HEADWAY_TARGET}'s PUBLIC (its headers include it) or PRIVATE (only its sources do) dependencies")
    else()
      set(why "${inc_dir}/ belongs to no library")
      set(fix "include it only from its own folder")
    endif()
    string(REPLACE ";" ", " allowed_text "${HEADWAY_ALLOWED}")
    string(REPLACE ";" ", " linked_text "${HEADWAY_LINKED}")
    if(NOT linked_text)
      set(linked_text "no headway library")
    endif()
    # Indented lines: CMake prints them as they are, without reflowing.
    string(APPEND errors
      "  ${rel_file}:${line_number}: #include \"${inc}\" breaks the layering of ${HEADWAY_TARGET}:\n"
      "    ${why}.\n"
      "    ${HEADWAY_TARGET} links ${linked_text} and may include from: ${allowed_text}.\n"
      "    Fix: ${fix} (CMakeLists.txt; the rule is in cmake/layering.cmake).\n")
  endforeach()
endforeach()

if(errors)
  message(FATAL_ERROR "Layering check of ${HEADWAY_TARGET} failed:\n${errors}")
endif()
file(TOUCH ${STAMP})
