// See lt_product.h. cuBLASLt is column-major, and reads each row-major matrix as its transpose
// with the same stride: y[m, n] = x · Wᵀ is D[n, m] = op(A)·B with A = W read as [k, n]
// (ld ldw) and transposed, B = x read as [k, m] (ld ldx), D = y read as [n, m] (ld ldy); y = x·W
// the same with A = W read as [n, k] (ld ldw), not transposed. cuBLASLt's bias has one element per
// row of D: one per column of y, as a linear layer's bias has.
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "backend/cuda/blas_library.h"
#include "backend/cuda/lt_product.h"
#include "tensor/error.h"

namespace tfm {
namespace cuda {

namespace {

// What each product may use of the context's workspace (split-K partial sums and the like).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The largest power of two up to 256 that divides the address: what the heuristic is told of
// an operand's alignment (it assumes 256 bytes unless told).
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// What a product does with a ReLU mask (LtReluMask): nothing, writes it (with its ReLU), or reads
// it (the ReLU's gradient), and then also sums the bias gradient.
enum class ReluMaskUse { kNone, kWrite, kRead, kReadWithBiasGradient };

// The mask's leading dimension in bits: a column of n rounded up to 128, as cuBLASLt asks.
int64_t mask_ld(int64_t n) {
  return (n + 127) / 128 * 128;
}

struct PlanKey {
  int device;
  int64_t m, n, k, ldx, ldw, ldy;
  int type, output_type, layout;
  bool bias, bias_in_bfloat16, relu;
  int mask;  // ReluMaskUse
  uint32_t align_x, align_w, align_y, align_bias, align_mask;
  auto tied() const {
    return std::tie(device, m, n, k, ldx, ldw, ldy, type, output_type, layout, bias,
                    bias_in_bfloat16, relu, mask, align_x, align_w, align_y, align_bias,
                    align_mask);
  }
  bool operator<(const PlanKey& o) const { return tied() < o.tied(); }
};

// One product's descriptors and the algorithm chosen for them. The bias pointer is an attribute
// of the descriptor, set at each call under `mutex`.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, x_layout = nullptr, y_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
  std::mutex mutex;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    const BlasLtLibrary& lt = blas_lt_library();
    if (y_layout) lt.layout_destroy(y_layout);
    if (x_layout) lt.layout_destroy(x_layout);
    if (w_layout) lt.layout_destroy(w_layout);
    if (desc) lt.desc_destroy(desc);
  }
};

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  TFM_CUDA(blas_lt_library().desc_set(desc, attribute, &value, sizeof value));
}
template <typename T>
void set(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
         const T& value) {
  TFM_CUDA(blas_lt_library().preference_set(preference, attribute, &value, sizeof value));
}

// The epilogue of a product: its bias and ReLU, or its ReLU mask's.
cublasLtEpilogue_t epilogue_of(const PlanKey& key) {
  switch (ReluMaskUse(key.mask)) {
    case ReluMaskUse::kWrite:
      return key.bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX;
    case ReluMaskUse::kRead:
      return CUBLASLT_EPILOGUE_DRELU;
    case ReluMaskUse::kReadWithBiasGradient:
      return CUBLASLT_EPILOGUE_DRELU_BGRAD;
    case ReluMaskUse::kNone:
      break;
  }
  return key.bias ? (key.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                  : (key.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
}

// The descriptors for `key` and cuBLASLt's first choice of algorithm for them (usable false where
// it has none). The bias (or bias gradient) and mask pointers given are the ones the heuristic
// judges alignment by.
std::unique_ptr<Plan> make_plan(const Context& c, const PlanKey& key, const void* bias,
                                const void* mask) {
  const BlasLtLibrary& lt = blas_lt_library();
  auto plan = std::make_unique<Plan>();
  const auto type = cudaDataType_t(key.type);
  TFM_CUDA(lt.desc_create(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const bool transposed_w = WeightLayout(key.layout) == WeightLayout::kOutputsByInputs;
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(transposed_w ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue_of(key)));
  if (ReluMaskUse(key.mask) != ReluMaskUse::kNone) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, mask);
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mask_ld(key.n));
  }
  if (ReluMaskUse(key.mask) == ReluMaskUse::kReadWithBiasGradient) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);  // the gradient, the output's type
  } else if (key.bias) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    // float32, or bfloat16 where given so (by default a bias has the output's type). cublasLt.h
    // allows a float32 bias for a float32 output only: with a bfloat16 one the heuristic finds no
    // algorithm, and such a product (the feed-forward's first in bfloat16 decoding) takes cuBLAS
    // and a pass, as the H200's profiles show ("prepared bfloat16 out (cuBLAS + pass)"), unless
    // its bias comes rounded (training's, MatmulEpilogue::rounded_bias).
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
        int32_t(key.bias_in_bfloat16 ? CUDA_R_16BF : CUDA_R_32F));
  }
  const auto output_type = cudaDataType_t(key.output_type);
  TFM_CUDA(lt.layout_create(&plan->w_layout, type, uint64_t(transposed_w ? key.k : key.n),
                            uint64_t(transposed_w ? key.n : key.k), key.ldw));
  TFM_CUDA(lt.layout_create(&plan->x_layout, type, uint64_t(key.k), uint64_t(key.m), key.ldx));
  TFM_CUDA(
      lt.layout_create(&plan->y_layout, output_type, uint64_t(key.n), uint64_t(key.m), key.ldy));
  cublasLtMatmulPreference_t preference = nullptr;
  TFM_CUDA(lt.preference_create(&preference));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  try {
    set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w);
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x);
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y);
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y);
    const cublasStatus_t status =
        lt.heuristic(c.blas_lt, plan->desc, plan->w_layout, plan->x_layout, plan->y_layout,
                     plan->y_layout, preference, 1, &result, &found);
    plan->usable = status == CUBLAS_STATUS_SUCCESS && found > 0 &&
                   result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= kWorkspaceBytes;
  } catch (...) {
    lt.preference_destroy(preference);
    throw;
  }
  lt.preference_destroy(preference);
  if (plan->usable) plan->algo = result.algo;
  return plan;
}

// The plan for `key`, made on first use. Decoding meets one shape per live-hypothesis count and
// weight; past kMaxPlans the cache starts again (shared pointers: a plan in use stays alive).
std::shared_ptr<Plan> plan_for(const Context& c, const PlanKey& key, const void* bias,
                               const void* mask) {
  constexpr size_t kMaxPlans = 4096;
  // Never destroyed: a plan's destructor calls into the library, which static destruction at
  // exit may already have torn down.
  static auto* mutex = new std::mutex;
  static auto* plans = new std::map<PlanKey, std::shared_ptr<Plan>>;
  {
    std::lock_guard<std::mutex> lock(*mutex);
    auto found = plans->find(key);
    if (found != plans->end()) return found->second;
  }
  std::shared_ptr<Plan> plan = make_plan(c, key, bias, mask);
  std::lock_guard<std::mutex> lock(*mutex);
  if (plans->size() >= kMaxPlans) plans->clear();
  return plans->emplace(key, std::move(plan)).first->second;
}

}  // namespace

int64_t lt_relu_mask_bytes(int64_t m, int64_t n) {
  return mask_ld(n) / 8 * m;
}

bool lt_product(const Context& c, int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx,
                const void* w, int64_t ldw, cudaDataType_t type, void* y,
                cudaDataType_t output_type, int64_t ldy, const float* float_bias,
                const uint16_t* rounded_bias, bool relu, WeightLayout layout,
                const LtReluMask& relu_mask) {
  static const bool enabled = !turned_off("TFM_CUDA_LT");  // else cuBLAS and a pass, to compare
  const ReluMaskUse mask_use = !relu_mask.mask           ? ReluMaskUse::kNone
                               : relu_mask.written       ? ReluMaskUse::kWrite
                               : relu_mask.bias_gradient ? ReluMaskUse::kReadWithBiasGradient
                                                         : ReluMaskUse::kRead;
  if (mask_use == ReluMaskUse::kWrite && !relu)
    throw std::logic_error("lt_product: a ReLU mask is written by a product with its ReLU");
  // The bias vector, or the bias gradient the backward's mask epilogue writes in its place.
  const void* bias = mask_use == ReluMaskUse::kReadWithBiasGradient ? relu_mask.bias_gradient
                     : float_bias ? static_cast<const void*>(float_bias)
                                  : rounded_bias;
  // A bias epilogue reads its vector in wide words: a bias off 16 bytes (a stacked bias of an
  // odd width) takes cuBLAS and a pass instead of risking a misaligned read.
  if (!enabled || (bias && !aligned(bias, 16))) return false;
  const BlasLtLibrary& lt = blas_lt_library();
  std::lock_guard<std::mutex> context_lock(c.blas_mutex);
  // The workspace and handle are made on first use, which a capture cannot hold (an allocation):
  // the step then runs uncaptured once, and makes them.
  if ((!c.lt_workspace || !c.blas_lt) && c.recording_here()) throw RecordingRefused();
  if (!c.lt_workspace) {  // the workspace first: a handle is made only where it exists
    TFM_CUDA(cudaMalloc(&c.lt_workspace, kWorkspaceBytes));  // kept for the context's life
  }
  if (!c.blas_lt) TFM_CUDA(lt.create(&c.blas_lt));
  const PlanKey key{c.device,
                    m,
                    n,
                    k,
                    ldx,
                    ldw,
                    ldy,
                    int(type),
                    int(output_type),
                    int(layout),
                    bias != nullptr && mask_use != ReluMaskUse::kReadWithBiasGradient,
                    !float_bias && rounded_bias,
                    relu,
                    int(mask_use),
                    alignment_of(x),
                    alignment_of(w),
                    alignment_of(y),
                    alignment_of(bias),
                    alignment_of(relu_mask.mask)};
  const std::shared_ptr<Plan> plan = plan_for(c, key, bias, relu_mask.mask);
  std::lock_guard<std::mutex> plan_lock(plan->mutex);
  if (!plan->usable) return false;
  if (bias) set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (relu_mask.mask)
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
        static_cast<const void*>(relu_mask.mask));
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t status = lt.matmul(
      c.blas_lt, plan->desc, &alpha, w, plan->w_layout, x, plan->x_layout, &beta, y, plan->y_layout,
      y, plan->y_layout, &plan->algo, c.lt_workspace, kWorkspaceBytes, c.stream);
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  // Refused while capturing a graph: the capture fails (and says why) and the step runs again
  // uncaptured, when the call answers for itself.
  if (c.recording_here())
    throw Error(std::string("cuBLASLt refused a product while capturing: ") +
                blas_library().status_string(status));
  // Refused at the call (nothing enqueued): this shape goes the other way from now on.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    plan->usable = false;
    return false;
  }
  TFM_CUDA(status);
  return false;
}

}  // namespace cuda
}  // namespace tfm
