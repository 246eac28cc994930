/* Local SGD of many clients' CNN1D models, one client-step at a time, fused.
 *
 * fedsim.models.CNN1D: x [n, C0*L0] viewed as [n, C0, L0] -> Conv1d(C0->C1, k1, s1, p1) -> ReLU
 *   -> Conv1d(C1->C2, k2, s2, p2) -> ReLU -> flatten (channel-major, index c*L2 + t) -> Linear(C2*L2 -> O).
 *
 * Every client starts from global_w ([dim], the parameters_to_vector of the model, PyTorch's layout) and
 * ends with its update (trained parameters - global_w) in row k of updates [K, dim]. Client k holds
 * examples order[e, offsets[k] : offsets[k] + sizes[k]] of x_all/y_all in epoch e's order; it takes one SGD
 * step per batch of B consecutive ones (the last batch may be short), on the mean cross-entropy of the
 * batch: the steps of fedsim.engine.vectorized and of ClientTrainer.train_one (float rounding differs):
 *     momentum == 0:  p -= lr * g
 *     momentum != 0:  buf = momentum * buf + g;  p -= lr * buf        (torch.optim.SGD's convention)
 *
 * Why by hand: the step of a model this small is dominated, in PyTorch, by memory traffic between its ~40
 * kernels (im2col/col2im copies, activations, masks, layout permutes, the update) over tensors of all the
 * clients of a chunk, which do not fit in cache. Here clients are trained one after the other, all the
 * steps of one before the next: a client-step's working set (~200 KB at batch 16) stays in L2, the
 * elementwise work is fused into the loops around the matrix products, padded batch slots cost nothing,
 * and the matrix products are the BLAS's sgemm (the one PyTorch itself uses, passed in as a function
 * pointer). Activations are channels-last. Clients are independent, so they are split over threads.
 *
 * Row-major products on a column-major (Fortran) sgemm: C = op(A) op(B) is C^T = op(B)^T op(A)^T, so the
 * call swaps A and B (and M and N) and keeps the transpose flags.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*sgemm_fn)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                         const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                         const float *beta, float *c, const int *ldc);

static sgemm_fn g_sgemm = NULL;

void fedsim_set_sgemm(void *fn) { g_sgemm = (sgemm_fn)fn; }

/* MKL_Set_Num_Threads_Local (MKL's by-value C entry point; may be NULL). The BLAS is called from several
 * threads here, and each must keep it sequential: MKL calls that open a parallel team on every thread would
 * oversubscribe the cores (measured on 2 cores: 2.5x slower, where sequential calls make it 1.6x faster).
 * Without this entry point the kernel runs on one thread. */
typedef int (*mkl_local_fn)(int);
static mkl_local_fn g_mkl_local = NULL;

void fedsim_set_mkl_threads_local(void *fn) { g_mkl_local = (mkl_local_fn)fn; }

/* row-major C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C */
static void gemm(char ta, char tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc) {
    const float one = 1.0f;
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* sgemm with k = 0 only scales C; keep that meaning */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
        return;
    }
    g_sgemm(&tb, &ta, &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc);
}

/* 16-float vectors (GCC/Clang vector extensions: one AVX-512 register, or two AVX / four SSE ones) for the
 * loops over channels when the channel count is a multiple of 16 */
typedef float vf __attribute__((vector_size(64)));
#define VW 16
static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
typedef int32_t vi __attribute__((vector_size(64)));
static inline vf vrelu(vf v) { const vf z = {0}; return (vf)((vi)v & (v > z)); }

/* y += a * x over n floats (x and y do not overlap) */
static inline void axpy(int n, float a, const float *restrict x, float *restrict y) {
    for (int c = 0; c < n; c++) y[c] += a * x[c];
}

static inline void relu(int n, float *restrict v) {
    for (int c = 0; c < n; c++) v[c] = v[c] > 0.0f ? v[c] : 0.0f;
}

/* x [C0, L0] -> out [C0, LP]: P1 zeros, x, zeros up to LP */
static void pad_input(const float *x, float *out, int C0, int L0, int P1, int LP) {
    for (int c = 0; c < C0; c++) {
        float *o = out + (size_t)c * LP;
        for (int q = 0; q < P1; q++) o[q] = 0.0f;
        memcpy(o + P1, x + (size_t)c * L0, (size_t)L0 * sizeof(float));
        for (int q = P1 + L0; q < LP; q++) o[q] = 0.0f;
    }
}

/* dims (int32), in this order */
enum { D_C0, D_L0, D_C1, D_K1, D_S1, D_P1, D_L1, D_C2, D_K2, D_S2, D_P2, D_L2, D_OUT, D_BATCH,
       /* offsets of the parameters in a client's flat vector, and its length */
       D_OW1, D_OB1, D_OW2, D_OB2, D_OH, D_OBH, D_DIM, D_COUNT };

/* Internal layouts, used between entry and exit of fedsim_cnn1d_train (PyTorch's on either side):
 *   conv1.weight [C1, C0, K1]  ->  [C0*K1, C1]  (tap-major: one tap's weights over the output channels
 *                                                 are contiguous, the inner loop of the direct convolution)
 *   conv2.weight [C2, C1, K2]  ->  [C2, K2*C1]  (columns (tap, channel): im2col rows are memcpy's of
 *                                                 channels-last activations)
 *   head.weight  [O, C2*L2]    ->  [O, L2*C2]   (channels-last flatten)
 * Each is a swap of the last two axes of an [A, X, Y] array; `forward` is 1 to go to the internal layout,
 * 0 to come back. */
static void swap_axes(float *w, float *tmp, int A, int X, int Y, int forward) {
    const size_t per = (size_t)X * Y;
    memcpy(tmp, w, (size_t)A * per * sizeof(float));
    for (int a = 0; a < A; a++)
        for (int x = 0; x < X; x++)
            for (int y = 0; y < Y; y++) {
                const size_t canon = a * per + (size_t)x * Y + y, inner = a * per + (size_t)y * X + x;
                if (forward) w[inner] = tmp[canon];
                else w[canon] = tmp[inner];
            }
}

static void relayout(float *p, float *tmp, int C0, int C1, int K1, int C2, int K2, int L2, int O, int ow1,
                     int ow2, int oh, int forward) {
    swap_axes(p + ow1, tmp, 1, C1, C0 * K1, forward);
    swap_axes(p + ow2, tmp, C2, C1, K2, forward);
    swap_axes(p + oh, tmp, O, C2, L2, forward);
}

typedef struct {
    const int32_t *dims;
    const float *global_w;
    float *updates;
    const float *x_all;
    const int64_t *y_all, *order, *offsets, *sizes;
    int epochs;
    int64_t total;
    float lr, momentum;
    double *loss_sum;
    int k0, k1; /* this worker's clients */
    int status;
} job_t;

/* trains clients [job->k0, job->k1); sets job->status: 0 on success, 2 if scratch memory could not be
 * allocated, 3 if a label is out of range */
static void *train_clients(void *arg) {
    job_t *job = (job_t *)arg;
    const int blas_prev = g_mkl_local ? g_mkl_local(1) : 0; /* 0: this thread follows the global setting */
    const int32_t *dims = job->dims;
    const float *global_w = job->global_w;
    float *updates = job->updates;
    const float *x_all = job->x_all;
    const int64_t *y_all = job->y_all, *order = job->order, *offsets = job->offsets, *sizes = job->sizes;
    const int epochs = job->epochs;
    const int64_t total = job->total;
    const float lr = job->lr, momentum = job->momentum;
    double *loss_sum = job->loss_sum;
    const int C0 = dims[D_C0], L0 = dims[D_L0], C1 = dims[D_C1], K1 = dims[D_K1], S1 = dims[D_S1],
              P1 = dims[D_P1], L1 = dims[D_L1], C2 = dims[D_C2], K2 = dims[D_K2], S2 = dims[D_S2],
              P2 = dims[D_P2], L2 = dims[D_L2], O = dims[D_OUT], B = dims[D_BATCH], DIM = dims[D_DIM];
    const int ow1 = dims[D_OW1], ob1 = dims[D_OB1], ow2 = dims[D_OW2], ob2 = dims[D_OB2], oh = dims[D_OH],
              obh = dims[D_OBH];
    const int ck2 = C1 * K2, F = C2 * L2; /* im2col width of conv2; head input width */
    const size_t xdim = (size_t)C0 * L0;
    /* zero-padded input length: every tap of every output inside, L0 + 2*P1 at least */
    const int LP = (L1 - 1) * S1 + K1 > L0 + P1 ? (L1 - 1) * S1 + K1 : L0 + P1;
    /* the largest batch these clients take (a batch size far above the clients' sizes costs no memory) */
    int64_t nb = 1;
    for (int k = job->k0; k < job->k1; k++) nb = sizes[k] > nb ? sizes[k] : nb;
    const int BA = nb < B ? (int)nb : B;

    size_t bufsz[] = {
        (size_t)BA * L1 * C1,  /* a1 (channels-last) */
        (size_t)BA * L2 * ck2, /* cols2, then d cols2 */
        (size_t)BA * L2 * C2,  /* a2 */
        (size_t)BA * L2 * C2,  /* dz2 */
        (size_t)BA * O,        /* logits, then d loss / d logits */
        (size_t)BA * L1 * C1,  /* da1, then dz1 in place */
        (size_t)DIM,           /* gradient, internal layout */
        (size_t)DIM,           /* relayout scratch */
        (size_t)DIM,           /* momentum buffer */
        (size_t)O,             /* softmax scratch */
        (size_t)BA * C0 * LP,  /* zero-padded inputs */
    };
    enum { NBUF = sizeof(bufsz) / sizeof(bufsz[0]) };
    float *mem[NBUF];
    size_t scratch = 0;
    for (int i = 0; i < NBUF; i++) scratch += (bufsz[i] + 15) & ~(size_t)15; /* 64-byte multiples */
    float *base = (float *)aligned_alloc(64, scratch * sizeof(float));
    if (!base) {
        job->status = 2;
        if (g_mkl_local) g_mkl_local(blas_prev);
        return NULL;
    }
    {
        size_t off = 0;
        for (int i = 0; i < NBUF; i++) { mem[i] = base + off; off += (bufsz[i] + 15) & ~(size_t)15; }
    }
    float *a1 = mem[0], *cols2 = mem[1], *a2 = mem[2], *dz2 = mem[3], *lg = mem[4], *da1 = mem[5],
          *grad = mem[6], *tmp = mem[7], *mbuf = mem[8], *ex = mem[9], *xpad = mem[10];
    int status = 0;

    /* client by client (clients are independent): a client's parameters and gradient stay in cache over
     * all its steps */
    for (int k = job->k0; k < job->k1 && !status; k++) {
        float *p = updates + (size_t)k * DIM; /* trained in place, from global_w */
        float *bk = momentum != 0.0f ? mbuf : NULL;
        memcpy(p, global_w, (size_t)DIM * sizeof(float));
        if (bk) memset(bk, 0, (size_t)DIM * sizeof(float));
        relayout(p, tmp, C0, C1, K1, C2, K2, L2, O, ow1, ow2, oh, 1);
        const float *w1 = p + ow1, *b1 = p + ob1, *w2 = p + ow2, *b2 = p + ob2, *hw = p + oh, *bh = p + obh;
        for (int e = 0; e < epochs && !status; e++) {
            for (int64_t first = 0; first < sizes[k] && !status; first += B) {
                /* this step's batch: examples order[e, offsets[k] + first : ... + n] of x_all / y_all */
                const int n = sizes[k] - first < B ? (int)(sizes[k] - first) : B;
                const int64_t *ix = order + (size_t)e * total + offsets[k] + first;
                const int m2 = n * L2;

                /* ---- conv1, direct (its input has few channels): a1[i, t, :] = relu(b1 + sum_tap w1[tap, :] x),
                 * over a zero-padded copy of the input so that every output sees all K1 taps */
                for (int i = 0; i < n; i++) {
                    pad_input(x_all + (size_t)ix[i] * xdim, xpad + (size_t)i * C0 * LP, C0, L0, P1, LP);
                    const float *xi = xpad + (size_t)i * C0 * LP;
                    int t0 = 0;
                    if (C1 % VW == 0) /* four outputs at a time: four independent FMA chains */
                        for (; t0 + 4 <= L1; t0 += 4)
                            for (int v = 0; v < C1; v += VW) {
                                vf acc0 = vload(b1 + v), acc1 = acc0, acc2 = acc0, acc3 = acc0;
                                for (int c0 = 0; c0 < C0; c0++) {
                                    const float *xs = xi + (size_t)c0 * LP + t0 * S1;
                                    const float *w = w1 + (size_t)c0 * K1 * C1 + v;
                                    for (int j = 0; j < K1; j++) {
                                        const vf wj = vload(w + (size_t)j * C1);
                                        acc0 += xs[j] * wj;
                                        acc1 += xs[j + S1] * wj;
                                        acc2 += xs[j + 2 * S1] * wj;
                                        acc3 += xs[j + 3 * S1] * wj;
                                    }
                                }
                                float *out = a1 + ((size_t)i * L1 + t0) * C1 + v;
                                vstore(out, vrelu(acc0));
                                vstore(out + C1, vrelu(acc1));
                                vstore(out + 2 * C1, vrelu(acc2));
                                vstore(out + 3 * C1, vrelu(acc3));
                            }
                    for (int t = t0; t < L1; t++) { /* the rest, and any channel count */
                        float *restrict out = a1 + ((size_t)i * L1 + t) * C1;
                        memcpy(out, b1, (size_t)C1 * sizeof(float));
                        for (int c0 = 0; c0 < C0; c0++) {
                            const float *xs = xi + (size_t)c0 * LP + t * S1;
                            for (int j = 0; j < K1; j++) axpy(C1, xs[j], w1 + (size_t)(c0 * K1 + j) * C1, out);
                        }
                        relu(C1, out);
                    }
                }

                /* ---- conv2: im2col over channels-last a1 (columns (tap, channel)), one product */
                for (int i = 0; i < n; i++) {
                    const float *ai = a1 + (size_t)i * L1 * C1;
                    for (int t = 0; t < L2; t++) {
                        float *row = cols2 + ((size_t)i * L2 + t) * ck2;
                        const int start = t * S2 - P2;
                        for (int j = 0; j < K2; j++) {
                            const int pos = start + j;
                            float *restrict dst = row + j * C1;
                            if (pos >= 0 && pos < L1) {
                                const float *src = ai + (size_t)pos * C1;
                                if (C1 % VW == 0) for (int v = 0; v < C1; v += VW) vstore(dst + v, vload(src + v));
                                else for (int c = 0; c < C1; c++) dst[c] = src[c];
                            } else {
                                for (int c = 0; c < C1; c++) dst[c] = 0.0f;
                            }
                        }
                    }
                }
                gemm('N', 'T', m2, C2, ck2, cols2, ck2, w2, ck2, 0.0f, a2, C2);
                for (int r = 0; r < m2; r++) {
                    float *row = a2 + (size_t)r * C2;
                    for (int c = 0; c < C2; c++) { const float v = row[c] + b2[c]; row[c] = v > 0.0f ? v : 0.0f; }
                }

                /* ---- head */
                gemm('N', 'T', n, O, F, a2, F, hw, F, 0.0f, lg, O);

                /* ---- mean cross-entropy; lg becomes d loss / d logits = (softmax - onehot) / n */
                double loss = 0.0;
                const float inv = 1.0f / (float)n;
                for (int i = 0; i < n; i++) {
                    float *row = lg + (size_t)i * O;
                    const int64_t y = y_all[ix[i]];
                    if (y < 0 || y >= O) { status = 3; break; }
                    float mx = row[0] + bh[0];
                    for (int o = 0; o < O; o++) { row[o] += bh[o]; mx = row[o] > mx ? row[o] : mx; }
                    float z = 0.0f;
                    for (int o = 0; o < O; o++) { ex[o] = expf(row[o] - mx); z += ex[o]; }
                    loss += (double)mx + log((double)z) - (double)row[y];
                    const float scale = inv / z;
                    for (int o = 0; o < O; o++) row[o] = ex[o] * scale;
                    row[y] -= inv;
                }
                if (status) break;
                loss_sum[k] += loss / (double)n;

                /* ---- backward: head (weight gradient straight into the internal layout) */
                gemm('T', 'N', O, F, n, lg, O, a2, F, 0.0f, grad + oh, F);
                for (int o = 0; o < O; o++) grad[obh + o] = 0.0f;
                for (int i = 0; i < n; i++)
                    for (int o = 0; o < O; o++) grad[obh + o] += lg[(size_t)i * O + o];
                gemm('N', 'N', n, F, O, lg, O, hw, F, 0.0f, dz2, F);
                /* ReLU of conv2, and its bias gradient */
                for (int c = 0; c < C2; c++) grad[ob2 + c] = 0.0f;
                for (int r = 0; r < m2; r++) {
                    float *d = dz2 + (size_t)r * C2;
                    const float *a = a2 + (size_t)r * C2;
                    for (int c = 0; c < C2; c++) { d[c] = a[c] > 0.0f ? d[c] : 0.0f; grad[ob2 + c] += d[c]; }
                }
                /* conv2 weight gradient [C2, K2*C1], then d cols2 (overwrites cols2) */
                gemm('T', 'N', C2, ck2, m2, dz2, C2, cols2, ck2, 0.0f, grad + ow2, ck2);
                gemm('N', 'N', m2, ck2, C2, dz2, C2, w2, ck2, 0.0f, cols2, ck2);
                /* col2im into da1 as a gather (each row of da1 written once), fused with the ReLU of conv1
                 * (da1 becomes dz1) and its bias gradient */
                for (int c = 0; c < C1; c++) grad[ob1 + c] = 0.0f;
                for (int i = 0; i < n; i++) {
                    const float *ci = cols2 + (size_t)i * L2 * ck2;
                    for (int pos = 0; pos < L1; pos++) {
                        float *restrict d = da1 + ((size_t)i * L1 + pos) * C1;
                        const float *a = a1 + ((size_t)i * L1 + pos) * C1;
                        /* taps j with t*S2 + j - P2 == pos, 0 <= t < L2 */
                        int j = (pos + P2) % S2;
                        int t = (pos + P2) / S2;
                        if (t >= L2) { j += (t - L2 + 1) * S2; t = L2 - 1; }
                        if (C1 % VW == 0) {
                            for (int v = 0; v < C1; v += VW) {
                                vf acc = {0};
                                for (int jj = j, tt = t; jj < K2 && tt >= 0; jj += S2, tt--)
                                    acc += vload(ci + (size_t)tt * ck2 + jj * C1 + v);
                                const vf z = {0};
                                acc = (vf)((vi)acc & (vload(a + v) > z));
                                vstore(d + v, acc);
                                vstore(grad + ob1 + v, vload(grad + ob1 + v) + acc);
                            }
                        } else {
                            for (int c = 0; c < C1; c++) d[c] = 0.0f;
                            for (int jj = j, tt = t; jj < K2 && tt >= 0; jj += S2, tt--) {
                                const float *src = ci + (size_t)tt * ck2 + jj * C1;
                                for (int c = 0; c < C1; c++) d[c] += src[c];
                            }
                            for (int c = 0; c < C1; c++) { d[c] = a[c] > 0.0f ? d[c] : 0.0f; grad[ob1 + c] += d[c]; }
                        }
                    }
                }
                /* conv1 weight gradient, direct: g[tap, :] = sum x * dz1 */
                memset(grad + ow1, 0, (size_t)C0 * K1 * C1 * sizeof(float));
                for (int i = 0; i < n; i++) {
                    const float *xi = xpad + (size_t)i * C0 * LP;
                    for (int c0 = 0; c0 < C0; c0++) {
                        float *g = grad + ow1 + (size_t)c0 * K1 * C1;
                        for (int j = 0; j < K1; j++) {
                            const float *xs = xi + (size_t)c0 * LP + j;
                            float *restrict gj = g + (size_t)j * C1;
                            if (C1 % VW == 0) {
                                for (int v = 0; v < C1; v += VW) {
                                    const float *d = da1 + (size_t)i * L1 * C1 + v;
                                    vf acc0 = vload(gj + v), acc1 = {0}, acc2 = {0}, acc3 = {0};
                                    int t = 0;
                                    for (; t + 4 <= L1; t += 4) {
                                        acc0 += xs[t * S1] * vload(d + (size_t)t * C1);
                                        acc1 += xs[(t + 1) * S1] * vload(d + (size_t)(t + 1) * C1);
                                        acc2 += xs[(t + 2) * S1] * vload(d + (size_t)(t + 2) * C1);
                                        acc3 += xs[(t + 3) * S1] * vload(d + (size_t)(t + 3) * C1);
                                    }
                                    for (; t < L1; t++) acc0 += xs[t * S1] * vload(d + (size_t)t * C1);
                                    vstore(gj + v, (acc0 + acc1) + (acc2 + acc3));
                                }
                            } else {
                                for (int t = 0; t < L1; t++) axpy(C1, xs[t * S1], da1 + ((size_t)i * L1 + t) * C1, gj);
                            }
                        }
                    }
                }

                /* ---- SGD (elementwise: the same in either layout) */
                if (bk) {
                    for (int j = 0; j < DIM; j++) { bk[j] = momentum * bk[j] + grad[j]; p[j] -= lr * bk[j]; }
                } else {
                    for (int j = 0; j < DIM; j++) p[j] -= lr * grad[j];
                }
            }
        }
        relayout(p, tmp, C0, C1, K1, C2, K2, L2, O, ow1, ow2, oh, 0);
        for (int j = 0; j < DIM; j++) p[j] -= global_w[j]; /* the update */
    }
    free(base);
    job->status = status;
    if (g_mkl_local) g_mkl_local(blas_prev);
    return NULL;
}

/* Trains `clients` clients (see the top of this file) on up to `threads` threads, each a contiguous range of
 * clients with about the same number of examples. Returns 0 on success, 1 if sgemm was not set, 2 if
 * memory could not be allocated, 3 if a label is out of range. */
int fedsim_cnn1d_train(const int32_t *dims, const float *global_w, float *updates, const float *x_all,
                       const int64_t *y_all, const int64_t *order, const int64_t *offsets, const int64_t *sizes, int epochs,
                       int64_t total, int clients, float lr, float momentum, double *loss_sum, int threads) {
    if (!g_sgemm) return 1;
    if (threads > clients) threads = clients;
    if (!g_mkl_local) threads = 1; /* cannot keep the BLAS sequential per thread */
    if (threads < 1) threads = 1;
    job_t base = {dims, global_w, updates, x_all, y_all, order, offsets, sizes, epochs, total, lr, momentum,
                  loss_sum, 0, clients, 0};
    if (threads == 1) {
        train_clients(&base);
        return base.status;
    }
    job_t *jobs = (job_t *)calloc((size_t)threads, sizeof(job_t));
    pthread_t *tids = (pthread_t *)calloc((size_t)threads, sizeof(pthread_t));
    if (!jobs || !tids) { free(jobs); free(tids); return 2; }
    int64_t all = 0;
    for (int k = 0; k < clients; k++) all += sizes[k] + 1;
    int k = 0, status = 0;
    int64_t done = 0;
    for (int w = 0; w < threads; w++) {
        jobs[w] = base;
        jobs[w].k0 = k;
        const int64_t goal = all * (w + 1) / threads; /* examples up to the end of this worker's range */
        while (k < clients && (w == threads - 1 || done + sizes[k] + 1 <= goal || k == jobs[w].k0))
            done += sizes[k++] + 1;
        jobs[w].k1 = k;
    }
    char *running = (char *)calloc((size_t)threads, 1);
    if (!running) { free(jobs); free(tids); return 2; }
    for (int w = 1; w < threads; w++) running[w] = pthread_create(&tids[w], NULL, train_clients, &jobs[w]) == 0;
    train_clients(&jobs[0]); /* this thread takes the first range, and any whose thread did not start */
    for (int w = 1; w < threads; w++) {
        if (running[w]) pthread_join(tids[w], NULL);
        else train_clients(&jobs[w]);
    }
    for (int w = 0; w < threads && !status; w++) status = jobs[w].status;
    free(running);
    free(jobs);
    free(tids);
    return status;
}
