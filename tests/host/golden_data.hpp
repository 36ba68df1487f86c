#pragma once
// The golden parity data (tests/data/golden: one layer of StepFun's public Step-4 reference on the
// Step-5 Preview geometry; see its README.md and manifest.json), test-only.
//
// Every file but the layer's weights is in the repository. The weights (31 MB) are regenerated on
// first use from the generator documented in manifest.json ("generator": FNV-1a-64 key,
// splitmix64 uniforms, Irwin-Hall normal) by the library's own checkpoint generator
// (step5/weights/checkpoint_generator.hpp, WeightPrng::kGoldenExact), written under the build
// tree (STEP5_TEST_TMPDIR/golden/weights.safetensors), and checked tensor by tensor against the
// manifest's "weights" (name set, shape, dtype, sha256 of the raw bytes) before any test uses them.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "sha256.hpp"
#include "step5/core/status.hpp"
#include "step5/weights/checkpoint_generator.hpp"
#include "step5/weights/safetensors.hpp"

namespace reftest {

/// The golden folder (CMake cache variable STEP5_GOLDEN_DIR; default tests/data/golden).
inline std::string golden_dir() { return STEP5_GOLDEN_DIR; }

/// `golden_dir()/name`; throws `step5::Error` (kNotFound) naming the path when it is absent.
inline std::string golden_path(const std::string& name) {
  const std::string p = golden_dir() + "/" + name;
  if (!std::filesystem::exists(p))
    throw step5::Error(step5::StatusCode::kNotFound,
                       "golden file '" + p + "' not found (STEP5_GOLDEN_DIR = '" + golden_dir() + "')");
  return p;
}

/// manifest.json of the golden folder. Throws `step5::Error` when absent or malformed.
inline nlohmann::json golden_manifest() {
  const std::string p = golden_path("manifest.json");
  std::ifstream f(p);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw step5::Error(step5::StatusCode::kIoError, "golden manifest '" + p + "': malformed JSON");
  return j;
}

/// The generator options that reproduce the golden layer (layer 0 of a one-layer step5_preview
/// checkpoint at the manifest's hidden size and seed, golden-exact stream).
inline step5::CheckpointOptions golden_checkpoint_options(const nlohmann::json& manifest) {
  step5::CheckpointOptions o;
  o.geometry = "step5_preview";
  o.num_layers = 1;
  o.layer_types = {"full_attention"};
  o.hidden = manifest.at("config").at("hidden_size").get<int>();
  o.seed = manifest.at("generator").at("seed").get<std::uint64_t>();
  o.prng = step5::WeightPrng::kGoldenExact;
  return o;
}

/// Checks the safetensors file `path` against the manifest's "weights": the same tensor names,
/// and per tensor the shape, the dtype ("bf16"/"fp32") and the sha256 of its bytes. Throws
/// `step5::Error` (kInvalidArgument) naming the first tensor that differs and what differs.
inline void verify_golden_weights(const std::string& path, const nlohmann::json& manifest) {
  using step5::Error;
  using step5::StatusCode;
  const step5::SafetensorsFile f(path);
  const auto& weights = manifest.at("weights");
  for (const auto& name : f.names())
    if (!weights.contains(name))
      throw Error(StatusCode::kInvalidArgument, "golden weights '" + path + "': tensor '" + name + "' is not in the manifest");
  for (auto it = weights.begin(); it != weights.end(); ++it) {
    const std::string& name = it.key();
    const auto& m = it.value();
    const std::string what = "golden weights '" + path + "': tensor '" + name + "'";
    if (!f.contains(name)) throw Error(StatusCode::kInvalidArgument, what + " is missing");
    const step5::TensorView v = f.view(name);
    const auto shape = m.at("shape").get<std::vector<std::int64_t>>();
    if (v.shape != shape)
      throw Error(StatusCode::kInvalidArgument,
                  what + " has shape " + step5::shape_string(v.shape) + ", manifest " + step5::shape_string(shape));
    const std::string dt = m.at("dtype").get<std::string>();
    const step5::DType want = dt == "bf16" ? step5::DType::kBF16 : dt == "fp32" ? step5::DType::kF32 : step5::DType::kU8;
    if (want == step5::DType::kU8 || v.dtype != want)
      throw Error(StatusCode::kInvalidArgument,
                  what + " has dtype " + std::string(step5::dtype_name(v.dtype)) + ", manifest '" + dt + "'");
    const std::string got = sha256_hex(v.data, v.nbytes()), expected = m.at("sha256").get<std::string>();
    if (got != expected)
      throw Error(StatusCode::kInvalidArgument, what + " has sha256 " + got + ", manifest " + expected);
  }
}

/// The golden layer's weights file (see the file comment), regenerated when absent or when it
/// does not match the manifest; always verified against the manifest before it is returned.
/// Concurrent test processes each generate into their own folder and rename the result into
/// place (atomic). Throws `step5::Error` naming the tensor when the regenerated weights differ.
inline std::string golden_weights_file() {
  namespace fs = std::filesystem;
  static const std::string cached = [] {
    const nlohmann::json manifest = golden_manifest();
    const fs::path dir = fs::path(STEP5_TEST_TMPDIR) / "golden";
    const fs::path file = dir / "weights.safetensors";
    if (fs::exists(file)) {
      try {
        verify_golden_weights(file.string(), manifest);
        return file.string();
      } catch (const step5::Error&) {
        // stale (older generator or manifest): regenerate below
      }
    }
    const fs::path work = dir / ("generate." + std::to_string(::getpid()));
    step5::generate_checkpoint(work.string(), golden_checkpoint_options(manifest));
    verify_golden_weights((work / "model.safetensors").string(), manifest);
    fs::rename(work / "model.safetensors", file);
    std::error_code ec;
    fs::remove_all(work, ec);
    return file.string();
  }();
  return cached;
}

/// The path of golden file `name`: the regenerated weights for "weights.safetensors"
/// (`golden_weights_file`), `golden_path(name)` otherwise.
inline std::string golden_file(const std::string& name) {
  return name == "weights.safetensors" ? golden_weights_file() : golden_path(name);
}

}  // namespace reftest
