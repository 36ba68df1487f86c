// Host tests of the programmatic-dependent-launch switch (step5/ops/pdl.hpp): the default comes
// from the environment (STEP5_PDL=0 turns it off; registered twice in tests/CMakeLists.txt, with
// and without that variable), and set_pdl_enabled changes it for every later launch. Whether the
// kernels give the same bits either way is tests/gpu/test_graph.cu's job.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#include "step5/ops/pdl.hpp"

TEST_CASE("pdl switch: default from STEP5_PDL, then set_pdl_enabled") {
  const char* env = std::getenv("STEP5_PDL");
  const bool off_by_env = env != nullptr && std::strcmp(env, "0") == 0;
  CHECK(step5::ops::pdl_enabled() == !off_by_env);
  CHECK(step5::ops::pdl_enabled() == !off_by_env);  // read once, stable
  step5::ops::set_pdl_enabled(false);
  CHECK_FALSE(step5::ops::pdl_enabled());
  step5::ops::set_pdl_enabled(true);
  CHECK(step5::ops::pdl_enabled());
}
