// A convolution without groups as an implicit GEMM on the tensor cores: BF16 operands, FP32
// accumulators, the result written in FP32 (OUT_BF16 0) or BF16 (OUT_BF16 1). Hand-written
// CUDA C++ (`kernels/bf16_conv.rs` prepends the problem as constants). With DGRAD 1 it is the
// data gradient of a stride-1 convolution: x is then the output gradient, w the weight with its
// in and out channels swapped (`[c, i, j, o]`), and tap (i, j) of input pixel (y, x) reads the
// output gradient at (y + PT − i·DH, x + PL − j·DW).
//
//   out[p, o] = Σ_{i, j, c} x[n, oy·SH + i·DH − PT, ox·SW + j·DW − PL, c] · w[o, i, j, c]
//
// over output pixels p = (n, oy, ox) (GEMM rows, M = NB·HO·WO), output channels o (columns,
// GN) and K = KH·KW·CP (tap-major, channels inner): x is channels-last with CP channels (a
// multiple of 8, strides SXN SXH SXW, channels contiguous), w `[o, i, j, c]` (strides SWO SWI
// SWJ, channels contiguous), out dense `[NB, HO, WO, GN]`. Taps in the padding read zero.
//
// Tiles: 128 pixels × 64 channels × 32 K, 256 threads in 4 × 2 warps of 32 × 32, each warp
// 2 × 4 `mma.sync.m16n8k16` BF16 products a K step of 16. Operands move 8 channels (16 bytes)
// a load, global → registers for the next K tile while the current one is multiplied → shared
// (two buffers, one barrier a tile). Shared rows are 40 values (20 words): the fragments'
// reads (row = lane / 4, word = lane % 4) hit 32 different banks. Each output value is one
// thread's sum over K in order: deterministic.

typedef unsigned int u32;
typedef unsigned short u16;

#define BM 128
#define BN 64
#define BK 32
#define ROW (BK + 8)
#define THREADS 256
#define GM (NB * HO * WO)
#define GK (KH * KW * CP)

__device__ __forceinline__ void mma_bf16(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ u16 to_bf16(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
}

// The 8 input values (16 bytes) of pixel `m` at K index `k` (a multiple of 8), zero outside.
__device__ __forceinline__ uint4 x_at(const u16* __restrict__ x, int m, int k) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (m >= GM || k >= GK) return zero;
    const int n = m / (HO * WO);
    const int rest = m % (HO * WO);
    const int oy = rest / WO, ox = rest % WO;
    const int tap = k / CP, c = k % CP;
#if DGRAD
    const int iy = oy + PT - (tap / KW) * DH;
    const int ix = ox + PL - (tap % KW) * DW;
#else
    const int iy = oy * SH + (tap / KW) * DH - PT;
    const int ix = ox * SW + (tap % KW) * DW - PL;
#endif
    if (iy < 0 || iy >= XH || ix < 0 || ix >= XW) return zero;
    return *reinterpret_cast<const uint4*>(
        x + (long long)n * SXN + (long long)iy * SXH + (long long)ix * SXW + c);
}

// The 8 weights (16 bytes) of output channel `o` at K index `k` (a multiple of 8), zero outside.
__device__ __forceinline__ uint4 w_at(const u16* __restrict__ w, int o, int k) {
    if (o >= GN || k >= GK) return make_uint4(0, 0, 0, 0);
    const int tap = k / CP, c = k % CP;
    return *reinterpret_cast<const uint4*>(
        w + (long long)o * SWO + (long long)(tap / KW) * SWI + (long long)(tap % KW) * SWJ + c);
}

extern "C" __global__ void __launch_bounds__(THREADS)
burnpose_bf16_conv(const u16* __restrict__ x, const u16* __restrict__ w, void* __restrict__ out) {
    __shared__ __align__(16) u16 As[2][BM][ROW];
    __shared__ __align__(16) u16 Bs[2][BN][ROW];

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int wm = (warp >> 1) * 32;
    const int wn = (warp & 1) * 32;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;

    // Vector `v` of a tile: row v / 4, K offset (v % 4) · 8. A: v = tid and tid + 256; B: tid.
    uint4 ra[2];
    uint4 rb;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int tiles = (GK + BK - 1) / BK;

#define LOAD(kt)                                                                              \
    {                                                                                         \
        const int k0 = (kt) * BK;                                                             \
        _Pragma("unroll") for (int j = 0; j < 2; ++j) {                                       \
            const int v = tid + j * THREADS;                                                  \
            ra[j] = x_at(x, m0 + v / 4, k0 + (v % 4) * 8);                                    \
        }                                                                                     \
        rb = w_at(w, n0 + tid / 4, k0 + (tid % 4) * 8);                                       \
    }
#define STORE(s)                                                                              \
    {                                                                                         \
        _Pragma("unroll") for (int j = 0; j < 2; ++j) {                                       \
            const int v = tid + j * THREADS;                                                  \
            *reinterpret_cast<uint4*>(&As[s][v / 4][(v % 4) * 8]) = ra[j];                    \
        }                                                                                     \
        *reinterpret_cast<uint4*>(&Bs[s][tid / 4][(tid % 4) * 8]) = rb;                       \
    }

    LOAD(0);
    STORE(0);
    __syncthreads();

    for (int kt = 0; kt < tiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < tiles;
        if (more) LOAD(kt + 1);
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            u32 af[2][4];
            u32 bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = wm + i * 16 + g;
                af[i][0] = *reinterpret_cast<const u32*>(&As[cur][r][ks + 2 * t]);
                af[i][1] = *reinterpret_cast<const u32*>(&As[cur][r + 8][ks + 2 * t]);
                af[i][2] = *reinterpret_cast<const u32*>(&As[cur][r][ks + 2 * t + 8]);
                af[i][3] = *reinterpret_cast<const u32*>(&As[cur][r + 8][ks + 2 * t + 8]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = wn + j * 8 + g;
                bf[j][0] = *reinterpret_cast<const u32*>(&Bs[cur][n][ks + 2 * t]);
                bf[j][1] = *reinterpret_cast<const u32*>(&Bs[cur][n][ks + 2 * t + 8]);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], af[i], bf[j]);
        }
        if (more) STORE(cur ^ 1);
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = m0 + wm + i * 16 + g;
            const int col = n0 + wn + j * 8 + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = row + (e >> 1) * 8;
                const int q = col + (e & 1);
                if (r < GM && q < GN) {
#if OUT_BF16
                    reinterpret_cast<u16*>(out)[(long long)r * GN + q] = to_bf16(acc[i][j][e]);
#else
                    reinterpret_cast<float*>(out)[(long long)r * GN + q] = acc[i][j][e];
#endif
                }
            }
        }
    }
}
