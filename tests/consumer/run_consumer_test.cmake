# Runs one consumer project of tests/consumer (cmake -P). Variables:
#   STEP5_SOURCE_DIR, STEP5_BINARY_DIR  the step5 trees
#   WORK_DIR                           scratch folder (removed first)
#   PROJECT                            sub-folder of tests/consumer to configure
#   INSTALL                            ON: install the step5 build tree into WORK_DIR/prefix first
#                                      and point CMAKE_PREFIX_PATH at it
#   CONFIGURE_ARGS                     extra configure arguments, separated by "|"
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
  list(APPEND _args "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
endif()
if(CONFIGURE_ARGS)
  string(REPLACE "|" ";" _extra "${CONFIGURE_ARGS}")
  list(APPEND _args ${_extra})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${STEP5_SOURCE_DIR}/tests/consumer/${PROJECT}" -B "${WORK_DIR}/build"
                        ${_args} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer ${PROJECT}: configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" --target step5_consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer ${PROJECT}: build failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/step5_consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(rc EQUAL 77)
  return()   # the output holds "SKIPPED: no GPU"
endif()
if(rc)
  message(FATAL_ERROR "consumer ${PROJECT}: run failed: ${rc}")
endif()
