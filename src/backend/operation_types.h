// The types in the signatures of the backend operations (backend/backend.h), shared by every
// backend: number formats, activations, the attention descriptors, the loss totals and the
// optimizer's hyperparameters. Plain data only; no backend's code.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tfm {

// The number format a prepared weight matrix stores its weights in, and multiplies in (float32
// accumulation and output either way). bfloat16 keeps float32's range with an 8-bit mantissa:
// half the memory, and twice the multiply rate on CPUs with AVX512-BF16 (CTranslate2's
// compute_type "bfloat16"); the activations are rounded to bfloat16 at each product's input.
// float16 (IEEE half: a 11-bit mantissa, values up to 65504) is the same on GPUs only, as in
// CTranslate2, whose tensor cores multiply it at bfloat16's rate. int8 stores each weight row as
// signed bytes with one float scale per row (a quarter of the memory) and quantises each
// activation row the same way at the product, which runs on integers with int32 accumulation
// (CTranslate2's compute_type "int8"; VNNI instructions on the CPU).
//
// kBFloat16 and kFloat16 also name the two 16-bit element types of stored rows (a key/value
// cache: Backend::round_to_16_bits and the operations beside it), which every backend has.
enum class Precision { kFloat32, kBFloat16, kFloat16, kInt8 };

// Whether `precision` is one of the two 16-bit floating-point formats.
inline bool is_16_bit_float(Precision precision) {
  return precision == Precision::kBFloat16 || precision == Precision::kFloat16;
}

// "float32", "bfloat16", "float16", "int8": the names --compute-type and the model files use.
const char* precision_name(Precision precision);
// The precision of such a name; false for any other string.
bool parse_precision(const std::string& name, Precision& precision);

// The element type of incremental decoding's key/value cache (the keys and values every
// decoding step reads again): float32, or bfloat16 or float16 — half the bytes, which is what a
// step over a long cache waits for; rows are rounded to nearest even as they are written.
enum class CacheFormat { kFloat32, kBFloat16, kFloat16 };

// The Precision that names a 16-bit cache's element type (kFloat32 for a float32 cache).
inline Precision cache_precision(CacheFormat cache) {
  return cache == CacheFormat::kBFloat16  ? Precision::kBFloat16
         : cache == CacheFormat::kFloat16 ? Precision::kFloat16
                                          : Precision::kFloat32;
}

// A --compute-type name as CTranslate2 spells them: "float32" (or "float"), "bfloat16" or
// "float16" (products and the cache in that format), "int8" (or "int8_float32": int8 products,
// float32 elsewhere), "int8_bfloat16" or "int8_float16" (int8 products, the cache in that
// format). False, and nothing set, for any other string ("default" and "auto" depend on the
// model and the device: api/compute_type.h).
bool parse_compute_type(const std::string& name, Precision& precision, CacheFormat& cache);
// The name parse_compute_type reads back ("int8_bfloat16" for int8 with a bfloat16 cache; a
// float32 cache under 16-bit products, which no name gives, is called by the products' format).
std::string compute_type_name(Precision precision, CacheFormat cache);

// One operand of a matrix product (Backend::matmul): float32 values, and for a bfloat16 product
// optionally the same values already rounded to bfloat16 ([rows, cols] as stored, row stride
// rounded_ld, or cols where rounded_ld is 0: dense, as Backend::round_to_16_bits writes it),
// which the product then reads instead of rounding `values` again. Training in bfloat16 rounds
// each weight once per pass and each output gradient once for its two backward products this
// way; a column block of a wider rounded matrix (the stacked Q|K|V projections' gradients) is
// read in place through rounded_ld. Converts implicitly from a float pointer. With a rounded
// copy, values may be null (a bfloat16 product then has only the copy to read: the
// feed-forward's hidden layer in bfloat16 training, MatmulEpilogue::rounded_output).
struct MatmulOperand {
  MatmulOperand(const float* v = nullptr, const uint16_t* r = nullptr, int64_t r_ld = 0)
      : values(v), rounded(r), rounded_ld(r_ld) {}
  const float* values;
  const uint16_t* rounded;  // kBFloat16 only (ignored by float32 products); null: not rounded
  int64_t rounded_ld;       // the rounded copy's row stride; 0: its cols (dense)
  // The rounded copy's row stride for an operand stored with `cols` columns.
  int64_t rounded_stride(int64_t cols) const { return rounded_ld > 0 ? rounded_ld : cols; }
  // The row stride of the array a pass over the operand reads (its rounded copy where given,
  // else its values, ld apart): what MatmulEpilogue::a_column_sums sums.
  int64_t read_stride(int64_t cols, int64_t ld) const {
    return rounded ? rounded_stride(cols) : ld;
  }
};

// One matrix of Backend::round_each_to_16_bits: `count` floats at x (dense) rounded into out.
struct RoundingJob {
  const float* x = nullptr;  // [count]
  int64_t count = 0;
  uint16_t* out = nullptr;  // [count]
};

// The function between a feed-forward sublayer's two linear transformations (§3.3: ReLU).
enum class Activation { kRelu, kGelu };

// What a product does to its finished result (Backend::matmul): + bias [n] on every row (a
// linear layer's b), then ReLU, max(·, 0), where relu is set (§3.3's first linear
// transformation). The same float results as add_bias / add_bias_activation after the product;
// a backend may do it in the product's own pass (the CPU's does where beta is 0), which spares a
// pass over the output.
//
// rounded_output (bfloat16 products with beta 0 only): C is written there instead, rounded to
// bfloat16 (nearest, ties to even; results below the smallest normal float flush to zero, as
// AVX512-BF16's conversion does), row stride ldc, and c is not touched (it may be null). Training
// in bfloat16 keeps the feed-forward's hidden layer this way: only products read it.
struct MatmulEpilogue {
  const float* bias = nullptr;  // [n] or null
  bool relu = false;
  uint16_t* rounded_output = nullptr;  // [m, ldc] or null
  // With rounded_output: the product may round its float32 sums to bfloat16 itself (a GPU
  // library writing the 16-bit output directly: half the bytes of a float result and a pass),
  // its bits then its own algorithm's (an ulp from the float32 product's rounded, where their
  // sums differ; results below the smallest normal float may stay), and with a bias only where
  // rounded_bias is given too, which it then adds instead (bias rounded to bfloat16, as
  // PyTorch's autocast rounds a linear layer's bias). For outputs nothing compares with a float32
  // product's: the logits, the feed-forward's hidden layer and its gradient, and Q, K and V of
  // training in bfloat16. Else (and
  // on the CPU) the rounding is the float32 product's, with the float32 bias.
  bool rounded_by_the_product = false;
  const uint16_t* rounded_bias = nullptr;  // [n] bias in bfloat16, or null
  // Training's feed-forward in bfloat16 (fc1 with its ReLU, the hidden layer in bfloat16 alone).
  // Forward, with relu: where the backend keeps one (Backend::relu_mask_bytes(m, n) > 0), the
  // product may record there which outputs the ReLU passed, in its own layout, for the backward
  // product below. Backward (relu_output given): read, where the forward product of the same m and
  // n recorded it.
  void* relu_mask = nullptr;
  // The input-gradient product through that ReLU (fc2's dy·W; rounded_output alone, beta 0, no
  // bias or relu, ldc = n): each result kept where relu_output [m, n] (the forward's bfloat16
  // output, dense) is positive, else 0 (relu_backward_bfloat16's gate; a backend may read the
  // forward's record instead), and with bias_gradient [n], Σ over the rows of the kept results
  // added to it (fc1's bias gradient: in float32, or rounded to bfloat16 first, as a GPU
  // library's epilogue gives it).
  const uint16_t* relu_output = nullptr;
  float* bias_gradient = nullptr;
  // A weight gradient's product (trans_a: A is a layer's output gradient dy, [k, m] rows lda
  // apart): Σ over A's k rows (not scaled by alpha) added into this [m], the layer's bias gradient,
  // as Backend::bias_backward sums it (in float32, from A's bfloat16 copy where it comes with one,
  // else from its values). A backend may take the sums inside the product (a GPU library's
  // epilogue reduces the operand as it loads it) instead of a pass over dy after it.
  float* a_column_sums = nullptr;
  // Training's products: the backend may run this one on the algorithm it timed fastest for the
  // shape among several (a GPU library's), whose sums' last bits may then differ from another
  // process's. False (inference's): the algorithm the library names, the same in every run.
  bool may_tune = false;
};

// The epilogue of a product itself, without the ReLU's record or gate (relu_mask, relu_output,
// bias_gradient) or its operand's column sums (a_column_sums), which a backend applies around it.
inline MatmulEpilogue product_epilogue(MatmulEpilogue e) {
  e.relu_mask = nullptr;
  e.relu_output = nullptr;
  e.bias_gradient = nullptr;
  e.a_column_sums = nullptr;
  return e;
}

// A matmul's column sums of A (MatmulEpilogue::a_column_sums) where the product does not read A
// as a weight gradient's dy: every backend refuses them alike.
inline void check_column_sums(const MatmulEpilogue& e, bool trans_a) {
  if (e.a_column_sums && !trans_a)
    throw std::invalid_argument(
        "matmul: the column sums of A are a weight gradient's (A read transposed)");
  if (e.a_column_sums && (e.relu || e.relu_mask))
    throw std::invalid_argument("matmul: a weight gradient's product has no ReLU");
  if (e.a_column_sums && e.relu_output)
    throw std::invalid_argument("matmul: a ReLU gate's product sums no column of its operand");
}

// A matmul's ReLU gate (MatmulEpilogue::relu_output) where its epilogue cannot have one: every
// backend refuses it alike.
inline void check_relu_gate(const MatmulEpilogue& e, float beta, int64_t ldc, int64_t n) {
  if (e.bias_gradient && !e.relu_output)
    throw std::invalid_argument("matmul: a bias gradient comes with a ReLU gate");
  if (e.relu_output && (!e.rounded_output || beta != 0.f || ldc != n || e.bias || e.relu))
    throw std::invalid_argument(
        "matmul: a ReLU gate takes a dense bfloat16 output alone, without bias or ReLU");
}

// How query q_i and key k_j of one head (both d_k = head_dim wide) make a logit:
//   kScaledDot  q_i·k_j / sqrt(d_k)        (§3.2.1, the default)
//   kDot        q_i·k_j                    (§3.2.1's "dot-product attention" without scaling)
//   kAdditive   v_hᵀ·tanh(q_i + k_j)       (Bahdanau et al.; v_h has d_k entries per head)
// In the additive score the head's query and key projections W_i^Q, W_i^K play the roles of
// Bahdanau's W and U (a further linear map after them would compose into the same thing).
enum class AttentionScoring { kScaledDot, kDot, kAdditive };

// The factor a scoring applies to the raw dot products: 1/sqrt(d_k) for kScaledDot, else 1
// (every backend scales by it).
inline float attention_score_scale(AttentionScoring kind, int64_t head_dim) {
  return kind == AttentionScoring::kScaledDot ? 1.f / std::sqrt(float(head_dim)) : 1.f;
}

struct AttentionScore {
  AttentionScoring kind = AttentionScoring::kScaledDot;
  const float* additive_v = nullptr;  // [heads, head_dim]; kAdditive only
};

// Where the heads live: row (b, t) of Q starts at q + (b * query_len + t) * q_row_stride and
// head h occupies columns [h * head_dim, (h + 1) * head_dim) of that row. The same for K, V, out.
struct AttentionShape {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t query_len = 0;  // Tq (padded)
  int64_t key_len = 0;    // Tk (padded)
  int64_t head_dim = 0;   // d_k = d_v
  int64_t q_row_stride = 0;
  int64_t k_row_stride = 0;
  int64_t v_row_stride = 0;
  int64_t out_row_stride = 0;
  // Distance between consecutive sequences; 0 means len × row stride (a dense batch). A KV
  // cache with room for more positions than key_len sets these to its capacity × row stride.
  int64_t k_batch_stride = 0;
  int64_t v_batch_stride = 0;
  // Incremental decoding (query_len 1, no dropout): key j of sequence b is row
  // key_rows[b * key_rows_stride + j] of k and v (batch strides unused), so beam hypotheses
  // that share a prefix read the same cached rows instead of each holding a copy. Null: dense.
  const int32_t* key_rows = nullptr;
  int64_t key_rows_stride = 0;
  AttentionScore score;  // how queries and keys make logits
  // Where the forward writes its output rounded to bfloat16 as well (round_to_16_bits: nearest,
  // ties to even), dense [batch · query_len, heads · head_dim], for W_o's bfloat16 product;
  // null: nowhere. out is written either way, unless rounded_out_only: then the caller reads
  // only the rounded copy (a bfloat16 training step's W_o, forward and backward), and out is
  // scratch whose contents are then unspecified (CUDA's tensor-core forward stores the copy
  // alone).
  uint16_t* rounded_out = nullptr;
  bool rounded_out_only = false;
  // Q, K and V in bfloat16 alone (all three, in the layouts of q, k and v: the same row and
  // batch strides, in elements), where a bfloat16 training step's projections wrote them so
  // because this call's path reads nothing else (Backend::attention_reads_rounded_inputs, which
  // a backend refuses such a call without: std::invalid_argument); q, k and v are then not read
  // (null), in the forward and in the backward. Null: q, k and v hold them, in float32.
  const uint16_t* rounded_q = nullptr;
  const uint16_t* rounded_k = nullptr;
  const uint16_t* rounded_v = nullptr;
  // The backward's d_out in bfloat16 alone (its layout: out_row_stride), which comes with those
  // (both or neither, in the backward): W_o's input-gradient product then writes it so. d_out is
  // then not read (null).
  const uint16_t* rounded_d_out = nullptr;
  // Where the backward writes dq, dk and dv rounded to bfloat16 as well (nearest, ties to even),
  // in their layouts (those of q, k and v: row and batch strides in elements), for the
  // projections' bfloat16 backward products; null: nowhere. dq, dk, dv are written either way,
  // unless rounded_gradients_only: then the caller reads only the rounded copies (a bfloat16
  // step's products and bias gradients), and dq, dk, dv are scratch whose contents are then
  // unspecified (CUDA's tensor-core backward stores the rounded copies alone).
  uint16_t* rounded_dq = nullptr;
  uint16_t* rounded_dk = nullptr;
  uint16_t* rounded_dv = nullptr;
  bool rounded_gradients_only = false;
  // The forward's weights (its probs, where given) are read by nothing but attention_backward
  // with this same shape (the flag included), mask and inputs (a training step without
  // attention dropout): the forward may store there instead whatever its backward rebuilds the
  // weights from, and the buffer's contents are then unspecified otherwise. CUDA's tensor-core
  // blocks store each query row's softmax shift and inverse sum ([B, H, Tq, 2] from the start of
  // probs, where there are at least two keys: Backend::attention_weights_floats says how much
  // that is, which the model allocates) and rebuild the weights from Q·Kᵀ in the backward, to
  // the bit.
  bool weights_for_backward_only = false;
  // The precision the attention's products may multiply in: kFloat32, or kBFloat16 (training in
  // bfloat16, whose projections round to bfloat16 anyway): operands rounded to bfloat16 (nearest
  // even; the weights P too) or to more bits, sums in float32. CUDA then takes tensor cores:
  // bfloat16 ones for up to 128 queries and keys with heads of 64, TF32 ones (10 bits) in the
  // whole-matrix products beyond; the CPU multiplies in float32 either way. Inference leaves it
  // kFloat32, so that a GPU finds the CPU's translations.
  Precision products = Precision::kFloat32;
};

// Which keys a query sees. Query t of sequence b has absolute position t + query_offset;
// key j is visible iff j < key_lengths[b], and j <= position when causal, and the distance
// is within window (window < 0: unrestricted; causal: position - j <= window).
struct AttentionMask {
  const int32_t* key_lengths = nullptr;  // [key batches]; null: all key_len keys valid
  // Which key/value sequence serves query sequence b (beam search: the hypotheses of one
  // sentence share its encoder keys); null: sequence b itself.
  const int32_t* key_batch = nullptr;
  bool causal = false;
  int64_t window = -1;
  int64_t query_offset = 0;
};

// attention_forward / attention_backward with Q, K and V in bfloat16 alone (AttentionShape::
// rounded_q, _k, _v) where the call's path does not read them (`reads`: Backend::
// attention_reads_rounded_inputs): every backend refuses it alike.
inline void check_rounded_attention_inputs(const char* operation, const AttentionShape& s,
                                           bool reads, bool backward = false) {
  if (!s.rounded_q && !s.rounded_k && !s.rounded_v && !s.rounded_d_out) return;
  if (!s.rounded_q || !s.rounded_k || !s.rounded_v)
    throw std::invalid_argument(std::string(operation) +
                                ": Q, K and V in bfloat16 need all three copies");
  if (backward && !s.rounded_d_out)
    throw std::invalid_argument(std::string(operation) +
                                ": Q, K and V in bfloat16 alone come with d_out so");
  if (!reads)
    throw std::invalid_argument(std::string(operation) +
                                ": Q, K and V in bfloat16 alone, which this call's path does not "
                                "read (Backend::attention_reads_rounded_inputs)");
}

// Backend::residual_layer_norm_backward writes F's output gradient in float32, in bfloat16, or
// both, and Backend::relu_backward_bfloat16 in bfloat16: every backend refuses a call that
// would write it nowhere alike.
inline void check_gradient_written(const char* operation, const void* values, const void* rounded) {
  if (!values && !rounded)
    throw std::invalid_argument(std::string(operation) + ": the gradient has no destination");
}

// Dropout on the attention weights (training only). mask: [batch, heads, query_len, key_len],
// written by the forward pass (from key) and read by the backward pass.
struct AttentionDropout {
  float p = 0.f;
  uint8_t* mask = nullptr;
  uint64_t key = 0;
};

// Sums over the rows of fused label-smoothed cross-entropy calls.
struct CrossEntropyTotals {
  double loss = 0;      // Σ rows of the smoothed loss
  double nll = 0;       // Σ rows of −log p_y (for perplexity)
  int64_t correct = 0;  // rows whose argmax is the target
};

// The per-row values of Backend::cross_entropy_forward_backward, row_totals[rows, 3] copied to
// the host, summed in row order (the same totals whatever the backend and its threads).
inline CrossEntropyTotals sum_cross_entropy_rows(const double* row_totals, int64_t rows) {
  CrossEntropyTotals totals;
  for (int64_t r = 0; r < rows; ++r) {
    totals.loss += row_totals[3 * r];
    totals.nll += row_totals[3 * r + 1];
    totals.correct += row_totals[3 * r + 2] != 0 ? 1 : 0;
  }
  return totals;
}

struct AdamHyperparameters {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.98f;
  float eps = 1e-9f;
};

}  // namespace tfm
