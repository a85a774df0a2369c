// The output head's chunk sizes and plan (model/output_head.h).
#include "model/output_head.h"

namespace tfm {

int64_t output_chunk_rows(const Backend& backend, int64_t vocab) {
  const int64_t row_bytes = vocab * int64_t(sizeof(float));
  return std::max<int64_t>(1, backend.logits_chunk_bytes() / std::max<int64_t>(row_bytes, 1));
}

int64_t output_logits_elements(const Backend& backend, int64_t vocab, int64_t positions) {
  return std::min(output_chunk_rows(backend, vocab), std::max<int64_t>(positions, 1)) * vocab;
}

void plan_output_head_forward(const Backend& backend, const LinearWeights& output, int64_t count,
                              OutputHeadBuffers& buffers, WorkspacePlan& plan) {
  const int64_t vocab = output.out;
  const int64_t elements = output_logits_elements(backend, vocab, count);
  if (rounds_to_bfloat16(output))
    plan.need(buffers.rounded_logits, elements);  // [chunk, V]
  else
    plan.need(buffers.logits, elements);  // [chunk, V]
  const int64_t chunk_rows = std::min(output_chunk_rows(backend, vocab), count);
  if (rounds_to_bfloat16(output) && chunk_rows > 0)
    plan.need(buffers.rounded_states, chunk_rows * output.in);  // [chunk, D]
}

}  // namespace tfm
