// How long pinning host memory takes, by method: cuMemHostAlloc, and mmap (+ MADV_HUGEPAGE)
// followed by cuMemHostRegister. Build on the GPU machine:
//   g++ -O2 -std=c++20 bench/transfer/pinned_alloc.cpp -I/usr/local/cuda/include -lcuda -o pinned_alloc
#include <cuda.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
  cuInit(0);
  CUdevice dev;
  CUcontext ctx;
  cuDeviceGet(&dev, 0);
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  for (size_t mib : {32, 64, 128, 256}) {
    const size_t bytes = mib << 20;
    for (int rep = 0; rep < 2; ++rep) {
      void* p = nullptr;
      double t = now();
      CUresult r = cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE);
      const double alloc = now() - t;
      cuMemFreeHost(p);
      for (bool huge : {false, true}) {
        void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        t = now();
        if (huge) madvise(m, bytes, MADV_HUGEPAGE);
        CUresult r2 = cuMemHostRegister(m, bytes, CU_MEMHOSTREGISTER_PORTABLE);
        const double reg = now() - t;
        std::printf("%4zu MiB: cuMemHostAlloc %.1f ms (%d)  mmap%s+cuMemHostRegister %.1f ms (%d)\n", mib,
                    alloc * 1e3, r, huge ? "+hugepage" : "", reg * 1e3, r2);
        cuMemHostUnregister(m);
        munmap(m, bytes);
      }
    }
  }
}
