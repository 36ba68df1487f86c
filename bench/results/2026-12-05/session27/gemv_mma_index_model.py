# Model of gemm_gemv_mma_kernel's index math (branch gemv-mma, gemm_gemv.cuh): every lane's W and X
# fragments as the kernel loads them, the m16n8k16 fragment layout of the PTX ISA (as the score
# kernel uses it), the segment sums and the output mapping, against X @ W^T on integer inputs
# (exact). Twenty-seventh session: passed on the 14 shapes below (odd N, K, T; grid-stride sets;
# multi-batch segments; K = 0; X's T rows staged, the rows past T never read). python3 gemv_mma_index_model.py
import random
kGemvWarps, kGemvMmaBatch = 8, 8
def x_row_bytes(K):
    chunk_bytes = (K + 31) // 32 * 64
    return (chunk_bytes + 127) // 128 * 128 + 64
def segments(K):
    batches = ((K + 31) // 32 + kGemvMmaBatch - 1) // kGemvMmaBatch
    s = 1
    while s < kGemvWarps and s < batches: s *= 2
    return s
def run(T, N, K, ldx, ldw, ldc, grid_cap):
    NT = 1 if T <= 8 else 2
    X = [[random.randint(-3, 3) for _ in range(ldx)] for _ in range(T)]
    W = [[random.randint(-3, 3) for _ in range(ldw)] for _ in range(N)]
    C = {}
    xr = x_row_bytes(K); pieces = xr // 16; kp = K // 8
    xs = [[None] * (xr // 2) for _ in range(T)]  # only T rows staged (None: never written)
    for i in range(T * pieces):
        t, p = divmod(i, pieces)
        xs[t][8*p:8*p+8] = X[t][8*p:8*p+8] if p < kp else [0] * 8
    kc = (K + 31) // 32; S = segments(K); R = kGemvWarps // S; seg_len = (kc + S - 1) // S
    sets = ((N + 15) // 16 + R - 1) // R
    rows_per_cta = 16 * R
    ctas = min((N + rows_per_cta - 1) // rows_per_cta, grid_cap)
    for cta in range(ctas):
        s_ = cta
        while s_ < sets:
            part = [[[0] * 32 for _ in range(NT * 4)] for _ in range(kGemvWarps)]
            for warp in range(kGemvWarps):
                slot, seg = divmod(warp, S)
                c_begin = min(kc, seg * seg_len); c_end = min(kc, c_begin + seg_len)
                acc = [[[0] * 4 for _ in range(NT)] for _ in range(32)]
                for c0 in range(c_begin, c_end, kGemvMmaBatch):
                    wv = [[[[0] * 8 for _ in range(2)] for _ in range(kGemvMmaBatch)] for _ in range(32)]
                    for lane in range(32):
                        g, c = lane >> 2, lane & 3
                        n0 = (s_ * R + slot) * 16 + g
                        for i in range(kGemvMmaBatch):
                            ci = c0 + i; e = 32 * ci + 8 * c
                            ok = ci < c_end and e < K
                            for h in range(2):
                                n = n0 + 8 * h
                                if ok and n < N: wv[lane][i][h] = W[n][e:e+8]
                    for i in range(kGemvMmaBatch):
                        ci = c0 + i
                        if ci >= c_end: continue
                        for j in range(NT):
                            for step in range(2):
                                A = [[None] * 16 for _ in range(16)]; B = [[None] * 8 for _ in range(16)]
                                for lane in range(32):
                                    g, c = lane >> 2, lane & 3
                                    off = (64*ci + 16*c)//2
                                    xv = xs[8*j + g][off:off + 8] if 8*j + g < T else [0] * 8
                                    w0, w1 = wv[lane][i][0], wv[lane][i][1]
                                    word = lambda v, k: v[2*k:2*k+2]
                                    a = [word(w0, 2*step), word(w1, 2*step), word(w0, 2*step+1), word(w1, 2*step+1)]
                                    b = [word(xv, 2*step), word(xv, 2*step+1)]
                                    A[g][2*c:2*c+2] = a[0]; A[g+8][2*c:2*c+2] = a[1]
                                    A[g][2*c+8:2*c+10] = a[2]; A[g+8][2*c+8:2*c+10] = a[3]
                                    for e2 in range(2):
                                        B[2*c+e2][g] = b[0][e2]; B[2*c+8+e2][g] = b[1][e2]
                                assert all(v is not None for row in A for v in row) and all(v is not None for row in B for v in row)
                                D = [[sum(A[m][k] * B[k][n] for k in range(16)) for n in range(8)] for m in range(16)]
                                for lane in range(32):
                                    g, c = lane >> 2, lane & 3
                                    acc[lane][j][0] += D[g][2*c]; acc[lane][j][1] += D[g][2*c+1]
                                    acc[lane][j][2] += D[g+8][2*c]; acc[lane][j][3] += D[g+8][2*c+1]
                for lane in range(32):
                    for j in range(NT):
                        for r in range(4): part[warp][j*4 + r][lane] = acc[lane][j][r]
            for e in range(R * NT * 128):
                sl = e // (NT * 128); jr = (e // 32) % (NT * 4); l = e % 32
                sm = sum(part[sl * S + q][jr][l] for q in range(S))
                n = (s_ * R + sl) * 16 + l // 4 + 8 * ((jr & 3) >> 1)
                t = 8 * (jr >> 2) + 2 * (l % 4) + (jr & 1)
                if n < N and t < T:
                    assert (t, n) not in C
                    C[(t, n)] = sm
            s_ += ctas
    for t in range(T):
        for n in range(N):
            ref = sum(X[t][k] * W[n][k] for k in range(K))
            assert C[(t, n)] == ref, (t, n, C[(t, n)], ref)
    return ctas, S, R, kc
random.seed(1)
for (T, N, K, ldx, ldw, ldc, cap) in [(2, 37, 200, 208, 200, 40, 3), (9, 37, 200, 208, 200, 40, 1), (16, 70, 64, 64, 72, 70, 2),
                                        (5, 20, 8, 8, 8, 20, 5), (8, 33, 1024, 1024, 1032, 34, 2), (13, 17, 520, 520, 520, 18, 1),
                                        (3, 16, 4104, 4112, 4120, 16, 1), (11, 50, 0, 8, 8, 50, 4), (4, 40, 2056, 2056, 2056, 40, 3), (2, 600, 64, 64, 64, 600, 2), (16, 300, 1000, 1000, 1000, 301, 2), (1, 40, 96, 96, 96, 40, 3), (2, 20, 800, 808, 800, 20, 1), (7, 33, 4104, 4112, 4120, 34, 2)]:
    print((T, N, K), run(T, N, K, ldx, ldw, ldc, cap), flush=True)
print("ok")
