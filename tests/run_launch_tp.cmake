# Runs tools/launch_tp.sh with a random MASTER_PORT (ctest runs tests in parallel and several
# users may share the machine: no fixed port), retrying with another port when rank 0's bind fails
# (the port was taken), then checks the exit status and the output.
#
#   cmake [-DEXPECT_EXIT_CODE=<n>] [-DEXPECT_REGEX=<regex>] [-DSKIP_EXIT_CODE=<n>] -P run_launch_tp.cmake -- <launch_tp.sh> N <command> [args...]
#
# EXPECT_EXIT_CODE defaults to 0. SKIP_EXIT_CODE: that exit status is passed through as the
# script's own failure with "SKIPPED" (ctest's SKIP_REGULAR_EXPRESSION marks it skipped).
if(NOT DEFINED EXPECT_EXIT_CODE)
  set(EXPECT_EXIT_CODE 0)
endif()
set(_cmd "")
set(_after OFF)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(_i RANGE 0 ${_last})
  if(_after)
    string(REPLACE ";" "\\;" _arg "${CMAKE_ARGV${_i}}")
    list(APPEND _cmd "${_arg}")
  elseif(CMAKE_ARGV${_i} STREQUAL "--")
    set(_after ON)
  endif()
endforeach()
list(JOIN _cmd " " _cmd_str)
foreach(_attempt RANGE 1 4)
  string(RANDOM LENGTH 4 ALPHABET 0123456789 _r)
  math(EXPR _port "20000 + (1${_r} % 10000) * 3")  # 20000..49997
  set(ENV{MASTER_PORT} ${_port})
  set(ENV{MASTER_ADDR} 127.0.0.1)
  execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _out MATCHES "bind failed")
    break()
  endif()
  message(STATUS "run_launch_tp: port ${_port} was taken, retrying")
endforeach()
message("${_out}")
if(DEFINED SKIP_EXIT_CODE AND _rc STREQUAL "${SKIP_EXIT_CODE}")
  message(FATAL_ERROR "SKIPPED: '${_cmd_str}' exited with ${_rc} (the skip code)")
endif()
if(NOT _rc STREQUAL "${EXPECT_EXIT_CODE}")
  message(FATAL_ERROR "run_launch_tp: '${_cmd_str}' (MASTER_PORT ${_port}) exited with ${_rc}; expected ${EXPECT_EXIT_CODE}")
endif()
if(DEFINED EXPECT_REGEX AND NOT _out MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "run_launch_tp: '${_cmd_str}' exited with ${_rc} but its output does not match '${EXPECT_REGEX}'")
endif()
message(STATUS "run_launch_tp: exit status ${_rc} as expected (MASTER_PORT ${_port})")
