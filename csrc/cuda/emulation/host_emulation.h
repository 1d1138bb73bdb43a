// A tiny CUDA execution emulator for checking ../fourier_attention_kernels.cuh on a machine
// without a GPU (used by run_emulated_check.py; not part of the built extension).
//
// Each block runs as blockDim real OS threads (blocks one after another, on the same threads),
// so __syncthreads and the warp shuffles are real barriers: a shuffle or __syncthreads that not
// every thread reaches deadlocks, which is reported (timeout) and aborts. Dynamic shared memory
// is allocated to the byte and starts filled with NaN bytes, so reading smem that was never
// written shows up in the results. Built with a sanitizer (run_emulated_check.py --sanitize),
// the barriers (atomics on a futex word) order the threads for the thread sanitizer,
// and shared memory past its size is a heap overflow for the address sanitizer.
#pragma once

#include <linux/futex.h>
#include <math.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct FfEmuDim {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local FfEmuDim threadIdx;
inline thread_local FfEmuDim blockIdx;

namespace ff_emu {

// A barrier of n threads on a futex: each arrival is one atomic add; the last one bumps the
// generation and wakes every waiter in one call, and a waiter takes no lock when it wakes (a
// mutex and a condition variable made the woken threads queue on the mutex, one context switch
// after another, which was most of an emulated launch's time). The add (acquire-release) and the
// generation's release and acquire order every thread's work before the barrier before every
// thread's work after it, also for the thread sanitizer.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    const uint32_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);  // (published by the release below)
      gen_.store(gen + 1, std::memory_order_release);
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&gen_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (gen_.load(std::memory_order_acquire) == gen) {
      timespec slice{1, 0};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&gen_), FUTEX_WAIT_PRIVATE, gen, &slice, nullptr, 0);
      if (gen_.load(std::memory_order_acquire) == gen && std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "ff_emu: barrier timeout (a __syncthreads or shuffle not reached by all threads)\n");
        std::abort();
      }
    }
  }

 private:
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");
  std::atomic<uint32_t> gen_{0};
  std::atomic<int> count_{0};
  const int n_;
};

struct Block {
  explicit Block(int threads, size_t smem) : sync(threads), slots(2 * threads), smem(smem, 0xFF) {
    for (int w = 0; w < threads / 32; ++w) warps.emplace_back(new Barrier(32));
  }
  Barrier sync;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<uint64_t> slots;  // the shuffles' two banks of one word per thread
  std::vector<unsigned char> smem;
};

inline Block* g_block = nullptr;
inline thread_local unsigned shuffle_bank = 0;  // the bank of this thread's last shuffle (see __shfl_sync)
inline std::mutex g_atomic_mu;

inline unsigned char* dynamic_smem() { return g_block->smem.data(); }

// FF_EMU_BLOCK_ORDER=reverse: the blocks of each launch run last to first. A GPU runs them in any
// order and at once, so a result that depends on their order (two blocks writing one word, a
// block reading what another block of the same launch writes) is a bug that the sanitizers,
// which see one block at a time here, cannot show: run_emulated_check.py compares both orders.
inline bool reverse_block_order() {
  const char* env = std::getenv("FF_EMU_BLOCK_ORDER");
  return env && std::strcmp(env, "reverse") == 0;
}

template <typename Kernel, typename... Args>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, const Args&... args) {
  if (threads % 32 != 0) std::abort();
  if (blocks <= 0) return;
  // One OS thread per CUDA thread for the whole launch, running the blocks one after another:
  // after each block every thread meets the block barrier, then thread 0 refills shared memory
  // with NaN bytes for the next (under the thread sanitizer starting a thread is slow enough
  // that new threads for each block would dominate a launch; the timing: docs/records/speed.md).
  Block block(threads, smem);
  g_block = &block;
  const bool reverse = reverse_block_order();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      threadIdx.x = (unsigned)t;
      for (int64_t bid = 0; bid < blocks; ++bid) {
        blockIdx.x = (unsigned)(reverse ? blocks - 1 - bid : bid);
        kernel(args...);
        block.sync.wait();  // the block is done in every thread
        if (bid + 1 == blocks) break;
        if (t == 0) std::fill(block.smem.begin(), block.smem.end(), (unsigned char)0xFF);
        block.sync.wait();  // the next block starts on fresh shared memory
      }
    });
  for (auto& th : pool) th.join();
  g_block = nullptr;
}

}  // namespace ff_emu

inline void __syncthreads() { ff_emu::g_block->sync.wait(); }

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 8 bytes");
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "ff_emu: only full-warp shuffles are emulated\n");
    std::abort();
  }
  ff_emu::Block* blk = ff_emu::g_block;
  const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  // Two banks of slots, taken in turn by a warp's shuffles: a lane reads the bank after the one
  // barrier, and the next shuffle writes the other bank, so a lane that runs ahead cannot
  // overwrite a slot that another is still to read (that write would be two shuffles on, past a
  // barrier the reader has not reached).
  uint64_t* bank = blk->slots.data() + (ff_emu::shuffle_bank ^= 1) * blk->slots.size() / 2;
  bank[tid] = bits;
  blk->warps[warp]->wait();
  const uint64_t got = bank[warp * 32 + (src_lane & 31)];
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  return __shfl_sync(mask, value, ((int)threadIdx.x % 32) ^ lane_mask);
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "ff_emu: only full-warp __syncwarp is emulated\n");
    std::abort();
  }
  ff_emu::g_block->warps[(int)threadIdx.x / 32]->wait();
}

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

template <typename T>
T atomicAdd(T* address, T value) {
  std::lock_guard<std::mutex> lock(ff_emu::g_atomic_mu);
  const T old = *address;
  *address = old + value;
  return old;
}
