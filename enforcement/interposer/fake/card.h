/* A simulated node of V100-SXM2-32GB cards, for the tests: what the fake libcuda.so.1 and
 * libnvidia-ml.so.1 share, like the real ones share the kernel driver.
 *
 * Test-only environment (never read by the limiter):
 *   FAKEGPU_STATE        file holding the cards' bookkeeping, shared by every process using it
 *                        (unset: private to the process)
 *   FAKEGPU_DEVICES      number of cards, 1..4 (default 1)
 *   FAKEGPU_ORDER        "reversed": CUDA ordinal i is NVML index n-1-i (as CUDA_DEVICE_ORDER may do)
 *   FAKEGPU_CONTEXT_MIB  what a CUDA context takes on its card (default 300)
 *   FAKEGPU_NO_DEVICE    "1": a driver library with no GPU behind it (cuInit -> NO_DEVICE) */
#ifndef FAKEGPU_CARD_H
#define FAKEGPU_CARD_H

#include <stdint.h>

#define CARD_MAX 4
#define CARD_TOTAL (32ull << 30)
#define CARD_RESERVED (256ull << 20) /* the driver's own share: never free */
#define CARD_NAME "Tesla V100-SXM2-32GB"

int card_count(void);
int card_of_ordinal(int ordinal); /* CUDA ordinal -> card (NVML index) */
void card_uuid(int card, unsigned char uuid[16]);
uint64_t card_context_bytes(void);
int card_no_device(void);

uint64_t card_used(int card);                   /* by every live process, the reserve included */
int card_take(int card, uint64_t bytes);        /* 0, or -1 when the card is full */
void card_give(int card, uint64_t bytes);
int card_processes(int card, unsigned int *pids, unsigned long long *bytes, int max); /* live holders */

#endif
