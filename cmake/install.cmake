# `cmake --install build --prefix P`: what a program that embeds loco, or a host that runs it,
# needs, and nothing else (no tests, no benchmarks, no private header):
#   P/bin                    loco, loco-train, loco-plugin-classes
#   P/lib                    libloco_runtime.so, libloco_client.so, libloco_diloco_job.so
#   P/lib/loco/plugins       the DiLoCo actors and their manifests (`loco start` finds them)
#   P/include/loco           the front doors (runtime.hpp, client.hpp, job.hpp, version.hpp)
#                            and the headers they include, at their paths in the tree
#   P/lib/cmake/loco         find_package(loco 0.N CONFIG): loco::runtime, loco::client,
#                            loco::diloco, loco_add_actor_plugin()
#   P/lib/pkgconfig/loco.pc  the same for pkg-config
# Relocatable: every path inside is relative to the prefix ($ORIGIN run paths, the CMake
# package's _IMPORT_PREFIX, pkg-config's ${pcfiledir}); LibTorch's run path stays absolute
# (the torch a host installed: the wheel, issue 23, points it into site-packages instead).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
include(cmake/public_headers.cmake)

set(LOCO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/loco)
set(LOCO_INSTALL_PLUGINDIR ${CMAKE_INSTALL_LIBDIR}/loco/plugins)

foreach(h IN LISTS LOCO_PUBLIC_HEADERS)
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loco/${dir} COMPONENT dev)
endforeach()
install(FILES ${LOCO_FRONT_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loco COMPONENT dev)

# Run paths: a library finds its siblings, a program lib/ beside bin/, a plugin lib/ two up.
# Paths outside the prefix that the build linked (LibTorch) are kept as they are
# (INSTALL_RPATH_USE_LINK_PATH, set on each target below: the targets exist by now).
set(LOCO_LIBRARY_TARGETS loco_runtime loco_client)
if(TARGET loco_diloco_job)
  list(APPEND LOCO_LIBRARY_TARGETS loco_diloco_job)
endif()
set_target_properties(loco_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(loco_client PROPERTIES EXPORT_NAME client)
if(TARGET loco_diloco_job)
  set_target_properties(loco_diloco_job PROPERTIES EXPORT_NAME diloco)
endif()
foreach(t IN LISTS LOCO_LIBRARY_TARGETS)
  target_include_directories(${t} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH ON
                                        VERSION ${PROJECT_VERSION}
                                        SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
endforeach()
install(TARGETS ${LOCO_LIBRARY_TARGETS} EXPORT loco-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(LOCO_PROGRAMS loco)
if(TARGET loco-train)
  list(APPEND LOCO_PROGRAMS loco-train)
endif()
set_target_properties(${LOCO_PROGRAMS} loco-plugin-classes PROPERTIES
                      INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}" INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS ${LOCO_PROGRAMS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
# loco-plugin-classes is an imported target of the package too: loco_add_actor_plugin runs it.
set_target_properties(loco-plugin-classes PROPERTIES EXPORT_NAME plugin-classes)
install(TARGETS loco-plugin-classes EXPORT loco-targets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT runtime)

get_property(LOCO_PLUGINS GLOBAL PROPERTY LOCO_INSTALLED_PLUGINS)
foreach(p IN LISTS LOCO_PLUGINS)
  set_target_properties(${p} PROPERTIES INSTALL_RPATH "$ORIGIN/../.." INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS ${p} LIBRARY DESTINATION ${LOCO_INSTALL_PLUGINDIR} COMPONENT runtime)
  install(FILES ${LOCO_PLUGIN_DIR}/lib${p}.classes DESTINATION ${LOCO_INSTALL_PLUGINDIR}
          COMPONENT runtime)
endforeach()

# The wheel: LibTorch is the torch package beside loco in site-packages (loco/bin ->
# ../../torch/lib), never the build's venv; redis-server rides along (`loco up` runs the one
# beside it). scripts/wheel then bundles the system libraries they need.
if(LOCO_WHEEL)
  set(torch_from_bin "$ORIGIN/../../torch/lib")
  foreach(t IN LISTS LOCO_LIBRARY_TARGETS LOCO_PROGRAMS)
    get_target_property(rp ${t} INSTALL_RPATH)
    set_target_properties(${t} PROPERTIES INSTALL_RPATH_USE_LINK_PATH OFF
                          INSTALL_RPATH "${rp};${torch_from_bin}")
  endforeach()
  set_target_properties(loco-plugin-classes PROPERTIES INSTALL_RPATH_USE_LINK_PATH OFF)
  foreach(p IN LISTS LOCO_PLUGINS)
    set_target_properties(${p} PROPERTIES INSTALL_RPATH_USE_LINK_PATH OFF
                          INSTALL_RPATH "$ORIGIN/../..;$ORIGIN/../../../../torch/lib")
  endforeach()
  # Debian's redis-server is a link to redis-check-rdb (the binary picks its role by name):
  # the file itself, under the name that makes it a server.
  find_program(LOCO_REDIS_SERVER redis-server REQUIRED)
  file(REAL_PATH ${LOCO_REDIS_SERVER} redis_file)
  install(PROGRAMS ${redis_file} DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME redis-server
          COMPONENT runtime)
endif()

install(EXPORT loco-targets NAMESPACE loco:: DESTINATION ${LOCO_INSTALL_CMAKEDIR}
        FILE loco-targets.cmake COMPONENT dev)
configure_package_config_file(cmake/loco-config.cmake.in
  ${PROJECT_BINARY_DIR}/loco-config.cmake INSTALL_DESTINATION ${LOCO_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so 0.23 accepts 0.23.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/loco-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/loco-config.cmake ${PROJECT_BINARY_DIR}/loco-config-version.cmake
        DESTINATION ${LOCO_INSTALL_CMAKEDIR} COMPONENT dev)

configure_file(cmake/loco.pc.in ${PROJECT_BINARY_DIR}/loco.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/loco.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
