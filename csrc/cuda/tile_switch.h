// The kernel instance the launcher runs by size, stated once (in the manner of flash-attention's
// static_switch.h): each choice is a list of rows (the largest size a row takes, the template
// argument it runs), the first row whose size holds the call's giving the argument (the last row
// takes every larger size). The launcher (fourier_attention_launch.h) runs a choice's instance with
// `dispatch`, which hands the argument to its callable as a compile-time constant; the sizes that
// depend on it (the forward's threads and V stride) read it with `of` / `apply`; and the SASS report
// (scripts/benchmarks/cuda_sass_report.py) compiles the same lists into its host program, so that a
// row changed here is launched, sized and counted alike.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../backend_limits.h"
#include "../fourier_element_math.h"

namespace fourierformer {
namespace cuda {

template <int kUpTo, int kValue>
struct TileRow {};

template <typename... Rows>
struct TileChoice {
  static constexpr int kLargest = 0;  // (no row)
};

template <int kUpTo, int kValue, typename... Rest>
struct TileChoice<TileRow<kUpTo, kValue>, Rest...> {
  static constexpr bool kLast = sizeof...(Rest) == 0;
  // the largest size a row takes (the last row's: every larger one too)
  static constexpr int kLargest = kLast ? kUpTo : TileChoice<Rest...>::kLargest;
  static_assert(kLast || kUpTo < TileChoice<Rest...>::kLargest, "rows in increasing size");

  // F<argument>::at(n) of the row that takes n (a size that follows the choice)
  template <template <int> class F>
  static FF_HD constexpr int apply(int64_t n) {
    if constexpr (kLast)
      return F<kValue>::at(n);
    else
      return n <= kUpTo ? F<kValue>::at(n) : TileChoice<Rest...>::template apply<F>(n);
  }

  // the template argument of the row that takes n
  static FF_HD constexpr int of(int64_t n) { return apply<Argument>(n); }

  // f(std::integral_constant<int, argument>) for the row that takes n (host code: the launcher)
  template <typename F>
  static void dispatch(int64_t n, F&& f) {
    if constexpr (kLast) {
      f(std::integral_constant<int, kValue>{});
    } else {
      if (n <= kUpTo)
        f(std::integral_constant<int, kValue>{});
      else
        TileChoice<Rest...>::dispatch(n, f);
    }
  }

  template <int kArg>
  struct Argument {
    static FF_HD constexpr int at(int64_t) { return kArg; }
  };
};

// forward_tiled_kernel<scalar_t, kO> by the value columns Dv: kO columns per thread, 4 threads a row
// (Dv > 64: two halves of the block, forward_split)
using ForwardColumns = TileChoice<TileRow<16, 4>, TileRow<64, 16>, TileRow<128, 32>, TileRow<limits::kCudaMaxHeadDim, 64>>;

// backward_main_tiled_kernel<scalar_t, kO, kCache> by the value columns Dv: dv in tiles of up to
// 4 kO columns (DvTile)
using MainPassColumns = TileChoice<TileRow<4, 1>, TileRow<8, 2>, TileRow<16, 4>, TileRow<32, 8>, TileRow<64, 16>,
                                   TileRow<limits::kCudaTiledBackwardMaxHeadDim, 32>>;

// forward_decode_kernel<scalar_t, kRows> by the query rows N of a slice: kRows held in registers;
// the last row's size is the most rows the decoding forward takes (kDecodeMaxRows)
using DecodeRows = TileChoice<TileRow<1, 1>, TileRow<2, 2>, TileRow<4, 4>, TileRow<8, 8>>;

}  // namespace cuda
}  // namespace fourierformer
