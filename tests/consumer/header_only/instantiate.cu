// The one translation unit of this engine that instantiates step5 (one geometry row), instead of
// linking step5::kernels.
#define STEP5_INSTANTIATE_ROWS(X) X(step5_preview)
#include "step5/instantiate.cuh"
