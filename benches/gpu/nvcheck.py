"""Compile one of our CUDA C++ kernels (kernels/*.cu) for sm_90a on a machine without a GPU:
NVRTC as CubeCL calls it, then ptxas for registers, spills and shared memory.

Setup (once, from PyPI): python3 -m venv /tmp/nv && /tmp/nv/bin/pip install
nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12
Usage: /tmp/nv/bin/python benches/gpu/nvcheck.py kernels/bf16_conv.cu 'NB=4 XH=80 ...'
(the constants the kernel's Rust side prepends, NAME=VALUE separated by spaces)."""
import ctypes, glob, os, subprocess, sys, tempfile

site = next(p for p in sys.path if p.endswith("site-packages"))
nvidia = os.path.join(site, "nvidia")
nvrtc = ctypes.CDLL(glob.glob(os.path.join(nvidia, "cuda_nvrtc/lib/libnvrtc.so.*"))[0])
defines = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in sys.argv[2].split())
src = (defines + open(sys.argv[1]).read()).encode()
prog = ctypes.c_void_p()
nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernel.cu", 0, None, None)
opts = [b"--gpu-architecture=sm_90a", b"-lineinfo"]
rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
size = ctypes.c_size_t()
nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
nvrtc.nvrtcGetProgramLog(prog, log)
print(log.value.decode())
if rc != 0:
    sys.exit(f"NVRTC failed ({rc})")
nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
ptx = ctypes.create_string_buffer(size.value)
nvrtc.nvrtcGetPTX(prog, ptx)
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "kernel.ptx")
    open(path, "wb").write(ptx.value)
    ptxas = os.path.join(nvidia, "cuda_nvcc/bin/ptxas")
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                         capture_output=True, text=True)
    print(out.stdout + out.stderr)
    sys.exit(out.returncode)
