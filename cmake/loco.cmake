# Helpers shared by every part of loco.

# Warnings as errors in loco's own code, with the compiler CI checks it with (Debian 12's GCC
# 12). Another compiler brings warnings of its own (GCC 13 finds an array-bounds one inside fmt
# 9's headers): -DLOCO_WERROR=OFF keeps them warnings there.
option(LOCO_WERROR "treat warnings in loco's own code as errors" ON)
function(loco_target_defaults target)
  # -Werror in its old place, so that an existing build's command lines stay the same.
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<BOOL:${LOCO_WERROR}>:-Werror>
                                           -Wno-missing-field-initializers)
  # In the tree its sources are found from the top; installed, loco's targets carry
  # include/ of the prefix instead (cmake/install.cmake).
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
endfunction()

# Adds every subfolder of the current folder that has a CMakeLists.txt.
function(loco_add_subdirectories)
  file(GLOB children RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(child IN LISTS children)
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${child} AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()

# loco_gtest(NAME SOURCES... LIBS ... LABELS ...): a GoogleTest binary registered with ctest.
function(loco_gtest name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  loco_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  include(GoogleTest)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT ${T_TIMEOUT})
  # Labels apart: gtest_discover_tests writes PROPERTIES unquoted into the script it generates,
  # so of "actors;multiprocess" only the first label stayed (and the second was taken for a
  # property's name). This script runs after the discovered tests' own and labels each of them.
  set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
  file(WRITE "${labels_file}"
       "foreach(test IN LISTS ${name}_TESTS)\n"
       "  set_tests_properties(\"\${test}\" PROPERTIES LABELS \"${T_LABELS}\")\n"
       "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
endfunction()

# Links an actor plugin into a program that uses its classes through handles.
# The program may reference no symbol of the plugin (registration runs from its
# static initialisers), so keep the linker from dropping it.
function(loco_link_plugin target plugin)
  target_link_libraries(${target} PRIVATE "-Wl,--no-as-needed" ${plugin} "-Wl,--as-needed")
endfunction()

# loco_add_plugin(NAME SOURCES... [LIBS ...] [TESTING] [NO_CLASSES]): a shared library of actor
# classes, written to build/plugins where nodes load it from, with its manifest
# (lib<NAME>.classes: the classes it registers), so that a node loads it only
# when it is asked to host one of them (runtime/core/plugins.hpp). TESTING: a
# plugin of tests or benchmarks, written to build/plugins-testing instead, which
# no node, `loco up` or image loads unless told to (--plugin, $LOCO_PLUGIN_PATH):
# its classes do what a test needs (write a file it names, hold memory), not what
# a user should be able to ask of a node. NO_CLASSES: a library that registers no
# class of its own (it acts from its static initialisers, and may link a plugin
# whose classes it would otherwise appear to offer): its manifest is empty, so a
# node loads it only where it is named by file. INSTALL: `cmake --install` installs it.
function(loco_add_plugin name)
  cmake_parse_arguments(P "TESTING;NO_CLASSES;INSTALL" "" "SOURCES;LIBS" ${ARGN})
  set(dir ${LOCO_PLUGIN_DIR})
  if(P_TESTING)
    set(dir ${LOCO_TEST_PLUGIN_DIR})
  endif()
  add_library(${name} SHARED ${P_SOURCES})
  loco_target_defaults(${name})
  target_link_libraries(${name} PUBLIC loco_runtime PRIVATE ${P_LIBS})
  set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${dir})
  if(P_INSTALL)  # cmake --install puts it, and its manifest, in lib/loco/plugins
    set_property(GLOBAL APPEND PROPERTY LOCO_INSTALLED_PLUGINS ${name})
  endif()
  if(P_NO_CLASSES)
    add_custom_command(TARGET ${name} POST_BUILD
      COMMAND ${CMAKE_COMMAND} -E rm -f ${dir}/lib${name}.classes
      COMMAND ${CMAKE_COMMAND} -E touch ${dir}/lib${name}.classes
      COMMENT "An empty manifest for ${name}")
    return()
  endif()
  add_dependencies(${name} loco-plugin-classes)
  add_custom_command(TARGET ${name} POST_BUILD
    COMMAND loco-plugin-classes $<TARGET_FILE:${name}> ${dir}/lib${name}.classes
    COMMENT "Listing the actor classes of ${name}")
endfunction()
