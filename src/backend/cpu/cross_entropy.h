// The training loss on rows of logits: label-smoothed cross-entropy exactly as PyTorch defines
// it, (1-ε)·(−log p_y) + ε·mean_k(−log p_k), fused with its gradient so the [rows, vocab]
// logits buffer is turned into d loss / d logits in place (no second vocabulary-sized buffer).
#pragma once

#include <cstdint>

#include "backend/operation_types.h"

namespace tfm {

// logits[rows, vocab] becomes grad_scale · (softmax − ((1-ε)·onehot(y) + ε/vocab)).
// row_totals[rows, 3]: each row's smoothed loss, −log p_y, and 1 where its first argmax is y
// (Backend::cross_entropy_forward_backward). targets[rows] must be valid ids. rounded_gradient
// (or null) [rows, vocab]: each row's gradient also in bfloat16, written while the row is warm;
// with logits null, it holds the logits in bfloat16 first (their values widened to float).
void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                    int64_t vocab, float smoothing, float grad_scale,
                                    double* row_totals, uint16_t* rounded_gradient);

}  // namespace tfm
