// The layers of §3, one file each, as forward / backward pairs on padded batches laid out
// [batch, time, d_model]:
//   model/linear.h               Linear (and the helpers every layer shares)
//   model/multi_head_attention.h multi-head attention (§3.2)
//   model/feed_forward.h         position-wise feed-forward network (§3.3)
//   model/embeddings.h           embeddings with the sqrt(d_model) scale (§3.4)
//   model/positional_encoding.h  sinusoidal positional encodings (§3.5)
// The sublayer wrapper (residual, layer norm, dropout) is model/sublayer.h; the stacks are
// model/stacks.h.
#pragma once

#include "model/embeddings.h"
#include "model/feed_forward.h"
#include "model/linear.h"
#include "model/multi_head_attention.h"
#include "model/positional_encoding.h"
