# CHOLMOD (SuiteSparse) as the imported target diffsoft::cholmod, defined when cholmod.h and libcholmod are
# found (hints: -DCHOLMOD_INCLUDE_DIR=..., -DCHOLMOD_LIBRARY=..., CMAKE_PREFIX_PATH). Included by CMakeLists.txt,
# which builds diffsoft::core with it when defined, and by the installed diffsoftConfig.cmake, because the
# static diffsoft::core built with it links it.
if(NOT TARGET diffsoft::cholmod)
  find_path(CHOLMOD_INCLUDE_DIR cholmod.h PATH_SUFFIXES suitesparse)
  find_library(CHOLMOD_LIBRARY cholmod)
  if(CHOLMOD_INCLUDE_DIR AND CHOLMOD_LIBRARY)
    add_library(diffsoft::cholmod UNKNOWN IMPORTED)
    set_target_properties(diffsoft::cholmod PROPERTIES IMPORTED_LOCATION "${CHOLMOD_LIBRARY}"
                                                       INTERFACE_INCLUDE_DIRECTORIES "${CHOLMOD_INCLUDE_DIR}")
  endif()
endif()
