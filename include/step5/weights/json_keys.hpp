#pragma once
/// \file step5/weights/json_keys.hpp
/// JSON parsing for the checkpoint files (safetensors headers, the index's weight_map,
/// config.json) that refuses a key repeated within one object: nlohmann::json keeps the last
/// value silently, so a header listing a tensor twice, or a config giving a field twice, would
/// load whichever came last. Host only (g++).
#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace step5::detail {

/// SAX pass that records the first key repeated within one object (one key set per open object;
/// linear in the input: nlohmann's callback parser rescans an object's members at its end, which
/// made a header of N tensors O(N^2)).
struct RepeatedKeyFinder : nlohmann::json_sax<nlohmann::json> {
  std::vector<std::unordered_set<std::string>> open;  // the keys of each open object
  std::optional<std::string> repeated;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (!open.back().insert(k).second) repeated = k;
    return !repeated;  // stop at the first repeat
  }
  bool end_object() override {
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

/// `nlohmann::json::parse(first, last)` (throws its exceptions on malformed JSON) that also
/// reports the first key repeated within one object: `*duplicate` receives it, or nullopt when
/// every object's keys are distinct (an empty key repeated is reported as ""). Callers refuse the
/// input when it is set. Linear in the input (a SAX pass, then the parse).
template <class It>
nlohmann::json parse_json_checking_keys(It first, It last, std::optional<std::string>* duplicate) {
  RepeatedKeyFinder finder;
  (void)nlohmann::json::sax_parse(first, last, &finder);  // malformed input: the parse below throws
  *duplicate = finder.repeated;
  if (finder.repeated) return {};
  return nlohmann::json::parse(first, last);
}

}  // namespace step5::detail
