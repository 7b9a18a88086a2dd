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
// buffers, one barrier a tile). An operand whose K axis is contiguous is kept row by row, rows
// of BK + 4 words (36 or 20); one whose rows (or columns) are contiguous is kept K step by K
// step, steps of BM + 8 (or BN + 8) words, so that neighbouring threads store neighbouring
// words. Either way the fragments' reads (row = lane / 4, K = lane % 4) hit 32 different banks
// (the padding makes a row, or a K step, 4 or 8 banks further). Out-of-range rows, columns and
// K are read as zero and not written.

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

// Element `tid + j · THREADS` of a tile of `rows` × BK, as (row, k): K-major when K is the
// operand's contiguous axis (neighbouring threads read neighbouring K), else row-major. Written
// as `tid`'s place plus `j` whole steps (THREADS is a multiple of both BK and `rows`), so that
// a thread's addresses are one base plus constant offsets.
__device__ __forceinline__ void tile_at(int tid, int j, bool k_inner, int rows, int& row, int& k) {
    if (k_inner) {
        row = tid / BK + j * (THREADS / BK);
        k = tid % BK;
    } else {
        row = tid % rows;
        k = tid / rows + j * (THREADS / rows);
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

#if ASYNC
// Global → shared without registers (`cp.async`): VA (VB) values of A (B) at a time along
// the operand's contiguous axis, 16 bytes where the Rust side found them aligned, else 4;
// `bytes` below the copy's size fill the rest with zeros (out-of-range values).
#define STAGES 4
#if VA == 4
#define CP_A "cp.async.cg.shared.global [%0], [%1], 16, %2;"
#else
#define CP_A "cp.async.ca.shared.global [%0], [%1], 4, %2;"
#endif
#if VB == 4
#define CP_B "cp.async.cg.shared.global [%0], [%1], 16, %2;"
#else
#define CP_B "cp.async.ca.shared.global [%0], [%1], 4, %2;"
#endif
#define CP(op, dst, src, bytes)                                                               \
    asm volatile(op ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes))
static_assert(BM * BK / VA % THREADS == 0 && BN * BK / VB % THREADS == 0,
              "every thread copies whole chunks of both tiles");
__device__ __forceinline__ int clamp_len(int left, int most) {
    return left <= 0 ? 0 : (left < most ? left : most);
}
#else
#define STAGES 2
#endif

static_assert(THREADS % BK == 0 && THREADS % BM == 0 && THREADS % BN == 0,
              "a thread's elements of a tile are whole steps of THREADS apart (tile_at)");

extern "C" __global__ void __launch_bounds__(THREADS)
burnpose_tf32_gemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C) {
#if A_K_INNER
    __shared__ __align__(16) u32 As[STAGES][BM][ROW];
#define AS(s, r, k) As[s][r][k]
#else
    __shared__ __align__(16) u32 As[STAGES][BK][BM + 8];
#define AS(s, r, k) As[s][k][r]
#endif
#if B_K_INNER
    __shared__ __align__(16) u32 Bs[STAGES][BN][ROW];
#define BS(s, r, k) Bs[s][r][k]
#else
    __shared__ __align__(16) u32 Bs[STAGES][BK][BN + 8];
#define BS(s, r, k) Bs[s][k][r]
#endif
#if ASYNC
// The shared tiles hold the operands as read: rounded to TF32 as the fragments are read.
#define FRAG(x) to_tf32(__uint_as_float(x))
#else
// The shared tiles hold the operands rounded to TF32 already.
#define FRAG(x) (x)
#endif

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

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int tiles = (GK + BK - 1) / BK;

    // The products of shared buffer `cur`, a K step of 8 at a time, in order.
#define COMPUTE(cur)                                                                          \
    _Pragma("unroll") for (int ks = 0; ks < BK; ks += 8) {                                    \
        u32 af[2][4];                                                                         \
        u32 bf[4][2];                                                                         \
        _Pragma("unroll") for (int i = 0; i < 2; ++i) {                                       \
            const int r = wm + i * 16 + g;                                                    \
            af[i][0] = FRAG(AS(cur, r, ks + t));                                              \
            af[i][1] = FRAG(AS(cur, r + 8, ks + t));                                          \
            af[i][2] = FRAG(AS(cur, r, ks + t + 4));                                          \
            af[i][3] = FRAG(AS(cur, r + 8, ks + t + 4));                                      \
        }                                                                                     \
        _Pragma("unroll") for (int j = 0; j < 4; ++j) {                                       \
            const int n = wn + j * 8 + g;                                                     \
            bf[j][0] = FRAG(BS(cur, n, ks + t));                                              \
            bf[j][1] = FRAG(BS(cur, n, ks + t + 4));                                          \
        }                                                                                     \
        _Pragma("unroll") for (int i = 0; i < 2; ++i)                                         \
            _Pragma("unroll") for (int j = 0; j < 4; ++j) mma_tf32(acc[i][j], af[i], bf[j]);  \
    }

#if ASYNC
    // Tile `kt` of both operands into shared buffer `s`, in chunks of VA (VB) values along
    // the contiguous axis; a chunk's first index is a multiple of its length.
#define ISSUE(s, kt)                                                                          \
    {                                                                                         \
        const int k0 = (kt) * BK;                                                             \
        _Pragma("unroll") for (int j = 0; j < BM * BK / VA / THREADS; ++j) {                  \
            const int ch = tid + j * THREADS;                                                 \
            int row, k, len;                                                                  \
            if (A_K_INNER) {                                                                  \
                row = ch / (BK / VA);                                                         \
                k = ch % (BK / VA) * VA;                                                      \
                len = m0 + row < GM ? clamp_len(GK - k0 - k, VA) : 0;                         \
            } else {                                                                          \
                k = ch / (BM / VA);                                                           \
                row = ch % (BM / VA) * VA;                                                    \
                len = k0 + k < GK ? clamp_len(GM - m0 - row, VA) : 0;                         \
            }                                                                                 \
            const float* src = len ? a + (long long)(m0 + row) * SAM + (long long)(k0 + k) * SAK : a; \
            CP(CP_A, &AS(s, row, k), src, len * 4);                                           \
        }                                                                                     \
        _Pragma("unroll") for (int j = 0; j < BN * BK / VB / THREADS; ++j) {                  \
            const int ch = tid + j * THREADS;                                                 \
            int row, k, len;                                                                  \
            if (B_K_INNER) {                                                                  \
                row = ch / (BK / VB);                                                         \
                k = ch % (BK / VB) * VB;                                                      \
                len = n0 + row < GN ? clamp_len(GK - k0 - k, VB) : 0;                         \
            } else {                                                                          \
                k = ch / (BN / VB);                                                           \
                row = ch % (BN / VB) * VB;                                                    \
                len = k0 + k < GK ? clamp_len(GN - n0 - row, VB) : 0;                         \
            }                                                                                 \
            const float* src = len ? b + (long long)(k0 + k) * SBK + (long long)(n0 + row) * SBN : b; \
            CP(CP_B, &BS(s, row, k), src, len * 4);                                           \
        }                                                                                     \
    }

    // STAGES - 1 tiles in flight ahead of the one multiplied; a group per tile (empty past
    // the last) so that waiting for all but STAGES - 2 groups means "tile kt has landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) ISSUE(s, s);
        asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < tiles; ++kt) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads();
        // The buffer refilled here was multiplied in the last iteration, before the barrier.
        const int next = kt + STAGES - 1;
        if (next < tiles) ISSUE(next % STAGES, next);
        asm volatile("cp.async.commit_group;");
        COMPUTE(kt % STAGES);
    }
#else
    float ra[PER_A];
    float rb[PER_B];
    // Global → registers: tile `kt` of both operands.
#define LOAD(kt)                                                                              \
    {                                                                                         \
        const int k0 = (kt) * BK;                                                             \
        _Pragma("unroll") for (int j = 0; j < PER_A; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid, j, A_K_INNER, BM, row, k);                                         \
            const int gm = m0 + row, ak = k0 + k;                                             \
            ra[j] = (gm < GM && ak < GK) ? a[(long long)gm * SAM + (long long)ak * SAK] : 0.0f; \
        }                                                                                     \
        _Pragma("unroll") for (int j = 0; j < PER_B; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid, j, B_K_INNER, BN, row, k);                                         \
            rb[j] = b_at(b, b1, n0 + row, k0 + k);                                            \
        }                                                                                     \
    }
    // Registers → shared buffer `s`, rounded to TF32.
#define STORE(s)                                                                              \
    {                                                                                         \
        _Pragma("unroll") for (int j = 0; j < PER_A; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid, j, A_K_INNER, BM, row, k);                                         \
            AS(s, row, k) = to_tf32(ra[j]);                                                           \
        }                                                                                     \
        _Pragma("unroll") for (int j = 0; j < PER_B; ++j) {                                   \
            int row, k;                                                                       \
            tile_at(tid, j, B_K_INNER, BN, row, k);                                         \
            BS(s, row, k) = to_tf32(rb[j]);                                                           \
        }                                                                                     \
    }

    LOAD(0);
    STORE(0);
    __syncthreads();

    for (int kt = 0; kt < tiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < tiles;
        if (more) LOAD(kt + 1);
        COMPUTE(cur);
        if (more) STORE(cur ^ 1);
        __syncthreads();
    }

#endif

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
