// cuBLAS and cuBLASLt for the emulated device (tests/emulated_cuda.h): the functions
// src/backend/cuda/blas_library.h looks up, written from cublas_v2.h's and cublasLt.h's own
// descriptions, so that matmul.cu and lt_product.cu run unchanged in emulated_cuda_tests and
// their products answer to backend_ops' float64 loops and the fixtures' PyTorch gradients.
//
// What the emulation holds the callers to, as the headers state it: column-major matrices
// (element (r, c) at r + c·ld, ld ≥ the stored rows), D = α·op(A)·op(B) + β·C with C not read
// where β = 0, shapes that agree, attribute values of the documented sizes, a bias of D's rows'
// length in D's type, a ReLU bit-mask with a leading dimension (in bits) that is a multiple of
// 128 and at least D's rows, and int8 operands whose rows are whole 4-byte words. A product it
// cannot run returns CUBLAS_STATUS_NOT_SUPPORTED (the heuristic finds no algorithm); a call that
// breaks those rules throws (std::logic_error, saying which), where the libraries would answer
// CUBLAS_STATUS_INVALID_VALUE: the backend takes that answer for a product to run another way,
// which would hide the wrong call from the tests.
//
// Sums run in float32 as tensor cores accumulate, in an order that depends on the algorithm
// (three of them, one only for operands on 16-byte words), so that two algorithms' results
// differ in their last bits as a GPU's do;
// each product advances the emulated clock by a cost of its shape and algorithm, so that
// lt_product.cu's tuning chooses between them, the same way in every run. The ReLU bit-mask,
// which NVIDIA leaves opaque, is one bit per element of D, column-major with the given
// leading dimension: what a product's forward writes, its backward reads.
#include "emulated_cuda.h"
// After it: the emulated backend's declarations.
#include "backend/cuda/blas_library.h"
#include "backend/cuda/cuda_common.h"
#include "tensor/float16.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kAlgorithms = 3;

// Element `index` of a matrix of `type`, widened.
float load(const void* base, cudaDataType_t type, int64_t index) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[index];
    case CUDA_R_16BF:
      return bfloat16_to_float(static_cast<const uint16_t*>(base)[index]);
    case CUDA_R_16F:
      return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case CUDA_R_8I:
      return float(static_cast<const int8_t*>(base)[index]);
    case CUDA_R_32I:
      return float(static_cast<const int32_t*>(base)[index]);
    default:
      throw std::logic_error("emulated cuBLAS: an element type it does not hold");
  }
}
// value stored as `type` (16-bit types rounded to nearest even).
void store(void* base, cudaDataType_t type, int64_t index, float value) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(base)[index] = value;
      return;
    case CUDA_R_16BF:
      static_cast<uint16_t*>(base)[index] = float_to_bfloat16(value);
      return;
    case CUDA_R_16F:
      static_cast<uint16_t*>(base)[index] = float_to_half(value);
      return;
    default:
      throw std::logic_error("emulated cuBLAS: an output type it does not write");
  }
}

// A column-major matrix as stored: rows × cols, column stride ld, and whether the product reads
// it transposed.
struct Stored {
  const void* data;
  cudaDataType_t type;
  int64_t rows, cols, ld;
  bool transposed;
  int64_t op_rows() const { return transposed ? cols : rows; }
  int64_t op_cols() const { return transposed ? rows : cols; }
  // Element (r, c) of op(matrix).
  float at(int64_t r, int64_t c) const {
    return transposed ? load(data, type, c + r * ld) : load(data, type, r + c * ld);
  }
};

// op(A) by rows and op(B) by columns, widened to float once: row r of the one and column c of
// the other are then each k contiguous floats.
struct Operands {
  Operands(const Stored& a, const Stored& b) : k(a.op_cols()) {
    rows.resize(size_t(a.op_rows() * k));
    for (int64_t r = 0; r < a.op_rows(); ++r)
      for (int64_t l = 0; l < k; ++l) rows[size_t(r * k + l)] = a.at(r, l);
    cols.resize(size_t(b.op_cols() * k));
    for (int64_t c = 0; c < b.op_cols(); ++c)
      for (int64_t l = 0; l < k; ++l) cols[size_t(c * k + l)] = b.at(l, c);
  }
  int64_t k;
  std::vector<float> rows, cols;
};

// Σ_l a(r, l)·b(l, c) over l < k, in float32 with fused multiply-adds, in the algorithm's order:
// 0 upward, 1 downward, 2 the two halves apart and then together.
float sum_products(const Operands& o, int64_t r, int64_t c, int algorithm) {
  const int64_t k = o.k;
  const float* x = o.rows.data() + r * k;
  const float* y = o.cols.data() + c * k;
  const auto add = [&](float sum, int64_t l) { return std::fma(x[l], y[l], sum); };
  float sum = 0.f;
  if (algorithm == 1) {
    for (int64_t l = k - 1; l >= 0; --l) sum = add(sum, l);
    return sum;
  }
  if (algorithm == 2) {
    float low = 0.f, high = 0.f;
    for (int64_t l = 0; l < k / 2; ++l) low = add(low, l);
    for (int64_t l = k / 2; l < k; ++l) high = add(high, l);
    return low + high;
  }
  for (int64_t l = 0; l < k; ++l) sum = add(sum, l);
  return sum;
}

// The emulated clock's advance for a product of m·n·k on `algorithm`: one of five rates, by
// shape and algorithm, so that different shapes find different algorithms fastest.
void advance_clock(int64_t m, int64_t n, int64_t k, int algorithm) {
  const uint64_t mix =
      uint64_t(algorithm) * 2654435761u + uint64_t(m) * 40503u + uint64_t(n) * 9176u + uint64_t(k);
  warp_emulation::emulated_clock_ms +=
      1e-9 * double(m) * double(n) * double(k) * (1.0 + 0.1 * double(mix % 5));
}

// ---- cuBLAS -------------------------------------------------------------------------------

cublasStatus_t create(cublasHandle_t* handle) {
  static int the_handle;
  *handle = reinterpret_cast<cublasHandle_t>(&the_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t set_stream(cublasHandle_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS's C[m, n] = α·op(A)·op(B) + β·C (column-major) with its argument checks.
cublasStatus_t gemm(cublasOperation_t trans_a, cublasOperation_t trans_b, int m, int n, int k,
                    const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                    cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type,
                    int ldc, cublasComputeType_t compute) {
  const bool ta = trans_a != CUBLAS_OP_N, tb = trans_b != CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) ||
      ldc < std::max(1, m))
    throw std::logic_error("emulated cuBLAS: a product's sizes or leading dimensions are invalid");
  if (a_type != b_type) return CUBLAS_STATUS_NOT_SUPPORTED;
  const Stored sa{a, a_type, ta ? k : m, ta ? m : k, lda, ta};
  const Stored sb{b, b_type, tb ? n : k, tb ? k : n, ldb, tb};
  if (a_type == CUDA_R_8I) {  // exact int32 sums; rows of whole 4-byte words
    if (c_type != CUDA_R_32I || compute != CUBLAS_COMPUTE_32I || lda % 4 != 0 || ldb % 4 != 0 ||
        !aligned(a, 4) || !aligned(b, 4))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    const int32_t scale = *static_cast<const int32_t*>(alpha);
    const int32_t keep = *static_cast<const int32_t*>(beta);
    int32_t* out = static_cast<int32_t*>(c);
    for (int col = 0; col < n; ++col)
      for (int row = 0; row < m; ++row) {
        int64_t sum = 0;
        for (int l = 0; l < k; ++l) sum += int64_t(sa.at(row, l)) * int64_t(sb.at(l, col));
        int32_t& value = out[row + int64_t(col) * ldc];
        value = int32_t(scale * sum + (keep == 0 ? 0 : int64_t(keep) * value));
      }
    return CUBLAS_STATUS_SUCCESS;
  }
  const bool float_types = a_type == CUDA_R_32F || a_type == CUDA_R_16BF || a_type == CUDA_R_16F;
  if (!float_types || c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const float scale = *static_cast<const float*>(alpha);
  const float keep = *static_cast<const float*>(beta);
  float* out = static_cast<float*>(c);
  const Operands operands(sa, sb);
  for (int col = 0; col < n; ++col)
    for (int row = 0; row < m; ++row) {
      float& value = out[row + int64_t(col) * ldc];
      const float sum = scale * sum_products(operands, row, col, 0);
      value = keep == 0.f ? sum : sum + keep * value;
    }
  advance_clock(m, n, k, 0);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm_ex(cublasHandle_t, cublasOperation_t trans_a, cublasOperation_t trans_b, int m,
                       int n, int k, const void* alpha, const void* a, cudaDataType a_type, int lda,
                       const void* b, cudaDataType b_type, int ldb, const void* beta, void* c,
                       cudaDataType c_type, int ldc, cublasComputeType_t compute,
                       cublasGemmAlgo_t) {
  return gemm(trans_a, trans_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type,
              ldc, compute);
}
cublasStatus_t sgemm(cublasHandle_t, cublasOperation_t trans_a, cublasOperation_t trans_b, int m,
                     int n, int k, const float* alpha, const float* a, int lda, const float* b,
                     int ldb, const float* beta, float* c, int ldc) {
  return gemm(trans_a, trans_b, m, n, k, alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, beta, c,
              CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F);
}

// cuBLAS's batched products, which attention_dense.cu's head_product calls: each of `count`
// matrices as one product above.
cublasStatus_t gemm_batched_ex(cublasHandle_t, cublasOperation_t trans_a, cublasOperation_t trans_b,
                               int m, int n, int k, const void* alpha, const void* const a[],
                               cudaDataType a_type, int lda, const void* const b[],
                               cudaDataType b_type, int ldb, const void* beta, void* const c[],
                               cudaDataType c_type, int ldc, int count, cublasComputeType_t compute,
                               cublasGemmAlgo_t) {
  for (int i = 0; i < count; ++i) {
    const cublasStatus_t status = gemm(trans_a, trans_b, m, n, k, alpha, a[i], a_type, lda, b[i],
                                       b_type, ldb, beta, c[i], c_type, ldc, compute);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t sgemm_batched(cublasHandle_t handle, cublasOperation_t trans_a,
                             cublasOperation_t trans_b, int m, int n, int k, const float* alpha,
                             const float* const a[], int lda, const float* const b[], int ldb,
                             const float* beta, float* const c[], int ldc, int count) {
  return gemm_batched_ex(handle, trans_a, trans_b, m, n, k, alpha,
                         reinterpret_cast<const void* const*>(a), CUDA_R_32F, lda,
                         reinterpret_cast<const void* const*>(b), CUDA_R_32F, ldb, beta,
                         reinterpret_cast<void* const*>(c), CUDA_R_32F, ldc, count,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

const char* status_string(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    default:
      return "an emulated cuBLAS status";
  }
}

// ---- cuBLASLt -----------------------------------------------------------------------------

struct MatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // or the bias gradient
  int32_t bias_type = -1;      // -1: D's
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};
struct MatrixLayout {
  cudaDataType_t type;
  int64_t rows, cols, ld;
};
MatmulDesc& desc_of(cublasLtMatmulDesc_t desc) {
  return *reinterpret_cast<MatmulDesc*>(desc);
}
const MatrixLayout& layout_of(cublasLtMatrixLayout_t layout) {
  return *reinterpret_cast<const MatrixLayout*>(layout);
}

cublasStatus_t lt_create(cublasLtHandle_t* handle) {
  static int the_handle;
  *handle = reinterpret_cast<cublasLtHandle_t>(&the_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t desc_create(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                           cudaDataType_t scale) {
  auto* made = new MatmulDesc;
  made->compute = compute;
  made->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(made);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t desc_destroy(cublasLtMatmulDesc_t desc) {
  delete &desc_of(desc);
  return CUBLAS_STATUS_SUCCESS;
}
// `buffer` holds a value of exactly the type cublasLt.h names for the attribute.
template <typename T>
cublasStatus_t read_attribute(const void* buffer, size_t size, T& into) {
  if (size != sizeof(T))
    throw std::logic_error("emulated cuBLASLt: an attribute's value is not of its type's size");
  std::memcpy(&into, buffer, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t desc_set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                        const void* buffer, size_t size) {
  MatmulDesc& d = desc_of(desc);
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return read_attribute(buffer, size, d.trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return read_attribute(buffer, size, d.trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return read_attribute(buffer, size, d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return read_attribute(buffer, size, d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return read_attribute(buffer, size, d.bias_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return read_attribute(buffer, size, d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return read_attribute(buffer, size, d.aux_ld);
    default:  // one the backend did not set before: a new use to emulate
      throw std::logic_error("emulated cuBLASLt: a descriptor attribute it does not emulate");
  }
}
cublasStatus_t layout_create(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                             uint64_t cols, int64_t ld) {
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(
      new MatrixLayout{type, int64_t(rows), int64_t(cols), ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t layout_destroy(cublasLtMatrixLayout_t layout) {
  delete &layout_of(layout);
  return CUBLAS_STATUS_SUCCESS;
}
// The alignments (bytes) the caller promises its operands; 256 each unless told, as cublasLt.h
// says the heuristic assumes.
struct Preference {
  uint64_t workspace = 0;
  uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D
};
Preference& preference_of(cublasLtMatmulPreference_t preference) {
  return *reinterpret_cast<Preference*>(preference);
}
cublasStatus_t preference_create(cublasLtMatmulPreference_t* preference) {
  *preference = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t preference_destroy(cublasLtMatmulPreference_t preference) {
  delete &preference_of(preference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t preference_set(cublasLtMatmulPreference_t preference,
                              cublasLtMatmulPreferenceAttributes_t attribute, const void* buffer,
                              size_t size) {
  Preference& p = preference_of(preference);
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return read_attribute(buffer, size, p.workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return read_attribute(buffer, size, p.alignment[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return read_attribute(buffer, size, p.alignment[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return read_attribute(buffer, size, p.alignment[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return read_attribute(buffer, size, p.alignment[3]);
    default:
      throw std::logic_error("emulated cuBLASLt: a preference it does not emulate");
  }
}

// The emulated algorithm that reads and writes in 16-byte words: offered where the preference
// promises operands that aligned, refused at the launch where they are not (as cublasLt.h warns
// an algorithm AlgoCheck accepted may be), so that the backend's handling of both shows.
constexpr uint64_t kWideAlgorithm = 2;
constexpr uint32_t kWideAlignment = 16;

bool has_bias(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
         epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
}
// Whether the epilogue reads or writes the bias pointer's vector: the bias, or the bias gradient
// (of the ReLU's gated output, or of B: its sums over k, one per column of D).
bool uses_bias_vector(uint32_t epilogue) {
  return has_bias(epilogue) || epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD ||
         epilogue == CUBLASLT_EPILOGUE_BGRADB;
}
bool writes_mask(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_RELU_AUX || epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
}
bool reads_mask(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_DRELU || epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD;
}

// Whether the emulated library has a kernel for the descriptors: float32 compute and scale; A and
// B of one floating type; D (and C, the same) float32, or A's 16-bit type; the epilogues the
// backend uses; a bias in D's type (the bias gradient in C's).
bool supported(const MatmulDesc& d, const MatrixLayout& a, const MatrixLayout& b,
               const MatrixLayout& c, const MatrixLayout& out) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) return false;
  if (a.type != b.type || c.type != out.type) return false;
  if (a.type != CUDA_R_32F && a.type != CUDA_R_16BF && a.type != CUDA_R_16F) return false;
  if (out.type != CUDA_R_32F && out.type != a.type) return false;
  switch (d.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
    case CUBLASLT_EPILOGUE_BGRADB:
      break;
    default:
      return false;
  }
  if (uses_bias_vector(d.epilogue) && d.bias_type != -1 && d.bias_type != int32_t(out.type))
    return false;
  return true;
}

// Throws unless the shapes agree (op(A) m × k, op(B) k × n, C and D m × n), each leading
// dimension covers its stored rows, an epilogue has the vectors it reads or writes and a mask's
// ld is as documented.
void check_valid(const MatmulDesc& d, const MatrixLayout& a, const MatrixLayout& b,
                 const MatrixLayout& c, const MatrixLayout& out) {
  const auto fail = [](const char* what) {
    throw std::logic_error(std::string("emulated cuBLASLt: ") + what);
  };
  const bool ta = d.trans_a != CUBLAS_OP_N, tb = d.trans_b != CUBLAS_OP_N;
  const int64_t m = out.rows, n = out.cols, k = ta ? a.rows : a.cols;
  if ((ta ? a.cols : a.rows) != m) fail("op(A)'s rows are not D's");
  if ((tb ? b.rows : b.cols) != n) fail("op(B)'s columns are not D's");
  if ((tb ? b.cols : b.rows) != k) fail("op(B)'s rows are not op(A)'s columns");
  if (c.rows != m || c.cols != n) fail("C's shape is not D's");
  for (const MatrixLayout* layout : {&a, &b, &c, &out})
    if (layout->ld < std::max<int64_t>(1, layout->rows))
      fail("a leading dimension below the stored rows");
  if (uses_bias_vector(d.epilogue) && !d.bias) fail("a bias epilogue without its vector");
  if ((writes_mask(d.epilogue) || reads_mask(d.epilogue)) &&
      (!d.aux || d.aux_ld % 128 != 0 || d.aux_ld < m))
    fail("a ReLU mask without its buffer, or its leading dimension not as documented");
}

cublasStatus_t heuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                         cublasLtMatrixLayout_t out, cublasLtMatmulPreference_t preference,
                         int requested, cublasLtMatmulHeuristicResult_t* results, int* found) {
  *found = 0;
  if (requested < 1) throw std::logic_error("emulated cuBLASLt: no algorithm requested");
  if (!supported(desc_of(desc), layout_of(a), layout_of(b), layout_of(c), layout_of(out)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  check_valid(desc_of(desc), layout_of(a), layout_of(b), layout_of(c), layout_of(out));
  // The wide algorithm first where the operands allow it, as a library ranks its fastest first.
  const Preference& p = preference_of(preference);
  const bool wide = std::all_of(std::begin(p.alignment), std::end(p.alignment),
                                [](uint32_t a) { return a >= kWideAlignment; });
  const std::vector<uint64_t> offered =
      wide ? std::vector<uint64_t>{kWideAlgorithm, 0, 1} : std::vector<uint64_t>{0, 1};
  for (uint64_t id : offered) {
    if (*found == requested) break;
    cublasLtMatmulHeuristicResult_t& r = results[*found];
    r = cublasLtMatmulHeuristicResult_t{};
    r.algo.data[0] = id;
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.f;
    ++*found;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t algo_check(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                          cublasLtMatrixLayout_t out, const cublasLtMatmulAlgo_t* algo,
                          cublasLtMatmulHeuristicResult_t* result) {
  if (!supported(desc_of(desc), layout_of(a), layout_of(b), layout_of(c), layout_of(out)) ||
      algo->data[0] >= uint64_t(kAlgorithms))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  check_valid(desc_of(desc), layout_of(a), layout_of(b), layout_of(c), layout_of(out));
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = *algo;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.f;
  return CUBLAS_STATUS_SUCCESS;
}

// D = epilogue(α·op(A)·op(B) + β·C): + bias (per row of D), then ReLU, writing the mask's bit
// for each element (set where the ReLU passed it); or the mask's gate, the gated values' sum
// over each row of D into the bias gradient.
cublasStatus_t lt_matmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                         const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                         cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                         cublasLtMatrixLayout_t c_layout, void* out,
                         cublasLtMatrixLayout_t out_layout, const cublasLtMatmulAlgo_t* algo, void*,
                         size_t, cudaStream_t) {
  const MatmulDesc& d = desc_of(desc);
  const MatrixLayout &la = layout_of(a_layout), &lb = layout_of(b_layout),
                     &lc = layout_of(c_layout), &lout = layout_of(out_layout);
  if (!supported(d, la, lb, lc, lout) || !algo || algo->data[0] >= uint64_t(kAlgorithms))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  check_valid(d, la, lb, lc, lout);
  if (algo->data[0] == kWideAlgorithm &&
      !(aligned(a, kWideAlignment) && aligned(b, kWideAlignment) && aligned(c, kWideAlignment) &&
        aligned(out, kWideAlignment)))
    return CUBLAS_STATUS_NOT_SUPPORTED;  // refused at the launch, nothing written
  const bool ta = d.trans_a != CUBLAS_OP_N, tb = d.trans_b != CUBLAS_OP_N;
  const Stored sa{a, la.type, la.rows, la.cols, la.ld, ta};
  const Stored sb{b, lb.type, lb.rows, lb.cols, lb.ld, tb};
  const int64_t m = lout.rows, n = lout.cols, k = sa.op_cols();
  const int algorithm = int(algo->data[0]);
  const float scale = *static_cast<const float*>(alpha);
  const float keep = *static_cast<const float*>(beta);
  const cudaDataType_t bias_type = d.bias_type == -1 ? lout.type : cudaDataType_t(d.bias_type);
  auto* mask = static_cast<uint8_t*>(const_cast<void*>(d.aux));
  std::vector<float> bias_gradient(size_t(m), 0.f);
  const Operands operands(sa, sb);
  for (int64_t col = 0; col < n; ++col)
    for (int64_t row = 0; row < m; ++row) {
      float value = scale * sum_products(operands, row, col, algorithm);
      if (keep != 0.f) value += keep * load(c, lc.type, row + col * lc.ld);
      if (has_bias(d.epilogue)) value += load(d.bias, bias_type, row);
      const int64_t bit = row + col * d.aux_ld;
      if (d.epilogue == CUBLASLT_EPILOGUE_RELU || d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
          writes_mask(d.epilogue)) {
        const bool passed = value > 0.f;
        if (!passed) value = 0.f;
        if (writes_mask(d.epilogue)) {
          if (passed)
            mask[bit / 8] = uint8_t(mask[bit / 8] | (1u << (bit % 8)));
          else
            mask[bit / 8] = uint8_t(mask[bit / 8] & ~(1u << (bit % 8)));
        }
      }
      if (reads_mask(d.epilogue)) {
        if (!((mask[bit / 8] >> (bit % 8)) & 1u)) value = 0.f;
        bias_gradient[size_t(row)] += value;
      }
      store(out, lout.type, row + col * lout.ld, value);
    }
  if (d.epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD)
    for (int64_t row = 0; row < m; ++row)
      store(const_cast<void*>(d.bias), bias_type, row, bias_gradient[size_t(row)]);
  if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB)  // op(B)'s sums over k, in float32, k in order
    for (int64_t col = 0; col < n; ++col) {
      float sum = 0.f;
      for (int64_t p = 0; p < k; ++p) sum += sb.at(p, col);
      store(const_cast<void*>(d.bias), bias_type, col, sum);
    }
  advance_clock(m, n, k, algorithm);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const BlasLibrary& blas_library() {
  static const BlasLibrary library = [] {
    BlasLibrary emulated{};
    emulated.create = create;
    emulated.set_stream = set_stream;
    emulated.sgemm = sgemm;
    emulated.gemm_ex = gemm_ex;
    emulated.sgemm_batched = sgemm_batched;
    emulated.gemm_batched_ex = gemm_batched_ex;
    emulated.status_string = status_string;
    return emulated;
  }();
  return library;
}

const BlasLtLibrary& blas_lt_library() {
  static const BlasLtLibrary library = [] {
    BlasLtLibrary emulated{};
    emulated.create = lt_create;
    emulated.desc_create = desc_create;
    emulated.desc_destroy = desc_destroy;
    emulated.desc_set = desc_set;
    emulated.layout_create = layout_create;
    emulated.layout_destroy = layout_destroy;
    emulated.preference_create = preference_create;
    emulated.preference_destroy = preference_destroy;
    emulated.preference_set = preference_set;
    emulated.heuristic = heuristic;
    emulated.algo_check = algo_check;
    emulated.matmul = lt_matmul;
    return emulated;
  }();
  return library;
}

}  // namespace cuda
}  // namespace tfm
