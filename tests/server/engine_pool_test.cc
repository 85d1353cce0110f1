#include "server/engine_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace parasol {
namespace {

// Engine 0 runs on the caller (the request thread); every other once, on the caller or one of
// the pool's threads. Parts that take a while are shared with the pool's threads.
TEST(EnginePoolTest, EveryEngineRunsOncePerCallAndEngineZeroOnTheCaller) {
  EnginePool pool(4);
  std::set<std::thread::id> all;
  int off_caller = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<int> ran(4, 0);
    std::vector<std::thread::id> ids(4);
    pool.RunOnAll([&](uint32_t e) {
      ran[e]++;
      ids[e] = std::this_thread::get_id();
      // Every tenth round, parts long enough for a sleeping thread to wake and take one.
      if (round % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
    EXPECT_EQ(ran, std::vector<int>(4, 1));
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    all.insert(ids.begin(), ids.end());
    off_caller += static_cast<int>(std::count_if(
        ids.begin(), ids.end(), [](std::thread::id id) { return id != std::this_thread::get_id(); }));
  }
  EXPECT_LE(all.size(), 4u);  // the caller and the pool's 3 threads, no others
  EXPECT_GT(off_caller, 0);   // the pool's threads took parts
}

// A thread that does not get to the parts (here: the pool's one thread, held in the part it
// took) leaves the parts nobody has taken to the caller, which does not wait for it to take
// them; the call ends once the held part is done.
TEST(EnginePoolTest, PartsNoThreadHasTakenAreLeftToTheCaller) {
  constexpr int kEngines = 5;
  EnginePool pool(kEngines, /*threads=*/2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 20; ++round) {
    std::mutex mu;
    std::condition_variable cv;
    bool taken = false;          // the pool's thread has begun a part
    bool taken_in_time = false;  // ... and the caller saw it within 60 s
    bool released = false;       // the held part saw the caller do all the others
    int on_caller = 0;
    std::vector<int> ran(kEngines, 0);
    pool.RunOnAll([&](uint32_t e) {
      std::unique_lock<std::mutex> lock(mu);
      ran[e]++;
      if (std::this_thread::get_id() == caller) {
        // Engine 0 waits until the pool's thread has taken a part: then it is held there.
        if (e == 0) taken_in_time = cv.wait_for(lock, std::chrono::seconds(60), [&] { return taken; });
        ++on_caller;
        cv.notify_all();
        return;
      }
      taken = true;
      cv.notify_all();
      released = cv.wait_for(lock, std::chrono::seconds(60),
                             [&] { return on_caller == kEngines - 1; });
    });
    EXPECT_EQ(ran, std::vector<int>(kEngines, 1)) << "round " << round;
    EXPECT_TRUE(taken_in_time) << "round " << round;
    EXPECT_EQ(on_caller, kEngines - 1) << "round " << round;
    ASSERT_TRUE(released) << "round " << round << ": the caller waited for the held thread";
  }
}

// A failure of the caller's own engine reaches the caller only once the other engines, which
// borrow the task, are done with it; the pool goes on working.
TEST(EnginePoolTest, ACallersFailureWaitsForTheOtherEngines) {
  EnginePool pool(3);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> finished{0};
    bool threw = false;
    try {
      pool.RunOnAll([&](uint32_t e) {
        if (e == 0) throw std::runtime_error("engine 0 failed");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        finished++;
      });
    } catch (const std::runtime_error& err) {
      threw = true;
      EXPECT_STREQ(err.what(), "engine 0 failed");
      EXPECT_EQ(finished.load(), 2);
    }
    ASSERT_TRUE(threw);
    std::atomic<int> ran{0};
    pool.RunOnAll([&](uint32_t) { ran++; });
    EXPECT_EQ(ran.load(), 3);
  }
}

// A failure of any other engine, on whichever thread took it, reaches the caller the same
// way, once the others are done; of two failures, one.
TEST(EnginePoolTest, AnyEnginesFailureReachesTheCallerOnceTheOthersAreDone) {
  EnginePool pool(4);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> finished{0};
    const uint32_t bad = 1 + static_cast<uint32_t>(round % 3);
    std::string caught;
    try {
      pool.RunOnAll([&](uint32_t e) {
        if (e == bad || (round % 2 && e == 3)) {
          throw std::runtime_error("engine " + std::to_string(e) + " failed");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        finished++;
      });
    } catch (const std::runtime_error& err) {
      caught = err.what();
      EXPECT_EQ(finished.load(), (round % 2 && bad != 3) ? 2 : 3) << "round " << round;
    }
    if (round % 2 && bad != 3) {
      EXPECT_TRUE(caught == "engine " + std::to_string(bad) + " failed" ||
                  caught == "engine 3 failed")
          << caught;
    } else {
      EXPECT_EQ(caught, "engine " + std::to_string(bad) + " failed");
    }
    std::atomic<int> ran{0};
    pool.RunOnAll([&](uint32_t) { ran++; });
    EXPECT_EQ(ran.load(), 4);
  }
}

TEST(EnginePoolTest, InlineRunsOnTheCaller) {
  EnginePool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.RunOnAll([&](uint32_t e) { ids[e] = std::this_thread::get_id(); }, /*run_inline=*/true);
  for (auto id : ids) EXPECT_EQ(id, std::this_thread::get_id());
}

// Background work as the shard hands it over: each engine's items, resumable, stopping between
// items once told to.
struct Resumable {
  explicit Resumable(uint32_t engines, uint32_t items)
      : next(engines), done(engines * items), items(items) {}
  void Run(uint32_t e, const std::atomic<bool>& stop) {
    ran_on[e].insert(std::this_thread::get_id());
    first_on.emplace(e, std::this_thread::get_id());
    while (next[e] < items) {
      if (stop.load()) return;
      done[e * items + next[e]]++;
      ++next[e];
    }
  }
  std::vector<uint32_t> next;
  std::vector<std::atomic<int>> done;
  std::map<uint32_t, std::set<std::thread::id>> ran_on;
  std::map<uint32_t, std::thread::id> first_on;  // the thread of each engine's first call
  const uint32_t items;
};

TEST(EnginePoolTest, BackgroundWorkRunsWithoutTheCallerAndFinishingRunsNothingTwice) {
  for (uint32_t engines : {1u, 2u, 4u}) {
    EnginePool pool(engines);
    // A few rounds: each waits for an idle-priority thread, which a loaded machine runs late.
    for (int round = 0; round < 3; ++round) {
      Resumable work(engines, 100);
      std::mutex mu;  // ran_on is written by one thread at a time, but read here
      pool.StartBackground([&](uint32_t e, const std::atomic<bool>& stop) {
        std::lock_guard<std::mutex> lock(mu);
        work.Run(e, stop);
      });
      // The background does it all while this thread waits (an idle-priority thread runs
      // when a core is free: this one sleeps).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      auto all_done = [&] {
        std::lock_guard<std::mutex> lock(mu);
        return std::all_of(work.next.begin(), work.next.end(),
                           [&](uint32_t n) { return n == work.items; });
      };
      while (!all_done() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(all_done()) << "the background did not run in 60 s";
      pool.FinishBackground();
      for (const auto& d : work.done) EXPECT_EQ(d.load(), 1);
      // Every engine's work ran on one thread, neither this one nor an engine's; finishing
      // then called each engine again (engine 0 on this thread, the others on whichever
      // thread took them).
      std::set<std::thread::id> first;
      for (const auto& [e, id] : work.first_on) first.insert(id);
      ASSERT_EQ(work.first_on.size(), engines);
      EXPECT_EQ(first.size(), 1u);
      EXPECT_EQ(first.count(std::this_thread::get_id()), 0u);
      for (const auto& [e, ids] : work.ran_on) {
        EXPECT_EQ(ids.size(), 2u) << e;
        if (e == 0) {
          EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);
        }
      }
    }
    pool.FinishBackground();  // nothing started: returns at once
  }
}

TEST(EnginePoolTest, FinishStopsTheBackgroundAndTheEnginesDoTheRestOnce) {
  constexpr uint32_t kEngines = 3;
  EnginePool pool(kEngines);
  for (int round = 0; round < 50; ++round) {
    Resumable work(kEngines, 2000);
    std::atomic<int> calls{0};
    std::mutex mu;  // Run() records its threads in maps
    pool.StartBackground([&](uint32_t e, const std::atomic<bool>& stop) {
      calls++;
      std::lock_guard<std::mutex> lock(mu);
      work.Run(e, stop);
    });
    if (round % 2) std::this_thread::sleep_for(std::chrono::microseconds(50));
    pool.FinishBackground();
    // Every item once, whether the background had begun, stopped midway, or never ran.
    for (const auto& d : work.done) ASSERT_EQ(d.load(), 1);
    for (uint32_t n : work.next) EXPECT_EQ(n, work.items);
    EXPECT_GE(calls.load(), static_cast<int>(kEngines));  // the engines' calls at least
  }
}

}  // namespace
}  // namespace parasol
