# Defines the imported target k15::memory (shared by CMakeLists.txt and the installed
# k15_memoryConfig.cmake): the static library, its headers, and what its link line needs.
include_guard(GLOBAL)

#
# An empty include_dir defines a target for the link alone (no include directory, no compile
# feature): what cmake/k15_inject.cmake adds to a project's executables, whose sources include no
# header of ours, so that their compile lines, and with them their objects, stay as they were.
function(k15_memory_define_target target library include_dir)
  add_library(${target} STATIC IMPORTED GLOBAL)
  if(include_dir)
    set_target_properties(${target} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${include_dir}"
      INTERFACE_COMPILE_FEATURES cxx_std_11)
  endif()
  set_target_properties(${target} PROPERTIES
    IMPORTED_LOCATION "${library}"
    # C++ inside: link with the C++ driver, so that libstdc++ comes too.
    IMPORTED_LINK_INTERFACE_LANGUAGES CXX
    # README's -lpthread -ldl (plain names: an imported Threads::Threads would be scoped to the
    # directory that found it, and this target is global).
    INTERFACE_LINK_LIBRARIES "pthread;${CMAKE_DL_LIBS}"
    # CMake puts the library after the target's objects; this makes the operators come in even
    # for a target whose own objects never call new (a launcher of engine libraries), so no
    # link order can leave libstdc++'s operators in place.
    INTERFACE_LINK_OPTIONS "LINKER:--undefined=k15_memory_link_error_put_libk15_memory_a_after_your_sources")
  if(include_dir AND NOT target STREQUAL "k15::memory")
    add_library(k15::memory ALIAS ${target})
  endif()
endfunction()
