# step5_kernels (step5::kernels): a static library of the kernels for sm_90a, built from the
# headers by step5/instantiate.cuh. One translation unit per (op, geometry): each
# src/instances/<op>.cu.in is configured once per selected geometry id with
# @STEP5_GEOMETRY_ID@ set; src/instances/entry_points.cu.in is configured once with the selected
# rows (and stubs for the rows STEP5_GEOMETRIES left out).
set(_step5_generated "")
set(STEP5_INSTANTIATE_ROWS "")
foreach(STEP5_GEOMETRY_ID IN LISTS STEP5_GEOMETRY_IDS)
  string(APPEND STEP5_INSTANTIATE_ROWS "X(${STEP5_GEOMETRY_ID}) ")
  foreach(_op attention indexer)
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/instances/${_op}_${STEP5_GEOMETRY_ID}.cu")
    configure_file("${CMAKE_CURRENT_SOURCE_DIR}/src/instances/${_op}.cu.in" "${_out}" @ONLY)
    list(APPEND _step5_generated "${_out}")
  endforeach()
endforeach()
set(_stub_rows "")
foreach(_id IN LISTS STEP5_ALL_GEOMETRY_IDS)
  if(NOT _id IN_LIST STEP5_GEOMETRY_IDS)
    string(APPEND _stub_rows "X(${_id}) ")
  endif()
endforeach()
if(_stub_rows)
  set(STEP5_INSTANTIATE_STUB_ROWS_DEFINE "#define STEP5_INSTANTIATE_STUB_ROWS(X) ${_stub_rows}")
else()
  set(STEP5_INSTANTIATE_STUB_ROWS_DEFINE "")
endif()
configure_file("${CMAKE_CURRENT_SOURCE_DIR}/src/instances/entry_points.cu.in"
               "${CMAKE_CURRENT_BINARY_DIR}/instances/entry_points.cu" @ONLY)
list(APPEND _step5_generated "${CMAKE_CURRENT_BINARY_DIR}/instances/entry_points.cu")

add_library(step5_kernels STATIC ${_step5_generated})
add_library(step5::kernels ALIAS step5_kernels)
set_target_properties(step5_kernels PROPERTIES EXPORT_NAME kernels)
target_link_libraries(step5_kernels PUBLIC step5)
set_target_properties(step5_kernels PROPERTIES
  CUDA_ARCHITECTURES 90a
  CUDA_SEPARABLE_COMPILATION OFF
  POSITION_INDEPENDENT_CODE ON)
# ptxas register/spill report, shown in CI logs
target_compile_options(step5_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-warn-spills,-warn-lmem-usage -lineinfo>)
