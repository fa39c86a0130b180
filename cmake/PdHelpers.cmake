# pd_cc_library / pd_cc_test: the one way targets are declared (shape of absl_cc_library).
#
#   pd_cc_library(NAME common_base SRCS a.cc HDRS a.h DEPS absl::status [INTERFACE])
#     -> target pd_common_base, alias pd::common_base
#   pd_cc_test(NAME common_hash_test SRCS block_hash_test.cc DEPS pd::common_hash LABELS unit)
#     -> executable common_hash_test, tests discovered at test time, every test labelled.
include_guard(GLOBAL)

function(pd_apply_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror=unused-result -Wno-missing-field-initializers>)
  if(PD_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

function(pd_cc_library)
  cmake_parse_arguments(PD "INTERFACE" "NAME" "SRCS;HDRS;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target pd_${PD_NAME})
  if(PD_INTERFACE OR NOT PD_SRCS)
    add_library(${target} INTERFACE ${PD_HDRS})
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} INTERFACE ${PD_DEPS})
  else()
    add_library(${target} STATIC ${PD_SRCS} ${PD_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} PUBLIC ${PD_DEPS} PRIVATE ${PD_PRIVATE_DEPS})
    pd_apply_warnings(${target})
  endif()
  add_library(pd::${PD_NAME} ALIAS ${target})
endfunction()

# LABELS is required: CI selects tests by label (unit, kernel, integration, e2e, slow, gpu).
function(pd_cc_test)
  # SERIAL: ctest runs the test's cases with nothing else at once (load tests that measure
  # or saturate the machine).
  cmake_parse_arguments(PD "SERIAL" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT PD_BUILD_TESTS)
    return()
  endif()
  if(NOT PD_LABELS)
    message(FATAL_ERROR "pd_cc_test(${PD_NAME}): LABELS is required")
  endif()
  if(NOT PD_TIMEOUT)
    set(PD_TIMEOUT 120)
  endif()
  add_executable(${PD_NAME} ${PD_SRCS})
  target_link_libraries(${PD_NAME} PRIVATE ${PD_DEPS} GTest::gmock GTest::gtest_main)
  # Tests locate shared data (../shared), built binaries and source files (scripts) through
  # these, never through env vars.
  target_compile_definitions(${PD_NAME} PRIVATE
    PD_SHARED_DIR="${PD_SHARED_DIR}" PD_BINARY_DIR="${PROJECT_BINARY_DIR}"
    PD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  pd_apply_warnings(${PD_NAME})
  # POST_BUILD discovery (lists tests right after linking, milliseconds). PRE_TEST would avoid
  # that, but CMake 3.25 generates a self-including file for it with single-config generators.
  set(_serial)
  if(PD_SERIAL)
    set(_serial RUN_SERIAL TRUE)
  endif()
  gtest_discover_tests(${PD_NAME}
    DISCOVERY_TIMEOUT 30
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES LABELS "${PD_LABELS}" TIMEOUT ${PD_TIMEOUT} ${_serial})
endfunction()

# pd_forbid_link_deps(TARGET <target> FORBIDDEN <target>...): fails the configure when <target>
# links any FORBIDDEN target, directly or through any chain of our (non-imported) libraries,
# naming the chain. Keeps layering promises ("pd-router does not link the engine's scheduler,
# forward pass or kernels") from eroding silently. Call it once every target exists, e.g.
#   cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL pd_forbid_link_deps ...)
function(pd_forbid_link_deps)
  cmake_parse_arguments(PD "" "TARGET" "FORBIDDEN" ${ARGN})
  set(forbidden)
  foreach(f IN LISTS PD_FORBIDDEN)
    if(NOT TARGET ${f})
      message(FATAL_ERROR "pd_forbid_link_deps(${PD_TARGET}): ${f} is not a target")
    endif()
    get_target_property(real ${f} ALIASED_TARGET)
    if(real)
      set(f ${real})
    endif()
    list(APPEND forbidden ${f})
  endforeach()
  # Breadth-first walk of the link graph; _pd_via_<t> remembers who pulled <t> in.
  set(queue ${PD_TARGET})
  set(seen ${PD_TARGET})
  while(queue)
    list(POP_FRONT queue t)
    get_target_property(type ${t} TYPE)
    set(deps)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${t} LINK_LIBRARIES)
      if(direct)
        list(APPEND deps ${direct})
      endif()
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND deps ${iface})
    endif()
    foreach(d IN LISTS deps)
      # A static library's PRIVATE deps appear as $<LINK_ONLY:dep>: still linked.
      if(d MATCHES "^\\$<LINK_ONLY:([^$<>]+)>$")
        set(d ${CMAKE_MATCH_1})
      endif()
      if(NOT TARGET ${d})
        continue()
      endif()
      get_target_property(real ${d} ALIASED_TARGET)
      if(real)
        set(d ${real})
      endif()
      get_target_property(imported ${d} IMPORTED)
      if(imported OR d IN_LIST seen)
        continue()
      endif()
      list(APPEND seen ${d})
      set(_pd_via_${d} ${t})
      if(d IN_LIST forbidden)
        set(chain ${d})
        set(c ${d})
        while(DEFINED _pd_via_${c})
          set(c ${_pd_via_${c}})
          list(PREPEND chain ${c})
        endwhile()
        list(JOIN chain " -> " chain)
        message(FATAL_ERROR "${PD_TARGET} must not link ${d}, but does: ${chain}")
      endif()
      list(APPEND queue ${d})
    endforeach()
  endwhile()
endfunction()
