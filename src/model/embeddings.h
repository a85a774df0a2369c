// Embeddings (§3.4): token ids to vectors scaled by sqrt(d_model), plus the positional
// encodings (model/positional_encoding.h) in the same pass; and the backward that adds the
// gradient into the table (and a learned position table).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace tfm {

// out[B, T, D] = table[ids] * (sqrt(D) if scale) + position_table[t + first_position + offset];
// ids [B, T]. Positions past a sequence's length are still embedded (their ids are pad) and
// are masked later. position_table: [max_positions, D], or null for "none"; the caller checks
// that first_position + len + offset <= max_positions.
void embed_forward(const Backend& backend, const ModelConfig& config, const EmbeddingTable& table,
                   const float* position_table, const int32_t* ids, int64_t batch, int64_t len,
                   int64_t first_position, float* out);
// d_table[ids] += scale · d_out; d_positions (learned tables only, else null) gets the
// position rows' sums.
void embed_backward(const Backend& backend, const ModelConfig& config, const float* d_out,
                    const int32_t* ids, int64_t batch, int64_t len, float* d_table,
                    float* d_positions);

}  // namespace tfm
