# One helper per target kind (after leveldb's leveldb_test and abseil's absl_cc_library).

# Flags every kvmesh target gets.
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

# kvmesh_library(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Creates static library kvmesh_<name> (alias kvmesh::<name>). The folder itself
# is its include root for internal headers, include/ for the public API.
function(kvmesh_library name)
  cmake_parse_arguments(A "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kvmesh_${name} STATIC ${A_SOURCES})
  add_library(kvmesh::${name} ALIAS kvmesh_${name})
  target_include_directories(kvmesh_${name} PUBLIC
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR})
  target_link_libraries(kvmesh_${name} PUBLIC kvmesh_flags ${A_PUBLIC_DEPS} PRIVATE ${A_PRIVATE_DEPS})
endfunction()

# kvmesh_test(<name> SOURCES ... LIBS ... [LABELS ...] [GPU])
# A Catch2 test binary; each TEST_CASE becomes one ctest test.
# GPU tests are tagged [gpu]: they get label "gpu" and report Skipped without a device.
function(kvmesh_test name)
  cmake_parse_arguments(A "GPU" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE kvmesh_flags ${A_LIBS} Catch2::Catch2WithMain)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # One label per test: catch_discover_tests re-splits PROPERTIES as a list,
  # so a multi-value LABELS cannot reach set_tests_properties intact.
  # Tests in a named group (cluster, mpi, ...) carry that label, others "unit".
  set(labels unit)
  if(A_LABELS)
    list(GET A_LABELS 0 labels)
  endif()
  catch_discover_tests(${name} TEST_SPEC "~[gpu]~[.]" PROPERTIES LABELS "${labels}" TIMEOUT 120)
  if(A_GPU)
    catch_discover_tests(${name} TEST_SPEC "[gpu]" TEST_PREFIX "gpu:"
      PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "SKIP: no GPU" TIMEOUT 300)
  endif()
endfunction()
