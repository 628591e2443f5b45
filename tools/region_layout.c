/*
 * Prints the layout of HAMi-core's shared accounting region as JSON:
 * every offset and size the node agent's reader uses, taken from the
 * header itself (offsetof/sizeof), so the committed table is the
 * compiler's and not a hand count.
 *
 * Build against a HAMi-core checkout (tools/region_layout.sh does this):
 *   cc -std=gnu11 -I tools/region_stubs -I $HAMI/src -o layout tools/region_layout.c
 * tools/region_stubs/ stands in for the two headers the region's header
 * includes but does not need for its layout: <cuda.h> (one pointer type,
 * CUcontext, used outside shared_region_t) and "static_config.h"
 * (made by CMake).
 */
#include <stdio.h>
#include <stddef.h>
#include "multiprocess/multiprocess_memory_limit.h"

#define FIELD(type, field) \
    printf("    \"%s\": {\"offset\": %zu, \"size\": %zu},\n", #field, \
           offsetof(type, field), sizeof(((type *)0)->field))
#define LAST(type, field) \
    printf("    \"%s\": {\"offset\": %zu, \"size\": %zu}\n", #field, \
           offsetof(type, field), sizeof(((type *)0)->field))

int main(void) {
    printf("{\n");
    printf("  \"magic\": %d,\n", MULTIPROCESS_SHARED_REGION_MAGIC_FLAG);
    printf("  \"major_version\": %d,\n", MAJOR_VERSION);
    printf("  \"minor_version\": %d,\n", MINOR_VERSION);
    printf("  \"device_max\": %d,\n", CUDA_DEVICE_MAX_COUNT);
    printf("  \"process_max\": %d,\n", SHARED_REGION_MAX_PROCESS_NUM);
    printf("  \"region_size\": %zu,\n", sizeof(shared_region_t));
    printf("  \"slot_size\": %zu,\n", sizeof(shrreg_proc_slot_t));
    printf("  \"device_memory_size\": %zu,\n", sizeof(device_memory_t));
    printf("  \"device_util_size\": %zu,\n", sizeof(device_util_t));
    printf("  \"region\": {\n");
    FIELD(shared_region_t, initialized_flag);
    FIELD(shared_region_t, major_version);
    FIELD(shared_region_t, minor_version);
    FIELD(shared_region_t, sm_init_flag);
    FIELD(shared_region_t, owner_pid);
    FIELD(shared_region_t, sem);
    FIELD(shared_region_t, device_num);
    FIELD(shared_region_t, uuids);
    FIELD(shared_region_t, limit);
    FIELD(shared_region_t, sm_limit);
    FIELD(shared_region_t, procs);
    FIELD(shared_region_t, proc_num);
    FIELD(shared_region_t, utilization_switch);
    FIELD(shared_region_t, recent_kernel);
    FIELD(shared_region_t, priority);
    FIELD(shared_region_t, last_kernel_time);
    LAST(shared_region_t, sem_postinit);
    printf("  },\n");
    printf("  \"slot\": {\n");
    FIELD(shrreg_proc_slot_t, pid);
    FIELD(shrreg_proc_slot_t, hostpid);
    FIELD(shrreg_proc_slot_t, used);
    FIELD(shrreg_proc_slot_t, monitorused);
    FIELD(shrreg_proc_slot_t, device_util);
    FIELD(shrreg_proc_slot_t, status);
    LAST(shrreg_proc_slot_t, seqlock);
    printf("  },\n");
    printf("  \"device_memory\": {\n");
    FIELD(device_memory_t, context_size);
    FIELD(device_memory_t, module_size);
    FIELD(device_memory_t, data_size);
    LAST(device_memory_t, total);
    printf("  },\n");
    printf("  \"device_util\": {\n");
    LAST(device_util_t, sm_util);
    printf("  }\n");
    printf("}\n");
    return 0;
}
