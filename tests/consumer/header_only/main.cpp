// g++ translation unit of the header-only consumer: calls the launchers that instantiate.cu defines.
#include "../common.hpp"

int main() { return consumer::run(); }
