# One helper per target kind (after leveldb's leveldb_test and abseil's absl_cc_library).
#
# Include directories (docs/architecture.md, "Layers"): include/ (the public
# API, plus the generated kvmesh/build_config.h in the build tree) is the only
# PUBLIC include directory of any library. The repository root, which makes
# "shard_node/block_store.h" and the like resolve, is PRIVATE to every kvmesh
# target: a folder's internal headers are reachable from kvmesh's own code, and
# scripts/check-layers.py (ctest "layering") keeps those includes one-way.

# Flags every kvmesh target gets (linked PRIVATE: they do not travel to users).
add_library(kvmesh_flags INTERFACE)
target_compile_options(kvmesh_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${KVMESH_WERROR}>>:-Werror>)
target_compile_definitions(kvmesh_flags INTERFACE BOOST_ASIO_NO_DEPRECATED)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  target_compile_definitions(kvmesh_flags INTERFACE BOOST_ASIO_HAS_CO_AWAIT=1)
endif()
if(KVMESH_SANITIZE)
  target_compile_options(kvmesh_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${KVMESH_SANITIZE} -fno-omit-frame-pointer>)
  target_link_options(kvmesh_flags INTERFACE -fsanitize=${KVMESH_SANITIZE})
endif()
target_include_directories(kvmesh_flags INTERFACE ${PROJECT_SOURCE_DIR})

# The public include directories, as seen from the build tree and from an install.
set(KVMESH_PUBLIC_INCLUDES
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# kvmesh_library(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Creates static library kvmesh_<name> (alias kvmesh::<name>) that names its own
# dependencies: PUBLIC_DEPS are the libraries its headers expose, PRIVATE_DEPS
# the ones only its sources use.
function(kvmesh_library name)
  cmake_parse_arguments(A "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kvmesh_${name} STATIC ${A_SOURCES})
  add_library(kvmesh::${name} ALIAS kvmesh_${name})
  target_include_directories(kvmesh_${name} PUBLIC ${KVMESH_PUBLIC_INCLUDES})
  target_link_libraries(kvmesh_${name} PUBLIC ${A_PUBLIC_DEPS} PRIVATE kvmesh_flags ${A_PRIVATE_DEPS})
endfunction()

# kvmesh_executable(<name> SOURCES ... LIBS ...): a program of the project.
function(kvmesh_executable name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE kvmesh_flags ${A_LIBS})
endfunction()

# Time bounds of the tests grow under sanitizers, which run code several times
# slower: KVMESH_TEST_TIMEOUT_SCALE (default 1; 4 with a sanitizer) multiplies
# every test's ctest TIMEOUT and the bounds on waits inside the tests (C++
# tests: kvmesh::testing::TimeBound in tests/test_time.h; scripts: the
# environment variable KVMESH_TEST_TIME_SCALE). kvmesh_timeout(<out-var>
# <seconds>) scales a TIMEOUT; kvmesh_test_bounds(<test> <seconds>) sets a
# test's scaled TIMEOUT and KVMESH_TEST_TIME_SCALE in its environment. Every
# test has a TIMEOUT (ctest `test_timeouts` checks): the test presets' default
# timeout never applies.
if(NOT DEFINED KVMESH_TEST_TIMEOUT_SCALE)
  if(KVMESH_SANITIZE)
    set(KVMESH_TEST_TIMEOUT_SCALE 4)
  else()
    set(KVMESH_TEST_TIMEOUT_SCALE 1)
  endif()
endif()
function(kvmesh_timeout out seconds)
  math(EXPR t "${seconds} * ${KVMESH_TEST_TIMEOUT_SCALE}")
  set(${out} ${t} PARENT_SCOPE)
endfunction()
function(kvmesh_test_bounds test seconds)
  kvmesh_timeout(t ${seconds})
  set_tests_properties(${test} PROPERTIES TIMEOUT ${t})
  set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT_MODIFICATION
               "KVMESH_TEST_TIME_SCALE=set:${KVMESH_TEST_TIMEOUT_SCALE}")
endfunction()

# kvmesh_mpi_test_env(<test>): for a test whose processes call MPI_Init.
# Under ASan their leak stacks must reach Open MPI's libraries for the
# suppressions in scripts/lsan.supp to match, and the fast unwinder stops at
# the first frame of an Open MPI component (dlclosed by MPI_Finalize, so
# nameless in the report): these tests unwind with the slow unwinder, which
# costs too much to turn on for every test.
function(kvmesh_mpi_test_env test)
  if(KVMESH_SANITIZE MATCHES "address")
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT_MODIFICATION
                 "ASAN_OPTIONS=string_append::fast_unwind_on_malloc=0")
  endif()
endfunction()

# kvmesh_test(<name> SOURCES ... LIBS ... [LABELS ...] [GPU])
# A Catch2 test binary; each TEST_CASE becomes one ctest test.
# GPU tests are tagged [gpu]: they get label "gpu" and report Skipped without a device.
function(kvmesh_test name)
  cmake_parse_arguments(A "GPU" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE kvmesh_flags ${A_LIBS} Catch2::Catch2WithMain)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${name} PRIVATE KVMESH_TEST_TIME_SCALE=${KVMESH_TEST_TIMEOUT_SCALE})
  # One label per test: catch_discover_tests re-splits PROPERTIES as a list,
  # so a multi-value LABELS cannot reach set_tests_properties intact.
  # Tests in a named group (cluster, mpi, ...) carry that label, others "unit".
  set(labels unit)
  if(A_LABELS)
    list(GET A_LABELS 0 labels)
  endif()
  kvmesh_timeout(t 120)
  catch_discover_tests(${name} TEST_SPEC "~[gpu]~[.]" PROPERTIES LABELS "${labels}" TIMEOUT ${t})
  if(A_GPU)
    kvmesh_timeout(tg 300)
    catch_discover_tests(${name} TEST_SPEC "[gpu]" TEST_PREFIX "gpu:"
      PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "SKIP: no GPU" TIMEOUT ${tg})
  endif()
endfunction()
