# The tracker in a project you do not want to edit:
#   cmake -DCMAKE_PROJECT_INCLUDE=/path/to/k15-memory/cmake/k15_inject.cmake ...
# CMake includes this after each project() call, once the compiler checks are done; the library is
# added to every executable once the whole project is configured, so try_compile checks and
# libraries are left alone (a shared library loaded by one of the executables is tracked through
# the executable's operators).
include_guard(GLOBAL)

# The project's sources include no header of ours: its executables get link options alone
# (k15_memory_link_only), so injecting into an existing build recompiles no object. Nothing of
# k15-memory is installed with the project.
if(NOT TARGET k15::memory)
  set(K15_MEMORY_INSTALL OFF)
  add_subdirectory("${CMAKE_CURRENT_LIST_DIR}/.." "${CMAKE_BINARY_DIR}/k15-memory")
endif()

function(k15_memory_inject_into directory)
  get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      # The property itself, not target_link_libraries: a project may already have used either
      # of that command's signatures on the target, and they cannot be mixed.
      set_property(TARGET ${target} APPEND PROPERTY LINK_LIBRARIES k15_memory_link_only)
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    k15_memory_inject_into("${subdirectory}")
  endforeach()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL k15_memory_inject_into "${CMAKE_SOURCE_DIR}")
