// The output head's chunk sizes and plan (model/output_head.h).
#include "model/output_head.h"

namespace tfm {

int64_t output_chunk_rows(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t(4) << 20) / vocab);
}

int64_t output_logits_elements(int64_t vocab, int64_t positions) {
  return std::min(output_chunk_rows(vocab), std::max<int64_t>(positions, 1)) * vocab;
}

void plan_output_head_forward(const LinearWeights& output, int64_t count,
                              OutputHeadBuffers& buffers, WorkspacePlan& plan) {
  const int64_t vocab = output.out;
  plan.need(buffers.logits, output_logits_elements(vocab, count));  // [chunk, V]
  const int64_t chunk_rows = std::min(output_chunk_rows(vocab), count);
  if (rounds_to_bfloat16(output) && chunk_rows > 0)
    plan.need(buffers.rounded_states, chunk_rows * output.in);  // [chunk, D]
}

}  // namespace tfm
