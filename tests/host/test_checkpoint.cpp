// Checkpoint I/O (SPEC §7): safetensors reader/writer, config.json parsing, checkpoint generator.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "golden_data.hpp"
#include "step5/weights/checkpoint_generator.hpp"
#include "step5/weights/config.hpp"
#include "step5/weights/layer_loader.hpp"
#include "step5/weights/safetensors.hpp"

namespace fs = std::filesystem;
using namespace step5;

namespace {

std::string tmp_path(const std::string& name) {
  fs::path d = fs::path(STEP5_TEST_TMPDIR) / "checkpoint";
  fs::create_directories(d);
  return (d / name).string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

/// A safetensors image: 8-byte LE length + header (as given) + data.
std::string st_image(const std::string& header, const std::string& data, std::uint64_t len_override = ~0ull) {
  std::uint64_t n = len_override == ~0ull ? header.size() : len_override;
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + data;
}

/// Runs `f`, requires a step5::Error whose code is `code` and whose message contains every one
/// of `parts`.
template <class F>
void expect_error(F&& f, StatusCode code, std::vector<std::string> parts) {
  try {
    f();
    FAIL("no step5::Error thrown (expected one containing '" << parts.front() << "')");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO("message: " << m);
    CHECK(e.code() == code);
    for (const auto& p : parts) CHECK_MESSAGE(m.find(p) != std::string::npos, "missing '" << p << "'");
  }
}

void expect_file_error(const std::string& name, const std::string& bytes, std::vector<std::string> parts) {
  const std::string p = tmp_path(name);
  write_bytes(p, bytes);
  parts.push_back(name);
  expect_error([&] { SafetensorsFile f(p); }, StatusCode::kIoError, parts);
}

double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  const double m = s / static_cast<double>(v.size());
  return std::sqrt(s2 / static_cast<double>(v.size()) - m * m);
}

/// The bytes the generator writes for tensor `w` (recomputed independently of the file).
std::vector<std::uint8_t> expected_bytes(const WeightInit& w, std::uint64_t seed, WeightPrng prng) {
  std::vector<std::uint8_t> b(w.spec.nbytes());
  generate_weight_chunk(w, weight_stream_key(seed, w.prng_name), 0, b.size() / dtype_size(w.spec.dtype), prng, b.data());
  return b;
}

}  // namespace

TEST_CASE("generator round trip: single file, step5_preview, config and every tensor") {
  const std::string dir = tmp_path("gen_single");
  fs::remove_all(dir);
  CheckpointOptions o;
  o.num_layers = 5;
  o.hidden = 96;
  o.seed = 7;
  const auto gen = generate_checkpoint(dir, o);
  REQUIRE(gen.files.size() == 1);
  CHECK(fs::path(gen.files[0]).filename() == "model.safetensors");
  CHECK_FALSE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));

  const ModelConfig c = load_model_config(dir);
  CHECK(c.hidden_size == 96);
  CHECK(c.num_hidden_layers == 5);
  CHECK(c.num_attention_heads == 64);
  CHECK(c.num_attention_groups == 4);
  CHECK(c.head_dim == 192);
  CHECK(c.gate_output_size == 64);
  CHECK(c.rms_norm_eps == doctest::Approx(1e-5));
  CHECK(c.sparse.topk == 512);
  CHECK(c.sparse.num_provider_groups == 4);
  CHECK(c.sparse.sparse_indexer_num_heads == 16);
  CHECK(c.sparse.sparse_indexer_num_k_heads == 1);
  CHECK(c.geometry_name == "step5_preview");
  CHECK(c.geometry == layout::geometry_of(layout::GeometryId::step5_preview));
  CHECK(c.dsa_layers() == std::vector<int>{3});
  CHECK(c.rope_theta_of(3) == 5e6);
  CHECK(c.rope_theta_of(0) == 1e4);
  CHECK(c.rope_scaling_applies(3));
  CHECK_FALSE(c.rope_scaling_applies(0));
  REQUIRE(c.rope_scaling.has_value());
  CHECK(c.rope_scaling->high_freq_factor == 32.0);
  CHECK(c.rope_scaling->original_max_position_embeddings == 1048576);

  Checkpoint ck(dir);
  CHECK_FALSE(ck.sharded());
  std::size_t count = 0;
  for (int l = 0; l < 5; ++l) {
    for (const auto& w : layer_weight_inits(c.geometry, 96, l, true)) {
      ++count;
      const TensorView v = ck.view(w.spec.name);
      CHECK(v.dtype == w.spec.dtype);
      CHECK(v.shape == w.spec.shape);
      const auto exp = expected_bytes(w, 7, WeightPrng::kFast);
      REQUIRE(v.nbytes() == exp.size());
      CHECK_MESSAGE(std::memcmp(v.data, exp.data(), exp.size()) == 0, w.spec.name);
    }
  }
  CHECK(ck.names().size() == count);
  // spot shapes/dtypes of SPEC §7 names
  expect_tensor(ck.view("model.layers.3.self_attn.q_proj.weight"), DType::kBF16, {64 * 192, 96});
  expect_tensor(ck.view("model.layers.3.self_attn.o_proj.weight"), DType::kBF16, {96, 64 * 192});
  expect_tensor(ck.view("model.layers.3.self_attn.sparse_indexer_w.weight"), DType::kF32, {16, 96});
  expect_tensor(ck.view("model.layers.3.self_attn.sparse_indexer_k_norm.bias"), DType::kF32, {256});
  expect_tensor(ck.view("model.layers.3.self_attn.ssmax_s"), DType::kF32, {64});
  expect_error([&] { expect_tensor(ck.view("model.layers.3.self_attn.q_norm.weight"), DType::kBF16, {192}); },
               StatusCode::kInvalidArgument, {"q_norm.weight", "expected BF16 [192]", "got F32 [192]"});
  // realistic scales: projections ~N(0, 0.02), z ~N(0, hidden^-0.5), norms ~N(0, 0.1), ssmax zero
  CHECK(stddev(to_float_vector(ck.view("model.layers.3.self_attn.q_proj.weight"))) == doctest::Approx(0.02).epsilon(0.02));
  CHECK(stddev(to_float_vector(ck.view("model.layers.3.self_attn.sparse_indexer_z.weight"))) ==
        doctest::Approx(1.0 / std::sqrt(96.0)).epsilon(0.05));
  CHECK(stddev(to_float_vector(ck.view("model.layers.0.self_attn.sparse_indexer_w.weight"))) == doctest::Approx(0.02).epsilon(0.1));
  for (float x : to_float_vector(ck.view("model.layers.1.self_attn.ssmax_s"))) CHECK(x == 0.0f);
  // layers differ (distinct streams)
  const auto a = ck.view("model.layers.0.self_attn.k_proj.weight"), b = ck.view("model.layers.1.self_attn.k_proj.weight");
  CHECK(std::memcmp(a.data, b.data, a.nbytes()) != 0);

  // deterministic: regenerating gives identical bytes; another seed does not
  const std::string dir2 = tmp_path("gen_single_again");
  generate_checkpoint(dir2, o);
  Checkpoint ck2(dir2);
  const auto q1 = ck.view("model.layers.2.self_attn.sparse_indexer_q.weight");
  const auto q2 = ck2.view("model.layers.2.self_attn.sparse_indexer_q.weight");
  CHECK(std::memcmp(q1.data, q2.data, q1.nbytes()) == 0);
  o.seed = 8;
  generate_checkpoint(dir2, o);
  Checkpoint ck3(dir2);
  const auto q3 = ck3.view("model.layers.2.self_attn.sparse_indexer_q.weight");
  CHECK(std::memcmp(q1.data, q3.data, q1.nbytes()) != 0);
}

TEST_CASE("generator round trip: sharded, dsa_h64_kv8_d128, indexer only on DSA layers") {
  const std::string dir = tmp_path("gen_sharded"), dir1 = tmp_path("gen_sharded_ref");
  fs::remove_all(dir);
  CheckpointOptions o;
  o.geometry = "dsa_h64_kv8_d128";
  o.num_layers = 2;
  o.hidden = 64;
  o.num_shards = 3;
  o.topk = 16;
  o.indexer_on_all_layers = false;
  o.layer_types = {"sliding_attention", "full_attention"};
  const auto gen = generate_checkpoint(dir, o);
  REQUIRE(gen.files.size() == 3);
  CHECK(fs::path(gen.files[1]).filename() == "model-00002-of-00003.safetensors");
  CHECK(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  o.num_shards = 1;
  generate_checkpoint(dir1, o);

  const ModelConfig c = load_model_config(dir + "/config.json");
  CHECK(c.geometry_name == "dsa_h64_kv8_d128");
  CHECK(c.geometry.rot_main == 64);
  CHECK(c.geometry.head_dim == 128);
  CHECK(c.sparse.topk == 16);
  CHECK(c.dsa_layers() == std::vector<int>{1});

  Checkpoint sh(dir), one(dir1);
  CHECK(sh.sharded());
  CHECK(sh.files().size() == 3);
  CHECK(sh.names() == one.names());
  std::set<std::string> files_used;
  for (const auto& n : sh.names()) {
    const auto a = sh.view(n), b = one.view(n);
    CHECK(a.dtype == b.dtype);
    CHECK(a.shape == b.shape);
    CHECK_MESSAGE(std::memcmp(a.data, b.data, a.nbytes()) == 0, n);
    files_used.insert(sh.file_of(n));
  }
  CHECK(files_used.size() == 3);
  CHECK(sh.contains("model.layers.1.self_attn.sparse_indexer_q.weight"));
  CHECK(sh.view("model.layers.1.self_attn.sparse_indexer_q.weight").shape == std::vector<std::int64_t>{32 * 256, 64});
  CHECK(sh.view("model.layers.0.self_attn.k_proj.weight").shape == std::vector<std::int64_t>{8 * 128, 64});
  // layer 0 is sliding: no indexer tensors; the error names the tensor and the files searched
  CHECK_FALSE(sh.contains("model.layers.0.self_attn.sparse_indexer_q.weight"));
  expect_error([&] { (void)sh.view("model.layers.0.self_attn.sparse_indexer_q.weight"); }, StatusCode::kNotFound,
               {"model.layers.0.self_attn.sparse_indexer_q.weight", "model.safetensors.index.json", "files searched",
                "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"});
  // the index also opens as a path
  Checkpoint via_index(dir + "/model.safetensors.index.json");
  CHECK(via_index.names() == sh.names());
}

TEST_CASE("generator output does not depend on the thread count") {
  CheckpointOptions o;
  o.num_layers = 1;
  o.hidden = 256;  // q_proj has 3.1M elements: split over the threads
  o.layer_types = {"full_attention"};
  o.num_threads = 1;
  const auto a = generate_checkpoint(tmp_path("gen_t1"), o);
  o.num_threads = 3;
  const auto b = generate_checkpoint(tmp_path("gen_t3"), o);
  Checkpoint ca(a.dir), cb(b.dir);
  REQUIRE(ca.names() == cb.names());
  for (const auto& n : ca.names()) {
    const auto x = ca.view(n), y = cb.view(n);
    REQUIRE(x.nbytes() == y.nbytes());
    CHECK_MESSAGE(std::memcmp(x.data, y.data, x.nbytes()) == 0, n);
  }
  // and element i is draw i of the tensor's stream (within bf16 rounding: the fast path folds the
  // scale into one fp32 multiply), also far into the tensor
  const auto q = to_float_vector(ca.view("model.layers.0.self_attn.q_proj.weight"));
  const std::uint64_t key = weight_stream_key(o.seed, "q_proj.weight");
  for (std::uint64_t i : {0ull, 1234567ull, 3145727ull})
    CHECK(q[i] == doctest::Approx(weight_normal(key, i, WeightPrng::kFast) * 0.02).epsilon(1.0 / 256));
}

TEST_CASE("generator options are validated") {
  CheckpointOptions o;
  o.geometry = "no_such_geometry";
  expect_error([&] { generate_checkpoint(tmp_path("gen_bad"), o); }, StatusCode::kUnsupported,
               {"no_such_geometry", layout::supported_layouts()});
  o = {};
  o.hidden = 8;
  o.num_layers = 1;
  o.layer_types = {"full_attention"};
  o.num_shards = 1000;
  expect_error([&] { generate_checkpoint(tmp_path("gen_bad"), o); }, StatusCode::kInvalidArgument, {"num_shards = 1000"});
  o.num_shards = 1;
  o.layer_types = {"full_attention", "full_attention"};
  expect_error([&] { generate_checkpoint(tmp_path("gen_bad"), o); }, StatusCode::kInvalidArgument,
               {"layer_types has 2 entries", "num_layers = 1"});
  // refused before the first file: no config.json is left behind (it was written before the
  // num_shards check), and num_layers / hidden within the bounds parse_model_config reads them with
  namespace fs = std::filesystem;
  const std::string fresh = tmp_path("gen_refused");
  fs::remove_all(fresh);
  o = {};
  o.hidden = 8;
  o.num_layers = 1;
  o.num_shards = 0;
  expect_error([&] { generate_checkpoint(fresh, o); }, StatusCode::kInvalidArgument, {"num_shards = 0"});
  CHECK_FALSE(fs::exists(fs::path(fresh) / "config.json"));
  o.num_shards = 1;
  o.num_layers = static_cast<int>(detail::kConfigMaxLayers) + 1;
  expect_error([&] { generate_checkpoint(fresh, o); }, StatusCode::kInvalidArgument,
               {"num_layers = 100001", "kConfigMaxLayers = 100000"});
  o.num_layers = 1;
  o.hidden = static_cast<int>(detail::kConfigMaxDim) + 1;
  expect_error([&] { generate_checkpoint(fresh, o); }, StatusCode::kInvalidArgument,
               {"hidden = 16777217", "kConfigMaxDim = 16777216"});
  CHECK_FALSE(fs::exists(fs::path(fresh) / "config.json"));
}

TEST_CASE("writer/reader: every dtype and the float / bf16 conversions") {
  const std::string p = tmp_path("dtypes.safetensors");
  const std::vector<std::uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555};  // 1, -2, 2^-24, inf, ~0.33325
  const std::vector<std::uint8_t> e4m3 = {0x38, 0x7e, 0x01, 0xb8, 0x7f};             // 1, 448, 2^-9, -1, NaN
  const std::vector<std::uint8_t> e5m2 = {0x3c, 0xc0};                               // 1, -2
  const std::vector<float> f32 = {1.0f, -0.1f, 3.14159265f, 1e-30f};
  const std::vector<std::uint16_t> bf = {float_to_bf16_bits(0.5f), float_to_bf16_bits(-3.0f)};
  const std::vector<std::int32_t> i32 = {-5, 7, 123456};
  const std::vector<double> f64 = {0.25, -1e10};
  std::vector<TensorView> ts = {
      {"a.f16", DType::kF16, {5}, f16.data()},      {"b.e4m3", DType::kF8E4M3, {5}, e4m3.data()},
      {"c.f32", DType::kF32, {2, 2}, f32.data()},   {"d.bf16", DType::kBF16, {1, 2}, bf.data()},
      {"e.i32", DType::kI32, {3}, i32.data()},      {"f.f64", DType::kF64, {2}, f64.data()},
      {"g.e5m2", DType::kF8E5M2, {2}, e5m2.data()}, {"h.empty", DType::kF32, {0, 4}, nullptr},
  };
  write_safetensors(p, ts, {{"format", "pt"}, {"note", "test"}});
  SafetensorsFile f(p);
  CHECK(f.metadata().at("note") == "test");
  CHECK(f.names().size() == ts.size());
  for (const auto& t : ts) {
    const auto v = f.view(t.name);
    CHECK(v.dtype == t.dtype);
    CHECK(v.shape == t.shape);
    REQUIRE(v.nbytes() == t.nbytes());
    if (t.nbytes()) CHECK(std::memcmp(v.data, t.data, t.nbytes()) == 0);
  }
  const auto h = to_float_vector(f.view("a.f16"));
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == -2.0f);
  CHECK(h[2] == std::ldexp(1.0f, -24));
  CHECK(std::isinf(h[3]));
  CHECK(h[4] == doctest::Approx(0.33325).epsilon(1e-4));
  const auto e = to_float_vector(f.view("b.e4m3"));
  for (std::size_t i = 0; i < 4; ++i) CHECK(e[i] == e4m3_bits_to_float(e4m3[i]));
  CHECK(e[1] == 448.0f);
  CHECK(std::isnan(e[4]));
  CHECK(to_float_vector(f.view("c.f32")) == f32);
  CHECK(to_float_vector(f.view("d.bf16")) == std::vector<float>{0.5f, -3.0f});
  CHECK(to_float_vector(f.view("e.i32")) == std::vector<float>{-5.0f, 7.0f, 123456.0f});
  CHECK(to_float_vector(f.view("f.f64")) == std::vector<float>{0.25f, -1e10f});
  CHECK(to_float_vector(f.view("g.e5m2")) == std::vector<float>{1.0f, -2.0f});
  CHECK(to_float_vector(f.view("h.empty")).empty());
  // bf16: copied for BF16, rounded to nearest even otherwise (fp32 -0.1 -> 0xbdcd)
  CHECK(to_bf16_bits_vector(f.view("d.bf16")) == bf);
  const auto b32 = to_bf16_bits_vector(f.view("c.f32"));
  for (std::size_t i = 0; i < f32.size(); ++i) CHECK(b32[i] == float_to_bf16_bits(f32[i]));
  CHECK(b32[1] == 0xbdcd);
  CHECK(to_bf16_bits_vector(f.view("b.e4m3"))[1] == float_to_bf16_bits(448.0f));
  // missing tensor names tensor and file
  expect_error([&] { (void)f.view("nope"); }, StatusCode::kNotFound, {"'nope'", "dtypes.safetensors"});
  // duplicate names are refused by the writer
  expect_error([&] { write_safetensors(tmp_path("dup.safetensors"), {ts[0], ts[0]}); }, StatusCode::kInvalidArgument,
               {"duplicate", "a.f16"});
  // sizes past int64 are refused by the writer (the reader's rule), before any file is written:
  // a tensor's bytes (2^62 x 4 bf16 wrapped to 0 in uint64) and the running data offset
  const std::string big = tmp_path("big.safetensors");
  fs::remove(big);
  expect_error([&] { SafetensorsWriter w(big, {{"t", DType::kBF16, {std::int64_t{1} << 62, 4}}}); },
               StatusCode::kInvalidArgument, {"'t'", "[4611686018427387904, 4]", "BF16", "overflows 64-bit sizes"});
  expect_error([&] { SafetensorsWriter w(big, {{"t", DType::kU8, {std::int64_t{1} << 31, std::int64_t{1} << 31, 4}}}); },
               StatusCode::kInvalidArgument, {"overflows 64-bit sizes"});
  std::vector<TensorSpec> many;
  for (int i = 0; i < 4; ++i) many.push_back({"u" + std::to_string(i), DType::kU8, {std::int64_t{1} << 62}});
  expect_error([&] { SafetensorsWriter w(big, many); }, StatusCode::kInvalidArgument,
               {"the data bytes up to tensor 'u1'", "overflow 64-bit sizes"});
  // write_safetensors: a negative dim is named as one; past int64, the writer's overflow message
  TensorView neg;
  neg.name = "n";
  neg.dtype = DType::kF32;
  neg.shape = {-1, 4};
  expect_error([&] { write_safetensors(big, {neg}); }, StatusCode::kInvalidArgument, {"'n' has a negative dim in [-1, 4]"});
  neg.shape = {std::int64_t{1} << 62, 4};
  expect_error([&] { write_safetensors(big, {neg}); }, StatusCode::kInvalidArgument, {"'n': shape", "overflows 64-bit sizes"});
  // a tensor name or metadata string that is not UTF-8 (JSON text must be; the reader refuses
  // such a header as malformed): refused naming it, as step5::Error, before any file is written
  // (nlohmann's type_error 316 escaped from the header's dump)
  expect_error([&] { SafetensorsWriter w(big, {{"a\xff", DType::kU8, {1}}}); }, StatusCode::kInvalidArgument,
               {"tensor name 'a\\xff'", "not valid UTF-8"});
  expect_error([&] { SafetensorsWriter w(big, {{"a", DType::kU8, {1}}}, {{"k", "v\xc3"}}); },
               StatusCode::kInvalidArgument, {"'__metadata__' entry 'k'", "not valid UTF-8"});
  // append: a length past the declared bytes is refused however large (written + n wrapped past
  // 2^64, passed the check, and fwrite read 2^64 - 1 bytes from a 4-byte buffer: 'failed: Success')
  {
    const std::string p = tmp_path("append_wrap.safetensors");
    SafetensorsWriter w(p, {{"a", DType::kU8, {4}}});
    const unsigned char b[4] = {1, 2, 3, 4};
    w.append(b, 1);
    expect_error([&] { w.append(b, ~std::uint64_t{0}); }, StatusCode::kInvalidArgument,
                 {"append_wrap.safetensors", "1 data bytes written, 18446744073709551615 more appended",
                  "the header declares 4"});
    w.append(b + 1, 3);
    w.finish();
    CHECK(to_float_vector(SafetensorsFile(p).view("a")) == std::vector<float>{1, 2, 3, 4});
  }
  // a write that fails inside the constructor (the header to /dev/full: ENOSPC once the stream's
  // buffer flushes) throws kIoError and closes the file it opened (the constructor's throw ran no
  // destructor: the descriptor leaked)
  if (fs::exists("/dev/full")) {
    const auto open_fds = [] {
      std::size_t n = 0;
      for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
      return n;
    };
    const std::size_t before = open_fds();
    for (int i = 0; i < 3; ++i)
      expect_error([&] { SafetensorsWriter w("/dev/full", {}, {{"m", std::string(1 << 20, 'x')}}); },
                   StatusCode::kIoError, {"/dev/full", "failed"});
    CHECK(open_fds() == before);
  }
  // a header above the reader's limit (here a metadata value of kSafetensorsMaxHeaderBytes bytes)
  // is refused by the writer, before any file is written (it wrote a file the reader refuses)
  expect_error([&] {
    SafetensorsWriter w(big, {}, {{"m", std::string(kSafetensorsMaxHeaderBytes, 'x')}});
  }, StatusCode::kInvalidArgument, {"header of", "exceeds the reader's limit of 100000000 bytes"});
  CHECK_FALSE(fs::exists(big));
}

TEST_CASE("reader: malformed files give clear errors and never crash") {
  const std::string good_hdr = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data16(16, '\x01');
  // sanity: the well-formed image reads
  {
    const std::string p = tmp_path("good.safetensors");
    write_bytes(p, st_image(good_hdr, data16));
    SafetensorsFile f(p);
    CHECK(f.view("t").shape == std::vector<std::int64_t>{2, 2});
  }
  expect_error([&] { SafetensorsFile f(tmp_path("does_not_exist.safetensors")); }, StatusCode::kNotFound,
               {"does_not_exist.safetensors", "cannot open"});
  expect_file_error("short.safetensors", "abc", {"3 bytes", "shorter than the 8-byte"});
  expect_file_error("empty.safetensors", "", {"0 bytes"});
  expect_file_error("len_beyond_eof.safetensors", st_image(good_hdr, data16, 4096), {"header length 4096", "exceeds the file size"});
  expect_file_error("len_huge.safetensors", st_image(good_hdr, data16, ~0ull - 1), {"exceeds the limit"});
  expect_file_error("truncated.safetensors", st_image(good_hdr, data16.substr(0, 10)),
                    {"'t'", "[0, 16]", "beyond the data section of 10 bytes", "truncated"});
  expect_file_error("lying_offsets.safetensors", st_image(R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", data16),
                    {"'t'", "span 12 bytes", "[2, 2] x F32 needs 16 bytes"});
  expect_file_error("begin_after_end.safetensors", st_image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", data16),
                    {"begin > end"});
  expect_file_error("malformed.safetensors", st_image(R"({"t":{"dtype":"F32",)", data16), {"malformed JSON"});
  // a tensor listed twice, or a field given twice: refused (nlohmann keeps the last value silently)
  expect_file_error("dup_tensor.safetensors",
                    st_image(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             data16.substr(0, 8)),
                    {"key 'a' appears twice", "a tensor listed twice"});
  expect_file_error("dup_field.safetensors",
                    st_image(R"({"t":{"dtype":"F32","dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})", data16),
                    {"key 'dtype' appears twice"});
  {  // the same key in different objects is fine
    const std::string p = tmp_path("same_key_two_objects.safetensors");
    write_bytes(p, st_image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data16));
    CHECK(SafetensorsFile(p).view("u").shape == std::vector<std::int64_t>{2});
  }
  expect_file_error("not_object.safetensors", st_image("[1,2,3]", data16), {"must be a JSON object", "array"});
  expect_file_error("entry_not_object.safetensors", st_image(R"({"t":5})", data16), {"'t'", "entry must be an object"});
  expect_file_error("no_dtype.safetensors", st_image(R"({"t":{"shape":[4],"data_offsets":[0,16]}})", data16), {"'t'", "missing field 'dtype'"});
  expect_file_error("no_shape.safetensors", st_image(R"({"t":{"dtype":"F32","data_offsets":[0,16]}})", data16), {"'t'", "missing field 'shape'"});
  expect_file_error("no_offsets.safetensors", st_image(R"({"t":{"dtype":"F32","shape":[4]}})", data16),
                    {"'t'", "missing field 'data_offsets'"});
  expect_file_error("bad_dtype.safetensors", st_image(R"({"t":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}})", data16),
                    {"'t'", "unknown dtype 'F7'", "BF16"});
  expect_file_error("dtype_type.safetensors", st_image(R"({"t":{"dtype":3,"shape":[4],"data_offsets":[0,16]}})", data16),
                    {"'dtype' must be a string"});
  expect_file_error("neg_dim.safetensors", st_image(R"({"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data16),
                    {"shape[0] must be a non-negative integer"});
  expect_file_error("float_dim.safetensors", st_image(R"({"t":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})", data16),
                    {"shape[0]", "floating-point"});
  expect_file_error("overflow_dims.safetensors",
                    st_image(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", data16),
                    {"overflows"});
  expect_file_error("offsets_3.safetensors", st_image(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]}})", data16),
                    {"array of 3 elements"});
  // a data_offsets element of JSON nested 100000 deep (200 KB, far below the header limit): named
  // by its JSON type (the message used to dump() it, a recursion that overflowed the stack)
  {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    expect_file_error("deep_offsets.safetensors",
                      st_image(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[)" + deep + R"(,16]}})", data16),
                      {"'t'", "data_offsets must be non-negative integers, got [a JSON array, 16]"});
  }
  expect_file_error("meta_not_strings.safetensors", st_image(R"({"__metadata__":{"a":1}})", ""), {"'__metadata__'", "must be a string"});
  // overlapping and out-of-order tensors are accepted (the format allows them)
  {
    const std::string p = tmp_path("overlap.safetensors");
    write_bytes(p, st_image(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}})", data16));
    SafetensorsFile f(p);
    CHECK(f.view("a").nbytes() == 16);
    CHECK(static_cast<const std::uint8_t*>(f.view("b").data) - static_cast<const std::uint8_t*>(f.view("a").data) == 8);
  }
  // a directory with no safetensors, an index that lies about a tensor, a malformed index
  {
    const std::string d = tmp_path("ckpt_empty_dir");
    fs::create_directories(d);
    expect_error([&] { Checkpoint c(d); }, StatusCode::kNotFound, {"ckpt_empty_dir", "no model.safetensors.index.json"});
    const std::string d2 = tmp_path("ckpt_bad_index");
    fs::create_directories(d2);
    write_bytes(d2 + "/s1.safetensors", st_image(good_hdr, data16));
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"s1.safetensors","u":"s1.safetensors"}})");
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError, {"'u'", "s1.safetensors", "has no such tensor"});
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"s2.safetensors"}})");
    // a shard the index names that does not exist: named with the index and the tensor mapped
    // to it (the message used to be the bare open failure, naming neither)
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kNotFound,
                 {"s2.safetensors", "checkpoint index '" + d2 + "/model.safetensors.index.json'", "tensor 't'",
                  "No such file"});
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":[1]})");
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError, {"'weight_map' must be an object"});
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":)");
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError, {"model.safetensors.index.json", "malformed JSON"});
    // a tensor mapped twice (nlohmann keeps the last one silently)
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"s1.safetensors","t":"s2.safetensors"}})");
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError, {"model.safetensors.index.json", "key 't' appears twice"});
    // a file outside the index's directory (a well-formed safetensors file there: refused by name,
    // never opened), an absolute path, an empty name; a subdirectory inside is fine
    const std::string outside = tmp_path("ckpt_outside");
    fs::create_directories(outside);
    write_bytes(outside + "/s1.safetensors", st_image(good_hdr, data16));
    for (const std::string name : {"../ckpt_outside/s1.safetensors", "sub/../../ckpt_outside/s1.safetensors", "./.."}) {
      INFO(name);
      write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":")" + name + R"("}})");
      expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError,
                   {"weight_map['t'] = '" + name + "'", "inside the index's directory", "no '..' component"});
    }
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"/tmp/s1.safetensors"}})");
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError, {"'/tmp/s1.safetensors'", "must be a relative file name"});
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":""}})");
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError, {"''", "must be a relative file name"});
    fs::create_directories(d2 + "/sub");
    write_bytes(d2 + "/sub/s3.safetensors", st_image(good_hdr, data16));
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"sub/s3.safetensors"}})");
    CHECK(Checkpoint(d2).names() == std::vector<std::string>{"t"});
    // an index above kMaxIndexBytes is refused by its size before it is parsed (a sparse file:
    // no disk space; it was parsed whole before)
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"s1.safetensors"}})");
    fs::resize_file(d2 + "/model.safetensors.index.json", kMaxIndexBytes + 1);
    expect_error([&] { Checkpoint c(d2); }, StatusCode::kIoError,
                 {"model.safetensors.index.json", "has " + std::to_string(kMaxIndexBytes + 1) + " bytes",
                  "expected at most " + std::to_string(kMaxIndexBytes)});
    write_bytes(d2 + "/model.safetensors.index.json", R"({"weight_map":{"t":"s1.safetensors"}})");
    Checkpoint c(d2);
    CHECK(c.names() == std::vector<std::string>{"t"});
  }
}

namespace {
nlohmann::json base_config() {
  CheckpointOptions o;
  o.num_layers = 8;
  o.hidden = 128;
  return make_checkpoint_config(o);
}
ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j, "test.json"); }
}  // namespace

TEST_CASE("config: nested and flat layouts, scalars, MTP layers") {
  const auto nested = base_config();
  const ModelConfig a = parse(nested);
  CHECK(a.dsa_layers() == std::vector<int>{3, 7});
  CHECK(a.geometry.rot_main == 64);
  CHECK(a.geometry.rot_idx == 32);
  CHECK(a.geometry.region_size == 8);
  CHECK(a.parallel_layout(8) == layout::ParallelLayout{8, 4});
  // flat: text fields at the top level
  nlohmann::json flat = nested["text_config"];
  const ModelConfig b = parse(flat);
  CHECK(b.geometry == a.geometry);
  CHECK(b.rope_theta == a.rope_theta);
  CHECK(b.layer_types == a.layer_types);
  // rope_theta scalar and partial_rotary_factor scalar are replicated; gate_output_size explicit
  nlohmann::json s = nested;
  s["text_config"]["rope_theta"] = 1e7;
  s["text_config"].erase("partial_rotary_factors");
  s["text_config"]["partial_rotary_factor"] = 1.0 / 3.0;
  s["text_config"].erase("use_head_wise_attn_gate");
  s["text_config"]["sparse_config"]["gate_output_size"] = 64;
  const ModelConfig c = parse(s);
  CHECK(c.rope_theta == std::vector<double>(8, 1e7));
  CHECK(c.gate_output_size == 64);
  CHECK(c.geometry_name == "step5_preview");
  // MTP layers: layer_types_with_mtp wins (SPEC §6), per-layer lists may cover the MTP layers
  nlohmann::json m = nested;
  auto& t = m["text_config"];
  t["num_nextn_predict_layers"] = 2;
  auto types = t["layer_types"].get<std::vector<std::string>>();
  types.push_back("sliding_attention");
  types.push_back("full_attention");
  t["layer_types_with_mtp"] = types;
  auto th = t["rope_theta"].get<std::vector<double>>();
  th.push_back(1e4);
  th.push_back(2e6);
  t["rope_theta"] = th;
  auto pf = t["partial_rotary_factors"].get<std::vector<double>>();
  pf.push_back(1.0);
  pf.push_back(1.0 / 3.0);
  t["partial_rotary_factors"] = pf;
  const ModelConfig d = parse(m);
  CHECK(d.total_layers() == 10);
  CHECK(d.dsa_layers() == std::vector<int>{3, 7, 9});
  CHECK(d.rope_theta_of(9) == 2e6);
  // no rope scaling and "default" rope scaling
  nlohmann::json r = nested;
  r["text_config"]["rope_scaling"] = {{"rope_type", "default"}};
  CHECK_FALSE(parse(r).rope_scaling.has_value());
  r["text_config"].erase("rope_scaling");
  CHECK_FALSE(parse(r).rope_scaling_applies(3));
}

TEST_CASE("config: errors name the field, where it was looked for, expected and found") {
  const auto base = base_config();
  auto mutate = [&](auto f) {
    nlohmann::json j = base;
    f(j["text_config"]);
    return j;
  };
  expect_error([&] { parse(mutate([](auto& t) { t.erase("head_dim"); })); }, StatusCode::kNotFound,
               {"test.json", "missing field 'head_dim'", "text_config", "top level"});
  expect_error([&] { parse(mutate([](auto& t) { t["head_dim"] = "192"; })); }, StatusCode::kInvalidArgument,
               {"text_config.head_dim", "must be an integer", "string"});
  expect_error([&] { parse(mutate([](auto& t) { t["num_hidden_layers"] = -1; })); }, StatusCode::kInvalidArgument,
               {"num_hidden_layers", "= -1", "outside"});
  // an integer above INT64_MAX where another type is expected is named with its value (it was
  // printed through int64 as "integer -1")
  expect_error([&] { parse(mutate([](auto& t) { t["layer_types"][0] = 18446744073709551615ull; })); },
               StatusCode::kInvalidArgument, {"'text_config.layer_types[0]' must be a string, got integer 18446744073709551615"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["enabled"] = 9223372036854775808ull; })); },
               StatusCode::kInvalidArgument, {"enabled' must be a boolean, got integer 9223372036854775808"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"].erase("topk"); })); }, StatusCode::kNotFound,
               {"missing field 'topk'", "text_config.sparse_config"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["topk"] = 2048; })); }, StatusCode::kInvalidArgument,
               {"sparse_config.topk", "2048", "[1, 1024]"});
  // optional switches of the maths: present, they must name what is computed (the driver used to
  // run such a checkpoint with DSA, RoPE and these norms anyway, and print a checksum)
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["enabled"] = false; })); }, StatusCode::kUnsupported,
               {"'text_config.sparse_config.enabled' = false is not supported", "expected true"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["sparse_indexer_use_rope"] = false; })); },
               StatusCode::kUnsupported, {"'text_config.sparse_config.sparse_indexer_use_rope' = false is not supported"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["sparse_indexer_use_rope"] = 1; })); },
               StatusCode::kInvalidArgument, {"sparse_indexer_use_rope' must be a boolean"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["sparse_indexer_k_norm_type"] = "rmsnorm"; })); },
               StatusCode::kUnsupported, {"'text_config.sparse_config.sparse_indexer_k_norm_type' = 'rmsnorm' is not supported", "expected 'layernorm'"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["sparse_indexer_q_norm_type"] = "none"; })); },
               StatusCode::kUnsupported, {"sparse_indexer_q_norm_type' = 'none'", "expected 'rmsnorm'"});
  // a misspelt yarn_only_types entry (the rope scaling silently applied to no layer)
  expect_error([&] { parse(mutate([](auto& t) { t["yarn_only_types"] = {"full_attentoin"}; })); },
               StatusCode::kInvalidArgument, {"yarn_only_types ['full_attentoin'] names no layer's type",
                                              "'sliding_attention'", "'full_attention'"});
  // an extra type no layer has, next to a real one, is accepted
  CHECK(parse(mutate([](auto& t) { t["yarn_only_types"] = {"full_attention", "chunked_attention"}; })).rope_scaling_applies(3));
  // an empty yarn_only_types restricts nothing, as an absent one (the reference engine's
  // `if yarn_only_types and layer_type not in yarn_only_types`; SPEC §6 treats an empty
  // layer_types_with_mtp the same way): the llama3 scaling applies to every layer, never to none
  {
    const ModelConfig y = parse(mutate([](auto& t) { t["yarn_only_types"] = nlohmann::json::array(); }));
    REQUIRE(y.rope_scaling.has_value());
    CHECK(y.rope_scaling_applies(3));
    CHECK(y.rope_scaling_applies(0));
    const ModelConfig absent = parse(mutate([](auto& t) { t.erase("yarn_only_types"); }));
    CHECK(absent.rope_scaling_applies(3));
  }
  // other spellings of the same norms, and the fields absent, are accepted
  CHECK(parse(mutate([](auto& t) {
          t["sparse_config"]["sparse_indexer_q_norm_type"] = "RMSNorm";
          t["sparse_config"]["sparse_indexer_k_norm_type"] = "layer_norm";
        })).geometry_name == "step5_preview");
  CHECK(parse(mutate([](auto& t) {
          for (const char* f : {"enabled", "sparse_indexer_use_rope", "sparse_indexer_q_norm_type", "sparse_indexer_k_norm_type"})
            t["sparse_config"].erase(f);
        })).geometry_name == "step5_preview");
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["num_provider_groups"] = 2; })); },
               StatusCode::kInvalidArgument, {"num_provider_groups = 2", "num_attention_groups = 4"});
  expect_error([&] { parse(mutate([](auto& t) { t["rope_theta"].erase(0); })); }, StatusCode::kInvalidArgument,
               {"rope_theta", "7 entries", "num_hidden_layers = 8"});
  expect_error([&] { parse(mutate([](auto& t) { t["layer_types"].push_back("x"); })); }, StatusCode::kInvalidArgument,
               {"layer_types", "9 entries"});
  expect_error([&] { parse(mutate([](auto& t) { t["partial_rotary_factors"][7] = 0.5; })); }, StatusCode::kInvalidArgument,
               {"DSA layers 3 and 7", "64 vs 96"});
  expect_error([&] { parse(mutate([](auto& t) { t["partial_rotary_factors"][3] = 0.3; })); }, StatusCode::kInvalidArgument,
               {"partial_rotary_factors[3]", "not an even number"});
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["proxy_dim"] = 128; })); }, StatusCode::kUnsupported,
               {"P=128", "matches no supported geometry", "step5_preview", "dsa_h64_kv8_d128"});
  expect_error([&] { parse(mutate([](auto& t) { t["rope_scaling"]["rope_type"] = "yarn"; })); }, StatusCode::kUnsupported,
               {"rope_scaling.rope_type", "yarn"});
  expect_error([&] { parse(mutate([](auto& t) { t["rope_scaling"].erase("low_freq_factor"); })); }, StatusCode::kNotFound,
               {"low_freq_factor", "rope_scaling"});
  expect_error([&] { parse(mutate([](auto& t) { t.erase("layer_types"); })); }, StatusCode::kNotFound, {"layer_types"});
  // layer_types and layer_types_with_mtp both given must agree on the layers both cover (the
  // reference config refuses "layer_types must match the dense prefix of layer_types_with_mtp");
  // a contradiction used to be resolved silently in favour of layer_types_with_mtp, moving DSA
  {
    auto with_mtp = [](auto& t) {
      t["num_nextn_predict_layers"] = 1;
      auto v = t["layer_types"];
      v.push_back("sliding_attention");
      t["layer_types_with_mtp"] = v;
    };
    CHECK(parse(mutate(with_mtp)).dsa_layers() == std::vector<int>{3, 7});  // consistent: accepted
    expect_error([&] { parse(mutate([&](auto& t) {
                   with_mtp(t);
                   t["layer_types_with_mtp"][7] = "sliding_attention";  // parsed with DSA on layer 3 only
                 })); },
                 StatusCode::kInvalidArgument,
                 {"'text_config.layer_types[7]' = 'full_attention'", "'text_config.layer_types_with_mtp[7]' = 'sliding_attention'"});
    // an empty layer_types_with_mtp is absent (SPEC §6): nothing to contradict
    CHECK(parse(mutate([](auto& t) { t["layer_types_with_mtp"] = nlohmann::json::array(); })).dsa_layers() ==
          std::vector<int>{3, 7});
  }
  expect_error([&] { parse(mutate([](auto& t) { t["sparse_config"]["apply_to_layer_types"] = {"dense"}; })); },
               StatusCode::kInvalidArgument, {"no layer has a type listed"});
  expect_error([&] { parse(mutate([](auto& t) { t.erase("use_head_wise_attn_gate"); })); }, StatusCode::kNotFound,
               {"gate_output_size", "use_head_wise_attn_gate"});
  expect_error([&] { parse(mutate([](auto& t) { t["rms_norm_eps"] = 0; })); }, StatusCode::kInvalidArgument, {"rms_norm_eps", "> 0"});
  expect_error([&] { parse(nlohmann::json::array()); }, StatusCode::kInvalidArgument, {"must be a JSON object"});
  expect_error([&] { parse_model_config_text("{\"text_config\": ", "bad.json"); }, StatusCode::kIoError, {"bad.json", "malformed JSON"});
  expect_error([&] { parse_model_config_text(R"({"hidden_size": 64, "hidden_size": 4096})", "dup.json"); },
               StatusCode::kIoError, {"dup.json", "field 'hidden_size' appears twice"});
  expect_error([&] { parse_model_config_text(R"({"text_config": {"": 1, "": 2}})", "empty_key.json"); },
               StatusCode::kIoError, {"empty_key.json", "field '' appears twice"});
  expect_error([&] { load_model_config(tmp_path("no_such_dir")); }, StatusCode::kNotFound, {"no_such_dir", "config.json"});
  {  // not a regular file, or too large: refused naming it (a FIFO used to block forever, /dev/zero
     // to read until memory ran out)
    const std::string d = tmp_path("config_special");
    fs::remove_all(d);
    fs::create_directories(d);
    REQUIRE(::mkfifo((d + "/config.json").c_str(), 0600) == 0);
    expect_error([&] { load_model_config(d); }, StatusCode::kIoError,
                 {"config.json' is a FIFO, expected a readable regular file"});
    // the same for a checkpoint file (core/mapped_file.hpp, shared by the reader and the index)
    REQUIRE(::mkfifo((d + "/model.safetensors").c_str(), 0600) == 0);
    expect_error([&] { SafetensorsFile f(d + "/model.safetensors"); }, StatusCode::kIoError,
                 {"model.safetensors' is a FIFO, expected a readable regular file"});
    // a directory is named as one (the message used to end in a stale errno text, "No such file")
    expect_error([&] { SafetensorsFile f(d); }, StatusCode::kIoError,
                 {"'" + d + "' is a directory, expected a readable regular file"});
    fs::remove(d + "/model.safetensors");
    fs::remove(d + "/config.json");
    fs::create_symlink("/dev/zero", d + "/config.json");
    expect_error([&] { load_model_config(d); }, StatusCode::kIoError,
                 {"config.json' is a character device, expected a readable regular file"});
    fs::remove(d + "/config.json");
    { std::ofstream(d + "/config.json") << "{}"; }
    fs::resize_file(d + "/config.json", kMaxConfigBytes + 1);  // sparse: no 64 MiB written
    expect_error([&] { load_model_config(d); }, StatusCode::kIoError, {"has 67108865 bytes", "at most 67108864"});
    fs::remove_all(d);
  }
  // a geometry outside the list is accepted when not required
  nlohmann::json j = mutate([](auto& t) { t["sparse_config"]["proxy_dim"] = 128; });
  CHECK(parse_model_config(j, "x", false).geometry_name.empty());
}

TEST_CASE("config: numbers used as fp32 (rope_theta, rms_norm_eps, llama3 factors) must fit a float") {
  const auto base = base_config();
  auto mutate = [&](auto f) {
    nlohmann::json j = base;
    f(j["text_config"]);
    return j;
  };
  // finite as double but > FLT_MAX: would become inf in the RoPE tables / the norms
  const std::string flt_max = "3.4028234663852886e+38";
  expect_error([&] { parse(mutate([](auto& t) { t["rope_theta"] = 1e39; })); }, StatusCode::kInvalidArgument,
               {"test.json", "text_config.rope_theta", "1e+39", "exceeds the largest float", flt_max});
  expect_error([&] { parse(mutate([](auto& t) { t["rope_theta"][5] = 1e39; })); }, StatusCode::kInvalidArgument,
               {"text_config.rope_theta[5]", "1e+39", flt_max});
  expect_error([&] { parse(mutate([](auto& t) { t["rms_norm_eps"] = 1e39; })); }, StatusCode::kInvalidArgument,
               {"text_config.rms_norm_eps", "1e+39", flt_max});
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor"}) {
    INFO(k);
    expect_error([&] { parse(mutate([&](auto& t) { t["rope_scaling"][k] = 1e39; })); }, StatusCode::kInvalidArgument,
                 {"text_config.rope_scaling." + std::string(k), "1e+39", flt_max});
  }
  // high_freq_factor above low_freq_factor as a double but equal as a float (the RoPE tables' fp32
  // rule): refused here, naming the fields, not later by load_layer_weights without the config
  expect_error([&] {
    parse(mutate([](auto& t) {
      t["rope_scaling"]["low_freq_factor"] = 1.0;
      t["rope_scaling"]["high_freq_factor"] = 1.00000001;
    }));
  }, StatusCode::kInvalidArgument, {"test.json", "text_config.rope_scaling", "high_freq_factor 1.00000001", "must be > low_freq_factor 1 as fp32 values"});
  // positive doubles that round to 0 as a float are refused as well
  expect_error([&] { parse(mutate([](auto& t) { t["rms_norm_eps"] = 1e-50; })); }, StatusCode::kInvalidArgument,
               {"text_config.rms_norm_eps", "1e-50", "below the smallest positive float"});
  expect_error([&] { parse(mutate([](auto& t) { t["rope_theta"] = 1e-50; })); }, StatusCode::kInvalidArgument,
               {"text_config.rope_theta", "1e-50", "below the smallest positive float"});
  // the existing > 0 rule and its message are unchanged
  expect_error([&] { parse(mutate([](auto& t) { t["rope_theta"] = -1.0; })); }, StatusCode::kInvalidArgument,
               {"text_config.rope_theta", "must be > 0"});
  // normal values and the bound itself still pass
  const double fmax = static_cast<double>(std::numeric_limits<float>::max());
  const ModelConfig c = parse(mutate([&](auto& t) {
    t["rope_theta"] = fmax;
    t["rms_norm_eps"] = 1e-6;
    t["rope_scaling"]["factor"] = 32.0;
  }));
  CHECK(c.rope_theta_of(3) == fmax);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.rope_scaling->factor == 32.0);
  CHECK(parse(base).rope_theta_of(0) == 1e4);
}

TEST_CASE("rope tables: max_position in [1, kMaxRopePositions], theta a positive fp32 value") {
  using model::kMaxRopePositions;
  const std::string bound = "[1, kMaxRopePositions = 16777216]";
  CHECK(kMaxRopePositions == (1 << 24));
  for (int mp : {0, -1, INT32_MIN, kMaxRopePositions + 1, INT32_MAX}) {
    INFO("max_position " << mp);
    expect_error([&] { model::make_rope_table(mp, 128, 1e4); }, StatusCode::kInvalidArgument,
                 {"make_rope_table", "max_position = " + std::to_string(mp), bound});
  }
  // rot: positive, even, at most kMaxRopeRot (a huge rot was attempted as an allocation of
  // max_position x rot/2 values: std::bad_alloc / length_error instead of a step5::Error)
  CHECK(model::kMaxRopeRot == 1024);
  CHECK(model::rope_inv_freq(1e4, model::kMaxRopeRot).size() == 512);
  for (int rot : {0, -2, 3, model::kMaxRopeRot + 2, 1 << 20}) {
    INFO("rot " << rot);
    expect_error([&] { model::make_rope_table(16, rot, 1e4); }, StatusCode::kInvalidArgument,
                 {"rope_inv_freq", "rot = " + std::to_string(rot), "at most kMaxRopeRot = 1024"});
  }
  // theta > FLT_MAX would be inf as a float (every inv_freq but the first 0), one that rounds to 0 inf
  expect_error([] { model::rope_inv_freq(1e39, 4); }, StatusCode::kInvalidArgument, {"rope_inv_freq", "theta = 1e+39", "3.40282347e+38"});
  expect_error([] { model::rope_inv_freq(1e-50, 4); }, StatusCode::kInvalidArgument, {"theta = 1e-50"});
  expect_error([] { model::rope_inv_freq(-1.0, 4); }, StatusCode::kInvalidArgument, {"theta = -1"});
  model::Llama3Scaling inf_factor;
  inf_factor.factor = std::numeric_limits<float>::infinity();
  expect_error([&] { model::rope_inv_freq(1e4, 4, inf_factor); }, StatusCode::kInvalidArgument, {"invalid llama3 scaling"});
  // the config parser's rule, 0 < low_freq_factor < high_freq_factor: low 4 > high 1, low 0 and
  // low -1 used to give tables silently (no smoothed band: a step at low_wavelen)
  for (const auto& [low, high] : {std::pair<float, float>{4.0f, 1.0f}, {0.0f, 4.0f}, {-1.0f, 4.0f}, {2.0f, 2.0f}}) {
    INFO("low " << low << " high " << high);
    const model::Llama3Scaling bad{8.0f, low, high, 8192};
    expect_error([&] { model::rope_inv_freq(5e5, 128, bad); }, StatusCode::kInvalidArgument,
                 {"rope_inv_freq: invalid llama3 scaling (factor 8, low_freq_factor " + model::detail::rope_num_text(low) +
                      ", high_freq_factor " + model::detail::rope_num_text(high) + ", original_max_position_embeddings 8192)",
                  "expected a finite factor > 0, finite 0 < low_freq_factor < high_freq_factor"});
  }
  // each value in range, yet an inverse frequency past FLT_MAX (its table row 0 was NaN = 0 * inf)
  expect_error([] { model::make_rope_table(4, 128, 1e-40); }, StatusCode::kInvalidArgument,
               {"rope_inv_freq", "theta = 1e-40", "rot = 128", "inv_freq[62] = inf", "expected finite"});
  model::Llama3Scaling tiny_factor;
  tiny_factor.factor = std::numeric_limits<float>::denorm_min();
  expect_error([&] { model::make_rope_table(4, 128, 5e6, tiny_factor); }, StatusCode::kInvalidArgument,
               {"rope_inv_freq", "llama3 factor = 1.40129846e-45", "= inf", "expected finite"});
  // the bounds themselves pass
  for (float f : model::rope_inv_freq(std::numeric_limits<float>::max(), 4)) CHECK(std::isfinite(f));
  for (float f : model::rope_inv_freq(1e-30, 128)) CHECK(std::isfinite(f));
  const model::RopeTable t = model::make_rope_table(3, 4, 1e4);
  CHECK(t.max_position == 3);
  CHECK(t.cos.size() == 6);
}

TEST_CASE("load_layer_weights: max_position bounds and config values used as fp32 are refused up front") {
  CheckpointOptions o;
  o.num_layers = 4;  // Step-5 Preview pattern: DSA layer 3
  o.hidden = 64;
  o.indexer_on_all_layers = false;
  o.dsa_layers_only = true;
  const std::string dir = tmp_path("gen_max_position");
  fs::remove_all(dir);
  generate_checkpoint(dir, o);
  const Checkpoint ck(dir);
  const ModelConfig cfg = load_model_config(dir);
  REQUIRE(cfg.dsa_layers() == std::vector<int>{3});
  layout::RankLayout rl;
  REQUIRE(layout::rank_layout(cfg.geometry, cfg.parallel_layout(1), 0, &rl).ok());
  for (int mp : {0, -7, model::kMaxRopePositions + 1, INT32_MAX}) {
    INFO("max_position " << mp);
    expect_error([&] { load_layer_weights(ck, cfg, 3, rl, mp); }, StatusCode::kInvalidArgument,
                 {"load_layer_weights", "max_position = " + std::to_string(mp), "[1, kMaxRopePositions = 16777216]"});
  }
  const model::LayerWeights w = load_layer_weights(ck, cfg, 3, rl, 16);
  CHECK(w.rope_main.max_position == 16);
  CHECK(w.rope_idx.max_position == 16);
  // the CPU model's weights: eps must be finite and >= 0 (the kernels' rule, check_norm_eps)
  for (const float eps : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), -0.5f}) {
    model::LayerWeights bad_eps = w;
    bad_eps.eps = eps;
    expect_error([&] { model::validate_weights(bad_eps); }, StatusCode::kInvalidArgument,
                 {"LayerWeights: eps = ", "expected a finite value >= 0 (rms_norm_eps)"});
  }
  CHECK(step5::check_norm_eps(0.0, "eps").ok());
  CHECK(step5::check_norm_eps(-1.0, "w.eps").message() == "w.eps = -1, expected a finite value >= 0 (rms_norm_eps)");
  // a hand-built config (not through parse_model_config) with values that overflow a float
  REQUIRE(cfg.rope_scaling_applies(3));
  ModelConfig bad = cfg;
  bad.rms_norm_eps = 1e39;
  expect_error([&] { load_layer_weights(ck, bad, 3, rl, 16); }, StatusCode::kInvalidArgument, {"'rms_norm_eps' = 1e+39", "3.40282347e+38"});
  bad = cfg;
  bad.rope_scaling->factor = 1e39;
  expect_error([&] { load_layer_weights(ck, bad, 3, rl, 16); }, StatusCode::kInvalidArgument, {"'rope_scaling.factor' = 1e+39"});
  // an integer field used as int: refused outside [1, INT32_MAX] instead of truncated
  for (const std::int64_t omp : {std::int64_t{0}, std::int64_t{-5}, (std::int64_t{1} << 32) + 8192}) {
    bad = cfg;
    bad.rope_scaling->original_max_position_embeddings = omp;
    expect_error([&] { load_layer_weights(ck, bad, 3, rl, 16); }, StatusCode::kInvalidArgument,
                 {"'rope_scaling.original_max_position_embeddings' = " + std::to_string(omp), "[1, 2147483647]"});
  }
  bad = cfg;
  bad.rope_theta[3] = 1e39;
  expect_error([&] { load_layer_weights(ck, bad, 3, rl, 16); }, StatusCode::kInvalidArgument, {"theta = 1e+39"});
  // a layer that is not a DSA layer: its RoPE (partial rotary factor, theta) is not the geometry's,
  // so tables built from rot_main would be silently wrong; refused naming its type and the DSA layers
  const std::string t0 = cfg.attention_layer_types()[0];
  REQUIRE(!cfg.is_dsa_layer(0));
  expect_error([&] { load_layer_weights(ck, cfg, 0, rl, 16); }, StatusCode::kInvalidArgument,
               {"load_layer_weights: layer 0", "is '" + t0 + "', not a DSA layer type", "expected one of the DSA layers [3]"});
  expect_error([&] { load_layer_weights(ck, cfg, 9, rl, 16); }, StatusCode::kInvalidArgument,
               {"layer 9", "outside the 4 layers", "DSA layers [3]"});
  expect_error([&] { load_layer_weights(ck, cfg, -1, rl, 16); }, StatusCode::kInvalidArgument, {"layer -1"});
  // a config hidden_size the tensors do not have, large enough that the fused matrix cannot be
  // allocated: the shape error naming q_proj, not std::bad_alloc
  bad = cfg;
  bad.hidden_size = 1 << 24;
  expect_error([&] { load_layer_weights(ck, bad, 3, rl, 16); }, StatusCode::kInvalidArgument,
               {"model.layers.3.self_attn.q_proj.weight", "shape [12288, 64]; expected [12288, 16777216]"});
  // a RankLayout that is not make_rank_layout's
  layout::RankLayout edited = rl;
  edited.shards[0].src_row += 8;
  expect_error([&] { load_layer_weights(ck, cfg, 3, edited, 16); }, StatusCode::kInvalidArgument,
               {"load_layer_weights: inconsistent RankLayout"});
}

TEST_CASE("sha256: FIPS 180-2 example vectors (one block, two-block padding, a million bytes)") {
  auto h = [](const std::string& s) { return reftest::sha256_hex(s.data(), s.size()); };
  CHECK(h("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(h("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(h("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(h(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("golden weights: regenerated bit for bit from the manifest's generator (sha256 per tensor)") {
  // The golden layer's weights are not in the repository: the generator in golden-exact mode
  // (manifest "generator") must reproduce every tensor's sha256 of manifest "weights".
  const nlohmann::json manifest = reftest::golden_manifest();
  const std::string dir = tmp_path("gen_golden");
  generate_checkpoint(dir, reftest::golden_checkpoint_options(manifest));
  const std::string file = (fs::path(dir) / "model.safetensors").string();
  reftest::verify_golden_weights(file, manifest);  // throws naming the tensor on any difference
  const auto& weights = manifest.at("weights");
  SafetensorsFile g(file);
  CHECK(g.names().size() == weights.size());
  for (const auto& n : g.names()) {
    // norms, bias, sparse_indexer_w and ssmax_s are fp32; projections bf16 (SPEC §7)
    const bool is_fp32 = n.find("norm") != std::string::npos || n.find("sparse_indexer_w") != std::string::npos ||
                         n.find("ssmax_s") != std::string::npos;
    CHECK_MESSAGE(g.view(n).dtype == (is_fp32 ? DType::kF32 : DType::kBF16), n);
  }
  CHECK(stddev(to_float_vector(g.view("model.layers.0.self_attn.q_proj.weight"))) == doctest::Approx(0.02).epsilon(0.02));
  // the config of the manifest matches the generator's geometry
  const auto& mc = manifest.at("config");
  const auto geo = layout::geometry_of(layout::GeometryId::step5_preview);
  CHECK(mc.at("num_attention_heads").get<int>() == geo.num_heads);
  CHECK(mc.at("num_attention_groups").get<int>() == geo.num_kv_heads);
  CHECK(mc.at("head_dim").get<int>() == geo.head_dim);
  CHECK(mc.at("sparse_indexer_num_heads").get<int>() == geo.index_num_heads);
  CHECK(mc.at("proxy_dim").get<int>() == geo.proxy_dim);
  CHECK(mc.at("rot_main").get<int>() == geo.rot_main);
  const ModelConfig c = load_model_config(dir);
  CHECK(c.hidden_size == 512);
  CHECK(c.geometry_name == "step5_preview");
  // the test-time copy the golden tests read is the same and verified too
  reftest::verify_golden_weights(reftest::golden_weights_file(), manifest);
}

TEST_CASE("golden weights: one changed byte is reported with the tensor's name") {
  const nlohmann::json manifest = reftest::golden_manifest();
  const std::string src = reftest::golden_weights_file();
  const std::string bad = tmp_path("golden_weights_one_byte.safetensors");
  fs::copy_file(src, bad, fs::copy_options::overwrite_existing);
  std::uint64_t offset = 0;
  {
    SafetensorsFile f(bad);
    const SafetensorsEntry* e = f.find("model.layers.0.self_attn.k_norm.weight");
    REQUIRE(e != nullptr);
    offset = e->begin + 5;
  }
  {
    std::fstream f(bad, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(static_cast<std::streamoff>(offset));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x01);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&b, 1);
    REQUIRE(f.good());
  }
  try {
    reftest::verify_golden_weights(bad, manifest);
    FAIL("verify_golden_weights accepted a changed byte");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("'model.layers.0.self_attn.k_norm.weight'") != std::string::npos, m);
    CHECK_MESSAGE(m.find("sha256") != std::string::npos, m);
    CHECK_MESSAGE(m.find(manifest["weights"]["model.layers.0.self_attn.k_norm.weight"]["sha256"].get<std::string>()) !=
                      std::string::npos, m);
  }
}

TEST_CASE("generator: dsa_layers_only, checkpoint_data_bytes, and atomic generation leaves nothing on failure") {
  CheckpointOptions o;
  o.num_layers = 8;  // Step-5 Preview pattern: DSA layers 3 and 7
  o.hidden = 64;
  o.indexer_on_all_layers = false;
  o.dsa_layers_only = true;
  const std::string dir = tmp_path("gen_atomic");
  fs::remove_all(dir);
  const auto gen = generate_checkpoint_atomically(dir, o);
  CHECK(gen.dir == fs::path(dir).lexically_normal().string());
  CHECK(gen.data_bytes == checkpoint_data_bytes(o));  // the estimate is what is written
  Checkpoint ck(dir);
  CHECK(ck.contains("model.layers.3.self_attn.q_proj.weight"));
  CHECK(ck.contains("model.layers.7.self_attn.sparse_indexer_q.weight"));
  CHECK_FALSE(ck.contains("model.layers.0.self_attn.q_proj.weight"));  // non-DSA layers: no tensors
  CHECK(load_model_config(dir + "/config.json").dsa_layers() == std::vector<int>{3, 7});
  o.dsa_layers_only = false;
  CHECK(checkpoint_data_bytes(o) > gen.data_bytes);
  // an existing directory is refused, not overwritten
  expect_error([&] { generate_checkpoint_atomically(dir, o); }, StatusCode::kInvalidArgument, {"already exists"});
  // a failure after config.json was written (num_shards is checked after it) leaves no directory
  const std::string bad = tmp_path("gen_atomic_bad");
  fs::remove_all(bad);
  o.num_shards = 100000;
  expect_error([&] { generate_checkpoint_atomically(bad, o); }, StatusCode::kInvalidArgument, {"num_shards = 100000"});
  CHECK_FALSE(fs::exists(bad));
  for (const auto& de : fs::directory_iterator(fs::path(bad).parent_path()))
    CHECK_MESSAGE(de.path().filename().string().find("gen_atomic_bad") == std::string::npos, de.path().string());
}
