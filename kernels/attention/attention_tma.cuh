// Internal to kernels/attention (nvcc only): the host-side tensor map of a [batch, seq, heads,
// head_dim] tensor that the warp-specialized forward (attention_fwd_v4_ws.cu) loads by TMA. The
// device side (mbarriers with bounded waits, TMA loads, setmaxnreg, named barriers) is
// kernels/core/sm90.h's.
//
// The 4-D tensor map views q (or k, v) as dims {head_dim, heads, seq, batch} (innermost first) and
// loads boxes of {64, 1, rows, 1}: 64 columns of one head for `rows` consecutive positions of one
// batch element, 128-byte swizzled. In shared memory (1024-byte-aligned destination) the box is row
// r at r * 128 bytes, 16-byte chunk c at chunk c ^ (r % 8): one column block of the swizzled tile
// layout attention_wgmma.cuh describes, so the wgmma descriptors read it unchanged. Positions past
// the sequence are zero-filled by the TMA unit (and still count in the transaction bytes).
//
//   CUtensorMap map;
//   SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map, DType::kBF16, k, batch, seq_k, kv_heads, 64, 128));
//   ... in the kernel: sm90::MbarArriveExpectTx(full, 128 * 64 * 2);
//                      sm90::TmaLoad4d(dst, &map, 0, kh, n0, b, full);
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_TMA_CUH_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_TMA_CUH_

#include <cuda.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::internal::attention_device {

// The tensor map of a contiguous [batch, seq, heads, head_dim] tensor of dtype (kBF16 or kF16),
// read in {64, 1, box_rows, 1} boxes with 128-byte swizzling. Errors: a base not 16-byte aligned
// (InvalidArgument), no cuTensorMapEncodeTiled in the driver (Unimplemented), or the driver
// rejecting the map (Internal, its code).
absl::Status EncodeHeadTileMap(CUtensorMap* map, DType dtype, const void* base, int64_t batch,
                               int64_t seq, int64_t heads, int64_t head_dim, int box_rows);

}  // namespace sg::kernels::internal::attention_device

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_TMA_CUH_
