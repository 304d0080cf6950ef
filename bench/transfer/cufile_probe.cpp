// Diagnoses cuFile on a machine: driver open, handle registration with and without O_DIRECT,
// and one read. Build on the GPU machine:
//   g++ -std=c++17 bench/transfer/cufile_probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64 \
//     -L/usr/local/cuda/lib64/stubs -lcufile -lcuda -o cufile_probe && ./cufile_probe FILE
#include <cuda.h>
#include <cufile.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  CUdevice device;
  CUcontext context;
  cuInit(0);
  cuDeviceGet(&device, 0);
  cuDevicePrimaryCtxRetain(&context, device);
  cuCtxSetCurrent(context);
  CUfileError_t e = cuFileDriverOpen();
  std::printf("cuFileDriverOpen: %d (cuda %d)\n", e.err, e.cu_err);
  for (int direct = 1; direct >= 0; --direct) {
    const int fd = open(argv[1], O_RDONLY | (direct ? O_DIRECT : 0));
    CUfileDescr_t descr{};
    descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    descr.handle.fd = fd;
    CUfileHandle_t handle;
    e = cuFileHandleRegister(&handle, &descr);
    std::printf("O_DIRECT=%d: cuFileHandleRegister %d (cuda %d)\n", direct, e.err, e.cu_err);
    if (e.err != 0) continue;
    CUdeviceptr p;
    cuMemAlloc(&p, 1 << 20);
    std::printf("  cuFileRead: %zd\n", cuFileRead(handle, reinterpret_cast<void*>(p), 1 << 20, 0, 0));
    cuFileHandleDeregister(handle);
    close(fd);
  }
}
