// W12 GEMM on the tensor cores, decoding the planes straight into MMA fragments (sm_80+; tuned on sm_90).
//
//     y[M, N] = x[M, K] @ W^T (+ bias),   W [N, K] as W12 planes (w12/format.py), K % 64 == 0.
//
// Why CUDA C++ and not Triton: the Triton kernels decode quads into registers, but Triton then moves the
// decoded pairs into its MMA layout through shared memory (or spends fp32 FMAs at M = 1): 1.00-1.25x over
// cuBLAS at M = 1 and 0.3-0.8x at M = 32 on Llama-3.1-8B shapes (H200, 2026-11-29). Here a thread decodes
// exactly the weights its mma.m16n8k16 A fragment holds, so nothing is exchanged.
//
// Mapping. A warp owns R tiles of 16 weight rows. Lane = 4 g + t: rows g and g + 8 of a tile, and in every
// 64-wide K step ("super-chunk") the 16 weights k0 + 16 t .. + 15 of each of its two rows: one 16-byte load
// of hi and one 8-byte load of lo per row. Those are 4 quads; quad j feeds the MMA of chunk j (4 MMAs per
// super-chunk). The K order inside an MMA is free as long as x uses the same permutation, so a quad's pairs
// (the decode's parity pairs, decode.py) map to the fragment as
//     a0 = we(row g)   = W[g, 4q], W[g, 4q+2]     a2 = wo(row g)   = W[g, 4q+1], W[g, 4q+3]
//     a1 = we(row g+8)                             a3 = wo(row g+8)
// and the B fragment of activation row n = 8 nt + g takes the same k:  b0 = x[n, 4q], x[n, 4q+2];
// b1 = x[n, 4q+1], x[n, 4q+3]  (two PRMTs of an 8-byte piece of x). Accumulators are fp32 (m16n8 C
// fragments: rows are weight rows, columns activation rows).
//
// Parallelism. A CTA of W warps owns one row block (16 R rows) and one K range; its warps take the
// super-chunks of that range round-robin (so at any moment they read W * 64 adjacent bytes of each row),
// then sum their fragments through shared memory in warp order. Small grids split K across CTAs
// (gridDim.y): each CTA stores an fp32 partial, and the last to arrive (a counter per row block) sums the
// partials in split order (deterministic), then applies escapes and bias, and resets the counter to 0.
//
// Escapes (w12/kernels/escapes.py): escape slots hold code 0, which decodes to the row's placeholder
// p = 2^(base - 127); the final writer adds x[m, k] * (v - p) for each escape of row n, from the CSR row
// pointer. No branch in the hot loop; a row's escapes touch only that row's outputs (inf/NaN included).
//
// The 8-bit view (VIEW8): hi alone, low mantissa bits 1000b, no escapes.
//
// Decode: the same PTX as decode.py's EXACT_PTX / VIEW8_PTX (checked there against every code by an
// emulator), two quads per asm block, ~2.9 instructions per weight.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ void decode_exact(uint32_t h0, uint32_t h1, uint32_t l, uint32_t b2, uint32_t &we0,
                                             uint32_t &we1, uint32_t &wo0, uint32_t &wo1) {
  asm("{\n"
      ".reg .b32 sel, sgn, l4, s, t, x, g;\n"
      "mov.b32 sel, 0xF80FF80F;\n"
      "mov.b32 sgn, 0x80008000;\n"
      "shr.u32 l4, %6, 4;\n"
      "shl.b32 s, %4, 4;\n"
      "prmt.b32 t, %6, 0, 0x4140;\n"
      "lop3.b32 x, s, t, sel, 0xD8;\n"
      "shl.b32 g, %4, 8;\n"
      "lop3.b32 x, x, g, sgn, 0xF8;\n"
      "add.u32 %0, x, %7;\n"
      "shr.u32 s, %4, 4;\n"
      "prmt.b32 t, l4, 0, 0x4140;\n"
      "lop3.b32 x, s, t, sel, 0xD8;\n"
      "lop3.b32 x, x, %4, sgn, 0xF8;\n"
      "add.u32 %2, x, %7;\n"
      "shl.b32 s, %5, 4;\n"
      "prmt.b32 t, %6, 0, 0x4342;\n"
      "lop3.b32 x, s, t, sel, 0xD8;\n"
      "shl.b32 g, %5, 8;\n"
      "lop3.b32 x, x, g, sgn, 0xF8;\n"
      "add.u32 %1, x, %8;\n"
      "shr.u32 s, %5, 4;\n"
      "prmt.b32 t, l4, 0, 0x4342;\n"
      "lop3.b32 x, s, t, sel, 0xD8;\n"
      "lop3.b32 x, x, %5, sgn, 0xF8;\n"
      "add.u32 %3, x, %8;\n"
      "}\n"
      : "=r"(we0), "=r"(we1), "=r"(wo0), "=r"(wo1)
      : "r"(h0), "r"(h1), "r"(l), "r"(b2), "r"(b2));
}

__device__ __forceinline__ void decode_view8(uint32_t h0, uint32_t h1, uint32_t b2v, uint32_t &we0,
                                             uint32_t &we1, uint32_t &wo0, uint32_t &wo1) {
  asm("{\n"
      ".reg .b32 keep, sgn, s, x, g;\n"
      "mov.b32 keep, 0x07F007F0;\n"
      "mov.b32 sgn, 0x80008000;\n"
      "shl.b32 s, %4, 4;\n"
      "and.b32 x, s, keep;\n"
      "shl.b32 g, %4, 8;\n"
      "lop3.b32 x, x, g, sgn, 0xF8;\n"
      "add.u32 %0, x, %6;\n"
      "shr.u32 s, %4, 4;\n"
      "and.b32 x, s, keep;\n"
      "lop3.b32 x, x, %4, sgn, 0xF8;\n"
      "add.u32 %2, x, %6;\n"
      "shl.b32 s, %5, 4;\n"
      "and.b32 x, s, keep;\n"
      "shl.b32 g, %5, 8;\n"
      "lop3.b32 x, x, g, sgn, 0xF8;\n"
      "add.u32 %1, x, %7;\n"
      "shr.u32 s, %5, 4;\n"
      "and.b32 x, s, keep;\n"
      "lop3.b32 x, x, %5, sgn, 0xF8;\n"
      "add.u32 %3, x, %7;\n"
      "}\n"
      : "=r"(we0), "=r"(we1), "=r"(wo0), "=r"(wo1)
      : "r"(h0), "r"(h1), "r"(b2v), "r"(b2v));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Streamed once: evict-first loads (L2 is better spent on x and the partials).
__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p) { return __ldcs(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ uint2 ld_stream8(const uint8_t *p) { return __ldcs(reinterpret_cast<const uint2 *>(p)); }

// One lane's share of a row in one step: Q quads (4 Q consecutive weights) of hi and their lo halfwords.
// Q = 16 (a 256-weight step: the 4 lanes of a row read 256 B of hi and 128 B of lo, whole 128-byte lines)
// or Q = 4 (a 64-weight step, for the K % 256 tail). Whole lines matter: with 64-byte pieces (the first
// version) each line was read half by one warp and half by another, and the kernel ran at 1.2-1.3 TB/s on
// the 4096 x 4096 projection (H200), against 2.6 TB/s for cuBLAS.
template <int Q, bool VIEW8>
struct Planes {
  uint4 h[Q / 4];
  uint32_t l[Q / 2];
};

template <int Q, bool VIEW8>
__device__ __forceinline__ void load_planes(Planes<Q, VIEW8> &p, const uint8_t *hi_row, const uint8_t *lo_row,
                                            int k) {
  const uint8_t *hp = hi_row + k;
#pragma unroll
  for (int i = 0; i < Q / 4; ++i) p.h[i] = ld_stream16(hp + 16 * i);
  if (!VIEW8) {
    const uint8_t *lp = lo_row + (k >> 1);
    if (Q >= 8) {
#pragma unroll
      for (int i = 0; i < Q / 8; ++i) {
        uint4 v = ld_stream16(lp + 16 * i);
        p.l[4 * i] = v.x, p.l[4 * i + 1] = v.y, p.l[4 * i + 2] = v.z, p.l[4 * i + 3] = v.w;
      }
    } else {
      uint2 v = ld_stream8(lp);
      p.l[0] = v.x, p.l[1] = v.y;
    }
  }
}

// Decode one step of R row tiles and multiply: quad j of this lane is k = kl + 4 j, where kl is the lane's
// first weight of the step; the B fragments take x at the same k.
template <int R, int NT, int Q, bool VIEW8>
__device__ __forceinline__ void step_mma(float (&acc)[R][NT][4], const Planes<Q, VIEW8> (&cur)[R][2],
                                         const uint32_t (&b2)[R][2], const __nv_bfloat16 *const (&x_row)[NT],
                                         const bool (&x_ok)[NT], int kl) {
#pragma unroll
  for (int i = 0; i < Q / 2; ++i) {  // quads 2i, 2i + 1
    uint32_t bx[NT][2][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint4 u = make_uint4(0, 0, 0, 0);
      if (x_ok[nt]) u = __ldg(reinterpret_cast<const uint4 *>(x_row[nt] + kl + 8 * i));
      bx[nt][0][0] = __byte_perm(u.x, u.y, 0x5410);  // x[4q], x[4q+2]
      bx[nt][0][1] = __byte_perm(u.x, u.y, 0x7632);  // x[4q+1], x[4q+3]
      bx[nt][1][0] = __byte_perm(u.z, u.w, 0x5410);
      bx[nt][1][1] = __byte_perm(u.z, u.w, 0x7632);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t we[2][2], wo[2][2];  // [row half][quad]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 &hv = cur[r][h].h[i / 2];
        const uint32_t h0 = (i & 1) ? hv.z : hv.x, h1 = (i & 1) ? hv.w : hv.y;
        if (VIEW8)
          decode_view8(h0, h1, b2[r][h], we[h][0], we[h][1], wo[h][0], wo[h][1]);
        else
          decode_exact(h0, h1, cur[r][h].l[i], b2[r][h], we[h][0], we[h][1], wo[h][0], wo[h][1]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mma_bf16(acc[r][nt], we[0][j], we[1][j], wo[0][j], wo[1][j], bx[nt][j][0], bx[nt][j][1]);
    }
  }
}

// Row block of one warp: R tiles of 16 rows; NT tiles of 8 activation rows.
template <int R, int NT, bool VIEW8>
__global__ void __launch_bounds__(256) w12_mma_kernel(
    const __nv_bfloat16 *__restrict__ x, const uint8_t *__restrict__ hi, const uint8_t *__restrict__ lo,
    const uint8_t *__restrict__ base, const int64_t *__restrict__ esc_idx,
    const __nv_bfloat16 *__restrict__ esc_val, const int32_t *__restrict__ esc_row_ptr,
    const float *__restrict__ bias, __nv_bfloat16 *__restrict__ y, float *__restrict__ part,
    int32_t *__restrict__ counters, int M, int N, int K, int stride_xm, int stride_ym) {
  constexpr int ROWS = 16 * R;
  constexpr int COLS = 8 * NT;
  constexpr int BIG = 16, SMALL = 4;  // quads per lane per step: 256- and 64-weight steps
  extern __shared__ float red[];      // [warps][ROWS][COLS], then reused for the block's sums
  __shared__ int is_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * ROWS;
  const int m0 = blockIdx.z * COLS;
  const int splits = gridDim.y;

  // This CTA's 256-weight steps; the last split also takes the K % 256 tail in 64-weight steps.
  const int big_steps = K >> 8;
  const int per = (big_steps + splits - 1) / splits;
  const int s_begin = min((int)blockIdx.y * per, big_steps);
  const int s_end = min(s_begin + per, big_steps);
  const bool has_tail = blockIdx.y == splits - 1;

  const uint8_t *hi_row[R][2];
  const uint8_t *lo_row[R][2];
  uint32_t b2[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int n = min(n0 + 16 * r + 8 * h + g, N - 1);  // clamped for loads; rows past N are never stored
      hi_row[r][h] = hi + (size_t)n * K;
      lo_row[r][h] = lo + (size_t)n * (K >> 1);
      uint32_t b = base[n];
      b2[r][h] = (b << 7) | (b << 23);
      if (VIEW8) b2[r][h] += 0x00080008u;
    }
  }
  const __nv_bfloat16 *x_row[NT];
  bool x_ok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int m = m0 + 8 * nt + g;
    x_ok[nt] = m < M;
    x_row[nt] = x + (size_t)(x_ok[nt] ? m : 0) * stride_xm;
  }

  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][nt][i] = 0.f;

  // 256-weight steps, round-robin over the warps, one step ahead in flight.
  {
    Planes<BIG, VIEW8> cur[R][2], nxt[R][2];
    int s = s_begin + warp;
    const int lane_k = 4 * BIG * t;  // this lane's first weight inside a step
    if (s < s_end) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) load_planes(cur[r][h], hi_row[r][h], lo_row[r][h], (s << 8) + lane_k);
    }
    for (; s < s_end; s += warps) {
      const int sn = s + warps;
      if (sn < s_end) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) load_planes(nxt[r][h], hi_row[r][h], lo_row[r][h], (sn << 8) + lane_k);
      }
      step_mma<R, NT, BIG, VIEW8>(acc, cur, b2, x_row, x_ok, (s << 8) + lane_k);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) cur[r][h] = nxt[r][h];
    }
  }
  // The tail: (K % 256) / 64 steps of 64 weights, one per warp.
  if (has_tail) {
    const int tail_steps = (K & 255) >> 6;
    for (int ts = warp; ts < tail_steps; ts += warps) {
      const int k = (big_steps << 8) + (ts << 6) + 4 * SMALL * t;
      Planes<SMALL, VIEW8> cur[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) load_planes(cur[r][h], hi_row[r][h], lo_row[r][h], k);
      step_mma<R, NT, SMALL, VIEW8>(acc, cur, b2, x_row, x_ok, k);
    }
  }

  // Warps' fragments -> shared memory [warp][row][col]; C fragment: rows g, g + 8; columns 2t, 2t + 1.
  float *mine = red + warp * ROWS * COLS;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      int row = 16 * r + g, col = 8 * nt + 2 * t;
      mine[row * COLS + col] = acc[r][nt][0];
      mine[row * COLS + col + 1] = acc[r][nt][1];
      mine[(row + 8) * COLS + col] = acc[r][nt][2];
      mine[(row + 8) * COLS + col + 1] = acc[r][nt][3];
    }
  __syncthreads();

  // The block's sum of every (row, col), in warp order; then either this is the only split, or partials.
  const int elems = ROWS * COLS;
  const int tile = blockIdx.z * gridDim.x + blockIdx.x;
  const size_t plane = (size_t)M * N;
  for (int e = threadIdx.x; e < elems; e += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += red[w * elems + e];
    red[e] = s;  // warp 0's slot: read above by this thread only
  }
  if (splits > 1) {
    __syncthreads();
    for (int e = threadIdx.x; e < elems; e += blockDim.x) {
      int n = n0 + e / COLS, m = m0 + e % COLS;
      if (n < N && m < M) part[blockIdx.y * plane + (size_t)m * N + n] = red[e];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      int arrived = atomicAdd(counters + tile, 1);
      is_last = arrived == splits - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    for (int e = threadIdx.x; e < elems; e += blockDim.x) {
      int n = n0 + e / COLS, m = m0 + e % COLS;
      float s = 0.f;
      if (n < N && m < M)
        for (int sp = 0; sp < splits; ++sp) s += __ldcg(part + sp * plane + (size_t)m * N + n);
      red[e] = s;
    }
    if (threadIdx.x == 0) counters[tile] = 0;
  }

  // Escapes, bias, BF16 store.
  for (int e = threadIdx.x; e < elems; e += blockDim.x) {
    int n = n0 + e / COLS, m = m0 + e % COLS;
    if (n >= N || m >= M) continue;
    float s = red[e];
    if (!VIEW8) {
      int e0 = esc_row_ptr[n], e1 = esc_row_ptr[n + 1];
      if (e0 < e1) {
        float p = __uint_as_float((uint32_t)base[n] << 23);
        const __nv_bfloat16 *xm = x + (size_t)m * stride_xm;
        for (int i = e0; i < e1; ++i) {
          int k = (int)(esc_idx[i] - (int64_t)n * K);
          s += __bfloat162float(xm[k]) * (__bfloat162float(esc_val[i]) - p);
        }
      }
    }
    if (bias != nullptr) s += bias[n];
    y[(size_t)m * stride_ym + n] = __float2bfloat16_rn(s);
  }
}

template <int R, int NT, bool VIEW8>
cudaError_t launch_t(const void *x, const void *hi, const void *lo, const void *base, const void *esc_idx,
                     const void *esc_val, const void *esc_row_ptr, const void *bias, void *y, void *part,
                     void *counters, int M, int N, int K, int stride_xm, int stride_ym, int splits, int warps,
                     cudaStream_t stream) {
  constexpr int ROWS = 16 * R, COLS = 8 * NT;
  dim3 grid((N + ROWS - 1) / ROWS, splits, (M + COLS - 1) / COLS);
  size_t smem = sizeof(float) * warps * ROWS * COLS;
  auto kernel = w12_mma_kernel<R, NT, VIEW8>;
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, warps * 32, smem, stream>>>(
      static_cast<const __nv_bfloat16 *>(x), static_cast<const uint8_t *>(hi), static_cast<const uint8_t *>(lo),
      static_cast<const uint8_t *>(base), static_cast<const int64_t *>(esc_idx),
      static_cast<const __nv_bfloat16 *>(esc_val), static_cast<const int32_t *>(esc_row_ptr),
      static_cast<const float *>(bias), static_cast<__nv_bfloat16 *>(y), static_cast<float *>(part),
      static_cast<int32_t *>(counters), M, N, K, stride_xm, stride_ym);
  return cudaGetLastError();
}

template <int R, bool VIEW8>
cudaError_t launch_nt(int nt, const void *x, const void *hi, const void *lo, const void *base,
                      const void *esc_idx, const void *esc_val, const void *esc_row_ptr, const void *bias,
                      void *y, void *part, void *counters, int M, int N, int K, int sxm, int sym, int splits,
                      int warps, cudaStream_t s) {
#define W12_CASE(NT_)                                                                                         \
  case NT_:                                                                                                   \
    return launch_t<R, NT_, VIEW8>(x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, y, part, counters, \
                                   M, N, K, sxm, sym, splits, warps, s);
  switch (nt) {
    W12_CASE(1)
    W12_CASE(2)
    W12_CASE(4)
    W12_CASE(8)
    default:
      return cudaErrorInvalidValue;
  }
#undef W12_CASE
}

}  // namespace

// C entry point (ctypes): nt in {1, 2, 4, 8} activation tiles of 8 rows per CTA (grid.z covers the rest),
// rows_per_warp in {16, 32}, warps in 1..8, splits >= 1 (then part: fp32 [splits, M, N] and counters: int32
// zeros, one per row block x activation block). Returns a cudaError_t (0 = success).
extern "C" int w12_mma_gemm(const void *x, const void *hi, const void *lo, const void *base, const void *esc_idx,
                            const void *esc_val, const void *esc_row_ptr, const void *bias, void *y, void *part,
                            void *counters, int M, int N, int K, int stride_xm, int stride_ym, int nt,
                            int rows_per_warp, int splits, int warps, int view8, void *stream) {
  if (K % 64 != 0 || warps < 1 || warps > 8 || splits < 1) return (int)cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (rows_per_warp == 16) {
    return view8 ? launch_nt<1, true>(nt, x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, y, part,
                                      counters, M, N, K, stride_xm, stride_ym, splits, warps, s)
                 : launch_nt<1, false>(nt, x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, y, part,
                                       counters, M, N, K, stride_xm, stride_ym, splits, warps, s);
  }
  if (rows_per_warp == 32) {
    return view8 ? launch_nt<2, true>(nt, x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, y, part,
                                      counters, M, N, K, stride_xm, stride_ym, splits, warps, s)
                 : launch_nt<2, false>(nt, x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, y, part,
                                       counters, M, N, K, stride_xm, stride_ym, splits, warps, s);
  }
  return (int)cudaErrorInvalidValue;
}
