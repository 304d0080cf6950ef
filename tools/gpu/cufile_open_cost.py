"""What cuFileDriverOpen costs a process that already uses CUDA: milliseconds, device memory,
threads and the files it writes into the working directory. ferry's automatic route skips this
step where nvidia-fs is absent (src/transfer/transfer.cpp); `--backend cufile`, GdsFile and
`ferry doctor` take it. Run from a scratch folder: python3 tools/gpu/cufile_open_cost.py"""
import ctypes
import glob
import os
import sys
import time

import torch


class CuFileError(ctypes.Structure):  # CUfileError_t
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


def free_device_bytes():
    return torch.cuda.mem_get_info(0)[0]


def thread_count():
    return len(os.listdir("/proc/self/task"))


def load_cufile():
    candidates = (["libcufile.so.0", "libcufile.so"] + glob.glob("/usr/local/cuda*/lib64/libcufile.so*")
                  + glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib",
                                           "libcufile.so*")))
    for name in candidates:
        try:
            started = time.perf_counter()
            lib = ctypes.CDLL(name)
            print(f"loaded {name} in {(time.perf_counter() - started) * 1000:.1f} ms")
            return lib
        except OSError:
            pass
    sys.exit("no libcufile found")


def main():
    torch.ones(1, device="cuda:0")  # the process uses CUDA already, as a server does
    torch.cuda.synchronize()
    lib = load_cufile()
    lib.cuFileDriverOpen.restype = CuFileError
    files, free, threads = set(os.listdir(".")), free_device_bytes(), thread_count()
    started = time.perf_counter()
    result = lib.cuFileDriverOpen()
    seconds = time.perf_counter() - started
    time.sleep(0.5)  # threads it starts in the background
    print(f"cuFileDriverOpen: err {result.err}, {seconds * 1000:.1f} ms, device memory used "
          f"+{(free - free_device_bytes()) / 2**20:.1f} MiB, threads {threads} -> {thread_count()}, "
          f"new files {sorted(set(os.listdir('.')) - files)}")


if __name__ == "__main__":
    main()
