# Expect-failure test runner: the command must exit with a non-zero status AND its output
# (stdout + stderr) must match a regex. (PASS_REGULAR_EXPRESSION alone ignores the exit code.)
#
#   cmake -DEXPECT_REGEX=<regex> [-DEXPECT_EXIT_CODE=<n>] -P expect_failure.cmake -- <command> [args...]
#
# EXPECT_EXIT_CODE (optional) requires that exact exit status; EXPECT_EXIT_CODE=0 turns the runner
# into an expect-success check (exit 0 AND the output matches). EXPECT_NOT_REGEX (optional): the
# output must not match it.
# A command that cannot be started or dies from a signal (a crash) fails the test too: only an
# orderly non-zero exit counts. Note: add_test splits arguments on ';', so write a ';' of the
# expected message as '.' in the regex.
if(NOT DEFINED EXPECT_REGEX OR EXPECT_REGEX STREQUAL "")
  message(FATAL_ERROR "expect_failure.cmake: -DEXPECT_REGEX=<regex> is required")
endif()

set(_cmd "")
set(_after_dashdash OFF)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(_i RANGE 0 ${_last})
  if(_after_dashdash)
    string(REPLACE ";" "\\;" _arg "${CMAKE_ARGV${_i}}")  # keep a ';' inside one argument
    list(APPEND _cmd "${_arg}")
  elseif(CMAKE_ARGV${_i} STREQUAL "--")
    set(_after_dashdash ON)
  endif()
endforeach()
if(NOT _cmd)
  message(FATAL_ERROR "expect_failure.cmake: no command given after '--'")
endif()

execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
list(JOIN _cmd " " _cmd_str)
if(NOT _rc MATCHES "^-?[0-9]+$")
  message(FATAL_ERROR "expect_failure: '${_cmd_str}' did not exit normally: ${_rc}")
endif()
if(_rc EQUAL 0 AND NOT (DEFINED EXPECT_EXIT_CODE AND EXPECT_EXIT_CODE EQUAL 0))
  message(FATAL_ERROR "expect_failure: '${_cmd_str}' exited with 0; expected a non-zero exit status")
endif()
if(DEFINED EXPECT_EXIT_CODE AND NOT _rc EQUAL EXPECT_EXIT_CODE)
  message(FATAL_ERROR "expect_failure: '${_cmd_str}' exited with ${_rc}; expected ${EXPECT_EXIT_CODE}")
endif()
if(NOT _out MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "expect_failure: '${_cmd_str}' exited with ${_rc} but its output does not match '${EXPECT_REGEX}'")
endif()
if(DEFINED EXPECT_NOT_REGEX AND _out MATCHES "${EXPECT_NOT_REGEX}")
  message(FATAL_ERROR "expect_failure: '${_cmd_str}' output matches '${EXPECT_NOT_REGEX}', which it must not")
endif()
message(STATUS "expect_failure: exit status ${_rc} and the output matches '${EXPECT_REGEX}'")
