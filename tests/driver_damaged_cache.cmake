# step5_driver with a damaged cached default checkpoint (issue 12 §4): generates the small default
# into a fresh cache directory, truncates its model.safetensors, and requires the second run to
# exit 2 with the hint naming the directory to delete.
#   cmake -DDRIVER=<step5_driver> -DCACHE=<dir> -P driver_damaged_cache.cmake
set(_args --backend cpu --hidden 256 --layers 1 --requests 2 --tokens 40 --chunk 16 --decode-steps 2 --topk 4
          --block-size 16 --cache-dir ${CACHE} --quiet)
file(REMOVE_RECURSE "${CACHE}")
execute_process(COMMAND "${DRIVER}" ${_args} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the first run (generating the default) failed with ${_rc}:\n${_out}")
endif()
file(GLOB _files "${CACHE}/*/model.safetensors")
list(LENGTH _files _n)
if(NOT _n EQUAL 1)
  message(FATAL_ERROR "expected one cached model.safetensors under ${CACHE}, found: ${_files}")
endif()
get_filename_component(_dir "${_files}" DIRECTORY)
file(WRITE "${_files}" "not a safetensors file")
execute_process(COMMAND "${DRIVER}" ${_args} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(NOT _rc EQUAL 2)
  message(FATAL_ERROR "the run on the damaged cache exited with ${_rc}; expected 2")
endif()
string(FIND "${_out}" "is damaged: delete it (rm -r '${_dir}')" _at)
if(_at LESS 0)
  message(FATAL_ERROR "the error does not give the hint to delete '${_dir}'")
endif()
file(REMOVE_RECURSE "${CACHE}")
