#pragma once
/// \file step5/weights/safetensors.hpp
/// Safetensors checkpoints (SPEC.md §7): the reader (safetensors_reader.hpp: header validation,
/// memory-mapped `SafetensorsFile`, conversions), the sharded index (safetensors_index.hpp:
/// `Checkpoint`) and the writer (safetensors_writer.hpp: `SafetensorsWriter`,
/// `write_safetensors`). Include one of them, or this header for all three.
///
/// Host only (g++); needs nlohmann-json.
#include "step5/weights/safetensors_index.hpp"
#include "step5/weights/safetensors_reader.hpp"
#include "step5/weights/safetensors_writer.hpp"
