// The shared slots (backend/workspace.h, SharedSlot) of the model's planned passes, listed in one
// place so that no two uses share a slot by accident. A slot's buffers lie in one part of the
// workspace: each holds values that the next operation reads and no backward does.
#pragma once

#include "backend/workspace.h"

namespace tfm {

// A sublayer's float32 output where the stack's products read bfloat16 copies
// (sublayer_forward_buffers' output_shared): read by the next sublayer's residual sum alone. One
// slot for each place in a layer, so that no sublayer writes the slot it reads: a
// self-attention sublayer reads a feed-forward one's output (or the embeddings), a
// cross-attention one a self-attention one's, a feed-forward one the sublayer before it. The
// embeddings' sum, which the first sublayer reads, lies where a feed-forward output would.
constexpr SharedSlot kSelfAttentionOutputSlot{0};
constexpr SharedSlot kCrossAttentionOutputSlot{1};
constexpr SharedSlot kFeedForwardOutputSlot{2};
// An attention's float32 context where W_o reads its bfloat16 copy alone
// (AttentionShape::rounded_out_only: the float32 one is the attention's scratch).
constexpr SharedSlot kAttentionContextSlot{3};

}  // namespace tfm
