// step5_driver — the example model driver (the project's main job).
//
// Loads a Step5-format checkpoint (default: the embedded Step-5 Preview–geometry default,
// generated once into a cache directory and reused), then runs the first --layers DSA layers
// end to end over several requests of different lengths batched together: chunked prefill,
// then decode steps, on the CPU reference (--backend cpu) or the GPU (--backend cuda), at any
// --tp of the geometry list (ranks' partials summed as the TP all-reduce, SPEC §4.8).
// Prints progress and per-phase timings; --json prints a machine-readable summary; --check
// compares against a second run (tp-sharded vs tp=1 on the CPU; GPU vs CPU).
#include <CLI/CLI.hpp>

#include <signal.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "driver_common.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/weights/checkpoint_generator.hpp"

namespace fs = std::filesystem;
using namespace step5;
using namespace step5::driver;

namespace {

struct Options {
  std::string checkpoint;
  std::string geometry = "step5_preview";
  int hidden = 0;  // 0: not given (the geometry row's hidden size)
  int skip_exit_code = 2;
  std::string cache_dir;
  int layers = 2;
  int tp = 1;
  int tokens = 512;
  int chunk = 256;
  int decode_steps = 8;
  int topk = 16;  // --topk; not given: the checkpoint's sparse_config.topk, or 16 on the embedded default
  int requests = 2;
  int block_size = 64;
  std::string backend = "auto";
  bool simulate_tp = false;
  bool check = false;
  bool json = false;
  bool quiet = false;
  std::uint64_t seed = 1234;
  bool multiprocess = false;  // one process per GPU (also when WORLD_SIZE is set and not 1)
  int dist_timeout = 300;     // seconds: rendezvous, NCCL init, each step's wait
  int rank = 0;               // this process's rank (one process per GPU), else 0
};

// Exit codes (README "The example driver").
constexpr int kExitOk = 0;           // the run (and --check, if asked) passed
constexpr int kExitCheckFailed = 1;  // --check compared and FAILED
constexpr int kExitError = 2;        // bad option, refused run (disk, memory), I/O or CUDA error
constexpr int kExitOutOfMemory = 3;  // host memory ran out during the run (std::bad_alloc)

// Positions index the RoPE tables and the block tables: keep them within 1M tokens (the longest
// context the library is tested for, SPEC §5).
constexpr long long kMaxPositions = 1ll << 20;

// The one parser + range check of the integer options: a bad value gives one line naming the
// option, the value and the allowed range (CLI11 prefixes the option name). Decimal only: CLI11
// then converts the text with strtoll base 0, which reads a leading 0 as octal (--tp 010 ran tp
// 8), so a leading zero is refused.
template <class T>
CLI::Validator int_in(T lo, T hi = std::numeric_limits<T>::max()) {
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        T v{};
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range || (ec == std::errc() && p == end && (v < lo || v > hi)))
          return "value " + text + " is outside the allowed range: expected " + range;
        if (ec != std::errc() || p != end) return "value '" + text + "' is not an integer: expected " + range;
        const std::size_t digits = text[0] == '-' ? 1 : 0;
        if (text.size() > digits + 1 && text[digits] == '0')
          return "value '" + text + "' has a leading zero: expected " + range + ", decimal without leading zeros";
        return {};
      },
      range.substr(3));
}

// The embedded default: Step-5 Preview geometry (SPEC §8 row step5_preview, hidden 4096), in
// the Step-5 Preview layer pattern (DSA on layers 4k+3: --layers N needs a 4N-layer config),
// with tensors only for the DSA layers the run uses (CheckpointOptions::dsa_layers_only),
// indexer tensors on DSA layers (like the real checkpoint). --geometry/--hidden pick another
// row of the list or a smaller hidden size (tests).

// The default checkpoint's cache directory: $STEP5_CACHE_DIR; else $XDG_CACHE_HOME/step5 where
// XDG_CACHE_HOME is an absolute path (the XDG base-directory rule: an empty or relative one is
// ignored); else $HOME/.cache/step5 (HOME not empty); else <temp>/step5-cache. A STEP5_CACHE_DIR
// that is set but empty is refused where the directory is used (cache_dir_of_run), not here
// (--help prints this default).
std::string default_cache_dir() {
  if (const char* x = std::getenv("STEP5_CACHE_DIR"); x != nullptr && *x != 0) return x;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') return std::string(x) + "/step5";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != 0) return std::string(h) + "/.cache/step5";
  return (fs::temp_directory_path() / "step5-cache").string();
}

// A path option given on the command line (`option` = its value): an empty value names no path
// (`--checkpoint "$UNSET"` ran the embedded default instead), and one starting with "--" is the
// next option taken as the value (`--cache-dir= --quiet`): refused, naming the option and `expected`.
void check_path_option(const char* option, const std::string& value, const std::string& expected) {
  if (value.empty()) throw Error(StatusCode::kInvalidArgument, std::string(option) + " '': expected " + expected);
  if (value.rfind("--", 0) == 0)
    throw Error(StatusCode::kInvalidArgument, std::string(option) + " '" + value + "' looks like an option: expected " +
                                                  expected + " (a value missing after " + option + "=?)");
}

// The cache directory of a run: --cache-dir where given, else default_cache_dir(). An empty
// --cache-dir or STEP5_CACHE_DIR names no directory: refused, naming it.
std::string cache_dir_of_run(const Options& opt, bool cache_dir_given) {
  if (cache_dir_given) {
    check_path_option("--cache-dir", opt.cache_dir, "a directory path");
    return opt.cache_dir;
  }
  if (const char* x = std::getenv("STEP5_CACHE_DIR"); x != nullptr && *x == 0)
    throw Error(StatusCode::kInvalidArgument, "STEP5_CACHE_DIR is set but empty: expected a directory path (or unset it)");
  return default_cache_dir();
}

CheckpointOptions default_checkpoint_options(const Options& opt) {
  CheckpointOptions o;
  o.geometry = opt.geometry;
  o.hidden = opt.hidden;
  o.num_layers = kPreviewDsaPeriod * opt.layers;  // opt.layers DSA layers
  o.indexer_on_all_layers = false;
  o.dsa_layers_only = true;
  return o;
}

// The cache directory name of a default checkpoint with `num_layers` layers.
std::string default_dir_name(const Options& opt, int hidden, int num_layers) {
  return opt.geometry + "-h" + std::to_string(hidden) + "-L" + std::to_string(num_layers) + "-dsa-v2";
}

// The default checkpoint lives in <cache>/<geometry>-h<hidden>-L<4*layers>-dsa-v2, generated
// once; a cached one with more layers serves too (the run uses the first DSA layers).
struct DefaultCheckpoint {
  fs::path cache_dir, dir;
  CheckpointOptions options;
  double bytes = 0;   // tensor bytes to write
  bool cached = false;
};

DefaultCheckpoint plan_default_checkpoint(const std::string& cache_dir, const Options& opt) {
  const layout::GeometryEntry* entry = layout::find_geometry(opt.geometry);
  const int hidden = opt.hidden > 0 ? opt.hidden : entry->hidden;
  DefaultCheckpoint d;
  d.cache_dir = cache_dir;
  d.options = default_checkpoint_options(opt);
  d.dir = d.cache_dir / default_dir_name(opt, hidden, d.options.num_layers);
  std::error_code ec;
  const std::string prefix = opt.geometry + "-h" + std::to_string(hidden) + "-L", suffix = "-dsa-v2";
  int best = 0;
  for (const auto& de : fs::directory_iterator(cache_dir, ec)) {
    const std::string n = de.path().filename().string();
    if (!n.starts_with(prefix) || !n.ends_with(suffix) || !de.is_directory(ec)) continue;
    const std::string mid = n.substr(prefix.size(), n.size() - prefix.size() - suffix.size());
    int l = 0;
    const auto [p, e] = std::from_chars(mid.data(), mid.data() + mid.size(), l);
    if (e == std::errc() && p == mid.data() + mid.size() && l >= d.options.num_layers && (best == 0 || l < best)) {
      best = l;
      d.dir = de.path();
      d.cached = true;
    }
  }
  if (!d.cached) d.bytes = static_cast<double>(checkpoint_data_bytes(d.options));
  return d;
}

// Before generating: prints the size and refuses when the disk has not that much free.
void check_disk(const DefaultCheckpoint& d, const Options& opt) {
  if (!opt.quiet)
    std::fprintf(stderr, "[step5] the default checkpoint (%s, tensors of %d DSA layers) takes %s of disk: %s\n",
                 opt.geometry.c_str(), opt.layers, gb(d.bytes).c_str(), d.dir.c_str());
  std::error_code ec;
  fs::create_directories(d.cache_dir, ec);
  if (!fs::is_directory(d.cache_dir, ec))
    throw Error(StatusCode::kIoError, "cannot create the cache directory '" + d.cache_dir.string() +
                                          "' (--cache-dir, else STEP5_CACHE_DIR, XDG_CACHE_HOME or HOME)");
  const fs::space_info sp = fs::space(d.cache_dir, ec);
  constexpr double kReserve = 256e6;  // left free besides the checkpoint
  if (!ec && d.bytes + kReserve > static_cast<double>(sp.available))
    throw Error(StatusCode::kInvalidArgument,
                "the default checkpoint for --layers " + std::to_string(opt.layers) + " needs " + gb(d.bytes) +
                    " of disk (and " + gb(kReserve) + " kept free), only " + gb(static_cast<double>(sp.available)) +
                    " are free in '" + d.cache_dir.string() +
                    "': use fewer --layers, a smaller --hidden, or --cache-dir on a larger disk");
}

// Writes it atomically (generate_checkpoint_atomically: a failure or an interruption never
// leaves a partial checkpoint under the final name). Temporaries of killed runs are removed.
void generate_default_checkpoint(const DefaultCheckpoint& d, const Options& opt) {
  std::error_code ec;
  const std::string tag = d.dir.filename().string() + ".partial-";
  for (const auto& de : fs::directory_iterator(d.cache_dir, ec)) {
    const std::string n = de.path().filename().string();
    if (!n.starts_with(tag)) continue;
    const long pid = std::strtol(n.c_str() + tag.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(de.path(), ec);
  }
  if (!opt.quiet) std::fprintf(stderr, "[step5] generating the default checkpoint (once)...\n");
  const auto t0 = Clock::now();
  generate_checkpoint_atomically(d.dir.string(), d.options);
  if (!opt.quiet) std::fprintf(stderr, "[step5] generated in %.1f s\n", seconds_since(t0));
}

struct RunResult {
  std::vector<std::vector<float>> outputs;  // per step: residual [T, hidden] after the layers
  // --check: per step, the residual before each layer and after the last (layers + 1 arrays)
  std::vector<std::vector<std::vector<float>>> layer_residuals;
  Timings timings;
  double prefill_s = 0, decode_s = 0;
  double checksum = 0;
};

// Fault injection for the multi-process failure tests: STEP5_TEST_KILL_RANK_AFTER_STEP=R:S makes
// rank R kill itself (SIGKILL) after step S (1-based) — "a rank killed mid-run". {-1, -1}: unset.
std::pair<int, int> test_kill_point() {
  const char* v = std::getenv("STEP5_TEST_KILL_RANK_AFTER_STEP");
  if (v == nullptr) return {-1, -1};
  // whole decimal int fields (sscanf's %d wrapped out-of-range values: 0:4294967297 fired at step 1)
  const auto field = [](const char* b, const char* e, int lo, int* out) {
    int n = 0;
    const auto [p, ec] = std::from_chars(b, e, n);
    if (b == e || ec != std::errc() || p != e || n < lo) return false;
    *out = n;
    return true;
  };
  const char* colon = std::strchr(v, ':');
  int r = -1, s = -1;
  if (colon == nullptr || !field(v, colon, 0, &r) || !field(colon + 1, colon + std::strlen(colon), 1, &s))
    throw Error(StatusCode::kInvalidArgument, std::string("STEP5_TEST_KILL_RANK_AFTER_STEP='") + v +
                                                  "': expected RANK:STEP, decimal ints (RANK >= 0, STEP >= 1)");
  return {r, s};
}

RunResult run(Backend& backend, const Model& model, const Workload& w, const Options& opt, bool progress,
              bool record_layers) {
  RunResult res;
  const auto [kill_rank, kill_step] = test_kill_point();
  const int hidden = model.config.hidden_size;
  std::vector<int> done(w.prompt_lens.size(), 0);
  for (std::size_t s = 0; s < w.steps.size(); ++s) {
    const Step& step = w.steps[s];
    const int T = step.num_tokens();
    std::vector<float> residual(static_cast<std::size_t>(T) * hidden);
    for (std::size_t b = 0; b < step.requests.size(); ++b) {
      const int r = step.requests[b];
      const int q0 = step.batch.cu_seqlens_q[b], n = step.batch.cu_seqlens_q[b + 1] - q0;
      const int pos0 = step.batch.view().past_len(static_cast<int>(b));
      for (int i = 0; i < n; ++i) token_embedding(opt.seed, r, pos0 + i, hidden, &residual[static_cast<std::size_t>(q0 + i) * hidden]);
    }
    std::vector<std::vector<float>> layer_res;
    const auto t0 = Clock::now();
    backend.run_step(step, opt.topk, residual, res.timings, record_layers ? &layer_res : nullptr);
    const double dt = seconds_since(t0);
    (step.prefill ? res.prefill_s : res.decode_s) += dt;
    for (float v : residual) res.checksum += std::fabs(static_cast<double>(v));
    if (progress)
      std::fprintf(stderr, "[step5] %s step %zu/%zu: %d tokens of %zu requests, %.3f s\n",
                   step.prefill ? "prefill" : "decode", s + 1, w.steps.size(), T, step.requests.size(), dt);
    res.outputs.push_back(std::move(residual));
    if (record_layers) res.layer_residuals.push_back(std::move(layer_res));
    if (opt.rank == kill_rank && static_cast<int>(s) + 1 == kill_step) {
      std::fprintf(stderr, "[step5] rank %d: killing itself after step %zu (STEP5_TEST_KILL_RANK_AFTER_STEP)\n", opt.rank, s + 1);
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
  }
  return res;
}

// The per-layer --check: every layer of every step of run `a` is recomputed by the CPU
// reference at tp 1 (`ref`) on exactly the same layer input (bf16 of a's residual before that
// layer; ref's caches are filled from those same inputs), and what the layer added to the
// residual (its all-reduced output) is compared token row by token row. Teacher forcing keeps
// the comparison to one layer's arithmetic: without it, bf16 rounding differences of one layer
// (e.g. tp-sharded bf16 partials, SPEC §4.8) flip near-tie top-k selections (SPEC §4.6) of the
// next layer and the runs drift apart legitimately.
//
// Within one layer a row can still differ by more than rounding when a selection flips on a
// near-tie score (the GPU's e4m3 q may round differently from the CPU's by one e4m3 step). A
// row off by more than kRowTol is excused only when, in some local group, the reference's k-th
// and (k+1)-th best history scores are within kNearTie of each other — and the excusing pair
// is printed; at most kMaxExcusedFraction of the rows may be excused. The check passes when
// every row over kRowTol is excused, the excused rows are within the cap, and the relative
// error over the other rows is <= kRelTol.
constexpr double kRowTol = 2e-2;
constexpr double kNearTie = 2e-2;
constexpr double kRelTol = 1e-2;
// 2 %: the README default workload (topk 16, random weights, short histories) has 0.8 % (tp 1)
// and 1.1 % (tp 8 simulated) of its rows legitimately excused on the H200 (2026-12-01: every one a
// printed near-tie, none unexplained); a broken kernel moves far more rows, most without a tie.
constexpr double kMaxExcusedFraction = 0.02;

// A near-tie at the k-th place of the reference's scores of one (token row, group).
struct NearTie {
  int group = 0;
  float kth = 0, next = 0;  // the k-th and (k+1)-th best reference history scores
};
// A row off by more than kRowTol: where, how much, and the near-tie that excuses it (if any).
struct RowOver {
  std::size_t step = 0, layer = 0;
  int row = 0, position = 0;
  double rel = 0;
  std::optional<NearTie> tie;
};
struct CheckStats {
  double rel_all = 0, rel = 0, worst = 0;  // all rows; rows within kRowTol; worst (step, layer)
  long rows = 0;
  std::vector<RowOver> over;  // every row over kRowTol
  long excused() const {
    return std::count_if(over.begin(), over.end(), [](const RowOver& r) { return r.tie.has_value(); });
  }
  long unexplained() const { return static_cast<long>(over.size()) - excused(); }
  long max_excused() const { return static_cast<long>(std::floor(kMaxExcusedFraction * rows)); }
  bool passed() const { return rel <= kRelTol && unexplained() == 0 && excused() <= max_excused(); }
};

// The near-tie at the k-th place of row t of the reference's scores, if some group has one.
std::optional<NearTie> near_tie(const reference::LayerIntermediates& I, int t, int topk) {
  const int T = static_cast<int>(I.positions.size());
  const int lg = static_cast<int>(I.scores.size() / (static_cast<std::size_t>(T) * I.ld_scores));
  const int hist = I.positions[t] / 8;
  if (hist <= topk) return std::nullopt;  // every history region is selected: nothing can flip
  for (int g = 0; g < lg; ++g) {
    const float* row = &I.scores[(static_cast<std::size_t>(g) * T + t) * I.ld_scores];
    std::vector<float> v(row, row + hist);
    std::nth_element(v.begin(), v.begin() + topk, v.end(), std::greater<float>());
    const float next = v[topk];
    const float kth = *std::min_element(v.begin(), v.begin() + topk);
    const double scale = std::max({std::fabs(kth), std::fabs(next), 1e-30f});
    if (std::fabs(static_cast<double>(kth) - next) <= kNearTie * scale) return NearTie{g, kth, next};
  }
  return std::nullopt;
}

CheckStats check_layers(const RunResult& a, CpuBackend& ref, const Workload& w, int topk, int hidden) {
  CheckStats c;
  double num = 0, den = 0, num_all = 0, den_all = 0;
  for (std::size_t s = 0; s < w.steps.size(); ++s) {
    const auto& lr = a.layer_residuals[s];
    for (std::size_t l = 0; l + 1 < lr.size(); ++l) {
      reference::LayerIntermediates I;
      const std::vector<bf16> reduced = ref.layer(w.steps[s], topk, l, lr[l], &I);
      double sn = 0, sd = 0;
      for (std::size_t r = 0; r * hidden < reduced.size(); ++r) {
        double rn = 0, rd = 0;
        for (int j = 0; j < hidden; ++j) {
          const std::size_t i = r * hidden + j;
          const double da = static_cast<double>(lr[l + 1][i]) - lr[l][i];
          const double db = to_float(reduced[i]);
          rn += (da - db) * (da - db);
          rd += db * db;
        }
        sn += rn, sd += rd;
        ++c.rows;
        const double rel = rd > 0 ? std::sqrt(rn / rd) : (rn > 0 ? INFINITY : 0.0);
        if (rel > kRowTol) {
          c.over.push_back({s, l, static_cast<int>(r), I.positions[r], rel, near_tie(I, static_cast<int>(r), topk)});
        } else {
          num += rn, den += rd;
        }
      }
      num_all += sn, den_all += sd;
      c.worst = std::max(c.worst, sd > 0 ? std::sqrt(sn / sd) : std::sqrt(sn));
    }
  }
  c.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  c.rel_all = den_all > 0 ? std::sqrt(num_all / den_all) : std::sqrt(num_all);
  return c;
}

struct NoGpu : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::unique_ptr<Backend> make_backend(const std::string& kind, const Model& m, const Workload& w, bool simulate_tp) {
  if (kind == "cpu") return std::make_unique<CpuBackend>(m, w);
  std::string why;
  auto b = make_cuda_backend(m, w, simulate_tp, &why);
  if (!b) throw NoGpu("--backend cuda: " + why);
  return b;
}


// A checkpoint given as its config.json file (or a .safetensors / index file inside it) means
// its directory for config.json; the Checkpoint reader takes the directory or that file.
struct CheckpointPaths {
  fs::path config, tensors;
};
CheckpointPaths checkpoint_paths(const std::string& given) {
  std::error_code ec;
  const fs::path p(given);
  if (fs::is_regular_file(p, ec)) {
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    return {dir / "config.json", p.filename() == "config.json" ? dir : p};
  }
  return {p / "config.json", p};
}

int run_driver(int argc, char** argv, Options& opt);

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    return run_driver(argc, argv, opt);
  } catch (const NoGpu& e) {
    std::fprintf(stderr, "step5_driver: %s\n", e.what());
    return opt.skip_exit_code;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "step5_driver: error: out of host memory (std::bad_alloc) during the run: use fewer --tokens, "
                         "--requests or --layers (the start-up estimate was too low, or other processes took memory)\n");
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step5_driver: error: %s\n", e.what());
    return kExitError;
  }
}

namespace {

int run_driver(int argc, char** argv, Options& opt) {
  CLI::App app{"step5_driver: runs Step5 DSA attention layers of a checkpoint end to end (prefill + decode)\n"
               "exit codes: 0 ok, 1 --check FAILED, 2 bad option / refused run / error, 3 out of host memory, "
               "--skip-exit-code when --backend cuda finds no suitable GPU"};
  app.option_defaults()->always_capture_default();
  app.add_option("--checkpoint", opt.checkpoint,
                 "checkpoint directory (config.json + safetensors) or its config.json; default: the embedded "
                 "Step-5 Preview default, generated once into the cache directory");
  app.add_option("--cache-dir", opt.cache_dir, "where the default checkpoint is generated")
      ->default_str(default_cache_dir() + " ($STEP5_CACHE_DIR, else $XDG_CACHE_HOME/step5, else ~/.cache/step5)");
  app.add_option("--geometry", opt.geometry, "geometry of the generated default checkpoint (a row of geometries.def)");
  app.add_option("--hidden", opt.hidden, "hidden size of the generated default checkpoint")
      ->check(int_in(1, 1 << 16))
      ->default_str("the geometry row's, 4096 for step5_preview");
  app.add_option("--skip-exit-code", opt.skip_exit_code,
                 "exit code when --backend cuda finds no (or too few) suitable GPUs (tests pass 77 = skipped)")
      ->check(int_in(0, 255));
  app.add_option("--layers", opt.layers, "number of DSA layers to run (the first ones of the checkpoint)")
      ->check(int_in(1, static_cast<int>(step5::detail::kConfigMaxLayers / kPreviewDsaPeriod)));  // the generated default's num_layers within the config parser's limit
  app.add_option("--tp", opt.tp, "tensor-parallel size (a tp value of the geometry list)")->check(int_in(1, 1024));
  app.add_option("--tokens", opt.tokens, "prompt length of the longest request")->check(int_in(1, static_cast<int>(kMaxPositions)));
  app.add_option("--chunk", opt.chunk, "prefill chunk (tokens per request per step)")->check(int_in(1, static_cast<int>(kMaxPositions)));
  app.add_option("--decode-steps", opt.decode_steps, "decode steps after the prefill")->check(int_in(0, static_cast<int>(kMaxPositions)));
  app.add_option("--topk", opt.topk, "regions selected per (token, KV group) (SPEC §1)")
      ->default_str("the checkpoint's sparse_config.topk; 16 on the embedded default")
      ->check(int_in(1, step5::layout::kMaxTopk));
  app.add_option("--requests", opt.requests,
                 "requests batched together (lengths tokens, tokens*(R-1)/R, ...); at most " +
                     std::to_string(step5::driver::kMaxRequests) + " (the GPU kernels' limit per step)")
      ->check(int_in(1, step5::driver::kMaxRequests));
  app.add_option("--block-size", opt.block_size, "paged-cache block size (a multiple of 8)")->check(int_in(8, 1 << 16));
  app.add_option("--backend", opt.backend, "cpu, cuda, or auto (cuda when a GPU backend is built and a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--simulate-tp", opt.simulate_tp, "cuda only: run all --tp ranks' shards on one GPU and sum their partials");
  app.add_flag("--check", opt.check,
               "compare with a second run: tp-sharded vs tp=1 (cpu), GPU vs CPU (cuda); cpu at tp 1 has nothing to "
               "compare (reported as not checked)");
  app.add_flag("--json", opt.json, "print a machine-readable JSON summary on stdout");
  app.add_option("--seed", opt.seed, "seed of the input embeddings")->check(int_in<std::uint64_t>(0));
  app.add_flag("--quiet", opt.quiet, "no progress lines");
  app.add_flag("--multiprocess", opt.multiprocess,
               "one process per GPU (set by tools/launch_tp.sh: WORLD_SIZE set and not 1 turns it on): this process is rank "
               "RANK of WORLD_SIZE = --tp on GPU LOCAL_RANK, meeting the others at MASTER_ADDR:MASTER_PORT");
  app.add_option("--dist-timeout", opt.dist_timeout,
                 "one process per GPU: seconds to wait for the other ranks (rendezvous, NCCL init, each step)")
      ->check(int_in(1, 86400));
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::string m = e.what();
    std::replace(m.begin(), m.end(), '\n', ' ');
    throw Error(StatusCode::kInvalidArgument, m);
  }

  // Options that do not apply are errors, not silently ignored.
  if (app.count("--checkpoint") > 0)
    check_path_option("--checkpoint", opt.checkpoint,
                      "a checkpoint directory or its config.json (leave --checkpoint out for the embedded default)");
  if (!opt.checkpoint.empty())
    for (const char* o : {"--geometry", "--hidden", "--cache-dir"})
      if (app.count(o) > 0)
        throw Error(StatusCode::kInvalidArgument, std::string(o) + " describes the generated default checkpoint; with --checkpoint '" +
                                                      opt.checkpoint + "' the checkpoint's config.json gives the geometry and hidden size");
  if (opt.simulate_tp && opt.backend == "cpu")
    throw Error(StatusCode::kInvalidArgument,
                "--simulate-tp applies to --backend cuda only (the cpu backend always runs every --tp rank on the host)");
  if (opt.block_size % step5::layout::kRegionSize != 0)
    throw Error(StatusCode::kInvalidArgument, "--block-size " + std::to_string(opt.block_size) + " is not a multiple of the region size " +
                                                  std::to_string(step5::layout::kRegionSize));
  if (static_cast<long long>(opt.tokens) + opt.decode_steps > kMaxPositions)
    throw Error(StatusCode::kInvalidArgument, "--tokens " + std::to_string(opt.tokens) + " + --decode-steps " +
                                                  std::to_string(opt.decode_steps) + " exceeds " +
                                                  std::to_string(kMaxPositions) + " positions");
  // One process per GPU: the rank environment (validated), --tp = WORLD_SIZE, the cuda backend.
  const bool multiprocess =
      opt.multiprocess || comm::multiprocess_requested([](const char* n) -> const char* { return std::getenv(n); });
  DistContext dist;
  if (multiprocess) {
    dist.env = comm::dist_env();
    dist.timeout_s = opt.dist_timeout;
    opt.rank = dist.env.rank;
    if (opt.backend == "cpu")
      throw Error(StatusCode::kInvalidArgument, "one process per GPU (WORLD_SIZE=" + std::to_string(dist.env.world_size) +
                                                    ", or --multiprocess) needs --backend cuda or auto; --backend cpu "
                                                    "runs every --tp rank in one process");
    if (opt.simulate_tp)
      throw Error(StatusCode::kInvalidArgument, "--simulate-tp runs every rank on one GPU in one process; it does not apply "
                                                "to one process per GPU (WORLD_SIZE=" + std::to_string(dist.env.world_size) + ")");
    if (dist.env.world_size != opt.tp)
      throw Error(StatusCode::kInvalidArgument, "WORLD_SIZE=" + std::to_string(dist.env.world_size) + " processes but --tp " +
                                                    std::to_string(opt.tp) + ": one process per rank needs WORLD_SIZE = --tp");
    opt.backend = "cuda";
  }
  const bool root = opt.rank == 0;  // prints the summary and runs --check
  if (!root) opt.quiet = true;

  const bool use_default = opt.checkpoint.empty();
  if (use_default && layout::find_geometry(opt.geometry) == nullptr)
    throw Error(StatusCode::kInvalidArgument, "--geometry '" + opt.geometry + "' is not in the list; supported: " +
                                                  layout::supported_layouts());

  const auto t_load = Clock::now();
  // The config first (the generated default's without writing it), to refuse what cannot run
  // before generating or loading anything.
  const CheckpointPaths given = checkpoint_paths(opt.checkpoint);
  ModelConfig cfg = use_default ? parse_model_config(make_checkpoint_config(default_checkpoint_options(opt)),
                                                     "the generated default's config.json")
                                : load_model_config(given.config.string());
  // SPEC §1: topk is the run-time sparse_config.topk. A given checkpoint runs with its own unless
  // --topk overrides it; the embedded default keeps the workload's 16 (at its default 512 tokens a
  // topk of 512 would select every history region).
  if (!use_default && app.count("--topk") == 0) opt.topk = cfg.sparse.topk;
  // The tp must be a row of the geometry list (one mechanism: the run-time dispatch).
  throw_if_error(layout::dispatch_layout(cfg.geometry_name, opt.tp, [](auto) { return Status::Ok(); }));
  if (static_cast<int>(cfg.dsa_layers().size()) < opt.layers)
    throw Error(StatusCode::kInvalidArgument, "--layers " + std::to_string(opt.layers) + ": the checkpoint (" + cfg.source +
                                                  ") has only " + std::to_string(cfg.dsa_layers().size()) + " DSA layers");
  // The default checkpoint's disk space, then the run's host memory, before writing anything.
  std::optional<DefaultCheckpoint> def_plan;
  if (use_default) {
    def_plan = plan_default_checkpoint(cache_dir_of_run(opt, app.count("--cache-dir") > 0), opt);
    if (!def_plan->cached && root) check_disk(*def_plan, opt);  // one process per GPU: rank 0 generates it
  }
  {
    const WorkloadShape shape = workload_shape(opt.requests, opt.tokens, opt.chunk, opt.decode_steps, opt.block_size);
    // Token rows and cache slots are int32 (cu_seqlens, slot_mapping; SPEC §5).
    if (shape.total_tokens > std::numeric_limits<std::int32_t>::max() / 2)
      throw Error(StatusCode::kInvalidArgument, "--requests " + std::to_string(opt.requests) + " x --tokens " +
                                                    std::to_string(opt.tokens) + " make " + std::to_string(static_cast<long long>(shape.total_tokens)) +
                                                    " token positions, more than the int32 batch metadata allows (" +
                                                    std::to_string(std::numeric_limits<std::int32_t>::max() / 2) + ")");
    const HostEstimate he = estimate_host_bytes(cfg, opt.layers, opt.tp, opt.topk, shape, opt.block_size,
                                                opt.backend != "cuda", opt.check && root, multiprocess);
    const double avail = host_available_bytes();
    if (avail > 0 && he.total() > 0.9 * avail)
      throw Error(StatusCode::kInvalidArgument,
                  "the run needs about " + gb(he.total()) + " of host memory (weights " + gb(he.weights) + " at hidden_size " +
                      std::to_string(cfg.hidden_size) + " of " + cfg.source + ", paged caches " +
                      gb(he.caches) + ", one step's intermediates " + gb(he.step) + ", residuals " + gb(he.residuals) +
                      ", batch metadata " + gb(he.metadata) + "), " + gb(avail) + " are available (MemAvailable): use fewer --tokens, --requests, --layers or --chunk (or a config "
                      "whose hidden_size the checkpoint's tensors have)");
    if (!opt.quiet && !opt.json)
      std::fprintf(stderr, "[step5] host memory: about %s needed, %s available\n", gb(he.total()).c_str(), gb(avail).c_str());
  }
  const Workload w = make_workload(opt.requests, opt.tokens, opt.chunk, opt.decode_steps, opt.block_size, opt.seed);

  // One process per GPU: the ranks meet (bounded by --dist-timeout), then agree that each has its
  // GPU before any NCCL call (so all skip together when one lacks it).
  std::optional<comm::TcpStore> store;
  if (multiprocess) {
    if (!opt.quiet)
      std::fprintf(stderr, "[step5] rank %d of %d (GPU %d): rendezvous at %s:%d (timeout %d s)\n", dist.env.rank,
                   dist.env.world_size, dist.env.local_rank, dist.env.master_addr.c_str(), dist.env.master_port,
                   opt.dist_timeout);
    store.emplace(dist.env, static_cast<double>(opt.dist_timeout));
    dist.store = &*store;
    const std::string mine = cuda_rank_unavailable(dist);
    const auto all = store->allgather(comm::TcpStore::Blob(mine.begin(), mine.end()));
    for (int r = 0; r < dist.env.world_size; ++r)
      if (!all[r].empty())
        throw NoGpu("--backend cuda: rank " + std::to_string(r) + " of " + std::to_string(dist.env.world_size) + ": " +
                    std::string(all[r].begin(), all[r].end()));
  }

  std::string cached;  // the cached default's directory (for the hint when it is damaged)
  if (use_default) {
    if (!def_plan->cached && root) generate_default_checkpoint(*def_plan, opt);
    if (multiprocess) {
      // The others wait for rank 0's generation (no bound on its length; rank 0 dying ends the
      // wait at once), then find it cached.
      store->barrier(7 * 24 * 3600.0);
      if (!root) def_plan = plan_default_checkpoint(def_plan->cache_dir.string(), opt);
    }
    cached = def_plan->dir.string();
  }
  const CheckpointPaths paths = use_default ? checkpoint_paths(cached) : given;
  std::optional<Checkpoint> ckpt;
  std::optional<Model> loaded;
  try {
    cfg = load_model_config(paths.config.string());
    ckpt.emplace(paths.tensors.string());
    loaded.emplace(load_model(*ckpt, cfg, opt.layers, opt.tp, w.max_position, multiprocess ? dist.env.rank : -1));
  } catch (const Error& e) {
    if (cached.empty()) throw;
    throw Error(e.code(), std::string(e.what()) + " -- the cached default checkpoint '" + cached +
                              "' is damaged: delete it (rm -r '" + cached + "') and run again to regenerate it");
  }
  const Model& model = *loaded;
  const double load_s = seconds_since(t_load);

  std::string backend_kind = opt.backend;
  std::unique_ptr<Backend> backend;
  const bool progress = !opt.quiet && !opt.json;
  if (multiprocess) backend = make_cuda_backend_multiprocess(model, w, dist);
  if (backend_kind == "auto") {
    std::string why;
    backend = make_cuda_backend(model, w, opt.simulate_tp, &why);
    backend_kind = backend ? "cuda" : "cpu";
    if (!backend && opt.simulate_tp)
      throw Error(StatusCode::kInvalidArgument, "--simulate-tp applies to the cuda backend only; --backend auto uses the cpu (" +
                                                    why + ")");
    if (!backend && !opt.quiet) std::fprintf(stderr, "[step5] --backend auto: using the CPU (%s)\n", why.c_str());
  }
  if (progress)
    std::fprintf(stderr, "[step5] %s, %s, tp %d, %zu DSA layers, %zu requests (%d prefill + %d decode tokens), topk %d\n",
                 cfg.geometry_name.c_str(), backend_kind.c_str(), opt.tp, model.layers.size(), w.prompt_lens.size(),
                 w.prefill_tokens, w.decode_tokens, opt.topk);
  if (!backend) backend = make_backend(backend_kind, model, w, opt.simulate_tp);
  RunResult res = run(*backend, model, w, opt, progress, opt.check && root);
  backend->finish();

  // One process per GPU: every rank's bytes read, checksum and timings to rank 0; the others are done.
  std::vector<std::size_t> bytes_read = model.bytes_read_per_rank;
  nlohmann::ordered_json per_rank = nlohmann::json::array();
  if (multiprocess) {
    nlohmann::ordered_json mine = {{"rank", dist.env.rank}, {"local_rank", dist.env.local_rank},
                                   {"bytes_read", model.bytes_read_per_rank[dist.env.rank]}, {"checksum", res.checksum},
                                   {"prefill_s", res.prefill_s}, {"decode_s", res.decode_s}, {"breakdown_s", res.timings}};
    const std::string text = mine.dump();
    const auto all = store->allgather(comm::TcpStore::Blob(text.begin(), text.end()));
    if (!root) return kExitOk;
    for (int r = 0; r < dist.env.world_size; ++r) {
      per_rank.push_back(nlohmann::ordered_json::parse(std::string(all[r].begin(), all[r].end())));
      bytes_read[r] = per_rank.back()["bytes_read"].get<std::size_t>();
    }
  }

  // --check: a second run to compare with.
  CheckStats stats;
  std::string check_what;
  bool compared = false;
  std::optional<Model> tp1;  // the tp-1 reference model of --check
  if (opt.check) {
    std::unique_ptr<CpuBackend> other;
    if (backend_kind == "cuda") {
      // The GPU run (tp-sharded, NCCL or simulated) against the CPU reference at tp 1.
      check_what = "cuda tp " + std::to_string(opt.tp) +
                   (multiprocess ? " (" + std::to_string(opt.tp) + " processes, NCCL)"
                                 : opt.simulate_tp && opt.tp > 1 ? " (simulated)" : "") +
                   " vs cpu reference tp 1";
      if (opt.tp > 1) tp1.emplace(load_model(*ckpt, cfg, opt.layers, 1, w.max_position));
      other = std::make_unique<CpuBackend>(tp1 ? *tp1 : model, w);
    } else if (opt.tp > 1) {
      check_what = "tp " + std::to_string(opt.tp) + " vs tp 1 (cpu)";
      tp1.emplace(load_model(*ckpt, cfg, opt.layers, 1, w.max_position));
      other = std::make_unique<CpuBackend>(*tp1, w);
    }
    if (other) {
      if (progress) std::fprintf(stderr, "[step5] --check: %s\n", check_what.c_str());
      stats = check_layers(res, *other, w, opt.topk, cfg.hidden_size);
      compared = true;
    } else {
      check_what = "NOT CHECKED: the cpu backend at tp 1 is the reference itself, there is nothing to compare "
                   "(use --tp > 1 or --backend cuda)";
    }
  }
  const bool check_ok = !compared || stats.passed();

  const double prefill_tps = res.prefill_s > 0 ? w.prefill_tokens / res.prefill_s : 0;
  const double decode_tps = res.decode_s > 0 ? w.decode_tokens / res.decode_s : 0;
  const std::string caveat = "tokens/s are wall time of " + std::to_string(model.layers.size()) +
                             " attention-only DSA layers (no MLP, no embeddings; one run, no warm-up) on this "
                             "workload: they compare runs and backends of the same workload, not a model's serving "
                             "throughput (a prefill of a few ms is dominated by launch and start-up costs)";
  if (opt.json) {
    nlohmann::ordered_json j;
    j["geometry"] = cfg.geometry_name;
    j["backend"] = backend_kind;
    j["tp"] = opt.tp;
    j["layers"] = model.layers;
    j["hidden"] = cfg.hidden_size;
    j["requests"] = w.prompt_lens;
    j["prefill_tokens"] = w.prefill_tokens;
    j["decode_tokens"] = w.decode_tokens;
    j["topk"] = opt.topk;
    j["timings_s"] = {{"load", load_s}, {"prefill", res.prefill_s}, {"decode", res.decode_s}};
    j["tokens_per_s"] = {{"prefill", prefill_tps}, {"decode", decode_tps}};
    j["tokens_per_s_note"] = caveat;
    j["breakdown_s"] = res.timings;
    j["bytes_read_per_rank"] = bytes_read;
    if (multiprocess) {
      j["processes"] = opt.tp;
      j["per_rank"] = per_rank;
    }
    if (tp1) j["check_reference_bytes_read"] = tp1->bytes_read_per_rank[0];
    j["checksum"] = res.checksum;
    if (!opt.check) {
      j["check"] = nullptr;
    } else if (!compared) {
      j["check"] = {{"what", check_what}, {"performed", false}, {"passed", nullptr}};
    } else {
      nlohmann::ordered_json over = nlohmann::json::array();
      for (const RowOver& r : stats.over) {
        nlohmann::ordered_json o = {{"step", r.step}, {"layer", r.layer}, {"row", r.row}, {"position", r.position},
                                    {"rel_error", r.rel}};
        o["near_tie"] = r.tie ? nlohmann::json{{"group", r.tie->group}, {"kth_score", r.tie->kth}, {"next_score", r.tie->next}}
                              : nlohmann::json();
        over.push_back(o);
      }
      j["check"] = {{"what", check_what}, {"performed", true}, {"rel_error", stats.rel},
                    {"rel_error_all_rows", stats.rel_all}, {"worst_layer_step_rel_error", stats.worst},
                    {"rows", stats.rows}, {"rows_over_2e-2", stats.over.size()},
                    {"rows_excused_by_near_tie", stats.excused()}, {"max_rows_excused", stats.max_excused()},
                    {"rows_over_unexplained_by_near_tie", stats.unexplained()}, {"rows_over", over},
                    {"passed", check_ok}};
    }
    std::cout << j.dump(2) << std::endl;
  } else {
    std::printf("step5_driver summary\n");
    std::printf("  geometry %s, backend %s, tp %d, DSA layers %zu, hidden %d, topk %d\n", cfg.geometry_name.c_str(),
                backend_kind.c_str(), opt.tp, model.layers.size(), cfg.hidden_size, opt.topk);
    std::printf("  requests %zu, prefill tokens %d (chunk %d), decode tokens %d\n", w.prompt_lens.size(),
                w.prefill_tokens, opt.chunk, w.decode_tokens);
    std::printf("  load    %8.3f s (%.1f MB read per rank)\n", load_s, bytes_read[0] / 1e6);
    for (const auto& pr : per_rank)
      std::printf("  rank %d (process, GPU %d): %.1f MB read, checksum %.6e, prefill %.3f s, decode %.3f s\n",
                  pr["rank"].get<int>(), pr["local_rank"].get<int>(), pr["bytes_read"].get<double>() / 1e6,
                  pr["checksum"].get<double>(), pr["prefill_s"].get<double>(), pr["decode_s"].get<double>());
    std::printf("  prefill %8.3f s  %10.1f tokens/s\n", res.prefill_s, prefill_tps);
    std::printf("  decode  %8.3f s  %10.1f tokens/s\n", res.decode_s, decode_tps);
    std::printf("  note: %s\n", caveat.c_str());
    for (const auto& [k, v] : res.timings) std::printf("    %-34s %8.3f s\n", k.c_str(), v);
    std::printf("  checksum %.6e\n", res.checksum);
    if (compared) {
      constexpr std::size_t kPrinted = 20;
      for (std::size_t i = 0; i < stats.over.size() && i < kPrinted; ++i) {
        const RowOver& r = stats.over[i];
        if (r.tie)
          std::printf("    row over %.0e: step %zu layer %zu row %d (position %d) rel %.3e, excused: near-tie in group %d, "
                      "k-th score %.6g vs (k+1)-th %.6g\n",
                      kRowTol, r.step, r.layer, r.row, r.position, r.rel, r.tie->group, r.tie->kth, r.tie->next);
        else
          std::printf("    row over %.0e: step %zu layer %zu row %d (position %d) rel %.3e, NOT explained by a near-tie\n",
                      kRowTol, r.step, r.layer, r.row, r.position, r.rel);
      }
      if (stats.over.size() > kPrinted)
        std::printf("    ... %zu more rows over %.0e (all in --json)\n", stats.over.size() - kPrinted, kRowTol);
      std::printf("  check: %s, per layer on identical inputs: rel error %.3e over rows within %.0e (%.3e over all "
                  "rows); %zu of %ld token rows > %.0e: %ld excused by a shown near-tie (at most %ld = %.0f%% allowed), "
                  "%ld not explained -> %s\n",
                  check_what.c_str(), stats.rel, kRowTol, stats.rel_all, stats.over.size(), stats.rows, kRowTol,
                  stats.excused(), stats.max_excused(), 100.0 * kMaxExcusedFraction, stats.unexplained(),
                  check_ok ? "PASSED" : "FAILED");
    } else if (opt.check) {
      std::printf("  check: %s\n", check_what.c_str());
    }
  }
  return check_ok ? kExitOk : kExitCheckFailed;
}

}  // namespace
