// Fused projection weight assembly and the loader contract (SPEC §3): every rank's matrix against
// rows cut from random global tensors by the brute-force map (layout_brute_force.hpp), missing
// shards, reload safety, shape/dtype/quantized/pre-fused refusals, fp32 -> bf16 rounding.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "layout_brute_force.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/weights/fused_weight.hpp"

namespace L = step5::layout;
using step5::DType;
using step5::TensorView;

namespace {
constexpr int kHidden = 64;
constexpr L::Geometry kPreview = L::geometry_of(L::GeometryId::step5_preview);
const char* const kNames[8] = {"q_proj", "k_proj", "v_proj", "sparse_indexer_q", "sparse_indexer_k",
                               "sparse_indexer_z", "g_proj", "sparse_indexer_w"};
const char* const kIds[8] = {"q", "k", "v", "index_q", "index_k", "index_z", "index_g", "index_w"};

// Random global checkpoint tensors of one layer: bf16 bits for the seven shards, fp32 for
// sparse_indexer_w (as in Step5 checkpoints).
struct Globals {
  std::vector<int> rows;
  std::vector<std::vector<std::uint16_t>> bf;  // [7][rows * hidden]
  std::vector<float> w;                        // [Ni * hidden]
  explicit Globals(const L::Geometry& g, unsigned seed = 1) : rows(bf::global_rows(g)), bf(7) {
    std::mt19937 rng(seed);
    for (int s = 0; s < 7; ++s) {
      bf[s].resize(static_cast<std::size_t>(rows[s]) * kHidden);
      for (auto& v : bf[s]) v = static_cast<std::uint16_t>(rng() & 0x7f7fu);  // finite values
    }
    std::normal_distribution<float> nd(0.0f, 0.05f);
    w.resize(static_cast<std::size_t>(rows[7]) * kHidden);
    for (auto& v : w) v = nd(rng);
  }
  TensorView view(int s, const std::string& prefix = "model.layers.3.self_attn.") const {
    TensorView t;
    t.name = prefix + kNames[s] + ".weight";
    t.shape = {rows[s], kHidden};
    if (s == 7) {
      t.dtype = DType::kF32;
      t.data = w.data();
    } else {
      t.dtype = DType::kBF16;
      t.data = bf[s].data();
    }
    return t;
  }
  std::uint16_t expected(const bf::RowRef& ref, int c) const {
    if (ref.tensor < 0) return 0;
    const std::size_t i = static_cast<std::size_t>(ref.row) * kHidden + c;
    if (ref.tensor == 7) return step5::float_to_bf16_bits(w[i]);
    return bf[ref.tensor][i];
  }
};

void load_all(step5::FusedWeightLoader& ld, const Globals& g, int skip = -1) {
  for (int s = 0; s < 8; ++s) {
    if (s == skip) continue;
    if (s % 2 == 0) {
      CHECK(ld.load_named(g.view(s)));
    } else {
      ld.load(kIds[s], g.view(s));
    }
  }
}

L::RankLayout layout_of(const L::Geometry& g, int tp, int rank) {
  const auto r = L::make_rank_layout(g, L::standard_layout(g, tp), rank);
  REQUIRE(r.ok());
  return r.layout;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const step5::Error& e) {
    return e.what();
  }
  return "<no error>";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("every (geometry, tp, rank): the fused matrix equals rows cut by the brute-force map") {
  for (const auto& e : L::kGeometries) {
    const Globals glob(e.geometry, 7);
    for (int i = 0; i < e.num_tp_values; ++i) {
      const int tp = e.tp_values[i];
      const bf::Layout sim = bf::simulate(e.geometry, tp);
      REQUIRE(sim.ok);
      for (int rank = 0; rank < tp; ++rank) {
        CAPTURE(e.name);
        CAPTURE(tp);
        CAPTURE(rank);
        step5::FusedWeightLoader ld(layout_of(e.geometry, tp, rank), kHidden);
        const auto& want = sim.ranks[rank].rows;
        REQUIRE(ld.rows() == static_cast<int>(want.size()));
        load_all(ld, glob);
        ld.assert_fully_loaded("model.layers.3.self_attn");
        REQUIRE(ld.ready());
        const auto w = ld.weight();
        REQUIRE(w.size() == want.size() * kHidden);
        int bad = 0;
        for (std::size_t r = 0; r < want.size() && bad < 5; ++r)
          for (int c = 0; c < kHidden; ++c)
            if (w[r * kHidden + c].bits != glob.expected(want[r], c)) {
              FAIL_CHECK("row " << r << " col " << c << " (tensor " << want[r].tensor << " row " << want[r].row
                                << ") = " << w[r * kHidden + c].bits << ", want " << glob.expected(want[r], c));
              ++bad;
              break;
            }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("missing shards are named, sorted, with the prefix, and the record is forgotten") {
  const Globals glob(kPreview);
  step5::FusedWeightLoader ld(layout_of(kPreview, 8, 3), kHidden);
  CHECK(ld.required_shards() == std::vector<std::string>{"q", "k", "v", "index_q", "index_k", "index_z", "index_g",
                                                         "index_w"});
  ld.load("v", glob.view(2));
  ld.load("q", glob.view(0));
  ld.load("index_z", glob.view(5));
  CHECK(ld.loaded_shards() == std::vector<std::string>{"q", "v", "index_z"});
  CHECK(ld.missing_shards() == std::vector<std::string>{"index_g", "index_k", "index_q", "index_w", "k"});
  std::string m = error_of([&] { ld.assert_fully_loaded("model.layers.7.self_attn"); });
  CHECK(has(m, "model.layers.7.self_attn"));
  CHECK(has(m, "missing shards [index_g, index_k, index_q, index_w, k]"));
  CHECK_FALSE(ld.ready());
  CHECK(ld.loaded_shards().empty());
  // the record was forgotten: supplying only the missing ones now is not enough
  for (int s : {1, 3, 4, 6, 7}) ld.load(kIds[s], glob.view(s));
  m = error_of([&] { ld.assert_fully_loaded("layer7"); });
  CHECK(has(m, "layer7"));
  CHECK(has(m, "missing shards [index_z, q, v]"));
  // nothing loaded at all
  m = error_of([&] { ld.assert_fully_loaded("p"); });
  CHECK(has(m, "missing shards [index_g, index_k, index_q, index_w, index_z, k, q, v]"));

  // gate_size 0: index_g is not required, and refused when given
  L::Geometry nogate = kPreview;
  nogate.gate_size = 0;
  step5::FusedWeightLoader ng(layout_of(nogate, 2, 1), kHidden);
  CHECK(ng.required_shards() == std::vector<std::string>{"q", "k", "v", "index_q", "index_k", "index_z", "index_w"});
  for (int s : {0, 1, 2, 3, 4, 5, 7}) ng.load(kIds[s], glob.view(s));
  ng.assert_fully_loaded("nogate");
  CHECK(ng.ready());
  m = error_of([&] { ng.load("index_g", glob.view(6)); });
  CHECK(has(m, "gate_size 0"));
}

TEST_CASE("a reload that omits a shard fails and exposes no stale rows") {
  const Globals first(kPreview, 11), second(kPreview, 12);
  const L::RankLayout rl = layout_of(kPreview, 4, 2);
  step5::FusedWeightLoader ld(rl, kHidden);
  load_all(ld, first);
  ld.assert_fully_loaded("L");
  REQUIRE(ld.ready());
  const std::vector<step5::bf16> w1(ld.weight().begin(), ld.weight().end());

  // a new load hides the previous matrix at once
  ld.load("q", second.view(0));
  CHECK_FALSE(ld.ready());
  std::string m = error_of([&] { (void)ld.weight(); });
  CHECK(has(m, "not available"));
  // ... and omitting k fails the check; the matrix stays hidden
  for (int s : {2, 3, 4, 5, 6, 7}) ld.load(kIds[s], second.view(s));
  m = error_of([&] { ld.assert_fully_loaded("L"); });
  CHECK(has(m, "missing shards [k]"));
  CHECK_FALSE(ld.ready());
  CHECK(has(error_of([&] { (void)ld.weight(); }), "not available"));
  // supplying just k afterwards cannot resurrect a matrix built from stale rows
  ld.load("k", second.view(1));
  CHECK(has(error_of([&] { ld.assert_fully_loaded("L"); }), "missing shards [index_g, index_k, index_q, index_w, index_z, q, v]"));

  // a complete reload: every row equals the second tensors (none of the first survives)
  load_all(ld, second);
  ld.assert_fully_loaded("L");
  const auto w2 = ld.weight();
  const bf::Layout sim = bf::simulate(kPreview, 4);
  const auto& want = sim.ranks[2].rows;
  int bad = 0, differs_from_first = 0;
  for (std::size_t r = 0; r < want.size(); ++r)
    for (int c = 0; c < kHidden; ++c) {
      bad += w2[r * kHidden + c].bits != second.expected(want[r], c);
      differs_from_first += w2[r * kHidden + c].bits != w1[r * kHidden + c].bits;
    }
  CHECK(bad == 0);
  CHECK(differs_from_first > 0);

  // reset_load_state hides the matrix and forgets a partial load
  ld.load("q", second.view(0));
  ld.reset_load_state();
  CHECK_FALSE(ld.ready());
  CHECK(ld.loaded_shards().empty());
}

TEST_CASE("wrong shape, dtype, quantized, pre-fused and unknown shards are refused with clear messages") {
  const Globals glob(kPreview);
  step5::FusedWeightLoader ld(layout_of(kPreview, 2, 0), kHidden);

  TensorView t = glob.view(0);
  t.shape = {64 * 192 - 1, kHidden};
  std::string m = error_of([&] { ld.load_named(t); });
  CHECK(has(m, "model.layers.3.self_attn.q_proj.weight"));
  CHECK(has(m, "shape [12287, 64]"));
  CHECK(has(m, "expected [12288, 64]"));

  t = glob.view(1);
  t.shape = {4 * 192, 128};  // wrong hidden
  m = error_of([&] { ld.load("k", t); });
  CHECK(has(m, "k_proj.weight"));
  CHECK(has(m, "[768, 128]"));
  CHECK(has(m, "expected [768, 64]"));

  t = glob.view(7);
  t.shape = {16, kHidden, 1};
  m = error_of([&] { ld.load_named(t); });
  CHECK(has(m, "sparse_indexer_w.weight"));
  CHECK(has(m, "expected [16, 64]"));

  t = glob.view(0);
  t.dtype = DType::kI32;
  m = error_of([&] { ld.load("q", t); });
  CHECK(has(m, "q_proj.weight"));
  CHECK(has(m, "unsupported dtype I32"));
  CHECK(has(m, "expected BF16"));

  for (DType q : {DType::kF8E4M3, DType::kF8E5M2, DType::kI8, DType::kU8}) {
    t = glob.view(3);
    t.dtype = q;
    m = error_of([&] { ld.load_named(t); });
    CAPTURE(m);
    CHECK(has(m, "sparse_indexer_q.weight"));
    CHECK(has(m, "quantized"));
    CHECK(has(m, std::string("dtype ") + std::string(step5::dtype_name(q))));
    CHECK(has(m, "expected BF16"));
  }

  TensorView fused;
  fused.name = "model.layers.3.self_attn.qkv_indexer_proj.weight";
  fused.shape = {18496, kHidden};
  fused.data = glob.bf[0].data();
  m = error_of([&] { ld.load_named(fused); });
  CHECK(has(m, "pre-fused"));
  CHECK(has(m, "model.layers.3.self_attn.qkv_indexer_proj.weight"));
  CHECK(has(error_of([&] { ld.load("q", fused); }), "pre-fused"));

  m = error_of([&] { ld.load("qkv", glob.view(0)); });
  CHECK(has(m, "unknown shard id 'qkv'"));
  CHECK(has(m, "q k v index_q index_k index_z index_g index_w"));

  t = glob.view(0);
  t.data = nullptr;
  CHECK(has(error_of([&] { ld.load("q", t); }), "no data"));

  // refused loads record nothing
  CHECK(ld.loaded_shards().empty());
  // names that are not part of the fused weight are skipped
  TensorView o = glob.view(0);
  o.name = "model.layers.3.self_attn.o_proj.weight";
  CHECK_FALSE(ld.load_named(o));
  o.name = "model.layers.3.self_attn.sparse_indexer_q_norm.weight";
  CHECK_FALSE(ld.load_named(o));
  CHECK(ld.loaded_shards().empty());

  CHECK(has(error_of([&] { step5::FusedWeightLoader bad(layout_of(kPreview, 2, 0), 0); }), "hidden must be > 0, got 0"));
  CHECK(has(error_of([&] { step5::FusedWeightLoader bad(L::RankLayout{}, 64); }), "inconsistent"));
  // an edited RankLayout (a shard moved to the last padding rows, a source offset past the tensor):
  // the copies used to read past the tensor or write past the fused matrix (ASan); refused up front
  for (int which = 0; which < 2; ++which) {
    L::RankLayout edited = layout_of(kPreview, 2, 0);
    if (which == 0) edited.shards[static_cast<int>(L::Shard::kIndexG)].dst_row = edited.padded_rows - 4;
    else edited.shards[0].src_row += 8;
    const std::string e = error_of([&] { step5::FusedWeightLoader bad(edited, 64); });
    CHECK_MESSAGE(has(e, "FusedWeightLoader: inconsistent RankLayout: shards["), e);
    CHECK_MESSAGE(has(e, which == 0 ? "shards[index_g].dst_row = " : "shards[q].src_row = "), e);
    CHECK_MESSAGE(has(e, "make_rank_layout"), e);
  }
}

TEST_CASE("a hidden size the tensors do not have is refused by shape, before the matrix is allocated") {
  // hidden 2^24 (parse_model_config's bound of hidden_size) with tensors of hidden 64: the
  // loader allocated [padded_rows, hidden] bf16 (about 620 GB at tp 1) in its constructor, so a
  // config.json whose hidden_size the tensors do not have gave std::bad_alloc (or a huge
  // zero-fill) instead of the shape error naming the tensor
  const Globals glob(kPreview);
  const int huge = 1 << 24;
  std::string m;
  CHECK_NOTHROW(m = error_of([&] {
                  step5::FusedWeightLoader ld(layout_of(kPreview, 1, 0), huge);
                  ld.load("q", glob.view(0));
                }));
  CHECK_MESSAGE(has(m, "q_proj.weight"), m);
  CHECK_MESSAGE(has(m, "shape [12288, 64]; expected [12288, 16777216]"), m);
  // the normal hidden still loads and exposes the full matrix
  step5::FusedWeightLoader ld(layout_of(kPreview, 1, 0), kHidden);
  load_all(ld, glob);
  ld.assert_fully_loaded("model.layers.3.self_attn");
  CHECK(ld.weight().size() == static_cast<std::size_t>(ld.rows()) * kHidden);
}

TEST_CASE("checkpoint names map to shard ids") {
  using step5::checkpoint_shard_id;
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.q_proj.weight") == "q");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.k_proj.weight") == "k");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.v_proj.weight") == "v");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.g_proj.weight") == "index_g");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_q.weight") == "index_q");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_k.weight") == "index_k");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_z.weight") == "index_z");
  CHECK(checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_w.weight") == "index_w");
  CHECK(checkpoint_shard_id("q_proj.weight") == "q");
  CHECK_FALSE(checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_k_norm.weight"));
  CHECK_FALSE(checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_k_norm.bias"));
  CHECK_FALSE(checkpoint_shard_id("model.layers.3.self_attn.o_proj.weight"));
  CHECK_FALSE(checkpoint_shard_id("model.layers.3.self_attn.ssmax_s"));
  CHECK_FALSE(checkpoint_shard_id("model.layers.3.self_attn.xq_proj.weight"));  // not a component match
  CHECK_FALSE(checkpoint_shard_id("model.layers.3.self_attn.q_proj.bias"));
}

TEST_CASE("fp32 sparse_indexer_w and fp16/fp32 shards are rounded to bf16 (RNE)") {
  // tp=1: index_w rows 0..15 land at fused rows 18496..18511 (src row j -> dst 18496 + j).
  const L::RankLayout rl = layout_of(kPreview, 1, 0);
  REQUIRE(rl.indexer_w.dst_row == 18496);
  const Globals glob(kPreview);
  std::vector<float> w(glob.w);
  // row 5 holds hand-picked values with literal expected bf16 bits
  const std::uint32_t in[] = {0x3f808000u,  // 1 + 2^-8: tie -> even 0x3f80
                              0x3f818000u,  // tie -> even 0x3f82
                              0x3f808001u,  // just above the tie -> 0x3f81
                              0xbf80ffffu,  // -1.0078..: -> 0xbf81
                              0x7f7fffffu,  // FLT_MAX rounds to +inf
                              0x00000001u,  // smallest subnormal -> +0
                              0x80000000u}; // -0
  const std::uint16_t out[] = {0x3f80, 0x3f82, 0x3f81, 0xbf81, 0x7f80, 0x0000, 0x8000};
  for (int c = 0; c < 7; ++c) w[5 * kHidden + c] = std::bit_cast<float>(in[c]);
  step5::FusedWeightLoader ld(rl, kHidden);
  for (int s = 0; s < 7; ++s) ld.load(kIds[s], glob.view(s));
  TensorView tw = glob.view(7);
  tw.data = w.data();
  ld.load_named(tw);
  ld.assert_fully_loaded("L");
  const auto m = ld.weight();
  for (int c = 0; c < 7; ++c) {
    CAPTURE(c);
    CHECK(m[static_cast<std::size_t>(18496 + 5) * kHidden + c].bits == out[c]);
  }
  // every other w element is the RNE rounding, and the padding rows (none at tp=1) / bf16 rows exact
  int bad = 0;
  for (int j = 0; j < 16; ++j)
    for (int c = 0; c < kHidden; ++c) {
      const float v = w[static_cast<std::size_t>(j) * kHidden + c];
      const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
      const std::uint16_t rne = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // finite inputs
      bad += m[static_cast<std::size_t>(18496 + j) * kHidden + c].bits != rne;
    }
  CHECK(bad == 0);

  // an fp32 q tensor and an fp16 k tensor are accepted and converted
  std::vector<float> q32(glob.bf[0].size());
  for (std::size_t i = 0; i < q32.size(); ++i) q32[i] = step5::bf16_bits_to_float(glob.bf[0][i]) * 1.00390625f;
  std::vector<std::uint16_t> k16(glob.bf[1].size());
  for (std::size_t i = 0; i < k16.size(); ++i) k16[i] = static_cast<std::uint16_t>(0x3c00u + (i % 1024));  // 1 + i/1024
  step5::FusedWeightLoader ld2(rl, kHidden);
  for (int s = 2; s < 8; ++s) ld2.load_named(glob.view(s));
  TensorView tq = glob.view(0);
  tq.dtype = DType::kF32;
  tq.data = q32.data();
  ld2.load_named(tq);
  TensorView tk = glob.view(1);
  tk.dtype = DType::kF16;
  tk.data = k16.data();
  ld2.load_named(tk);
  ld2.assert_fully_loaded("L");
  const auto m2 = ld2.weight();
  bad = 0;
  for (std::size_t i = 0; i < q32.size(); ++i) bad += m2[i].bits != step5::float_to_bf16_bits(q32[i]);
  CHECK(bad == 0);
  // fp16 1 + n/1024 -> bf16 (7 mantissa bits): RNE of n/8; e.g. n = 4 (1.00390625) ties to 1.0
  const std::size_t k0 = static_cast<std::size_t>(rl.shard(L::Shard::kK).dst_row) * kHidden;
  CHECK(m2[k0 + 0].bits == 0x3f80);
  CHECK(m2[k0 + 4].bits == 0x3f80);   // tie -> even
  CHECK(m2[k0 + 5].bits == 0x3f81);
  CHECK(m2[k0 + 12].bits == 0x3f82);  // 1.5 steps -> tie -> even (2)
  CHECK(m2[k0 + 1023].bits == 0x4000);  // 1.999 -> 2.0
}
