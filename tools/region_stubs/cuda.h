/* Stand-in for <cuda.h>: the region's header needs only this pointer type,
 * and only outside shared_region_t, so the layout does not depend on it. */
#ifndef GPUSHARE_REGION_STUB_CUDA_H
#define GPUSHARE_REGION_STUB_CUDA_H
typedef struct CUctx_st *CUcontext;
#endif
