#pragma once
// A task that runs on a thread of its own once the task before it has ended, as the streaming
// worker chains its fragments' operations and its evaluations.
//
// It holds the task before only until it has waited for it. A lambda that captured the future
// of the one before kept it for as long as its own future lived: std::async's shared state
// keeps the callable, so each operation held the one before, which held the one before it, and
// the chain held every operation's payload since the worker began (a soak's nodes grew 80 to
// 360 MB an hour; decision 0054).
#include <future>
#include <type_traits>
#include <utility>

namespace loco {

// Runs `task()` after `before` (if valid) has ended. With `rethrow`, a failure of the task
// before is this one's too (its get(); the task does not run); without, it only waits.
template <class T, class F>
auto run_after(std::shared_future<T> before, bool rethrow, F task)
    -> std::shared_future<std::invoke_result_t<F&>> {
  return std::async(std::launch::async,
                    [before = std::move(before), rethrow, task = std::move(task)]() mutable {
                      if (before.valid()) {
                        // Moved out: the capture no longer holds the task before.
                        const std::shared_future<T> earlier = std::move(before);
                        if (rethrow)
                          earlier.get();
                        else
                          earlier.wait();
                      }
                      return task();
                    })
      .share();
}

}  // namespace loco
