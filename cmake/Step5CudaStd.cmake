# step5_cuda_cxx20(): the step5 targets require cxx_std_20, which CMake also applies to CUDA
# sources. CMake < 3.25.2 does not know nvcc's C++20 flag (CMake issue 23079): it then refuses
# the targets ("requires the language dialect CUDA20") or leaves nvcc at its default (C++17 for
# nvcc 13: "namespace std has no member bit_cast"). On such a CMake this macro teaches the
# calling directory the flag (nvcc accepts -std=c++20). It is a macro, so it sets the variables
# in the caller's scope: CMakeLists.txt calls it for the build tree, step5Config.cmake for every
# project that does find_package(step5) — the flag travels with the package. Newer CMake knows
# the flag itself and is left alone.
macro(step5_cuda_cxx20)
  if(CMAKE_VERSION VERSION_LESS 3.25.2 AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
endmacro()
