#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/ring.h"
#include "kernels/core/status.h"

namespace sg::comm::internal {

int64_t ChunkCount(const RingSpec& spec, int64_t* chunk_elems, uint32_t max_index) {
  int64_t longest = 0;
  for (const Segment& s : spec.segments) longest = std::max(longest, s.count);
  int64_t chunk = std::max<int64_t>(1, spec.chunk_elems);
  int64_t per_step = std::max<int64_t>(1, int64_t(max_index) / (spec.recv_steps + 2));
  if ((longest + chunk - 1) / chunk > per_step) chunk = (longest + per_step - 1) / per_step;
  *chunk_elems = chunk;
  return std::max<int64_t>(1, (longest + chunk - 1) / chunk);
}

namespace {

struct Chunk {
  int64_t offset, count;  // elements in the buffer
};

Chunk ChunkOf(const Segment& seg, int64_t c, int64_t chunk_elems) {
  int64_t begin = std::min(seg.count, c * chunk_elems);
  int64_t end = std::min(seg.count, begin + chunk_elems);
  return {seg.offset + begin, end - begin};
}

struct PendingRecv {
  std::unique_ptr<TransportRequest> req;
  int step;
  int64_t c;
  int slot;  // scratch slot when reducing, else -1
};

}  // namespace

// Steps:
//  1. Split segments into C chunks (the same split on every rank, so empty chunks are skipped
//     consistently on both ends of a link).
//  2. If send_first, start sending every chunk of segment send_segment0.
//  3. Post receives in (step, chunk) order, at most `window` in flight; the oldest unfinished
//     (step, chunk) in the whole ring always has its receive posted, so the pipeline cannot stall.
//  4. When a receive completes: reduce it from scratch into the buffer (or it already landed in
//     place), then, if forward(step), send that chunk to `next` at once.
//  5. Finish when all receives and sends are done; check deadline/abort while waiting.
absl::Status RunRingHost(const RingSpec& spec, OpContext& ctx) {
  Transport& t = *spec.transport;
  const int64_t esize = SizeOf(spec.dtype);
  int64_t chunk_elems = 0;
  const int64_t C = ChunkCount(spec, &chunk_elems, 1u << 20);
  auto index = [&](int step, int64_t c) { return uint32_t(step * C + c); };

  std::vector<std::unique_ptr<TransportRequest>> sends;
  auto send_chunk = [&](const Chunk& ch, uint32_t tag_index) -> absl::Status {
    SG_ASSIGN_OR_RETURN(auto r, t.ISend(spec.next, ctx.Tag(tag_index), spec.buf + ch.offset * esize,
                                        size_t(ch.count * esize)));
    sends.push_back(std::move(r));
    return absl::OkStatus();
  };
  if (spec.send_first) {
    const Segment& seg = spec.segments[spec.send_segment0];
    for (int64_t c = 0; c < C; ++c) {
      Chunk ch = ChunkOf(seg, c, chunk_elems);
      if (ch.count > 0) SG_RETURN_IF_ERROR(send_chunk(ch, index(0, c)));
    }
  }

  // Never more receives in flight than the ring has chunks to receive (the all-gather asks for
  // 2^20 "unlimited": a free-slot list that long cost milliseconds per call); slots exist only
  // when receives land in scratch (reductions).
  const int window =
      int(std::max<int64_t>(1, std::min<int64_t>(spec.window, int64_t(spec.recv_steps) * C)));
  std::vector<char> scratch(spec.reduce ? size_t(window * chunk_elems * esize) : 0);
  std::vector<int> free_slots;
  if (spec.reduce) {
    for (int i = window - 1; i >= 0; --i) free_slots.push_back(i);
  }
  std::deque<PendingRecv> pending;
  int next_step = 0;
  int64_t next_c = 0;

  auto post_more = [&]() -> absl::Status {
    while (next_step < spec.recv_steps && int(pending.size()) < window) {
      Chunk ch = ChunkOf(spec.segments[spec.recv_segment(next_step)], next_c, chunk_elems);
      if (ch.count > 0) {
        int slot = -1;
        char* dst = spec.buf + ch.offset * esize;
        if (spec.reduce) {
          slot = free_slots.back();
          free_slots.pop_back();
          dst = scratch.data() + size_t(slot) * chunk_elems * esize;
        }
        SG_ASSIGN_OR_RETURN(auto r, t.IRecv(spec.prev, ctx.Tag(index(next_step, next_c)), dst,
                                            size_t(ch.count * esize)));
        pending.push_back({std::move(r), next_step, next_c, slot});
      }
      if (++next_c == C) {
        next_c = 0;
        ++next_step;
      }
    }
    return absl::OkStatus();
  };

  SG_RETURN_IF_ERROR(post_more());
  int64_t idle = 0;
  while (!pending.empty() || !sends.empty()) {
    bool progressed = false;
    for (auto it = pending.begin(); it != pending.end();) {
      SG_ASSIGN_OR_RETURN(bool done, it->req->Test());
      if (!done) {
        ++it;
        continue;
      }
      progressed = true;
      Chunk ch = ChunkOf(spec.segments[spec.recv_segment(it->step)], it->c, chunk_elems);
      if (spec.reduce) {
        SG_RETURN_IF_ERROR(ReduceInto(spec.op, spec.dtype, spec.buf + ch.offset * esize,
                                      scratch.data() + size_t(it->slot) * chunk_elems * esize,
                                      ch.count));
        free_slots.push_back(it->slot);
      }
      if (spec.forward(it->step)) {
        SG_RETURN_IF_ERROR(send_chunk(ch, spec.chain ? index(it->step, it->c)
                                                     : index(it->step + 1, it->c)));
      }
      it = pending.erase(it);
    }
    for (auto it = sends.begin(); it != sends.end();) {
      SG_ASSIGN_OR_RETURN(bool done, (*it)->Test());
      if (done) {
        progressed = true;
        it = sends.erase(it);
      } else {
        ++it;
      }
    }
    SG_RETURN_IF_ERROR(post_more());
    if (progressed) {
      idle = 0;
      continue;
    }
    // Let other ranks on the same cores run, and check deadline and abort flag now and then.
    if (++idle > 64) std::this_thread::yield();
    if (idle % 256 == 0) {
      if (!pending.empty()) {
        SG_RETURN_IF_ERROR(ctx.Check(*pending.front().req, spec.prev));
      } else {
        SG_RETURN_IF_ERROR(ctx.Check(*sends.front(), spec.next));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sg::comm::internal
