"""What cuFileDriverOpen costs a process that already uses CUDA (time, device memory, threads,
files): the step ferry's automatic route ran in every process before choosing staged."""
import ctypes, ctypes.util, glob, os, sys, time
import torch
torch.cuda.init()
x = torch.ones(1, device="cuda:0")
torch.cuda.synchronize()
def free():
    f, t = torch.cuda.mem_get_info(0)
    return f
def threads():
    return len(os.listdir("/proc/self/task"))
names = ["libcufile.so.0", "libcufile.so"] + glob.glob("/usr/local/cuda*/lib64/libcufile.so*") + glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcufile.so*"))
lib = None
for n in names:
    try:
        t = time.perf_counter()
        lib = ctypes.CDLL(n)
        print(f"loaded {n} in {(time.perf_counter() - t) * 1000:.1f} ms")
        break
    except OSError:
        pass
if lib is None:
    print("no libcufile"); sys.exit(1)
before_files = set(os.listdir("."))
f0, th0 = free(), threads()
t = time.perf_counter()
class Err(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]
lib.cuFileDriverOpen.restype = Err
r = lib.cuFileDriverOpen()
dt = time.perf_counter() - t
time.sleep(0.5)
f1, th1 = free(), threads()
print(f"cuFileDriverOpen: err {r.err}, {dt*1000:.1f} ms, device memory used +{(f0-f1)/2**20:.1f} MiB, threads {th0} -> {th1}, new files {sorted(set(os.listdir('.')) - before_files)}")
