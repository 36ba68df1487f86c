# step5_kernels: a static library of kernel instances for sm_90a, one translation unit per
# (op, geometry): each src/instances/<op>.cu.in is configured once per selected geometry id
# with @STEP5_GEOMETRY_ID@ set. Ops whose instances do not depend on the geometry are plain
# src/instances/<op>.cu files.
file(GLOB _step5_instance_templates CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/src/instances/*.cu.in")
file(GLOB _step5_instance_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/src/instances/*.cu")
set(_step5_generated "")
foreach(_tmpl IN LISTS _step5_instance_templates)
  get_filename_component(_op "${_tmpl}" NAME_WE)
  foreach(STEP5_GEOMETRY_ID IN LISTS STEP5_GEOMETRY_IDS)
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/instances/${_op}_${STEP5_GEOMETRY_ID}.cu")
    configure_file("${_tmpl}" "${_out}" @ONLY)
    list(APPEND _step5_generated "${_out}")
  endforeach()
endforeach()
# Rows left out by STEP5_GEOMETRIES get stub launchers that return kUnsupported, so code that
# dispatches over the whole list (ops/layer.hpp) still links.
foreach(STEP5_GEOMETRY_ID IN LISTS STEP5_ALL_GEOMETRY_IDS)
  if(NOT STEP5_GEOMETRY_ID IN_LIST STEP5_GEOMETRY_IDS)
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/instances/unbuilt_${STEP5_GEOMETRY_ID}.cu")
    configure_file("${CMAKE_CURRENT_SOURCE_DIR}/src/instances/unbuilt_geometry.cu.stub" "${_out}" @ONLY)
    list(APPEND _step5_generated "${_out}")
  endif()
endforeach()
if(NOT _step5_generated AND NOT _step5_instance_sources)
  return()
endif()
add_library(step5_kernels STATIC ${_step5_generated} ${_step5_instance_sources})
add_library(step5::kernels ALIAS step5_kernels)
target_link_libraries(step5_kernels PUBLIC step5 CUDA::cudart CUDA::cublasLt)
set_target_properties(step5_kernels PROPERTIES
  CUDA_ARCHITECTURES 90a
  CUDA_SEPARABLE_COMPILATION OFF
  POSITION_INDEPENDENT_CODE ON)
# ptxas register/spill report, shown in CI logs
target_compile_options(step5_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-warn-spills,-warn-lmem-usage -lineinfo>)
