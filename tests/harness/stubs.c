/* What HAMi-core's region code calls outside itself, for a harness with no GPU:
 * NVML answers "no device, no process", CUDA device i is NVML device i, and the
 * shim's log level is its quietest. None of it touches the region. */
#include <stddef.h>
#include "nvml.h"

int g_log_level = 0;

const char *nvmlErrorString(nvmlReturn_t result) { (void)result; return "stub"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { *count = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    (void)index; *device = NULL; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    (void)device; if (length) uuid[0] = '\0'; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos) {
    (void)device; (void)infos; *count = 0; return NVML_SUCCESS;
}
unsigned int cuda_to_nvml_map(unsigned int cudadev) { return cudadev; }
int setspec(void) { return 0; }
