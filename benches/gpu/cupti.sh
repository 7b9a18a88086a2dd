# Sourced by the GPU scripts that read CUPTI (the launch census, `bench-conv`): puts libcupti on
# LD_LIBRARY_PATH. CUPTI ships with the toolkit (extras/CUPTI) and in the nvidia-cuda-cupti wheel.
for d in /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64 \
  $(python3 -c 'import nvidia.cuda_cupti, os; print(os.path.join(list(nvidia.cuda_cupti.__path__)[0], "lib"))' 2>/dev/null); do
  ls "$d"/libcupti.so* >/dev/null 2>&1 && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && echo "cupti: $d" && break
done
