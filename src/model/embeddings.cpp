// Embedding lookup forward / backward.
#include "model/embeddings.h"

#include <cmath>

namespace tfm {

void embed_forward(const Backend& backend, const ModelConfig& config, const EmbeddingTable& table,
                   const float* position_table, const int32_t* ids, int64_t batch, int64_t len,
                   int64_t first_position, float* out) {
  const int64_t d = config.d_model;
  const float scale = config.scale_embeddings ? std::sqrt(float(d)) : 1.f;
  const int64_t first = first_position + config.position_offset;
  if (table.values)
    backend.embedding_forward(table.values, position_table, ids, batch * len, len, d, scale, first,
                              out);
  else if (table.prepared)
    backend.embedding_forward_prepared(*table.prepared, position_table, ids, batch * len, len, d,
                                       scale, first, out);
  else
    backend.embedding_forward_int8(table.int8, position_table, ids, batch * len, len, d, scale,
                                   first, out);
}

void embed_backward(const Backend& backend, const ModelConfig& config, const float* d_out,
                    const int32_t* ids, int64_t batch, int64_t len, float* d_table,
                    float* d_positions) {
  const int64_t d = config.d_model;
  const float scale = config.scale_embeddings ? std::sqrt(float(d)) : 1.f;
  backend.embedding_backward(d_out, ids, batch * len, len, d, scale, config.position_offset,
                             d_table, d_positions);
}

}  // namespace tfm
