// C[b] = A[b] · B[b] in FP32 on the tensor cores (TF32 operands, FP32 accumulators), one
// block per BM × BN tile of one product, the whole K of that product in order: every output
// value is one thread's sum in a fixed order, so two runs give the same bits. Hand-written CUDA
// C++ (`kernels/tf32_gemm.rs` prepends the problem as constants: GM, GN, GK, the batch split
// NB1, the operands' element strides SA0 SA1 SAM SAK, SB0 SB1 SBK SBN, A_K_INNER / B_K_INNER,
// whether an operand's K axis is its contiguous one, and IMPLICIT with the convolution's
// constants where B is a weight gradient's columns read from the convolution's input, and the
// tile: BM, BN, BK).
//
// Tiles: BM (M) × BN (N) × BK (K) (64 × 64 × 32, or 128 rows or columns with BK 16), a warp per
// 32 × 32 of the tile, each warp 2 × 4 `mma.sync.m16n8k8` TF32 products a K step of 8.
// Operands are rounded to TF32 (`cvt.rna`) as they are stored to shared memory; the next K tile
// is read from global memory into registers while the current one is multiplied (two shared
// buffers, one barrier a tile). Rows of the shared tiles are BK + 4 words (36 or 20), so the
// fragments' reads (row = lane / 4, column = lane % 4) hit 32 different banks. Out-of-range
// rows, columns and K are read as zero and not written.

typedef unsigned int u32;

#define ROW (BK + 4)
#define WARPS_N (BN / 32)
#define THREADS (32 * (BM / 32) * WARPS_N)
#define PER_A (BM * BK / THREADS)
#define PER_B (BN * BK / THREADS)

__device__ __forceinline__ u32 to_tf32(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Element `i` (< rows · BK) of a tile, as (row, k): K-major when K is the operand's contiguous
// axis (neighbouring threads read neighbouring K), else row-major.
__device__ __forceinline__ void tile_at(int i, bool k_inner, int rows, int& row, int& k) {
    if (k_inner) {
        row = i / BK;
        k = i % BK;
    } else {
        row = i % rows;
        k = i / rows;
    }
}

// B's value at (k, n) of product `b1` of the second batch axis, zero outside the problem. With
// IMPLICIT, B is a convolution's columns read straight from its input `x` (`[N, C, H, W]` by
// strides SXC SXH SXW, the image's base in `b`): column n = (channel, tap), row k = the chunk's
// k-th output pixel, b1 the chunk; zero where the tap falls in the padding.
__device__ __forceinline__ float b_at(const float* b, long long b1, int n, int k) {
    if (n >= GN || k >= GK) return 0.0f;
#if IMPLICIT
    const int p = (int)b1 * GK + k;
    const int oy = p / WO, ox = p % WO;
    const int ch = n / KK, tap = n % KK;
    const int iy = oy * SH + (tap / KW) * DH - PT;
    const int ix = ox * SW + (tap % KW) * DW - PL;
    if (iy < 0 || iy >= XH || ix < 0 || ix >= XW) return 0.0f;
    return b[(long long)ch * SXC + (long long)iy * SXH + (long long)ix * SXW];
#else
    return b[(long long)k * SBK + (long long)n * SBN];
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
burnpose_tf32_gemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C) {
    __shared__ u32 As[2][BM][ROW];
    __shared__ u32 Bs[2][BN][ROW];

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int wm = (warp / WARPS_N) * 32;
    const int wn = (warp % WARPS_N) * 32;

    const long long bz = blockIdx.z;
    const long long b0 = bz / NB1;
    const long long b1 = bz % NB1;
    const float* a = A + b0 * SA0 + b1 * SA1;
    const float* b = B + b0 * SB0 + b1 * SB1;
    float* c = C + bz * (long long)GM * GN;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;

    float ra[PER_A];
    float rb[PER_B];
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int tiles = (GK + BK - 1) / BK;

    // Global → registers: tile `kt` of both operands.
#define LOAD(kt)                                                                              \
    {                                                                                         \
        const int k0 = (kt) * BK;                                                             \
        _Pragma("unroll") for (int j = 0; j < PER_A; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid + j * THREADS, A_K_INNER, BM, row, k);                                \
            const int gm = m0 + row, ak = k0 + k;                                             \
            ra[j] = (gm < GM && ak < GK) ? a[(long long)gm * SAM + (long long)ak * SAK] : 0.0f; \
        }                                                                                     \
        _Pragma("unroll") for (int j = 0; j < PER_B; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid + j * THREADS, B_K_INNER, BN, row, k);                                \
            rb[j] = b_at(b, b1, n0 + row, k0 + k);                                            \
        }                                                                                     \
    }
    // Registers → shared buffer `s`, rounded to TF32.
#define STORE(s)                                                                              \
    {                                                                                         \
        _Pragma("unroll") for (int j = 0; j < PER_A; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid + j * THREADS, A_K_INNER, BM, row, k);                                \
            As[s][row][k] = to_tf32(ra[j]);                                                   \
        }                                                                                     \
        _Pragma("unroll") for (int j = 0; j < PER_B; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid + j * THREADS, B_K_INNER, BN, row, k);                                \
            Bs[s][row][k] = to_tf32(rb[j]);                                                   \
        }                                                                                     \
    }

    LOAD(0);
    STORE(0);
    __syncthreads();

    for (int kt = 0; kt < tiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < tiles;
        if (more) LOAD(kt + 1);
#pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            u32 af[2][4];
            u32 bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = wm + i * 16 + g;
                af[i][0] = As[cur][r][ks + t];
                af[i][1] = As[cur][r + 8][ks + t];
                af[i][2] = As[cur][r][ks + t + 4];
                af[i][3] = As[cur][r + 8][ks + t + 4];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = wn + j * 8 + g;
                bf[j][0] = Bs[cur][n][ks + t];
                bf[j][1] = Bs[cur][n][ks + t + 4];
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_tf32(acc[i][j], af[i], bf[j]);
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
                if (r < GM && q < GN) c[(long long)r * GN + q] = acc[i][j][e];
            }
        }
    }
}
