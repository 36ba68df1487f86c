#pragma once
/// \file step5/weights/json_keys.hpp
/// JSON parsing for the checkpoint files (safetensors headers, the index's weight_map,
/// config.json) that refuses a key repeated within one object: nlohmann::json keeps the last
/// value silently, so a header listing a tensor twice, or a config giving a field twice, would
/// load whichever came last. Host only (g++).
#include <nlohmann/json.hpp>

#include <string>
#include <unordered_set>
#include <vector>

namespace step5::detail {

/// `nlohmann::json::parse(first, last)` (throws its exceptions on malformed JSON) that also
/// reports the first key repeated within one object: `*duplicate` receives it ("" when every
/// object's keys are distinct). The parsed value keeps nlohmann's last-wins value; callers refuse
/// the input when `*duplicate` is not empty.
template <class It>
nlohmann::json parse_json_checking_keys(It first, It last, std::string* duplicate) {
  duplicate->clear();
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  const nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys.emplace_back();
    else if (ev == E::object_end) keys.pop_back();
    else if (ev == E::key && !keys.empty() && !keys.back().insert(v.get<std::string>()).second && duplicate->empty())
      *duplicate = v.get<std::string>();
    return true;
  };
  return nlohmann::json::parse(first, last, cb);
}

}  // namespace step5::detail
