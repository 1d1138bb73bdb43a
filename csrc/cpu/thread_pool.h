// The CPU backend's worker pool: (batch, head) slices handed out one at a time to ATen's threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace fourierformer {
namespace cpu {

// Each thread keeps its workspace between calls while it is at most this many floats (16 MiB),
// so that a call does not pay for fresh pages; a larger one is freed when the call ends.
constexpr size_t kKeptWorkspaceFloats = size_t(1) << 22;

// fn(bh) for bh in [0, n), in parallel: each worker takes the next slice as it finishes one,
// so that a core slowed by other work does fewer slices (with ATen's static split, the
// whole call would wait for its share). setup() runs once per worker.
template <typename Setup, typename Fn>
void for_each_slice_balanced(int64_t n, Setup setup, Fn fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto state = setup();
    for (int64_t bh = next.fetch_add(1); bh < n; bh = next.fetch_add(1)) fn(bh, state);
  });
}

}  // namespace cpu
}  // namespace fourierformer
