// Positional encoding (§3.5): the sinusoids PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
// PE(pos, 2i+1) = cos(...), in the paper's interleaved layout or the concatenated one other
// toolkits use; embeddings.h adds them (or a learned table) to the token embeddings.
#pragma once

#include "model/config.h"

namespace tfm {

// The sinusoidal encodings of positions 0 .. max_positions-1 in the config's layout:
// table[max_positions, D].
void fill_sinusoid_table(const ModelConfig& config, float* table);

// The floats of that table, which a model with sinusoidal positions builds as it loads (its
// file holds no such tensor), else 0: max_positions × D.
int64_t sinusoid_table_elements(const ModelConfig& config);

}  // namespace tfm
