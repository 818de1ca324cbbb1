/* Random puts and takes on the limiter's allocation table against a plain array: every take
 * must find exactly what the reference holds (deletions shift probe runs, so this is the part
 * worth checking by brute force). Exit 0 when they agree. */
#include <stdio.h>
#include <stdlib.h>

#include "limiter.h"

#define KEYS 3000
#define STEPS 200000

int main(void)
{
    static uint64_t held[2][KEYS]; /* bytes by kind and key, 0 when absent */
    unsigned int seed = 12345;
    for (long step = 0; step < STEPS; step++) {
        int kind = (rand_r(&seed) & 1) ? KIND_POINTER : KIND_HANDLE;
        uint64_t k = (uint64_t)(rand_r(&seed) % KEYS);
        uint64_t key = kind == KIND_POINTER ? 0x7f0000000000ull + (k << 21) : k; /* real-looking spacing */
        if (rand_r(&seed) % 3) {
            struct allocation a = {key, (uint64_t)step + 1, (int)(k % 4), kind}, stale;
            int replaced = table_put(&a, &stale);
            if (replaced != (held[kind - 1][k] != 0) || (replaced && stale.bytes != held[kind - 1][k])) {
                printf("put mismatch at step %ld\n", step);
                return 1;
            }
            held[kind - 1][k] = a.bytes;
        } else {
            struct allocation out;
            int found = table_take(kind, key, &out);
            if (found != (held[kind - 1][k] != 0) || (found && (out.bytes != held[kind - 1][k] || out.key != key))) {
                printf("take mismatch at step %ld\n", step);
                return 1;
            }
            held[kind - 1][k] = 0;
        }
    }
    for (int kind = 1; kind <= 2; kind++)
        for (uint64_t k = 0; k < KEYS; k++) {
            struct allocation out;
            uint64_t key = kind == KIND_POINTER ? 0x7f0000000000ull + (k << 21) : k;
            if (table_take(kind, key, &out) != (held[kind - 1][k] != 0)) {
                printf("final mismatch kind %d key %llu\n", kind, (unsigned long long)k);
                return 1;
            }
        }
    printf("table agrees with the reference over %d steps\n", STEPS);
    return 0;
}
