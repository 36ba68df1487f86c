// libFuzzer target: config.json parsing (SPEC §1, §6, §7) on arbitrary bytes. Any input must
// either parse into a ModelConfig whose geometry is consistent, or throw step5::Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "step5/weights/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool require_listed : {true, false}) {
    try {
      const step5::ModelConfig c = step5::parse_model_config_text(text, "fuzz-config.json", require_listed);
      if (c.sparse.num_provider_groups != c.num_attention_groups) __builtin_trap();
      if (c.dsa_layers().empty()) __builtin_trap();
      if (require_listed && c.geometry_name.empty()) __builtin_trap();
      for (int l : c.dsa_layers()) {
        (void)c.rope_theta_of(l);
        (void)c.rope_scaling_applies(l);
      }
    } catch (const step5::Error& e) {
      if (std::string(e.what()).empty()) __builtin_trap();
    }
  }
  return 0;
}
