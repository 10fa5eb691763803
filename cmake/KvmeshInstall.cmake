# The client library and its installation (find_package(kvmesh) from outside).
#
# kvmesh::client is one shared library holding what an inference server links
# to reach a kvmesh cluster: the public types and config loader (common), the
# wire protocol and the TCP/UCX channels (transport), the router, the
# NetworkClient and the C ABI (router). Its third-party dependencies are
# private to it (the public headers use the standard library only), so a
# consumer needs nothing but this package. The servers, the embedded cluster,
# the decode engine and the demo are not in it.
set(_kvmesh_client_parts kvmesh_common kvmesh_protocol kvmesh_transport kvmesh_openssl_util kvmesh_net
                         kvmesh_router kvmesh_remote kvmesh_capi kvmesh_kv_route)
if(KVMESH_HAVE_UCX)
  list(APPEND _kvmesh_client_parts kvmesh_ucx)
endif()
add_library(kvmesh_client SHARED)
add_library(kvmesh::client ALIAS kvmesh_client)
foreach(part IN LISTS _kvmesh_client_parts)
  target_sources(kvmesh_client PRIVATE $<TARGET_OBJECTS:${part}>)
endforeach()
# The parts' own dependencies (their objects are already in; nothing is linked twice).
target_link_libraries(kvmesh_client PRIVATE kvmesh_flags ${_kvmesh_client_parts})
target_include_directories(kvmesh_client INTERFACE ${KVMESH_PUBLIC_INCLUDES})
# Built with sanitizers, the library needs the sanitizer's runtime linked into
# the executable (ahead of every other library): whoever links kvmesh::client
# (examples/c_client.c, an installed package's consumer) links it too.
if(KVMESH_SANITIZE)
  target_link_options(kvmesh_client INTERFACE -fsanitize=${KVMESH_SANITIZE})
endif()
set_target_properties(kvmesh_client PROPERTIES OUTPUT_NAME kvmesh_client VERSION ${PROJECT_VERSION}
                                               SOVERSION ${PROJECT_VERSION_MAJOR}
                                               EXPORT_NAME client)

include(CMakePackageConfigHelpers)
set(KVMESH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvmesh)
install(TARGETS kvmesh_client EXPORT kvmeshTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The client's public headers (embedded.h needs the servers' code: not installed).
install(FILES
  include/kvmesh/block_key.h include/kvmesh/clock.h include/kvmesh/config.h include/kvmesh/kvmesh.h
  include/kvmesh/network.h include/kvmesh/request.h include/kvmesh/router.h include/kvmesh/sequence.h
  include/kvmesh/size.h include/kvmesh/status.h include/kvmesh/types.h
  ${PROJECT_BINARY_DIR}/include/kvmesh/build_config.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvmesh)
install(EXPORT kvmeshTargets NAMESPACE kvmesh:: DESTINATION ${KVMESH_CMAKE_DIR})
configure_package_config_file(cmake/kvmeshConfig.cmake.in ${PROJECT_BINARY_DIR}/kvmeshConfig.cmake
                              INSTALL_DESTINATION ${KVMESH_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvmeshConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvmeshConfig.cmake ${PROJECT_BINARY_DIR}/kvmeshConfigVersion.cmake
        DESTINATION ${KVMESH_CMAKE_DIR})
