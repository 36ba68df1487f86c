// nvcc consumer of the installed step5::kernels (see CMakeLists.txt, common.hpp).
#include "../common.hpp"

int main() { return consumer::run(); }
