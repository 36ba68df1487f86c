#pragma once
/// \file step5/weights/safetensors_index.hpp
/// A checkpoint of one or more safetensors files (SPEC.md §7): `Checkpoint` opens a directory,
/// one `.safetensors` file, or a sharded checkpoint's `model.safetensors.index.json` (a
/// `weight_map` of tensor name → file name, relative to the index's directory and inside it: no
/// absolute path, no `..` component), and finds each
/// tensor's file. Every file is read and validated by safetensors_reader.hpp; errors throw
/// `step5::Error` naming the index/file and the tensor (kNotFound for a missing path or tensor,
/// kIoError for a malformed index, an index above kMaxIndexBytes, a file name outside the index's
/// directory, a tensor in two files — with an index too, in two of the files it lists —, or an
/// index entry whose file lacks it).
///
/// Host only (g++); needs nlohmann-json.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "step5/core/status.hpp"
#include "step5/core/tensor.hpp"
#include "step5/weights/safetensors_reader.hpp"

namespace step5 {

/// The largest `*.index.json` a Checkpoint parses (a real one is a few MiB: about 100 bytes per
/// tensor); like config.json's kMaxConfigBytes, so that a huge or endless file is refused by size
/// instead of being parsed whole into memory.
inline constexpr std::uint64_t kMaxIndexBytes = 256ull << 20;

/// A checkpoint of one or more safetensors files (SPEC §7): a directory holding
/// `model.safetensors.index.json` (sharded), or `model.safetensors`, or otherwise every
/// `*.safetensors` file in it; or a path to one `.safetensors` file; or a path to an
/// `*.index.json` file. Shards listed by an index are all opened (and validated) up front.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path p(path);
    if (!fs::exists(p, ec))
      throw Error(StatusCode::kNotFound, "checkpoint path '" + path + "' does not exist");
    if (fs::is_directory(p, ec)) {
      root_ = p.string();
      if (fs::exists(p / "model.safetensors.index.json", ec)) {
        open_index((p / "model.safetensors.index.json").string());
      } else if (fs::exists(p / "model.safetensors", ec)) {
        add_file((p / "model.safetensors").string());
      } else {
        std::vector<std::string> files;
        for (const auto& de : fs::directory_iterator(p, ec))
          if (de.path().extension() == ".safetensors") files.push_back(de.path().string());
        std::sort(files.begin(), files.end());
        if (files.empty())
          throw Error(StatusCode::kNotFound,
                      "checkpoint directory '" + path +
                          "' has no model.safetensors.index.json, no model.safetensors and no *.safetensors file");
        for (const auto& f : files) add_file(f);
      }
    } else if (p.filename().string().size() > 11 &&
               p.filename().string().ends_with(".index.json")) {
      root_ = p.parent_path().string();
      open_index(p.string());
    } else {
      root_ = p.parent_path().string();
      add_file(p.string());
    }
  }

  /// True when the checkpoint has a tensor `name`.
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// All tensor names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> r;
    for (const auto& [n, _] : where_) r.push_back(n);
    return r;
  }
  /// Path of the file holding `name` (throws like `view`).
  const std::string& file_of(const std::string& name) const { return files_[locate(name)]->path(); }
  /// Zero-copy view of `name`, valid while this Checkpoint lives. Throws `Error` (kNotFound)
  /// naming the tensor and the files searched.
  TensorView view(const std::string& name) const { return files_[locate(name)]->view(name); }
  /// The opened files, in the order they were opened.
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  /// True when the checkpoint was opened through an index json.
  bool sharded() const { return !index_path_.empty(); }

 private:
  std::size_t locate(const std::string& name) const {
    auto it = where_.find(name);
    if (it != where_.end()) return it->second;
    std::string searched;
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (i == 8) {
        searched += ", ... (" + std::to_string(files_.size()) + " files)";
        break;
      }
      searched += (i ? ", '" : "'") + files_[i]->path() + "'";
    }
    throw Error(StatusCode::kNotFound, "tensor " + detail::quote_name(name) + " not found in checkpoint '" +
                                           (index_path_.empty() ? root_ : index_path_) +
                                           "' (files searched: " + searched + ")");
  }
  std::size_t add_file(const std::string& file) {
    auto it = file_ids_.find(file);
    if (it != file_ids_.end()) return it->second;
    files_.push_back(std::make_unique<SafetensorsFile>(file));
    const std::size_t id = files_.size() - 1;
    file_ids_[file] = id;
    if (index_path_.empty()) {  // no index: the files' own headers say where tensors are
      for (const auto& e : files_[id]->entries()) {
        auto [pos, inserted] = where_.emplace(e.name, id);
        if (!inserted)
          throw Error(StatusCode::kIoError, "tensor " + detail::quote_name(e.name) + " is in both '" +
                                                files_[pos->second]->path() + "' and '" + file + "'");
      }
    }
    return id;
  }
  void open_index(const std::string& index_file) {
    namespace fs = std::filesystem;
    index_path_ = index_file;
    MappedFile m(index_file);
    if (m.size() > kMaxIndexBytes)  // parsed whole into a JSON tree (several times its size in memory)
      detail::throw_io("checkpoint index '" + index_file + "' has " + std::to_string(m.size()) +
                       " bytes, expected at most " + std::to_string(kMaxIndexBytes));
    nlohmann::json j;
    std::optional<std::string> repeated;
    try {
      j = detail::parse_json_checking_keys(reinterpret_cast<const char*>(m.data()),
                                           reinterpret_cast<const char*>(m.data()) + m.size(), &repeated);
    } catch (const nlohmann::json::exception& e) {
      detail::throw_io("checkpoint index '" + index_file + "': malformed JSON: " + e.what());
    }
    if (repeated)
      detail::throw_io("checkpoint index '" + index_file + "': key " + detail::quote_name(*repeated) +
                       " appears twice in one object (a tensor mapped twice?)");
    if (!j.is_object())
      detail::throw_io("checkpoint index '" + index_file + "': must be a JSON object, got " +
                       detail::json_type_name(j));
    auto wm = j.find("weight_map");
    if (wm == j.end()) detail::throw_io("checkpoint index '" + index_file + "': missing field 'weight_map'");
    if (!wm->is_object())
      detail::throw_io("checkpoint index '" + index_file + "': field 'weight_map' must be an object, got " +
                       detail::json_type_name(*wm));
    const fs::path dir = fs::path(index_file).parent_path();
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        detail::throw_io("checkpoint index '" + index_file + "': weight_map[" + detail::quote_name(it.key()) +
                         "] must be a file name string, got " + detail::json_type_name(it.value()));
      const std::string& fname = it.value().get_ref<const std::string&>();
      if (fname.empty() || fs::path(fname).is_absolute() || fs::path(fname).has_root_name())
        detail::throw_io("checkpoint index '" + index_file + "': weight_map[" + detail::quote_name(it.key()) +
                         "] = " + detail::quote_name(fname) + " must be a relative file name");
      for (const fs::path& part : fs::path(fname))
        if (part == "..")
          detail::throw_io("checkpoint index '" + index_file + "': weight_map[" + detail::quote_name(it.key()) +
                           "] = " + detail::quote_name(fname) +
                           " must name a file inside the index's directory (no '..' component)");
      std::size_t id = 0;
      try {  // lexically normal: "s.safetensors" and "./s.safetensors" are one file
        id = add_file((dir / fname).lexically_normal().string());
      } catch (const Error& e) {  // a missing or malformed shard: say which index and tensor name it
        throw Error(e.code(), "checkpoint index '" + index_file + "' maps tensor " + detail::quote_name(it.key()) +
                                  " to " + detail::quote_name(fname) + ": " + e.what());
      }
      if (!files_[id]->contains(it.key()))
        detail::throw_io("checkpoint index '" + index_file + "' maps tensor " + detail::quote_name(it.key()) +
                         " to '" + files_[id]->path() + "', which has no such tensor");
      where_[it.key()] = id;
    }
    // a tensor held by two of the listed files is refused as without an index: an engine that
    // reads every listed file's tensors would take the copy the index does not name
    for (std::size_t id = 0; id < files_.size(); ++id)
      for (const auto& e : files_[id]->entries())
        if (auto w = where_.find(e.name); w != where_.end() && w->second != id)
          detail::throw_io("checkpoint index '" + index_file + "': tensor " + detail::quote_name(e.name) +
                           " is in both '" + files_[w->second]->path() + "' (where the index maps it) and '" +
                           files_[id]->path() + "'");
  }

  std::string root_;
  std::string index_path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> file_ids_;
  std::map<std::string, std::size_t> where_;
};

}  // namespace step5
