/* The simulated cards' bookkeeping: per process and card, the bytes it holds (its context
 * included). As with the real driver, a process that exits, however it exits, gives all of its
 * memory back: holders whose pid is gone (or a zombie) are dropped whenever the cards are read. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include "card.h"

#define HOLDERS 256

struct holder {
    int32_t pid;
    uint32_t unused;
    uint64_t bytes[CARD_MAX];
};

struct cards {
    struct holder holder[HOLDERS];
};

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static struct cards *cards;
static struct cards private_cards;
static int fd = -1;

static long env_number(const char *name, long fallback)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : fallback;
}

int card_count(void)
{
    long n = env_number("FAKEGPU_DEVICES", 1);
    return n < 1 ? 1 : n > CARD_MAX ? CARD_MAX : (int)n;
}

int card_of_ordinal(int ordinal)
{
    const char *order = getenv("FAKEGPU_ORDER");
    return order && strcmp(order, "reversed") == 0 ? card_count() - 1 - ordinal : ordinal;
}

void card_uuid(int card, unsigned char uuid[16])
{
    static const unsigned char base[16] = {0x5a, 0x1e, 0xc0, 0xde, 0x00, 0x00, 0x4c, 0x0f,
                                           0x9d, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(uuid, base, 16);
    uuid[15] = (unsigned char)(0xa0 + card);
}

uint64_t card_context_bytes(void) { return (uint64_t)env_number("FAKEGPU_CONTEXT_MIB", 300) << 20; }

int card_no_device(void)
{
    const char *v = getenv("FAKEGPU_NO_DEVICE");
    return v && strcmp(v, "1") == 0;
}

static int dead(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return 0;
    ssize_t n = read(f, text, sizeof text - 1);
    close(f);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    char *p = strrchr(text, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static void enter(void)
{
    pthread_mutex_lock(&mutex);
    if (cards == NULL) {
        const char *path = getenv("FAKEGPU_STATE");
        cards = &private_cards;
        if (path && *path) {
            fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
            if (fd < 0 || ftruncate(fd, sizeof(struct cards)) != 0) {
                perror("fakegpu: FAKEGPU_STATE");
                abort();
            }
            void *map = mmap(NULL, sizeof(struct cards), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED) {
                perror("fakegpu: mmap");
                abort();
            }
            cards = map;
        }
    }
    if (fd >= 0)
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
            ;
    for (int i = 0; i < HOLDERS; i++)
        if (cards->holder[i].pid != 0 && dead(cards->holder[i].pid))
            memset(&cards->holder[i], 0, sizeof cards->holder[i]);
}

static void leave(void)
{
    if (fd >= 0)
        flock(fd, LOCK_UN);
    pthread_mutex_unlock(&mutex);
}

static struct holder *me(void)
{
    pid_t pid = getpid();
    struct holder *free_one = NULL;
    for (int i = 0; i < HOLDERS; i++) {
        if (cards->holder[i].pid == pid)
            return &cards->holder[i];
        if (cards->holder[i].pid == 0 && free_one == NULL)
            free_one = &cards->holder[i];
    }
    if (free_one == NULL) {
        fputs("fakegpu: too many processes\n", stderr);
        abort();
    }
    free_one->pid = pid;
    return free_one;
}

static uint64_t used_locked(int card)
{
    uint64_t sum = CARD_RESERVED;
    for (int i = 0; i < HOLDERS; i++)
        if (cards->holder[i].pid != 0)
            sum += cards->holder[i].bytes[card];
    return sum;
}

uint64_t card_used(int card)
{
    enter();
    uint64_t used = used_locked(card);
    leave();
    return used;
}

int card_take(int card, uint64_t bytes)
{
    enter();
    uint64_t used = used_locked(card);
    int ok = bytes <= CARD_TOTAL - used;
    if (ok)
        me()->bytes[card] += bytes;
    leave();
    return ok ? 0 : -1;
}

void card_give(int card, uint64_t bytes)
{
    enter();
    uint64_t *held = &me()->bytes[card];
    *held -= bytes < *held ? bytes : *held;
    leave();
}

int card_processes(int card, unsigned int *pids, unsigned long long *bytes, int max)
{
    enter();
    int n = 0;
    for (int i = 0; i < HOLDERS; i++) {
        const struct holder *h = &cards->holder[i];
        if (h->pid != 0 && h->bytes[card] > 0) {
            if (n < max) {
                pids[n] = (unsigned int)h->pid;
                bytes[n] = h->bytes[card];
            }
            n++;
        }
    }
    leave();
    return n;
}
