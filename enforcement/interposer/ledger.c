/* The container's ledger: what each of its processes holds on each device.
 *
 * One small file in GPUSLICE_SLICE_STATE_DIR, mapped shared by every process of the container;
 * one slot per process (pid, start time, bytes per device). Every read-modify-write happens under
 * flock(2) on that file, which the kernel drops when its holder dies, so a crash can never leave
 * the ledger locked; a slot is only ever written by its own process (or swept, below).
 *
 * Liveness is a lock, not a PID: each process holds an open-file-description lock on one byte of
 * its slot for as long as it lives; the kernel releases it when the process dies however it dies
 * (SIGKILL, OOM killer), and it means the same in every PID namespace sharing the directory (the
 * containers of one pod). Whoever next needs the figure (a query, or a charge that would not fit)
 * sweeps the slots nobody holds, and so takes a dead process's share back. Where the filesystem
 * has no such locks, the sweep falls back to the PID: gone, a zombie, or reused (another start
 * time). The driver frees a dead process's memory at exit: the sweep only catches up with it.
 *
 * Without a usable state directory the process is accounted alone against the cap (and says so
 * once on stderr): the slice still gets a cap per process; the agent's watchdog, which sums the
 * whole container from NVML, stays the authority. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "limiter.h"

#define LEDGER_DEVICES 16
#define LEDGER_SLOTS 128
#define LEDGER_FILE "gpuslice-ledger.v1"
#define LEDGER_MAGIC "GPUSLICE"
#define LEDGER_VERSION 1u

struct slot {
    int32_t pid;         /* 0: free */
    uint32_t attached;   /* devices where this process's context reserve is charged (bit mask) */
    uint64_t start_time; /* /proc/<pid>/stat field 22, 0 where /proc cannot be read */
    uint64_t bytes[LEDGER_DEVICES];
};

struct area {
    char magic[8];
    uint32_t version;
    uint32_t devices;
    unsigned char uuid[LEDGER_DEVICES][16];
    struct slot slot[LEDGER_SLOTS];
};

static struct {
    pthread_mutex_t mutex; /* flock serialises processes, not the threads sharing one descriptor */
    pid_t pid;             /* the process that opened the ledger: any other is a forked child */
    int fd;                /* -1: private */
    int byte_locks;        /* the filesystem has OFD locks: liveness by lock, not by PID */
    struct area *area;
    int self;
    uint64_t start_time;
} L = {PTHREAD_MUTEX_INITIALIZER, 0, -1, 1, NULL, -1, 0};

static struct area private_area;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void before_fork(void) { pthread_mutex_lock(&L.mutex); }
static void after_fork(void) { pthread_mutex_unlock(&L.mutex); }
static void watch_forks(void) { pthread_atfork(before_fork, after_fork, after_fork); }

/* Field 22 (start time) and the state of /proc/<pid>/stat; 0 when it cannot be read. */
static uint64_t start_time_of(pid_t pid, char *state)
{
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    char *p = strrchr(text, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL || p[1] != ' ')
        return 0;
    p += 2;
    if (state)
        *state = *p;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

/* The byte of the ledger file that stands for slot i's owner being alive. */
static struct flock slot_lock(int i, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(offsetof(struct area, slot) + (size_t)i * sizeof(struct slot));
    fl.l_len = 1;
    return fl;
}

static int alive(int i)
{
    const struct slot *s = &L.area->slot[i];
    if (L.fd >= 0 && L.byte_locks) {
        struct flock fl = slot_lock(i, F_WRLCK);
        if (fcntl(L.fd, F_OFD_GETLK, &fl) == 0)
            return fl.l_type != F_UNLCK;
    }
    if (kill(s->pid, 0) != 0 && errno == ESRCH)
        return 0;
    if (L.start_time == 0 || s->start_time == 0)
        return 1; /* no /proc to tell a reused pid by: trust kill(2) */
    char state = '?';
    uint64_t started = start_time_of(s->pid, &state);
    return started == s->start_time && state != 'Z' && state != 'X';
}

static void use_private(const char *why, const char *detail)
{
    if (why)
        limiter_warn(why, detail);
    memset(&private_area, 0, sizeof private_area);
    L.fd = -1;
    L.area = &private_area;
}

static void open_shared(void)
{
    const char *dir = limiter_config()->state_dir;
    if (dir == NULL) {
        use_private("GPUSLICE_SLICE_STATE_DIR is not set: accounting this process alone against the cap", NULL);
        return;
    }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, LEDGER_FILE) >= sizeof path) {
        use_private("GPUSLICE_SLICE_STATE_DIR is too long: accounting this process alone", dir);
        return;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        use_private("cannot open the ledger, accounting this process alone", strerror(errno));
        return;
    }
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
        ;
    struct stat st;
    const char *bad = NULL;
    int fresh = 0;
    if (fstat(fd, &st) != 0)
        bad = strerror(errno);
    else if (st.st_size == 0) {
        fresh = 1;
        if (ftruncate(fd, sizeof(struct area)) != 0)
            bad = strerror(errno);
        (void)fchmod(fd, 0666); /* every user of the container shares it; the directory is private */
    } else if ((size_t)st.st_size != sizeof(struct area))
        bad = "it has another size: another version of the limiter made it";
    struct area *area = MAP_FAILED;
    if (bad == NULL && (area = mmap(NULL, sizeof(struct area), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        bad = strerror(errno);
    if (bad == NULL) {
        static const char zero[8];
        if (fresh || memcmp(area->magic, zero, sizeof zero) == 0) { /* a creator that died half-way left zeros */
            memcpy(area->magic, LEDGER_MAGIC, sizeof area->magic);
            area->version = LEDGER_VERSION;
        } else if (memcmp(area->magic, LEDGER_MAGIC, sizeof area->magic) != 0 || area->version != LEDGER_VERSION)
            bad = "it is not a ledger of this version";
    }
    flock(fd, LOCK_UN);
    if (bad != NULL) {
        if (area != MAP_FAILED)
            munmap(area, sizeof(struct area));
        close(fd);
        use_private("unusable ledger in GPUSLICE_SLICE_STATE_DIR, accounting this process alone", bad);
        return;
    }
    L.fd = fd;
    L.area = area;
}

static void lock(void)
{
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&L.mutex);
    pid_t me = getpid();
    if (L.area == NULL || L.pid != me) {
        /* first use, or a forked child: the parent's slot and descriptor are not ours */
        if (L.area != NULL && L.fd >= 0) {
            munmap(L.area, sizeof(struct area));
            close(L.fd);
        }
        L.pid = me;
        L.self = -1;
        L.start_time = start_time_of(me, NULL);
        open_shared();
    }
    if (L.fd >= 0)
        while (flock(L.fd, LOCK_EX) != 0 && errno == EINTR)
            ;
}

static void unlock(void)
{
    if (L.fd >= 0)
        flock(L.fd, LOCK_UN);
    pthread_mutex_unlock(&L.mutex);
}

static void sweep(void)
{
    for (int i = 0; i < LEDGER_SLOTS; i++) {
        struct slot *s = &L.area->slot[i];
        if (i != L.self && s->pid != 0 && !alive(i))
            memset(s, 0, sizeof *s);
    }
}

/* Holds slot i's liveness byte for this process's lifetime; 0 when it is ours now. */
static int hold(int i)
{
    if (L.fd < 0 || !L.byte_locks)
        return 0;
    struct flock fl = slot_lock(i, F_WRLCK);
    if (fcntl(L.fd, F_OFD_SETLK, &fl) == 0)
        return 0;
    if (errno == EAGAIN || errno == EACCES)
        return -1; /* a live process still holds it (its slot was swept by a PID guess) */
    L.byte_locks = 0; /* no OFD locks on this filesystem: PIDs it is */
    return 0;
}

static int claim_self(void)
{
    if (L.self >= 0)
        return L.self;
    struct slot *slots = L.area->slot;
    for (int i = 0; i < LEDGER_SLOTS && L.self < 0; i++)
        if (slots[i].pid == L.pid && slots[i].start_time == L.start_time && !alive(i) && hold(i) == 0)
            L.self = i; /* our own slot from before an exec: that image's memory went with it */
    for (int pass = 0; pass < 2 && L.self < 0; pass++) {
        if (pass == 1)
            sweep();
        for (int i = 0; i < LEDGER_SLOTS && L.self < 0; i++)
            if (slots[i].pid == 0 && hold(i) == 0)
                L.self = i;
    }
    if (L.self < 0) {
        flock(L.fd, LOCK_UN);
        munmap(L.area, sizeof(struct area));
        close(L.fd);
        use_private("the ledger has no free slot, accounting this process alone", NULL);
        L.self = 0;
    }
    struct slot *s = &L.area->slot[L.self];
    memset(s, 0, sizeof *s);
    s->start_time = L.start_time;
    s->pid = L.pid;
    return L.self;
}

static int find_device(const unsigned char uuid[16], int claim)
{
    struct area *a = L.area;
    for (uint32_t i = 0; i < a->devices && i < LEDGER_DEVICES; i++)
        if (memcmp(a->uuid[i], uuid, 16) == 0)
            return (int)i;
    if (!claim || a->devices >= LEDGER_DEVICES)
        return LEDGER_NO_DEVICE;
    memcpy(a->uuid[a->devices], uuid, 16);
    return (int)a->devices++;
}

static void attach(int self, int device)
{
    struct slot *s = &L.area->slot[self];
    if (!(s->attached & (1u << device))) {
        s->attached |= 1u << device;
        s->bytes[device] += limiter_config()->context_bytes;
    }
}

static uint64_t total(int device)
{
    uint64_t sum = 0;
    for (int i = 0; i < LEDGER_SLOTS; i++)
        if (L.area->slot[i].pid != 0)
            sum += L.area->slot[i].bytes[device];
    return sum;
}

static int fits(uint64_t used, uint64_t bytes)
{
    uint64_t cap = limiter_config()->cap_bytes;
    return bytes <= cap && used <= cap - bytes;
}

int ledger_charge(const unsigned char uuid[16], uint64_t bytes, int *device)
{
    lock();
    int dev = find_device(uuid, 1);
    *device = dev;
    if (dev == LEDGER_NO_DEVICE) {
        unlock();
        return 0; /* a 17th device: not accounted here, the watchdog still is */
    }
    int self = claim_self();
    attach(self, dev);
    int ok = fits(total(dev), bytes);
    if (!ok) {
        sweep(); /* only now: a lock query per slot on every allocation would be waste */
        ok = fits(total(dev), bytes);
    }
    if (ok)
        L.area->slot[self].bytes[dev] += bytes;
    unlock();
    return ok ? 0 : -1;
}

void ledger_refund(int device, uint64_t bytes)
{
    if (device < 0 || device >= LEDGER_DEVICES)
        return;
    lock();
    if (L.self >= 0) {
        uint64_t *held = &L.area->slot[L.self].bytes[device];
        *held -= bytes < *held ? bytes : *held;
    }
    unlock();
}

uint64_t ledger_used(const unsigned char uuid[16], int attach_here)
{
    lock();
    int dev = find_device(uuid, attach_here);
    uint64_t used = 0;
    if (dev != LEDGER_NO_DEVICE) {
        if (attach_here)
            attach(claim_self(), dev);
        sweep();
        used = total(dev);
    }
    unlock();
    return used;
}
