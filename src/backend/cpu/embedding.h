// The CPU kernels of the embedding layer (§3.4) with its positional encodings (§3.5): a row
// gather with scale and position add, and its scatter-add backward.
#pragma once

#include <cstdint>

#include "tensor/int8_weights.h"

namespace tfm {

// out[rows, d] = table[ids[r]] · scale + positions[r % len + first_position] (null: no add).
void embedding_forward(const float* table, const float* positions, const int32_t* ids, int64_t rows,
                       int64_t len, int64_t d, float scale, int64_t first_position, float* out);

// The same from int8 rows: table[i] = values[i] · scales[i].
void embedding_forward(const Int8Rows& table, const float* positions, const int32_t* ids,
                       int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                       float* out);

// out[rows, d] = out · scale + positions[r % len + first_position] (null: no add): the rest of a
// lookup whose rows were gathered into out already.
void scale_and_add_positions(const float* positions, int64_t rows, int64_t len, int64_t d,
                             float scale, int64_t first_position, float* out);

// d_table[ids[r]] += scale · d_out[r]; d_positions[r % len + first_position] += d_out[r] when
// not null. Serial over rows (ids repeat), vectorised over d.
void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                        int64_t d, float scale, int64_t first_position, float* d_table,
                        float* d_positions);

}  // namespace tfm
