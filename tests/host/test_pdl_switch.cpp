// Host tests of the programmatic-dependent-launch switch (step5/ops/pdl.hpp): the default comes
// from the environment (STEP5_PDL=0 turns it off; registered twice in tests/CMakeLists.txt, with
// and without that variable), and set_pdl_enabled changes it for every later launch. Whether the
// kernels give the same bits either way is tests/gpu/test_graph.cu's job.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "step5/ops/pdl.hpp"

TEST_CASE("pdl switch: STEP5_PDL values") {
  using step5::ops::detail::pdl_env_state;
  CHECK(pdl_env_state(nullptr) == 1);
  CHECK(pdl_env_state("") == 1);
  CHECK(pdl_env_state("1") == 1);
  CHECK(pdl_env_state("0") == 0);
  for (const char* bad : {"off", "false", "2", "00", " 0"}) {
    CAPTURE(bad);
    CHECK(pdl_env_state(bad) == 2);
  }
}

TEST_CASE("pdl switch: a STEP5_PDL that is neither 0 nor 1 is refused, naming the value") {
  const char* env = std::getenv("STEP5_PDL");
  if (env == nullptr || step5::ops::detail::pdl_env_state(env) != 2) return;  // the STEP5_PDL=off registration
  const step5::Status s = step5::ops::pdl_env_status();
  CHECK(s.code() == step5::StatusCode::kInvalidArgument);
  CHECK(s.message().find(std::string("STEP5_PDL = '") + env + "'") != std::string::npos);
  step5::ops::set_pdl_enabled(true);  // an explicit choice decides
  CHECK(step5::ops::pdl_env_status().ok());
}

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
