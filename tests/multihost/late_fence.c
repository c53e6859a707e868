/* LD_PRELOAD library for tests/multihost/test_slurm.py: in the process whose PMIX_RANK is
 * LATE_FENCE_RANK, every PMIx_Fence_nb completion reaches the caller LATE_FENCE_MS
 * milliseconds late (default 1000), as when the launcher tells that node last that a
 * fence is complete. The wait runs on a thread of its own, so that PMIx keeps serving
 * the process's other requests meanwhile. Build: cc -shared -fPIC -o late_fence.so
 * late_fence.c -ldl -lpthread */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef void (*op_cbfunc)(int status, void *cbdata);
typedef int (*fence_nb_fn)(const void *procs, size_t nprocs, const void *info, size_t ninfo,
                           op_cbfunc cbfunc, void *cbdata);

struct completion {
    op_cbfunc cbfunc;
    void *cbdata;
    int status;
};

static void *complete_late(void *arg) {
    struct completion *done = arg;
    const char *ms = getenv("LATE_FENCE_MS");
    usleep(1000 * (useconds_t)(ms ? atoi(ms) : 1000));
    done->cbfunc(done->status, done->cbdata);
    free(done);
    return NULL;
}

static void fence_complete(int status, void *arg) {
    struct completion *done = arg;
    pthread_t thread;
    done->status = status;
    pthread_create(&thread, NULL, complete_late, done);
    pthread_detach(thread);
}

int PMIx_Fence_nb(const void *procs, size_t nprocs, const void *info, size_t ninfo,
                  op_cbfunc cbfunc, void *cbdata) {
    static fence_nb_fn real;
    if (!real) {
        /* libpmix arrives by dlopen (mpi4py, libmpi, libpmix): not in RTLD_NEXT's scope */
        void *lib = dlopen("libpmix.so.2", RTLD_NOW | RTLD_NOLOAD);
        real = (fence_nb_fn)dlsym(lib ? lib : RTLD_NEXT, "PMIx_Fence_nb");
        if (!real) {
            fprintf(stderr, "late_fence: no PMIx_Fence_nb in this process\n");
            abort();
        }
    }
    const char *late = getenv("LATE_FENCE_RANK"), *rank = getenv("PMIX_RANK");
    if (cbfunc && late && rank && atoi(late) == atoi(rank)) {
        struct completion *done = malloc(sizeof *done);
        done->cbfunc = cbfunc;
        done->cbdata = cbdata;
        return real(procs, nprocs, info, ninfo, fence_complete, done);
    }
    return real(procs, nprocs, info, ninfo, cbfunc, cbdata);
}
