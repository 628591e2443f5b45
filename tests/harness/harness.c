/* A process of a GPU container, as far as the shim's region goes: it opens its
 * region through HAMi-core's own code (multiprocess_memory_limit.c, compiled
 * unchanged beside stubs.c), adds USE bytes on device 0 as an allocation does,
 * and prints what the shim's checks read back: the limit and the SM share of
 * devices 0 and 15, and device 0's use summed over the region's processes.
 *
 *   harness [USE [hold]]   hold: keep the process (and its use) until stdin ends
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t get_current_device_memory_limit(const int dev);
int get_current_device_sm_limit(int dev);
int add_gpu_device_memory_usage(int32_t pid, int cudadev, size_t usage, int type);
uint64_t get_current_device_memory_usage(const int dev);

int main(int argc, char **argv) {
    size_t use = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
    int hold = argc > 2 && strcmp(argv[2], "hold") == 0;
    if (use > 0) {
        add_gpu_device_memory_usage(getpid(), 0, use, 2);
    }
    printf("limit=%llu limit15=%llu sm=%d sm15=%d used=%llu\n",
           (unsigned long long)get_current_device_memory_limit(0),
           (unsigned long long)get_current_device_memory_limit(15),
           get_current_device_sm_limit(0), get_current_device_sm_limit(15),
           (unsigned long long)get_current_device_memory_usage(0));
    fflush(stdout);
    if (hold) {
        char c;
        while (read(0, &c, 1) > 0) {
        }
    }
    return 0;
}
