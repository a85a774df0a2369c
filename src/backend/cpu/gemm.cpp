// gemm() on oneDNN. Two paths, chosen per call, so that callers never pick:
// - Outside OpenMP parallel regions: a oneDNN matmul primitive (brgemm kernels) with the
//   operands described by their strides, so transposes cost nothing, and the epilogue (bias,
//   ReLU) in the same pass. Creating one costs ~0.3 ms, so primitives are kept per shape, the
//   most recently used 4096 of them. Each holds ~50 KB of generated code and kernel state, and
//   training's row counts (and the depth of its weight gradients) change with every batch, so
//   those dimensions run as a multiple of 32 plus a rest below 32, two products of sizes from
//   a small set (run_in_pieces): one primitive per row count grew training's memory by
//   0.4-0.9 MB a step until the cache was full. With few rows (decoding: 32 hypotheses) it
//   runs 3–6× the rate of dnnl_sgemm, which repacks the weights on every call.
// - Inside a parallel construct (attention's per-(sequence, head) products, which the region
//   already spreads over the threads): dnnl_sgemm, single-threaded there, with no creation cost
//   for the many small shapes.
// In bfloat16 (bfloat16 training) both operands are first rounded into dense bfloat16 copies,
// which a bfloat16 matmul primitive (AVX512-BF16, twice float32's multiply rate) reads with the
// same strides-as-transposes, accumulating in float32.
#include "backend/cpu/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <dnnl.hpp>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/int8_quantization.h"
#include "backend/cpu/parallel_threshold.h"
#include "tensor/float16.h"
#include "tensor/int8_weights.h"

namespace tfm {

namespace {

struct GemmShape {
  bool trans_a, trans_b, accumulate, bfloat16, bias, relu, rounded_output;
  int64_t m, n, k, lda, ldb, ldc;
  bool operator==(const GemmShape&) const = default;
};

struct GemmShapeHash {
  size_t operator()(const GemmShape& s) const {
    uint64_t h = uint64_t(s.trans_a) | uint64_t(s.trans_b) << 1 | uint64_t(s.accumulate) << 2 |
                 uint64_t(s.bfloat16) << 3 | uint64_t(s.bias) << 4 | uint64_t(s.relu) << 5 |
                 uint64_t(s.rounded_output) << 6;
    for (int64_t v : {s.m, s.n, s.k, s.lda, s.ldb, s.ldc}) h = (h ^ uint64_t(v)) * 0x100000001b3ull;
    return size_t(h ^ (h >> 29));
  }
};

dnnl::engine& cpu_engine() {
  // oneDNN's own primitive cache (1024, least recently used first) stays at its default: it
  // shares one primitive among the decoder layers' PackedMatrix objects of equal shape. It sees
  // the shapes our cache (below) sees, in the same order, so it holds a subset of the
  // primitives ours holds: bounding ours bounds both (measured: the same plateau with it at
  // 128).
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// Row-major [rows, cols] with row stride ld, read transposed when `transposed`.
dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, int64_t ld, bool transposed,
                               dnnl::memory::data_type type = dnnl::memory::data_type::f32) {
  return dnnl::memory::desc({rows, cols}, type,
                            transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

struct CachedMatmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c;
  dnnl::memory::desc bias;        // [1, n] float32, added to every row of c (empty: none)
  dnnl::memory::desc scratchpad;  // what execute() lends it (size 0: nothing)
};

// Creates entry's primitive for its a, b, c. With lend_scratchpad its scratchpad is lent by
// the executing thread (scratchpad_mode::user) instead of owned: a cache of thousands of
// primitives (training's batch shapes) then holds their code only. Prepared weights' few
// primitives own theirs (lending measured 1–3% slower in greedy decoding). Measured training the
// small preset in bfloat16 on the quickstart corpus, 1,000 steps: peak RSS 1.6 GB with 1,024
// primitives that own their scratchpads (3.2 GB with 16,384), 0.84 GB with 1,024 lent ones and 1.24
// GB with every shape's.
void create_matmul(CachedMatmul& entry, bool lend_scratchpad, dnnl::primitive_attr attr = {}) {
  if (lend_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::desc desc = entry.bias.get_size() == 0
                                      ? dnnl::matmul::desc(entry.a, entry.b, entry.c)
                                      : dnnl::matmul::desc(entry.a, entry.b, entry.bias, entry.c);
  dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  if (lend_scratchpad) entry.scratchpad = pd.scratchpad_desc();
  entry.primitive = dnnl::matmul(pd);
}

// A primitive's post-ops: + the destination's old values (a product with beta 1) first, then
// the ReLU.
dnnl::primitive_attr post_ops_attr(bool accumulate, bool relu) {
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (accumulate) ops.append_sum(1.f);
  if (relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(ops);
  return attr;
}

// This thread's scratchpad, grown to `bytes` (page-aligned, as oneDNN aligns its own).
void* thread_scratchpad(size_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    buffer.reset(std::aligned_alloc(4096, rounded));
    if (!buffer) {
      capacity = 0;
      throw std::bad_alloc();
    }
    capacity = rounded;
  }
  return buffer.get();
}

// c = a · b (+ bias, where the primitive adds one) on this thread's stream; a, c and bias are
// wrapped in place, b is already a memory object. Through the C API's argument array: the C++
// API's std::unordered_map of arguments cost a few heap blocks per product (0.8% of a bfloat16
// training step in malloc/free).
void execute(const CachedMatmul& mm, void* a, const dnnl::memory& b, void* c,
             const float* bias = nullptr) {
  dnnl::stream& stream = thread_stream();
  const dnnl::memory a_memory(mm.a, cpu_engine(), a), c_memory(mm.c, cpu_engine(), c);
  dnnl_exec_arg_t args[5] = {
      {DNNL_ARG_SRC, a_memory.get()}, {DNNL_ARG_WEIGHTS, b.get()}, {DNNL_ARG_DST, c_memory.get()}};
  int count = 3;
  dnnl::memory bias_memory, scratchpad_memory;
  if (mm.bias.get_size() != 0) {
    if (!bias) throw std::logic_error("gemm: a primitive with a bias executed without one");
    bias_memory = dnnl::memory(mm.bias, cpu_engine(), const_cast<float*>(bias));
    args[count++] = {DNNL_ARG_BIAS, bias_memory.get()};
  }
  if (const size_t bytes = mm.scratchpad.get_size()) {
    scratchpad_memory = dnnl::memory(mm.scratchpad, cpu_engine(), thread_scratchpad(bytes));
    args[count++] = {DNNL_ARG_SCRATCHPAD, scratchpad_memory.get()};
  }
  dnnl::error::wrap_c_api(dnnl_primitive_execute(mm.primitive.get(), stream.get(), count, args),
                          "could not execute a matmul primitive");
  stream.wait();
}

// The primitive for a shape, created on first use; null if oneDNN has none for it. The cache
// keeps the kMaxShapes most recently used: a decoding step's ~10 shapes × up to a few hundred
// live-hypothesis counts, and training's product shapes × the sizes run_in_pieces cuts their
// batch dimensions into (the quickstart's small preset: 13 × at most 72, 861 in all, every one
// met by step 350, in the first epoch of 450-500 steps). Before those pieces every batch shape had
// primitives of its own, and with 1,024 training recreated most of them every epoch (small preset,
// bfloat16: 7,500 target tokens/s in the second epoch against 8,500 with every shape kept). Shared
// pointers, so that evicting one never frees a primitive that another thread is running.
std::shared_ptr<const CachedMatmul> matmul_for(const GemmShape& s) {
  constexpr size_t kMaxShapes = 4096;
  using Recency = std::list<GemmShape>;  // most recent first
  struct Entry {
    std::shared_ptr<const CachedMatmul> matmul;
    Recency::iterator position;
  };
  static std::mutex mutex;
  static Recency recency;
  static std::unordered_map<GemmShape, Entry, GemmShapeHash> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = cache.find(s);
  if (found != cache.end()) {
    recency.splice(recency.begin(), recency, found->second.position);
    return found->second.matmul;
  }
  if (cache.size() >= kMaxShapes) {
    cache.erase(recency.back());
    recency.pop_back();
  }
  auto entry = std::make_shared<CachedMatmul>();
  try {
    const auto operands = s.bfloat16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
    entry->a = matrix_desc(s.m, s.k, s.lda, s.trans_a, operands);
    entry->b = matrix_desc(s.k, s.n, s.ldb, s.trans_b, operands);
    entry->c = matrix_desc(
        s.m, s.n, s.ldc, false,
        s.rounded_output ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32);
    if (s.bias) entry->bias = matrix_desc(1, s.n, s.n, false);
    create_matmul(*entry, true, post_ops_attr(s.accumulate, s.relu));
  } catch (const dnnl::error&) {
    return nullptr;
  }
  recency.push_front(s);
  cache.emplace(s, Entry{entry, recency.begin()});
  return entry;
}

void run_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                    lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success)
    throw std::runtime_error("oneDNN sgemm failed with status " + std::to_string(int(status)));
}

// The epilogue applied to c[m, n] (row stride ldc) after the product, where the primitive did
// not apply it in its own pass (beta ≠ 0, sgemm): the same float results, c + bias then
// max(·, 0), either way. Nothing for an empty epilogue.
void apply_epilogue(float* c, int64_t ldc, const MatmulEpilogue& epilogue, int64_t m, int64_t n) {
  if (!epilogue.bias && !epilogue.relu) return;
  const int64_t blocks = ldc == n ? 1 : m, rows = ldc == n ? m : 1;  // dense: one call
  for (int64_t i = 0; i < blocks; ++i) {
    float* block = c + i * ldc;
    if (epilogue.relu)
      add_bias_activation(block, epilogue.bias, block, rows, n, Activation::kRelu);
    else if (epilogue.bias)
      add_bias(block, epilogue.bias, rows, n);
  }
}

// Whether a primitive applies the epilogue in its own pass: only where beta is 0 (oneDNN adds
// its bias before the sum post-op, which would change the order of the float sums).
bool primitive_applies_epilogue(float beta) {
  return beta == 0.f;
}

// The cache key of a plain product's primitive (alpha 1, beta 0 or 1): beta 1 as a sum
// post-op, and the parts of the epilogue the primitive applies.
GemmShape plain_product_shape(bool trans_a, bool trans_b, float beta, bool bfloat16,
                              const MatmulEpilogue& epilogue, int64_t m, int64_t n, int64_t k,
                              int64_t lda, int64_t ldb, int64_t ldc) {
  const bool fused = primitive_applies_epilogue(beta);
  return {trans_a,
          trans_b,
          beta == 1.f,
          bfloat16,
          fused && epilogue.bias != nullptr,
          fused && epilogue.relu,
          epilogue.rounded_output != nullptr,
          m,
          n,
          k,
          lda,
          ldb,
          ldc};
}

// The sizes a batch-dependent dimension runs in: a multiple of kShapeQuantum, then the rest
// below it, so that the primitives of every row count up to r are at most r / 32 + 31 per
// product shape instead of r (r / q + q - 1 is smallest near q = √r: 32 to 64 for training's
// row counts of 1,000 to 4,000). The rest is one more execution, on at most 31 rows or 31
// columns of depth.
constexpr int64_t kShapeQuantum = 32;

struct Pieces {
  int64_t begin[2], size[2];
  int count;
};

Pieces pieces_of(int64_t extent) {
  const int64_t rest = extent % kShapeQuantum, whole = extent - rest;
  if (whole == 0 || rest == 0) return {{0, 0}, {extent, 0}, 1};
  return {{0, whole}, {whole, rest}, 2};
}

// Whether a product of depth k runs as two products (the second adding to the first).
bool splits_depth(int64_t k) {
  return pieces_of(k).count > 1;
}

// c = op(a) · op(b) + beta · c (beta 0 or 1), then the epilogue, through cached primitives:
// the rows and the depth each in pieces_of's pieces (a later depth piece adds to the earlier
// ones). T is float, or uint16_t for dense bfloat16 copies. The primitives apply the epilogue
// where beta is 0 and the depth is one piece; elsewhere it is applied to the finished product.
// A bfloat16 output needs one depth piece (the caller goes through float otherwise). False,
// with nothing computed, where oneDNN has no primitive for one of the pieces.
template <typename T>
bool run_in_pieces(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
                   int64_t lda, const T* b, int64_t ldb, float beta, float* c, int64_t ldc,
                   const MatmulEpilogue& epilogue) {
  constexpr bool bfloat16 = std::is_same_v<T, uint16_t>;
  const Pieces rows = pieces_of(m), depth = pieces_of(k);
  if (epilogue.rounded_output && depth.count > 1)
    throw std::logic_error("gemm: a bfloat16 output of a product in depth pieces");
  const bool fused = primitive_applies_epilogue(beta) && depth.count == 1;
  const MatmulEpilogue piece_epilogue = fused ? epilogue : MatmulEpilogue{};
  std::shared_ptr<const CachedMatmul> mm[2][2];  // [row piece][depth piece]
  for (int r = 0; r < rows.count; ++r)
    for (int d = 0; d < depth.count; ++d) {
      mm[r][d] = matmul_for(plain_product_shape(trans_a, trans_b, d == 0 ? beta : 1.f, bfloat16,
                                                piece_epilogue, rows.size[r], n, depth.size[d], lda,
                                                ldb, ldc));
      if (!mm[r][d]) return false;
    }
  for (int r = 0; r < rows.count; ++r)
    for (int d = 0; d < depth.count; ++d) {
      const int64_t i = rows.begin[r], p = depth.begin[d];
      const T* a_piece = a + (trans_a ? p * lda + i : i * lda + p);  // op(a)[i.., p..]
      const T* b_piece = b + (trans_b ? p : p * ldb);                // op(b)[p.., 0..]
      void* out = piece_epilogue.rounded_output
                      ? static_cast<void*>(piece_epilogue.rounded_output + i * ldc)
                      : static_cast<void*>(c + i * ldc);
      execute(*mm[r][d], const_cast<T*>(a_piece),
              dnnl::memory(mm[r][d]->b, cpu_engine(), const_cast<T*>(b_piece)), out,
              piece_epilogue.bias);
    }
  if (!fused) apply_epilogue(c, ldc, epilogue, m, n);
  return true;
}

}  // namespace

TFM_CPU_KERNEL void round_to_bfloat16(const float* x, int64_t m, int64_t k, int64_t ldx,
                                      uint16_t* out, int64_t ldo) {
#pragma omp parallel for schedule(static) if (m * k >= kParallelElements && omp_get_level() == 0)
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * ldx;
    uint16_t* o = out + r * ldo;
#pragma omp simd
    for (int64_t c = 0; c < k; ++c) o[c] = float_to_bfloat16(row[c]);
  }
}

TFM_CPU_KERNEL void round_to_float16(const float* x, int64_t m, int64_t k, int64_t ldx,
                                     uint16_t* out) {
#pragma omp parallel for schedule(static) if (m * k >= kParallelElements && omp_get_level() == 0)
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * ldx;
    uint16_t* o = out + r * k;
    for (int64_t c = 0; c < k; ++c) o[c] = float_to_half(row[c]);
  }
}

const char* float16_refusal() {
  return "float16 products run on GPUs only (as in CTranslate2); bfloat16 is the CPU's 16-bit "
         "format";
}

bool bfloat16_supported() {
  static const bool supported = [] {
    try {
      const auto bf16 = dnnl::memory::data_type::bf16;
      dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(dnnl::memory::desc({32, 64}, bf16, dnnl::memory::format_tag::ab),
                             dnnl::memory::desc({64, 64}, bf16, dnnl::memory::format_tag::any),
                             dnnl::memory::desc({32, 64}, dnnl::memory::data_type::f32,
                                                dnnl::memory::format_tag::ab)),
          cpu_engine());
      // Native bf16 instructions (elsewhere oneDNN emulates them, slower than float32).
      const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
      const auto bf16_isa = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
      return (isa & bf16_isa) == bf16_isa &&
             std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return supported;
}

bool int8_supported() {
  static const bool supported = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto has = [isa](dnnl::cpu_isa wanted) {
      return (isa & static_cast<unsigned>(wanted)) == static_cast<unsigned>(wanted);
    };
    return has(dnnl::cpu_isa::avx512_core_vnni) || has(dnnl::cpu_isa::avx2_vnni);
  }();
  return supported;
}

namespace {

dnnl::memory::data_type weight_data_type(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return dnnl::memory::data_type::bf16;
    case Precision::kInt8:
      return dnnl::memory::data_type::s8;
    case Precision::kFloat16:  // refused before (check_packable)
    case Precision::kFloat32:
      break;
  }
  return dnnl::memory::data_type::f32;
}

// The operands of a product with `precision` weights on m rows of x (row stride ldx) into y (row
// stride ldy). bfloat16 and int8 read a dense converted copy of x; int8 writes int32 products
// that dequantize_products turns into y.
dnnl::memory::desc input_desc(Precision precision, int64_t m, int64_t k, int64_t ldx) {
  if (precision == Precision::kFloat32) return matrix_desc(m, k, ldx, false);
  const auto type =
      precision == Precision::kInt8 ? dnnl::memory::data_type::u8 : dnnl::memory::data_type::bf16;
  return dnnl::memory::desc({m, k}, type, dnnl::memory::format_tag::ab);
}
dnnl::memory::desc output_desc(Precision precision, int64_t m, int64_t n, int64_t ldy) {
  if (precision != Precision::kInt8) return matrix_desc(m, n, ldy, false);
  return dnnl::memory::desc({m, n}, dnnl::memory::data_type::s32, dnnl::memory::format_tag::ab);
}

// A thread's scratch for converting a product's input, reused across calls.
template <typename T>
T* thread_scratch(std::vector<T>& buffer, int64_t n) {
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

}  // namespace

struct PackedMatrix::Impl {
  int64_t n = 0, k = 0;
  Precision precision = Precision::kFloat32;
  dnnl::memory::desc packed_desc;  // [k, n] in oneDNN's blocked layout
  // The packed bytes, from plain malloc rather than oneDNN's own 64-byte-aligned allocation:
  // a model prepared for inference only frees each weight after packing it, and an exact-size
  // request fits the block a weight of the same size just left, where an over-aligned one did
  // not (float32 base translation peaked 31 MiB higher, with 12k more page faults).
  std::unique_ptr<void, decltype(&std::free)> storage{nullptr, &std::free};
  dnnl::memory packed;               // the packed copy of W, in storage
  std::vector<float> weight_scales;  // [n] int8: the scale of each row of W
  std::vector<int32_t> column_sums;  // [n] int8: Σ of each quantised row of W
  std::vector<float> plain;          // [n, k] stacked copy, only when oneDNN could not pack
  std::mutex mutex;
  bool pack(const void* weights);
  // int8: the stacked quantised rows [n, k] and their scales [n].
  void pack_int8(const std::vector<int8_t>& values, std::vector<float> scales);
  // key: m, ldx, ldy, then whether the primitive adds a bias, applies a ReLU (float32 and
  // bfloat16; int8's epilogue runs in dequantize_products) and writes bfloat16
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, bool>,
           std::shared_ptr<const CachedMatmul>>
      by_rows;
  // read_rows: where element (c, i) of the packed [k, n] lies is column_offsets[c] +
  // row_offset(i) (a blocked layout places each dimension independently); built on first use.
  std::vector<int64_t> column_offsets;  // [k]
  std::once_flag column_offsets_once;
};

namespace {

// The element offset of pos in a oneDNN blocked layout (what oneDNN's memory_desc_wrapper::off
// computes): each inner block takes its digits of the position, innermost last, then the
// outer parts are multiplied by the strides.
int64_t blocked_offset(const dnnl_memory_desc_t& md, dnnl_dims_t pos) {
  const dnnl_blocking_desc_t& blocking = md.format_desc.blocking;
  int64_t offset = md.offset0, block_stride = 1;
  for (int b = blocking.inner_nblks - 1; b >= 0; --b) {
    const int d = int(blocking.inner_idxs[b]);
    offset += (pos[d] % blocking.inner_blks[b]) * block_stride;
    pos[d] /= blocking.inner_blks[b];
    block_stride *= blocking.inner_blks[b];
  }
  for (int d = 0; d < md.ndims; ++d)
    offset += (pos[d] + md.padded_offsets[d]) * blocking.strides[d];
  return offset;
}

// Throws std::invalid_argument where this CPU cannot multiply in `precision`, or for bad parts.
void check_packable(size_t parts, size_t part_rows, int64_t k, Precision precision) {
  if (parts != part_rows || k <= 0) throw std::invalid_argument("PackedMatrix: bad parts");
  if (precision == Precision::kBFloat16 && !bfloat16_supported())
    throw std::invalid_argument("this CPU has no bfloat16 matrix instructions (AVX512-BF16)");
  if (precision == Precision::kFloat16) throw std::invalid_argument(float16_refusal());
  if (precision == Precision::kInt8 && !int8_supported())
    throw std::invalid_argument("this CPU has no int8 dot-product instructions (VNNI)");
  // int8 products accumulate up to 255 · 127 per input column in int32.
  if (precision == Precision::kInt8 && k > std::numeric_limits<int32_t>::max() / (255 * 127))
    throw std::invalid_argument("int8 products support at most 66313 input columns");
}

// The parts stacked row after row into one [Σ rows, k] matrix.
template <typename T>
std::vector<T> stack_rows(const std::vector<const T*>& parts, const std::vector<int64_t>& part_rows,
                          int64_t k) {
  int64_t n = 0;
  for (int64_t r : part_rows) n += r;
  std::vector<T> stacked(size_t(n * k));  // [n, k]
  int64_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::copy_n(parts[i], part_rows[i] * k, stacked.data() + offset * k);
    offset += part_rows[i];
  }
  return stacked;
}

}  // namespace

// Copies W [n, k] (plain, row-major: float32, or int8 for the int8 precision) into the blocked
// layout matmul picks for 32 rows, converting float32 to bfloat16 on the way where asked; the
// same layout serves every row count (the kernels block over n and k only). Returns false where
// oneDNN has no such layout.
bool PackedMatrix::Impl::pack(const void* weights) {
  const auto weight_type = weight_data_type(precision);
  try {
    dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(input_desc(precision, 32, k, k),
                           dnnl::memory::desc({k, n}, weight_type, dnnl::memory::format_tag::any),
                           output_desc(precision, 32, n, n)),
        cpu_engine());
    packed_desc = pd.weights_desc();
    storage.reset(std::malloc(std::max<size_t>(packed_desc.get_size(), 1)));
    if (!storage) throw std::bad_alloc();
    packed = dnnl::memory(packed_desc, cpu_engine(), storage.get());
    // W read as Wᵀ: [k, n] with strides {1, k}.
    const auto source_type =
        precision == Precision::kInt8 ? dnnl::memory::data_type::s8 : dnnl::memory::data_type::f32;
    dnnl::memory source(dnnl::memory::desc({k, n}, source_type, dnnl::memory::dims{1, k}),
                        cpu_engine(), const_cast<void*>(weights));
    dnnl::stream stream(cpu_engine());
    dnnl::reorder(source, packed).execute(stream, source, packed);  // converts to bf16 too
    stream.wait();
    return true;
  } catch (const dnnl::error&) {
    packed = dnnl::memory();
    storage.reset();
    if (precision != Precision::kFloat32)
      throw std::invalid_argument("packing weights in a reduced precision failed");
    return false;
  }
}

void PackedMatrix::Impl::pack_int8(const std::vector<int8_t>& values, std::vector<float> scales) {
  weight_scales = std::move(scales);
  column_sums.resize(size_t(n));
  int8_row_sums(values.data(), n, k, column_sums.data());
  pack(values.data());
}

PackedMatrix::PackedMatrix(const std::vector<const float*>& parts,
                           const std::vector<int64_t>& part_rows, int64_t k, Precision precision)
    : impl_(std::make_shared<Impl>()) {
  check_packable(parts.size(), part_rows.size(), k, precision);
  Impl& p = *impl_;
  p.k = k;
  p.precision = precision;
  p.n = 0;
  for (int64_t r : part_rows) p.n += r;
  // Several parts are stacked into one [n, k] copy; one part is read where it is.
  const bool one_part = parts.size() == 1;
  std::vector<float> stacked;
  if (!one_part) stacked = stack_rows(parts, part_rows, k);
  const float* w = one_part ? parts[0] : stacked.data();  // [n, k]
  if (precision == Precision::kInt8) {
    std::vector<int8_t> values(size_t(p.n * k));  // [n, k]
    std::vector<float> scales(size_t(p.n));       // [n]
    quantize_weight_rows(w, p.n, k, values.data(), scales.data());
    p.pack_int8(values, std::move(scales));
    return;
  }
  if (p.pack(w)) return;
  if (one_part) stacked.assign(w, w + p.n * k);
  p.plain = std::move(stacked);
}

PackedMatrix::PackedMatrix(const std::vector<Int8Rows>& parts,
                           const std::vector<int64_t>& part_rows, int64_t k)
    : impl_(std::make_shared<Impl>()) {
  check_packable(parts.size(), part_rows.size(), k, Precision::kInt8);
  Impl& p = *impl_;
  p.k = k;
  p.precision = Precision::kInt8;
  std::vector<const int8_t*> values;
  std::vector<const float*> scales;
  for (const Int8Rows& part : parts) {
    values.push_back(part.values);
    scales.push_back(part.scales);
  }
  const std::vector<int8_t> stacked = stack_rows(values, part_rows, k);  // [n, k]
  p.n = int64_t(stacked.size()) / k;
  p.pack_int8(stacked, stack_rows(scales, part_rows, 1));
}

int64_t PackedMatrix::rows() const {
  return impl_->n;
}
int64_t PackedMatrix::cols() const {
  return impl_->k;
}
Precision PackedMatrix::precision() const {
  return impl_->precision;
}

void PackedMatrix::read_rows(const int32_t* ids, int64_t count, float* out) const {
  Impl& p = *impl_;
  if (p.precision != Precision::kFloat32)
    throw std::logic_error("PackedMatrix::read_rows: float32 matrices only");
  for (int64_t r = 0; r < count; ++r)
    if (ids[r] < 0 || ids[r] >= p.n) throw std::out_of_range("PackedMatrix::read_rows: row id");
  if (!p.plain.empty()) {
    for (int64_t r = 0; r < count; ++r)
      std::copy_n(p.plain.data() + int64_t(ids[r]) * p.k, p.k, out + r * p.k);
    return;
  }
  const dnnl_memory_desc_t& md = p.packed_desc.data;  // [k, n]: row i of W is column i
  if (md.format_kind != dnnl_blocked || md.ndims != 2)
    throw std::logic_error("PackedMatrix::read_rows: not a blocked layout");
  std::call_once(p.column_offsets_once, [&] {
    p.column_offsets.resize(size_t(p.k));
    for (int64_t c = 0; c < p.k; ++c) {
      dnnl_dims_t pos = {c, 0};
      p.column_offsets[size_t(c)] = blocked_offset(md, pos);
    }
  });
  dnnl_dims_t origin = {0, 0};
  const int64_t base = blocked_offset(md, origin);  // offset0 and any padding offsets
  const float* packed = static_cast<const float*>(p.storage.get());
  const int64_t* columns = p.column_offsets.data();
#pragma omp parallel for schedule(static) if (count * p.k >= kParallelElements)
  for (int64_t r = 0; r < count; ++r) {
    dnnl_dims_t pos = {0, ids[r]};
    const float* row = packed + (blocked_offset(md, pos) - base);
    float* o = out + r * p.k;  // [k]
    for (int64_t c = 0; c < p.k; ++c) o[c] = row[columns[c]];
  }
}

void PackedMatrix::multiply(MatmulOperand operand, int64_t m, int64_t ldx, float* y, int64_t ldy,
                            const MatmulEpilogue& epilogue) const {
  Impl& p = *impl_;
  const bool bfloat16_output = epilogue.rounded_output != nullptr;
  if (bfloat16_output && p.precision != Precision::kBFloat16)
    throw std::invalid_argument("PackedMatrix::multiply: a bfloat16 output needs bfloat16 weights");
  const uint16_t* given_rounded = p.precision == Precision::kBFloat16 ? operand.rounded : nullptr;
  const float* x = operand.values;  // [m, k] (row stride ldx)
  if (!x && !given_rounded) throw std::invalid_argument("PackedMatrix::multiply: no operand");
  if (m <= 0) return;
  std::shared_ptr<const CachedMatmul> mm;
  if (!p.plain.empty()) {
    gemm(false, true, m, p.n, p.k, 1.f, x, ldx, p.plain.data(), p.k, 0.f, y, ldy,
         Precision::kFloat32, epilogue);
    return;
  }
  // int8 applies the epilogue while dequantising; the float primitives in their own pass.
  const bool primitive_bias = epilogue.bias && p.precision != Precision::kInt8;
  const bool primitive_relu = epilogue.relu && p.precision != Precision::kInt8;
  {
    const auto key = std::make_tuple(m, ldx, ldy, primitive_bias, primitive_relu, bfloat16_output);
    std::lock_guard<std::mutex> lock(p.mutex);
    auto found = p.by_rows.find(key);
    if (found != p.by_rows.end()) {
      mm = found->second;
    } else {
      auto entry = std::make_shared<CachedMatmul>();
      entry->a = input_desc(p.precision, m, p.k, ldx);
      entry->b = p.packed_desc;
      // A bfloat16 output is rounded by the primitive as gemm's is (bfloat16_output_via_float).
      entry->c = bfloat16_output ? matrix_desc(m, p.n, ldy, false, dnnl::memory::data_type::bf16)
                                 : output_desc(p.precision, m, p.n, ldy);
      if (primitive_bias) entry->bias = matrix_desc(1, p.n, p.n, false);
      try {
        create_matmul(*entry, false, post_ops_attr(false, primitive_relu));
      } catch (const dnnl::error& e) {
        throw std::runtime_error("oneDNN has no matmul for " + std::to_string(m) +
                                 " rows with packed weights: " + e.what());
      }
      if (p.by_rows.size() >= 1024) p.by_rows.clear();
      p.by_rows[key] = entry;
      mm = entry;
    }
  }
  switch (p.precision) {
    case Precision::kFloat32:
      execute(*mm, const_cast<float*>(x), p.packed, y, epilogue.bias);
      break;
    case Precision::kBFloat16: {
      void* out = bfloat16_output ? static_cast<void*>(epilogue.rounded_output) : y;
      thread_local std::vector<uint16_t> rounded_buffer;
      const int64_t given_ld = operand.rounded_stride(p.k);
      if (given_rounded && given_ld == p.k) {
        execute(*mm, const_cast<uint16_t*>(given_rounded), p.packed, out, epilogue.bias);
        break;
      }
      uint16_t* rounded = thread_scratch(rounded_buffer, m * p.k);  // [m, k] x in bfloat16
      if (given_rounded)  // rows given apart: the primitive reads them dense
        for (int64_t r = 0; r < m; ++r)
          std::copy_n(given_rounded + r * given_ld, p.k, rounded + r * p.k);
      else
        round_to_bfloat16(x, m, p.k, ldx, rounded, p.k);
      execute(*mm, rounded, p.packed, out, epilogue.bias);
      break;
    }
    case Precision::kFloat16:  // never packed (check_packable)
      throw std::logic_error("PackedMatrix: float16 is not packed on the CPU");
    case Precision::kInt8: {
      thread_local std::vector<uint8_t> quantised_buffer;
      thread_local std::vector<float> scale_buffer;
      thread_local std::vector<int32_t> product_buffer;
      uint8_t* quantised = thread_scratch(quantised_buffer, m * p.k);  // [m, k] x in int8 + 128
      float* row_scales = thread_scratch(scale_buffer, m);             // [m]
      int32_t* products = thread_scratch(product_buffer, m * p.n);     // [m, n]
      quantize_activation_rows(x, m, p.k, ldx, quantised, row_scales);
      execute(*mm, quantised, p.packed, products);
      dequantize_products(products, m, p.n, p.column_sums.data(), row_scales,
                          p.weight_scales.data(), y, ldy, epilogue.bias, epilogue.relu);
      break;
    }
  }
}

namespace {

// A bfloat16 output (MatmulEpilogue::rounded_output) where no primitive writes it: the float
// result in this thread's scratch, then rounded as AVX512-BF16's conversion rounds (nearest,
// ties to even; results below the smallest normal float flush to zero), so that every path
// writes the same bits.
void bfloat16_output_via_float(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, MatmulOperand a, int64_t lda, MatmulOperand b,
                               int64_t ldb, int64_t ldc, const MatmulEpilogue& epilogue) {
  thread_local std::vector<float> result_buffer;
  float* result = thread_scratch(result_buffer, m * n);  // [m, n]
  MatmulEpilogue in_float = epilogue;
  in_float.rounded_output = nullptr;
  gemm_bfloat16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 0.f, result, n, in_float);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = result[i * n + j];
      epilogue.rounded_output[i * ldc + j] = std::fabs(v) < std::numeric_limits<float>::min()
                                                 ? uint16_t(std::signbit(v) << 15)
                                                 : float_to_bfloat16(v);
    }
}

}  // namespace

// A and B rounded into bfloat16 copies (this thread's scratch) unless given so, then
// the cached bfloat16 primitives (run_in_pieces), which also apply the epilogue where beta is 0
// and write a bfloat16 output where one is asked for (through a float result where the depth
// runs in two pieces); where none applies (inside a parallel region, alpha ≠ 1 or beta not 0
// or 1) the same rounded values widened back and multiplied by sgemm, so that every path
// computes the same products of bfloat16 inputs.
void gemm_bfloat16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
                   int64_t ldc, MatmulEpilogue epilogue) {
  if (!bfloat16_supported())
    throw std::invalid_argument("bfloat16 products need a CPU with AVX512-BF16");
  if (epilogue.rounded_output && beta != 0.f)
    throw std::invalid_argument("gemm: a bfloat16 output needs beta 0");
  if (m <= 0 || n <= 0) return;
  if (epilogue.rounded_output &&
      (k <= 0 || alpha != 1.f || omp_get_level() > 0 || splits_depth(k))) {
    bfloat16_output_via_float(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, ldc, epilogue);
    return;
  }
  if (k <= 0) {
    gemm(trans_a, trans_b, m, n, k, alpha, a.values, lda, b.values, ldb, beta, c, ldc,
         Precision::kFloat32, epilogue);  // the epilogue of beta · C
    return;
  }
  thread_local std::vector<uint16_t> a_buffer, b_buffer;
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;  // A as stored
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;  // B as stored
  // Each operand in bfloat16: the given copy where it lies, or the values rounded here into this
  // thread's scratch in their own layout (row stride lda, the columns the product reads). Rows
  // that lie apart (a column block of a wider matrix) are summed by oneDNN's AMX kernels in
  // another order than dense ones, so rounding into a dense copy gave other bits than the given
  // copy of the same block (the stacked Q|K|V gradients'); in the values' layout it gives the
  // same. The scratch is at most half the bytes of the float matrix the values lie in.
  auto in_bfloat16 = [](MatmulOperand x, int64_t rows, int64_t cols, int64_t ld,
                        std::vector<uint16_t>& buffer, int64_t& ld16) -> const uint16_t* {
    if (x.rounded) {
      ld16 = x.rounded_stride(cols);
      return x.rounded;
    }
    uint16_t* out = thread_scratch(buffer, (rows - 1) * ld + cols);  // [rows, cols], stride ld
    round_to_bfloat16(x.values, rows, cols, ld, out, ld);
    ld16 = ld;
    return out;
  };
  int64_t a16_ld = 0, b16_ld = 0;
  const uint16_t* a16 = in_bfloat16(a, a_rows, a_cols, lda, a_buffer, a16_ld);  // [a_rows, a_cols]
  const uint16_t* b16 = in_bfloat16(b, b_rows, b_cols, ldb, b_buffer, b16_ld);  // [b_rows, b_cols]
  const bool plain_product = alpha == 1.f && (beta == 0.f || beta == 1.f);
  if (plain_product && omp_get_level() == 0 &&
      run_in_pieces(trans_a, trans_b, m, n, k, a16, a16_ld, b16, b16_ld, beta, c, ldc, epilogue))
    return;
  if (epilogue.rounded_output) {
    bfloat16_output_via_float(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, ldc, epilogue);
    return;
  }
  thread_local std::vector<float> a_wide_buffer, b_wide_buffer;
  float* a_wide = thread_scratch(a_wide_buffer, a_rows * a_cols);  // [a_rows, a_cols]
  float* b_wide = thread_scratch(b_wide_buffer, b_rows * b_cols);  // [b_rows, b_cols]
  for (int64_t r = 0; r < a_rows; ++r)
    for (int64_t i = 0; i < a_cols; ++i)
      a_wide[r * a_cols + i] = bfloat16_to_float(a16[r * a16_ld + i]);
  for (int64_t r = 0; r < b_rows; ++r)
    for (int64_t i = 0; i < b_cols; ++i)
      b_wide[r * b_cols + i] = bfloat16_to_float(b16[r * b16_ld + i]);
  run_sgemm(trans_a, trans_b, m, n, k, alpha, a_wide, a_cols, b_wide, b_cols, beta, c, ldc);
  apply_epilogue(c, ldc, epilogue, m, n);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          Precision precision, MatmulEpilogue epilogue) {
  if (precision == Precision::kInt8)
    throw std::invalid_argument("gemm: int8 products need weights prepared in int8");
  if (precision == Precision::kFloat16) throw std::invalid_argument(float16_refusal());
  if (precision == Precision::kBFloat16) {
    gemm_bfloat16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, epilogue);
    return;
  }
  if (epilogue.rounded_output)
    throw std::invalid_argument("gemm: a bfloat16 output needs a bfloat16 product");
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // op(A)·op(B) is the zero matrix: only the beta term (and the epilogue) remains.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    apply_epilogue(c, ldc, epilogue, m, n);
    return;
  }
  const bool plain_product = alpha == 1.f && (beta == 0.f || beta == 1.f);
  // Inside a parallel construct (even of one thread) sgemm; the primitives elsewhere.
  if (omp_get_level() == 0 && plain_product &&
      run_in_pieces(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, epilogue))
    return;
  run_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  apply_epilogue(c, ldc, epilogue, m, n);
}

}  // namespace tfm
