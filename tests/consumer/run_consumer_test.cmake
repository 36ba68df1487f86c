# Runs one consumer project of tests/consumer (cmake -P). Variables:
#   STEP5_SOURCE_DIR, STEP5_BINARY_DIR  the step5 trees
#   WORK_DIR                           scratch folder (removed first)
#   PROJECT                            sub-folder of tests/consumer to configure
#   INSTALL                            ON: install the step5 build tree into WORK_DIR/prefix first
#                                      and point CMAKE_PREFIX_PATH at it
#   CONFIGURE_ARGS                     extra configure arguments, separated by "|"
#   EXTRA_PREFIX                       prefixes searched after the install prefix ("|"-separated;
#                                      e.g. where nlohmann_json lives on the GPU machine)
#   PROGRAMS                           targets to build and run in order ("|"-separated;
#                                      default step5_consumer); the first one's exit 77 = skipped
# Configures, builds and runs the project's step5_consumer. A run that prints "SKIPPED: no GPU"
# (exit 77) is reported by CTest as skipped (SKIP_REGULAR_EXPRESSION).
file(REMOVE_RECURSE "${WORK_DIR}")
set(_args "")
if(INSTALL)
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${STEP5_BINARY_DIR}" --prefix "${WORK_DIR}/prefix"
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "install failed: ${rc}")
  endif()
  set(_prefix "${WORK_DIR}/prefix")
endif()
if(EXTRA_PREFIX)
  string(REPLACE "|" ";" _extra_prefix "${EXTRA_PREFIX}")
  list(APPEND _prefix ${_extra_prefix})
endif()
if(_prefix)
  string(REPLACE ";" "\\;" _prefix_arg "${_prefix}")
  list(APPEND _args "-DCMAKE_PREFIX_PATH=${_prefix_arg}")
endif()
if(NOT PROGRAMS)
  set(PROGRAMS step5_consumer)
endif()
string(REPLACE "|" ";" _programs "${PROGRAMS}")
if(CONFIGURE_ARGS)
  string(REPLACE "|" ";" _extra "${CONFIGURE_ARGS}")
  list(APPEND _args ${_extra})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${STEP5_SOURCE_DIR}/tests/consumer/${PROJECT}" -B "${WORK_DIR}/build"
                        ${_args} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer ${PROJECT}: configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" --target ${_programs} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer ${PROJECT}: build failed: ${rc}")
endif()
foreach(_program IN LISTS _programs)
  execute_process(COMMAND "${WORK_DIR}/build/${_program}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${_program}: ${out}${err}")
  if(rc EQUAL 77)
    return()   # the output holds "SKIPPED: no GPU"
  endif()
  if(rc)
    message(FATAL_ERROR "consumer ${PROJECT}: ${_program} failed: ${rc}")
  endif()
endforeach()
