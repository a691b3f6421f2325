# `cmake --install`: strata as a CMake package (find_package(strata) + strata::<name>), for C++
# programs and for the Python package's compiled module. Included by the top-level CMakeLists.txt
# after every target exists. Layout under the prefix:
#   include/strata/<folder>/<file>.h   the headers, with the include paths of the source tree
#   include/strata/strata/config.h     the generated build configuration
#   lib/libstrata_<name>.a             the libraries (position-independent)
#   lib/strata/libstrata_sentencepiece.so   the SentencePiece module (runtime/data/CMakeLists.txt)
#   lib/cmake/strata/                  strataConfig.cmake, its version file, the exported targets
#   bin/strata                         the binary
include(CMakePackageConfigHelpers)

set(STRATA_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/strata)
set(STRATA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

# Every library a program may link, in dependency order; a name absent from this build (gpu/
# without CUDA, engine/ and models/ without libtorch) is skipped. Test helpers stay out.
set(_strata_exported
  strata_build_config strata_base strata_swap strata_tiers strata_gpu strata_gpu_device_kind
  strata_devices strata_cpu_optimizer strata_numerics strata_ds_config strata_plan strata_persist
  strata_data strata_metrics strata_comm strata_engine strata_models strata_command_framework
  strata_commands strata_bench)
set(_strata_targets "")
foreach(_t IN LISTS _strata_exported)
  if(NOT TARGET ${_t})
    continue()
  endif()
  list(APPEND _strata_targets ${_t})
  # strata::base, strata::engine, strata::build_config, ...
  string(REGEX REPLACE "^strata_" "" _name ${_t})
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
  # Each folder's target names the source root as its public include directory (so that
  # "runtime/engine/engine.h" resolves); an exported target may not carry a source path, so that
  # entry becomes the source root while building and include/strata once installed, where the
  # headers keep the same relative paths.
  get_target_property(_dirs ${_t} INTERFACE_INCLUDE_DIRECTORIES)
  if(_dirs)
    set(_mapped "")
    foreach(_d IN LISTS _dirs)
      if(_d STREQUAL PROJECT_SOURCE_DIR)
        list(APPEND _mapped "$<BUILD_INTERFACE:${_d}>"
                            "$<INSTALL_INTERFACE:${STRATA_INSTALL_INCLUDEDIR}>")
      else()
        list(APPEND _mapped "${_d}")
      endif()
    endforeach()
    set_target_properties(${_t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_mapped}")
  endif()
endforeach()
# The headers are C++20: a program that includes them must compile as C++20 too.
target_compile_features(strata_base PUBLIC cxx_std_20)

install(TARGETS ${_strata_targets} EXPORT strataTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The module is found at run time relative to the program (runtime/data/tokenizer.cc), never
# linked; exported so that a program's build can name its file ($<TARGET_FILE:strata::sentencepiece>).
set_target_properties(strata_sentencepiece PROPERTIES EXPORT_NAME sentencepiece)
install(TARGETS strata_sentencepiece EXPORT strataTargets
  LIBRARY DESTINATION ${STRATA_SENTENCEPIECE_INSTALL_DIR})
install(TARGETS strata RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Every header of the library folders, internal ones included: public headers include some of
# them (the layering is by folder, not by file).
foreach(_dir base swap tiers gpu cpu_optimizer runtime bench)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_dir})
    install(DIRECTORY ${_dir} DESTINATION ${STRATA_INSTALL_INCLUDEDIR}
            FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/strata/config.h
        DESTINATION ${STRATA_INSTALL_INCLUDEDIR}/strata)

install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${STRATA_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake
  INSTALL_DESTINATION ${STRATA_INSTALL_CMAKEDIR}
  PATH_VARS STRATA_SENTENCEPIECE_INSTALL_DIR)
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
        DESTINATION ${STRATA_INSTALL_CMAKEDIR})
