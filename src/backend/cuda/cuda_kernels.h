// The CUDA backend's kernels as host functions that enqueue them on a stream: what
// cuda_backend.cu calls for each Backend operation that is not a cuBLAS product. Each has the
// meaning of the Backend method of the same name (backend/backend.h); pointers are device
// memory. Defined in elementwise.cu, loss_and_search.cu, attention.cu and attention_dense.cu.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/operation_types.h"
#include "tensor/int8_weights.h"

namespace tfm {

class PreparedMatrix;

namespace cuda {

// --- elementwise.cu ---
// out[rows, cols] (row stride ldo) = x (row stride ldx) rounded to `format`: kBFloat16 or
// kFloat16 (std::invalid_argument otherwise).
void round_to_16_bits(cudaStream_t s, const float* x, int64_t rows, int64_t cols, int64_t ldx,
                      Precision format, uint16_t* out, int64_t ldo);
// Backend::round_each_to_16_bits: every job as round_to_16_bits rounds it, up to 64 jobs a
// launch.
void round_each_to_16_bits(cudaStream_t s, const std::vector<RoundingJob>& jobs, Precision format);
// out[rows, cols] (row stride ldo) in bfloat16, subnormal results flushed to zero (the
// product epilogue's rounded_output), from the float result[rows, cols] (row stride ldr) plus
// bias[cols] (null: none), then ReLU where relu: the epilogue and the rounding in one pass.
void round_to_bfloat16_flushing(cudaStream_t s, const float* result, int64_t ldr, const float* bias,
                                bool relu, int64_t rows, int64_t cols, uint16_t* out, int64_t ldo);
void add(cudaStream_t s, float* y, const float* x, int64_t n);
// y[n] += x[n] widened from bfloat16 (a bias gradient cuBLASLt's epilogue summed in bfloat16).
void add_bfloat16(cudaStream_t s, float* y, const uint16_t* x, int64_t n);
void scale(cudaStream_t s, float* x, float factor, int64_t n);
void fill(cudaStream_t s, float* y, int64_t n, float value);
// c[rows, cols] (row stride ldc) *= beta (beta 0: set to 0, whatever c held).
void scale_matrix(cudaStream_t s, float* c, int64_t ldc, int64_t rows, int64_t cols, float beta);
// y[rows, cols] (row stride ldy) += bias, then ReLU where relu (the product epilogue).
void bias_relu_epilogue(cudaStream_t s, float* y, int64_t ldy, const float* bias, bool relu,
                        int64_t rows, int64_t cols);
void add_bias_activation(cudaStream_t s, float* pre, const float* bias, float* out, int64_t rows,
                         int64_t cols, bool apply_activation, Activation act);
void activation_backward(cudaStream_t s, float* d, const float* pre, int64_t n, Activation act);
void relu_backward_bfloat16(const Context& c, const float* d, const uint16_t* relu_output,
                            int64_t rows, int64_t cols, uint16_t* rounded_d, float* column_sums);
void bias_backward(const Context& c, const float* dy, const uint16_t* rounded_dy, int64_t rows,
                   int64_t cols, int64_t ld, float* dbias);
void dropout_mask(cudaStream_t s, uint8_t* mask, int64_t n, float p, uint64_t key);
void apply_dropout(cudaStream_t s, float* x, const uint8_t* mask, int64_t n, float p, uint64_t key);
void layer_norm(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y,
                int64_t rows, int64_t cols, float eps, float* mean, float* rstd);
void layer_norm_backward(const Context& c, const float* dy, const float* x, const float* mean,
                         const float* rstd, const float* gamma, float* dx, float* dgamma,
                         float* dbeta, int64_t rows, int64_t cols, bool accumulate);
// Backend::residual_layer_norm and its backward.
void residual_layer_norm(cudaStream_t s, float* f, const float* x, int64_t rows, int64_t cols,
                         float p, uint64_t key, uint8_t* mask, const float* gamma,
                         const float* beta, float eps, float* y, float* mean, float* rstd,
                         uint16_t* rounded_y);
void residual_layer_norm_backward(const Context& c, float* dy, const float* sum, const float* mean,
                                  const float* rstd, const float* gamma, float* dgamma,
                                  float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                  float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                  int64_t rows, int64_t cols);
// out[rows, d] = table rows (float32, or int8 values × scales when int8.values) × scale +
// positions; `table_ld` is the float table's row stride.
void embedding_forward(cudaStream_t s, const float* table, int64_t table_ld, Int8Rows int8,
                       const float* positions, const int32_t* ids, int64_t rows, int64_t len,
                       int64_t d, float scale, int64_t first_position, float* out);
// out[rows, d] = out · scale + positions (a prepared table's rows, already read into out).
void scale_and_add_positions(cudaStream_t s, const float* positions, int64_t rows, int64_t len,
                             int64_t d, float scale, int64_t first_position, float* out);
// Backend::embedding_forward_prepared: the rows of a float32 prepared table (its read_rows),
// then scale_and_add_positions.
void embedding_forward_prepared(cudaStream_t s, const PreparedMatrix& table, const float* positions,
                                const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                float scale, int64_t first_position, float* out);
void embedding_backward(cudaStream_t s, const float* d_out, const int32_t* ids, int64_t rows,
                        int64_t len, int64_t d, float scale, int64_t first_position, float* d_table,
                        float* d_positions);
// Backend::adam_update's step `step` (from 1), its bias corrections folded into the step size.
void adam_update(cudaStream_t s, float* const* params, const int64_t* offsets, int64_t count,
                 int64_t total, const float* grad, float* m, float* v, const AdamHyperparameters& h,
                 int64_t step);
void sgd_update(cudaStream_t s, float* param, const float* grad, int64_t n, float lr);
// Σ x² in double in a fixed order, waited for.
double sum_of_squares(const Context& c, const float* x, int64_t n);
void gather_rows(cudaStream_t s, const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                 int64_t d, float* y, int64_t ldy);
void scatter_rows(cudaStream_t s, const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                  int64_t d, float* y, int64_t ldy);
void mean_of_row_groups(cudaStream_t s, const float* x, int64_t groups, int64_t group_size,
                        int64_t cols, float* y);
void scatter_rows_to_16_bits(cudaStream_t s, const float* x, int64_t ldx, const int64_t* rows,
                             int64_t count, int64_t d, Precision format, uint16_t* y, int64_t ldy);
// Int8 products (matmul.cu's int8 path): q[m, k] = the activation rows quantised as the CPU
// quantises them (tensor/int8_weights.h, backend/cpu/int8_quantization.h), in signed form, and
// scales[m]; weight rows quantised by quantize_weight_rows' rule.
void quantize_activation_rows(cudaStream_t s, const float* x, int64_t m, int64_t k, int64_t ldx,
                              int8_t* q, float* scales);
void quantize_weight_rows(cudaStream_t s, const float* w, int64_t n, int64_t k, int8_t* values,
                          float* scales);
// y[m, n] (row stride ldy) = (q_x[m, k] · q_wᵀ) · x_scales[r] · w_scales[c], int32 sums; then
// + bias[c] (null: none) and max(·, 0) where relu.
void int8_product(cudaStream_t s, const int8_t* qx, const float* x_scales, const int8_t* qw,
                  const float* w_scales, int64_t m, int64_t n, int64_t k, float* y, int64_t ldy,
                  const float* bias, bool relu);
// The same result from int32 sums already in y: y[m, n] (row stride ldy) holds q_x · q_wᵀ as
// int32 (cuBLAS's int8 product, written there), and becomes float in place, by int8_product's
// arithmetic.
void dequantize_int8_sums(cudaStream_t s, float* y, int64_t m, int64_t n, int64_t ldy,
                          const float* x_scales, const float* w_scales, const float* bias,
                          bool relu);
// out[count, d] = rows ids of the float32 matrix w[., d].
void read_rows(cudaStream_t s, const float* w, const int32_t* ids, int64_t count, int64_t d,
               float* out);

// --- loss_and_search.cu ---
void log_softmax_pick(cudaStream_t s, const float* logits, const int32_t* targets, int64_t rows,
                      int64_t cols, float* out);
// std::invalid_argument where rows > 0 and there are neither logits nor rounded_gradient.
void cross_entropy_forward_backward(cudaStream_t s, float* logits, const int32_t* targets,
                                    int64_t rows, int64_t vocab, float smoothing, float grad_scale,
                                    double* row_totals, uint16_t* rounded_gradient);
void best_tokens(cudaStream_t s, const float* scores, int64_t rows, int64_t vocab, int64_t keep,
                 int32_t banned, float* values, int32_t* tokens, float* log_sums);

// --- attention.cu ---
void attention_forward(const Context& c, const AttentionShape& shape, const AttentionMask& mask,
                       const float* q, const float* k, const float* v, float* probs, float* out,
                       const AttentionDropout& dropout);
void attention_forward_16_bit_cache(const Context& c, const AttentionShape& shape,
                                    const AttentionMask& mask, const float* q, Precision format,
                                    const uint16_t* k, const uint16_t* v, float* probs, float* out);
void attention_backward(const Context& c, const AttentionShape& shape, const AttentionMask& mask,
                        const float* q, const float* k, const float* v, const float* probs,
                        const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                        float* dv, float* d_additive_v);

// --- attention_short.cu: a block per (sequence, head) for at most 64 queries and keys ---
// Whether a block per (sequence, head) can take this call: dot-product scores, heads of 64, no
// attention dropout, no cached rows or shared key batches, at most most_rows queries and keys.
bool block_per_head_applies(const AttentionShape& s, const AttentionMask& mask,
                            const AttentionDropout& dropout, int64_t most_rows);
// Whether attention_short.cu serves this forward: the above for at most 64 queries and keys.
bool short_attention_applies(const AttentionShape& s, const AttentionMask& mask,
                             const AttentionDropout& dropout);
// attention_forward (probs may be null) where it applies.
void short_attention_forward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                             const float* q, const float* k, const float* v, float* probs,
                             float* out);

// --- attention_tensor_cores.cu: the same blocks on bfloat16 tensor cores, for training ---
// Whether training's attention may take tensor cores at all (AttentionShape::products:
// these blocks, and TF32 in attention_dense.cu's backward): not where
// TFM_CUDA_TENSOR_CORE_ATTENTION=0.
bool attention_tensor_cores_enabled();
// Whether it serves this call: AttentionShape::products kBFloat16 where block_per_head_applies
// for up to 128 queries and keys (beyond 64, where the device lends a block the shared memory),
// and beyond 128 where attention_in_registers.cu's tiles take it, and tensor cores are enabled.
bool tensor_core_attention_applies(const Context& c, const AttentionShape& s,
                                   const AttentionMask& mask, const AttentionDropout& dropout);
// Backend::attention_reads_rounded_inputs: where the tensor-core blocks serve the call, which read
// Q, K and V in bfloat16 where AttentionShape::rounded_q, _k, _v give them; not where
// TFM_CUDA_BFLOAT16_QKV=0 (training's projections then write float32 Q, K, V, as before).
bool attention_reads_rounded_inputs(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const AttentionDropout& dropout);
// The profile's name for a forward (or backward) these blocks serve: which kernels take it
// (attention_in_registers.cu's, or the WMMA ones).
const char* tensor_core_attention_name(bool forward);
// Backend::attention_weights_floats: [B, H, Tq, 2] where these blocks serve the call and keep
// each row's statistics for the backward (rebuilds its weights), else the weights' count.
int64_t attention_weights_floats(const Context& c, const AttentionShape& s,
                                 const AttentionMask& mask, const AttentionDropout& dropout);
// attention_forward (probs may be null) and attention_backward (from the stored probs, or what
// the forward stored there instead: AttentionShape::weights_for_backward_only) there.
void tensor_core_attention_forward(const Context& c, const AttentionShape& s,
                                   const AttentionMask& mask, const float* q, const float* k,
                                   const float* v, float* probs, float* out);
void tensor_core_attention_backward(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const float* q, const float* k,
                                    const float* v, const float* probs, const float* d_out,
                                    float* dq, float* dk, float* dv);

// --- attention_in_registers.cu: the same calls with scores and weights in registers ---
// Whether tensor_core_attention_forward and _backward hand their calls to the kernels below:
// not where TFM_CUDA_ATTENTION_IN_REGISTERS=0 (the WMMA blocks then serve them).
bool attention_in_registers_enabled();
// The shared memory a block of its tiled kernels (beyond 128 queries or keys) needs for a call of
// query_len queries.
size_t attention_in_registers_tile_bytes(int64_t query_len);
// attention_forward where tensor_core_attention_applies: Q, K and V from q, k, v or (where
// AttentionShape::rounded_q is given) its bfloat16 copies; out null where only s.rounded_out is
// asked for; probs null, or the weights ([B, H, Tq, Tk]), or (statistics_only) each row's shift
// and inverse sum ([B, H, Tq, 2]: attention_weights_floats).
void attention_in_registers_forward(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const float* q, const float* k,
                                    const float* v, float* probs, float* out, float scale,
                                    bool statistics_only);
// attention_backward there, from what the forward stored (rebuild_weights: the statistics); dq,
// dk, dv null where only their rounded copies are asked for.
void attention_in_registers_backward(const Context& c, const AttentionShape& s,
                                     const AttentionMask& mask, const float* q, const float* k,
                                     const float* v, const float* probs, const float* d_out,
                                     float* dq, float* dk, float* dv, float scale,
                                     bool rebuild_weights);

// --- attention_dense.cu: the whole-matrix path attention.cu hands these calls to ---
// Whether it serves this call: dot-product scores without cached rows or shared key batches
// (and, without stored weights, score matrices of at most 1 GiB).
bool dense_attention_applies(const AttentionShape& s, const AttentionMask& mask, bool keeps_probs);
// attention_forward with the dropout mask already drawn; probs may be null (inference).
void dense_attention_forward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                             const float* q, const float* k, const float* v, float* probs,
                             float* out, const AttentionDropout& dropout);
void dense_attention_backward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                              const float* q, const float* k, const float* v, const float* probs,
                              const AttentionDropout& dropout, const float* d_out, float* dq,
                              float* dk, float* dv);

}  // namespace cuda
}  // namespace tfm
