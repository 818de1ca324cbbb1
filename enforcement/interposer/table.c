/* This process's live allocations (device pointers and VMM handles) with their size and device,
 * so that a free returns exactly what its allocation charged. Open addressing with linear
 * probing and backward-shift deletion (no tombstones); it doubles at 3/4 load. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "limiter.h"

static struct {
    pthread_mutex_t mutex;
    pid_t pid; /* a forked child starts empty: its parent's allocations are not its own */
    struct allocation *slots; /* kind 0: empty */
    size_t size;              /* a power of two, or 0 */
    size_t count;
} T = {PTHREAD_MUTEX_INITIALIZER, 0, NULL, 0, 0};

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void before_fork(void) { pthread_mutex_lock(&T.mutex); }
static void after_fork(void) { pthread_mutex_unlock(&T.mutex); }
static void watch_forks(void) { pthread_atfork(before_fork, after_fork, after_fork); }

static size_t home(int kind, uint64_t key, size_t size)
{
    uint64_t h = (key ^ (uint64_t)kind) * 0x9e3779b97f4a7c15ull; /* Fibonacci hashing */
    return (size_t)(h >> 32) & (size - 1);
}

static size_t find(int kind, uint64_t key)
{
    size_t i = home(kind, key, T.size);
    while (T.slots[i].kind != 0 && (T.slots[i].kind != kind || T.slots[i].key != key))
        i = (i + 1) & (T.size - 1);
    return i;
}

static int grow(void)
{
    size_t size = T.size ? T.size * 2 : 64;
    struct allocation *old = T.slots, *slots = calloc(size, sizeof *slots);
    if (slots == NULL)
        return -1;
    size_t old_size = T.size;
    T.slots = slots;
    T.size = size;
    for (size_t i = 0; i < old_size; i++)
        if (old[i].kind != 0)
            T.slots[find(old[i].kind, old[i].key)] = old[i];
    free(old);
    return 0;
}

static void enter(void)
{
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&T.mutex);
    if (T.pid != getpid()) {
        free(T.slots);
        T.slots = NULL;
        T.size = T.count = 0;
        T.pid = getpid();
    }
}

int table_put(const struct allocation *a, struct allocation *stale)
{
    enter();
    int replaced = 0;
    if ((T.count + 1) * 4 > T.size * 3 && grow() != 0) {
        pthread_mutex_unlock(&T.mutex);
        return -1; /* untracked: its charge stays until the process exits, never too little */
    }
    size_t i = find(a->kind, a->key);
    if (T.slots[i].kind != 0) {
        *stale = T.slots[i]; /* the driver reused an address we never saw freed */
        replaced = 1;
    } else
        T.count++;
    T.slots[i] = *a;
    pthread_mutex_unlock(&T.mutex);
    return replaced;
}

int table_take(int kind, uint64_t key, struct allocation *out)
{
    enter();
    if (T.size == 0) {
        pthread_mutex_unlock(&T.mutex);
        return 0;
    }
    size_t i = find(kind, key);
    int found = T.slots[i].kind != 0;
    if (found) {
        *out = T.slots[i];
        T.slots[i].kind = 0;
        T.count--;
        /* backward shift: pull later members of the probe run into the hole */
        size_t hole = i;
        for (size_t j = (i + 1) & (T.size - 1); T.slots[j].kind != 0; j = (j + 1) & (T.size - 1)) {
            size_t want = home(T.slots[j].kind, T.slots[j].key, T.size);
            /* j may move to hole if its home is not in the cyclic interval (hole, j] */
            if (((j - want) & (T.size - 1)) >= ((j - hole) & (T.size - 1))) {
                T.slots[hole] = T.slots[j];
                T.slots[j].kind = 0;
                hole = j;
            }
        }
    }
    pthread_mutex_unlock(&T.mutex);
    return found;
}
