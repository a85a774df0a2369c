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

struct PlanKey {
  int device;
  int64_t m, n, k, ldx, ldw, ldy;
  int type, output_type, layout;
  bool bias, bias_in_bfloat16, relu;
  uint32_t align_x, align_w, align_y, align_bias;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, m, n, k, ldx, ldw, ldy, type, output_type, layout, bias,
                    bias_in_bfloat16, relu, align_x, align_w, align_y,
                    align_bias) < std::tie(o.device, o.m, o.n, o.k, o.ldx, o.ldw, o.ldy, o.type,
                                           o.output_type, o.layout, o.bias, o.bias_in_bfloat16,
                                           o.relu, o.align_x, o.align_w, o.align_y, o.align_bias);
  }
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

// The descriptors for `key` and cuBLASLt's first choice of algorithm for them (usable false where
// it has none). The bias pointer given is the one the heuristic judges alignment by.
std::unique_ptr<Plan> make_plan(const Context& c, const PlanKey& key, const void* bias) {
  const BlasLtLibrary& lt = blas_lt_library();
  auto plan = std::make_unique<Plan>();
  const auto type = cudaDataType_t(key.type);
  TFM_CUDA(lt.desc_create(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const bool transposed_w = WeightLayout(key.layout) == WeightLayout::kOutputsByInputs;
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(transposed_w ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
  const cublasLtEpilogue_t epilogue =
      key.bias ? (key.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
               : (key.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue));
  if (key.bias) {
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
std::shared_ptr<Plan> plan_for(const Context& c, const PlanKey& key, const void* bias) {
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
  std::shared_ptr<Plan> plan = make_plan(c, key, bias);
  std::lock_guard<std::mutex> lock(*mutex);
  if (plans->size() >= kMaxPlans) plans->clear();
  return plans->emplace(key, std::move(plan)).first->second;
}

}  // namespace

bool lt_product(const Context& c, int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx,
                const void* w, int64_t ldw, cudaDataType_t type, void* y,
                cudaDataType_t output_type, int64_t ldy, const float* float_bias,
                const uint16_t* rounded_bias, bool relu, WeightLayout layout) {
  static const bool enabled = !turned_off("TFM_CUDA_LT");  // else cuBLAS and a pass, to compare
  const void* bias = float_bias ? static_cast<const void*>(float_bias) : rounded_bias;
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
                    bias != nullptr,
                    !float_bias && rounded_bias,
                    relu,
                    alignment_of(x),
                    alignment_of(w),
                    alignment_of(y),
                    alignment_of(bias)};
  const std::shared_ptr<Plan> plan = plan_for(c, key, bias);
  std::lock_guard<std::mutex> plan_lock(plan->mutex);
  if (!plan->usable) return false;
  if (bias) set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
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
