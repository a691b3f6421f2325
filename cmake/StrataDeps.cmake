# strata_option(NAME DOC): declares an AUTO|ON|OFF cache option STRATA_WITH_<NAME>.
function(strata_option name doc)
  set(STRATA_WITH_${name} AUTO CACHE STRING "${doc} (AUTO|ON|OFF)")
  set_property(CACHE STRATA_WITH_${name} PROPERTY STRINGS AUTO ON OFF)
  if(NOT STRATA_WITH_${name} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "STRATA_WITH_${name} must be AUTO, ON or OFF, got '${STRATA_WITH_${name}}'")
  endif()
endfunction()

# strata_resolve(NAME FOUND): sets STRATA_HAVE_<NAME> from the option and whether the dependency
# was found; ON with a missing dependency is a configure error.
function(strata_resolve name found)
  if(STRATA_WITH_${name} STREQUAL "OFF")
    set(STRATA_HAVE_${name} 0 PARENT_SCOPE)
  elseif(${found})
    set(STRATA_HAVE_${name} 1 PARENT_SCOPE)
  elseif(STRATA_WITH_${name} STREQUAL "ON")
    message(FATAL_ERROR "STRATA_WITH_${name}=ON but the dependency was not found "
                        "(run scripts/setup.sh, or configure with -DSTRATA_WITH_${name}=OFF)")
  else()
    set(STRATA_HAVE_${name} 0 PARENT_SCOPE)
  endif()
endfunction()
