// Thread-safety annotations: clang's -Wthread-safety checks them at compile time; other compilers
// see nothing. scripts/check-threads.sh compiles the tree with clang and -Werror=thread-safety.
//
//   class Queue {
//     Mutex mu_;
//     std::deque<Job> jobs_ GUARDED_BY(mu_);
//     void PopLocked() REQUIRES(mu_);
//   };
//
// GUARDED_BY(mu): the field is read and written only with mu held. PT_GUARDED_BY(mu): the same for
// what a pointer field points to. REQUIRES(mu) / REQUIRES_SHARED(mu): the caller holds mu.
// EXCLUDES(mu): the caller must not hold mu (the function takes it). ACQUIRE / RELEASE /
// TRY_ACQUIRE: the function takes or drops the capability and returns holding it (or not).
// ACQUIRED_BEFORE / ACQUIRED_AFTER: the lock order (checked only with -Wthread-safety-beta).
// NO_THREAD_SAFETY_ANALYSIS: the function is not checked; say why beside it.
// The vocabulary is clang's (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) and leveldb's.
#pragma once

#if defined(__clang__)
#define STRATA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define STRATA_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) STRATA_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY STRATA_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) STRATA_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) STRATA_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) STRATA_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) STRATA_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) STRATA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) STRATA_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) STRATA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) STRATA_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) STRATA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) STRATA_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) STRATA_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) STRATA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define LOCKS_EXCLUDED(...) EXCLUDES(__VA_ARGS__)
#define ASSERT_CAPABILITY(x) STRATA_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) STRATA_THREAD_ANNOTATION(lock_returned(x))
#define EXCLUSIVE_LOCKS_REQUIRED(...) REQUIRES(__VA_ARGS__)
#define NO_THREAD_SAFETY_ANALYSIS STRATA_THREAD_ANNOTATION(no_thread_safety_analysis)
