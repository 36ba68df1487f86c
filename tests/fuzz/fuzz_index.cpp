// libFuzzer target: a sharded checkpoint's model.safetensors.index.json (SPEC §7) on arbitrary
// bytes, next to fixed valid shards. Any index must either give a Checkpoint in which every
// tensor it maps is held by exactly one of the opened files, inside the checkpoint's directory,
// and reads back as written — or throw step5::Error. (The shards: a.safetensors {t, u},
// b.safetensors {v}, c.safetensors {t}: an index naming c.safetensors maps t to a file while
// another listed file holds it too, which must be refused.)
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "step5/weights/safetensors_index.hpp"
#include "step5/weights/safetensors_writer.hpp"

namespace {

namespace fs = std::filesystem;

// The shards: each tensor's first element differs per file, so a read-back names its file.
struct ShardTensor {
  const char* file;
  const char* name;
  std::vector<std::uint16_t> values;
};
const std::vector<ShardTensor>& shard_tensors() {
  static const std::vector<ShardTensor> all = {{"a.safetensors", "t", {1, 2, 3, 4}},
                                               {"a.safetensors", "u", {5, 6}},
                                               {"b.safetensors", "v", {7, 8, 9}},
                                               {"c.safetensors", "t", {11, 12, 13, 14}}};
  return all;
}

// The checkpoint directory with the three shards, written once per process.
const fs::path& shard_dir() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("step5-fuzz-index-" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::map<std::string, std::vector<step5::TensorView>> files;
    for (const ShardTensor& t : shard_tensors())
      files[t.file].push_back({t.name, step5::DType::kBF16, {static_cast<std::int64_t>(t.values.size())}, t.values.data()});
    for (const auto& [file, views] : files) step5::write_safetensors((d / file).string(), views);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(shard_dir(), ec);
    });
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path& dir = shard_dir();
  const fs::path index = dir / "model.safetensors.index.json";
  {
    std::ofstream f(index, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const step5::Checkpoint ck(dir.string());
    const std::string root = fs::weakly_canonical(dir).string();
    for (const std::string& name : ck.names()) {
      // inside the directory
      const std::string file = fs::weakly_canonical(ck.file_of(name)).string();
      if (file.rfind(root + "/", 0) != 0) __builtin_trap();
      // held by exactly one opened file
      int holders = 0;
      for (const auto& f : ck.files())
        for (const auto& e : f->entries()) holders += e.name == name;
      if (holders != 1) __builtin_trap();
      // reads back what the shard holds (the first element of each tensor differs per file)
      const step5::TensorView tv = ck.view(name);
      if (tv.data == nullptr || tv.nbytes() == 0) __builtin_trap();
      std::uint16_t first = 0;
      std::memcpy(&first, tv.data, 2);
      const std::string shard = fs::path(file).filename().string();
      bool as_written = false;
      for (const ShardTensor& t : shard_tensors()) as_written = as_written || (shard == t.file && name == t.name && first == t.values[0]);
      if (!as_written) __builtin_trap();
    }
  } catch (const step5::Error& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
