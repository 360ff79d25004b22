// Independent jobs of uneven size (tensors to convert or generate) run on a few threads: each thread takes
// the next job from a shared queue, so one large job does not hold up a static share of the others. The
// calling thread reports progress a few times a second while the workers run.
#pragma once

#include <cstddef>
#include <functional>

#include "puredrive/util/status.h"

namespace pd {

// The thread count a `--threads` option asks for: `requested`, or the hardware concurrency when it is 0 or
// less.
int resolve_thread_count(int requested);

// Runs job(i) for every i in [0, n), in the given order of start, on `threads` threads (0: all cores); stops
// starting new jobs after the first error, which it returns. tick(), if set, is called on the calling thread
// about every 250 ms and once at the end.
Status run_parallel_jobs(size_t n, int threads, const std::function<Status(size_t)>& job,
                         const std::function<void()>& tick = {});

}  // namespace pd
