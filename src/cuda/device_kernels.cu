// Every kernel of ferry in one translation unit, so nvcc makes one PTX module and the driver
// loads it once per device (device_kernels.cpp).
#include "cuda/copy_matched.cu"
#include "cuda/xxh3_blocks.cu"
