// The SIMT emulator's scheduler: runs a launch's blocks one at a time in a
// seeded random order, each block's lanes as fibers in a seeded random order,
// switching only at collectives (and, at random, at atomics), and resolves
// each collective only when every lane it names waits at the same call site
// with the same mask. What cannot resolve is a fault, reported once.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "fiber.h"
#include "include/simt_runtime.h"
#include "runtime_internal.h"

namespace pe_simt {
namespace detail {

thread_local const LaneContext* current_lane = nullptr;

namespace {

constexpr int kWarp = 32;

enum class LaneState : uint8_t { kRunnable, kWaiting, kExited };

struct Lane {
  LaneContext context;
  LaneState state = LaneState::kRunnable;
  bool started = false;
  // The collective it waits at.
  Collective kind = Collective::kSyncThreads;
  const char* file = "";
  int line = 0;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = kWarp;
  uint64_t result = 0;
};

// The one block that runs (the runtime mutex is held), and the fibers its
// lanes run on, kept across blocks and launches.
struct BlockRun {
  const KernelLaunch* launch = nullptr;
  uint3 block_idx{0, 0, 0};
  // "kernel NAME (launched at FILE:LINE) block (x,y,z)", formatted when the
  // block starts: every report about it begins so, the fault signal
  // handler's too (it may not format).
  char description[1024] = "";
  std::vector<Lane> lanes;
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<int> order;  // This pass's lanes, in the order they run.
  size_t next_in_order = 0;
  std::unique_ptr<char[]> dynamic_shared;
  int running = -1;
  bool faulted = false;
};

BlockRun& Run() {
  static BlockRun* run = new BlockRun;  // Never destroyed: used at exit.
  return *run;
}

const char* CollectiveName(Collective kind) {
  static constexpr const char* kNames[] = {
      "__syncthreads",    "__syncwarp",      "__shfl_sync",   "__shfl_up_sync",
      "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync", "__any_sync",
      "__all_sync",       "__activemask"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) ==
                    static_cast<size_t>(Collective::kActiveMask) + 1,
                "one name per Collective");
  return kNames[static_cast<int>(kind)];
}

bool IsShuffle(Collective kind) {
  return kind >= Collective::kShfl && kind <= Collective::kShflXor;
}

bool SameSite(const Lane& a, const Lane& b) {
  return a.line == b.line &&
         (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

// The same collective: call site, kind and mask.
bool SameCollective(const Lane& a, const Lane& b) {
  return a.state == LaneState::kWaiting && b.state == LaneState::kWaiting &&
         a.kind == b.kind && a.mask == b.mask && SameSite(a, b);
}

std::string Describe(const Lane& lane) {
  char text[64];
  std::string where = std::string(lane.file) + ":" + std::to_string(lane.line);
  if (lane.kind == Collective::kSyncThreads ||
      lane.kind == Collective::kActiveMask) {
    return where + " (" + CollectiveName(lane.kind) + ")";
  }
  std::snprintf(text, sizeof(text), ", mask 0x%08x)", lane.mask);
  return where + " (" + CollectiveName(lane.kind) + text;
}

void BlockFault(const std::string& message) {
  BlockRun& run = Run();
  run.faulted = true;
  RaiseFault(std::string(run.description) + ": " + message);
}

// "0-15,17": the block's threads for which `selected(thread)` holds,
// compactly.
template <typename Selected>
std::string Lanes(Selected selected) {
  const int num_lanes = static_cast<int>(Run().lanes.size());
  std::string text;
  for (int i = 0; i < num_lanes; ++i) {
    if (!selected(i)) continue;
    int j = i;
    while (j + 1 < num_lanes && selected(j + 1)) ++j;
    if (!text.empty()) text += ",";
    text += std::to_string(i);
    if (j > i) text += "-" + std::to_string(j);
    i = j;
  }
  return text.empty() ? "(none)" : text;
}

// The threads of the warp at `warp_base` whose bits are set in `lanes`.
auto InWarp(int warp_base, unsigned lanes) {
  return [warp_base, lanes](int thread) {
    const int lane = thread - warp_base;
    return lane >= 0 && lane < kWarp && ((lanes >> lane) & 1u) != 0;
  };
}

bool Exited(int thread) {
  return Run().lanes[thread].state == LaneState::kExited;
}

bool AtBarrier(int thread) {
  const Lane& lane = Run().lanes[thread];
  return lane.state == LaneState::kWaiting &&
         lane.kind == Collective::kSyncThreads;
}

// The pass's next lane that can run, or -1 when the pass is done.
int NextInOrder() {
  BlockRun& run = Run();
  while (run.next_in_order < run.order.size()) {
    const int index = run.order[run.next_in_order++];
    if (run.lanes[index].state == LaneState::kRunnable) return index;
  }
  return -1;
}

void LaneMain();

// Makes lane `index` the running one (started if it was not) and returns
// its fiber, to switch to.
Fiber* Enter(int index) {
  BlockRun& run = Run();
  Lane& lane = run.lanes[index];
  run.running = index;
  current_lane = &lane.context;
  if (!lane.started) {
    lane.started = true;
    run.fibers[index]->Start(&LaneMain);
  }
  return run.fibers[index].get();
}

// From the running lane, which waits, yields or has `finished`: straight on
// to the pass's next lane, or back to the scheduler after the last.
void SwitchAway(bool finished) {
  BlockRun& run = Run();
  Fiber* self = run.fibers[run.running].get();
  const int next = NextInOrder();
  self->SwitchTo(next < 0 ? nullptr : Enter(next), finished);
}

void LaneMain() {
  BlockRun& run = Run();
  run.launch->body();
  run.lanes[run.running].state = LaneState::kExited;
  SwitchAway(true);
}

void Release(Lane& lane, uint64_t result) {
  lane.result = result;
  lane.state = LaneState::kRunnable;
}

// Resolves a warp collective whose lanes all wait at it; false if one
// faulted.
bool ResolveWarpGroup(int warp_base, unsigned mask, Lane& first) {
  BlockRun& run = Run();
  uint64_t vote = 0;
  for (int i = 0; i < kWarp; ++i) {
    if ((mask >> i) & 1u)
      vote |= uint64_t{run.lanes[warp_base + i].value != 0} << i;
  }
  for (int i = 0; i < kWarp; ++i) {
    if (!((mask >> i) & 1u)) continue;
    Lane& lane = run.lanes[warp_base + i];
    uint64_t result = 0;
    if (first.kind == Collective::kBallot) {
      result = vote;
    } else if (first.kind == Collective::kAny) {
      result = vote != 0;
    } else if (first.kind == Collective::kAll) {
      result = vote == mask;
    } else if (IsShuffle(first.kind)) {
      const int width = lane.width;
      if (width < 1 || width > kWarp || (width & (width - 1)) != 0) {
        BlockFault(Describe(lane) + " by thread " +
                   std::to_string(warp_base + i) + ": width " +
                   std::to_string(width) + " is not a power of 2 up to 32");
        return false;
      }
      const int segment = i & ~(width - 1);
      int source = i;
      if (first.kind == Collective::kShfl) {
        source = segment + (lane.arg & (width - 1));
      } else if (first.kind == Collective::kShflUp) {
        if (lane.arg >= 0 && i - lane.arg >= segment) source = i - lane.arg;
      } else if (first.kind == Collective::kShflDown) {
        if (lane.arg >= 0 && i + lane.arg < segment + width)
          source = i + lane.arg;
      } else if ((i ^ lane.arg) < segment + width) {
        source = i ^ lane.arg;
      }
      if (source < 0 || source >= kWarp || !((mask >> source) & 1u)) {
        BlockFault(Describe(lane) + ": thread " +
                   std::to_string(warp_base + i) + " reads lane " +
                   std::to_string(source) +
                   ", which is not in the mask (undefined in CUDA)");
        return false;
      }
      result = run.lanes[warp_base + source].value;
    }
    Release(lane, result);
  }
  return true;
}

// Resolves what can be; returns how many lanes it released, -1 on a fault.
// Allocates nothing unless it reports.
int Resolve() {
  BlockRun& run = Run();
  const int num_lanes = static_cast<int>(run.lanes.size());
  int released = 0;
  int first_at_barrier = -1, num_at_barrier = 0;
  bool any_exited = false, one_barrier = true;
  for (int i = 0; i < num_lanes; ++i) {
    any_exited = any_exited || Exited(i);
    if (!AtBarrier(i)) continue;
    if (first_at_barrier < 0) first_at_barrier = i;
    one_barrier =
        one_barrier && SameSite(run.lanes[first_at_barrier], run.lanes[i]);
    ++num_at_barrier;
  }
  if (first_at_barrier >= 0) {
    const Lane& first = run.lanes[first_at_barrier];
    if (any_exited) {
      BlockFault(std::string("__syncthreads at ") + first.file + ":" +
                 std::to_string(first.line) + " waited for by threads " +
                 Lanes(AtBarrier) + " while threads " + Lanes(Exited) +
                 " exited (the condition around __syncthreads must be the "
                 "same in the whole block)");
      return -1;
    }
    if (num_at_barrier == num_lanes && one_barrier) {
      for (Lane& lane : run.lanes) Release(lane, 0);
      return num_lanes;
    }
  }
  for (int warp_base = 0; warp_base < num_lanes; warp_base += kWarp) {
    const int warp_lanes = std::min(kWarp, num_lanes - warp_base);
    for (int i = 0; i < warp_lanes; ++i) {
      Lane& lane = run.lanes[warp_base + i];
      if (lane.state != LaneState::kWaiting ||
          lane.kind == Collective::kSyncThreads) {
        continue;
      }
      if (lane.kind == Collective::kActiveMask) {
        unsigned active = 0;
        for (int j = 0; j < warp_lanes; ++j) {
          const Lane& other = run.lanes[warp_base + j];
          if (other.state == LaneState::kWaiting && other.kind == lane.kind &&
              SameSite(lane, other)) {
            active |= 1u << j;
          }
        }
        for (int j = 0; j < warp_lanes; ++j) {
          if ((active >> j) & 1u) Release(run.lanes[warp_base + j], active);
        }
        released += __builtin_popcount(active);
        continue;
      }
      if (!((lane.mask >> i) & 1u)) {
        BlockFault(Describe(lane) + ": thread " +
                   std::to_string(warp_base + i) + " is not in its own mask");
        return -1;
      }
      if (warp_lanes < kWarp && (lane.mask >> warp_lanes) != 0) {
        BlockFault(Describe(lane) + ": the mask names lanes past the block's " +
                   std::to_string(num_lanes) + " threads");
        return -1;
      }
      unsigned gone = 0, waiting = 0;
      for (int j = 0; j < warp_lanes; ++j) {
        if (!((lane.mask >> j) & 1u)) continue;
        const Lane& other = run.lanes[warp_base + j];
        if (other.state == LaneState::kExited) gone |= 1u << j;
        if (SameCollective(lane, other)) waiting |= 1u << j;
      }
      if (gone != 0) {
        BlockFault(Describe(lane) + " by threads " +
                   Lanes(InWarp(warp_base, waiting)) +
                   ": the mask names threads " +
                   Lanes(InWarp(warp_base, gone)) + ", which exited");
        return -1;
      }
      if (waiting == lane.mask) {
        if (!ResolveWarpGroup(warp_base, lane.mask, lane)) return -1;
        released += __builtin_popcount(waiting);
      }
    }
  }
  return released;
}

// Nothing runs, nothing resolves: names each group of waiting lanes.
void Deadlock() {
  BlockRun& run = Run();
  const int num_lanes = static_cast<int>(run.lanes.size());
  std::vector<bool> listed(num_lanes, false);
  std::string groups;
  for (int i = 0; i < num_lanes; ++i) {
    const Lane& lane = run.lanes[i];
    if (listed[i] || lane.state != LaneState::kWaiting) continue;
    auto in_group = [&](int j) {
      const bool same_warp =
          j / kWarp == i / kWarp || lane.kind == Collective::kSyncThreads;
      return j >= i && !listed[j] && same_warp &&
             SameCollective(lane, run.lanes[j]);
    };
    groups += (groups.empty() ? "" : "; ") + std::string("threads ") +
              Lanes(in_group) + " wait at " + Describe(lane);
    for (int j = i; j < num_lanes; ++j) {
      if (in_group(j)) listed[j] = true;
    }
  }
  bool any_exited = false;
  for (int i = 0; i < num_lanes; ++i) any_exited = any_exited || Exited(i);
  if (any_exited) groups += "; threads " + Lanes(Exited) + " exited";
  BlockFault("deadlock: no collective can complete: " + groups);
}

bool RunBlock() {
  BlockRun& run = Run();
  const int num_lanes = static_cast<int>(run.lanes.size());
  for (;;) {
    for (;;) {
      run.order.clear();
      for (int i = 0; i < num_lanes; ++i) {
        if (run.lanes[i].state == LaneState::kRunnable) run.order.push_back(i);
      }
      if (run.order.empty()) break;
      for (size_t i = run.order.size(); i > 1; --i) {
        std::swap(run.order[i - 1], run.order[NextRandom() % i]);
      }
      // The lanes run in this order, each switching to the next.
      run.next_in_order = 0;
      Enter(NextInOrder())->Resume();
      current_lane = nullptr;
      run.running = -1;
    }
    bool all_exited = true;
    for (const Lane& lane : run.lanes) {
      all_exited = all_exited && lane.state == LaneState::kExited;
    }
    if (all_exited) return true;
    const int released = Resolve();
    if (released < 0) return false;
    if (released == 0) {
      Deadlock();
      return false;
    }
  }
}

}  // namespace

void OutsideKernel(const char* what) {
  std::fprintf(stderr, "simt: %s used outside a kernel (PE_SIMT_SEED=%llu)\n",
               what, static_cast<unsigned long long>(Seed()));
  std::abort();
}

uint64_t Arrive(const char* file, int line, Collective kind, unsigned mask,
                uint64_t value, int arg, int width) {
  BlockRun& run = Run();
  if (current_lane == nullptr || run.running < 0) {
    OutsideKernel(CollectiveName(kind));
  }
  const int index = run.running;
  Lane& lane = run.lanes[index];
  lane.state = LaneState::kWaiting;
  lane.kind = kind;
  lane.file = file;
  lane.line = line;
  lane.mask = mask;
  lane.value = value;
  lane.arg = arg;
  lane.width = width;
  SwitchAway(false);
  return lane.result;
}

void AtomicPoint() {
  BlockRun& run = Run();
  if (current_lane == nullptr || run.running < 0) OutsideKernel("an atomic");
  if ((NextRandom() & 3) == 0) SwitchAway(false);
}

void* DynamicSharedMemory() {
  if (current_lane == nullptr) OutsideKernel("dynamic shared memory");
  return Run().dynamic_shared.get();
}

std::string RunningLaneDescription() {
  const BlockRun& run = Run();
  if (run.launch == nullptr || run.running < 0) return "";
  const uint3& t = run.lanes[run.running].context.thread_idx;
  return std::string(run.description) + " thread (" + std::to_string(t.x) +
         "," + std::to_string(t.y) + "," + std::to_string(t.z) + ")";
}

bool RunKernel(const KernelLaunch& launch) {
  CountLaunch(launch.name);
  BlockRun& run = Run();
  const dim3 grid = launch.grid;
  const dim3 block = launch.block;
  const uint64_t num_blocks = uint64_t{grid.x} * grid.y * grid.z;
  const size_t num_lanes = size_t{block.x} * block.y * block.z;
  while (run.fibers.size() < num_lanes) {
    run.fibers.push_back(std::make_unique<Fiber>());
  }
  run.lanes.assign(num_lanes, Lane());
  run.dynamic_shared.reset(new char[launch.shared_bytes]);
  run.launch = &launch;
  run.faulted = false;
  ArmFaultSignals(run.description);
  // A seeded permutation of the blocks; an affine one past a million.
  std::vector<uint64_t> order;
  uint64_t stride = 1, offset = 0;
  if (num_blocks <= (uint64_t{1} << 20)) {
    order.resize(num_blocks);
    std::iota(order.begin(), order.end(), uint64_t{0});
    for (uint64_t i = num_blocks; i > 1; --i) {
      std::swap(order[i - 1], order[NextRandom() % i]);
    }
  } else {
    offset = NextRandom() % num_blocks;
    do {
      stride = NextRandom() % num_blocks | 1;
    } while (std::gcd(stride, num_blocks) != 1);
  }
  for (uint64_t n = 0; n < num_blocks && !run.faulted; ++n) {
    const uint64_t b =
        order.empty() ? (offset + n * stride) % num_blocks : order[n];
    run.block_idx = uint3{static_cast<unsigned>(b % grid.x),
                          static_cast<unsigned>(b / grid.x % grid.y),
                          static_cast<unsigned>(b / grid.x / grid.y)};
    std::snprintf(run.description, sizeof(run.description),
                  "kernel %s (launched at %s:%d) block (%u,%u,%u)", launch.name,
                  launch.file, launch.line, run.block_idx.x, run.block_idx.y,
                  run.block_idx.z);
    for (size_t t = 0; t < num_lanes; ++t) {
      Lane& lane = run.lanes[t];
      lane = Lane();
      lane.context.thread_idx =
          uint3{static_cast<unsigned>(t % block.x),
                static_cast<unsigned>(t / block.x % block.y),
                static_cast<unsigned>(t / block.x / block.y)};
      lane.context.block_idx = run.block_idx;
      lane.context.block_dim = block;
      lane.context.grid_dim = grid;
    }
    Scribble(run.dynamic_shared.get(), launch.shared_bytes);
    RunBlock();
  }
  run.launch = nullptr;
  return !run.faulted;
}

}  // namespace detail
}  // namespace pe_simt
