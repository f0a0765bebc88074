// The colour calls of many views (DINOv2's, SimCLR's) on their u8 pixels, in place: Pillow's
// arithmetic as torchvision runs it on a PIL image, line for line the CPU rendition in
// src/views/pillow.rs (apply_view_ops). Every float and double step is written with its
// rounding (__fmul_rn, __dadd_rn, ...), so nothing is contracted into a fused multiply-add and
// the bytes are the CPU's.
//
// gpufeed_views_colour: one block per view, the view's calls in order, each a pass of the
// block's threads over its pixels (HWC, 3 bytes each). A blur reads the view and writes its
// other buffer (the view's room in the scratch, or the view itself), the two taking turns; a
// view left in the scratch is copied back at the end. Contrast's grey level is a block-wide
// integer sum of the luma in shared memory.
//
// The plan, one array of 64-bit words:
//   words[v], v = 0..views: the word where view v's calls start (they end where view v + 1's
//     start); each call two words: the kind in the low 32 bits of the first, its integer
//     argument in the high 32 (hue: the shift; solarize: the threshold; blur: the kernel size),
//     and in the second the factor's float32 bits (brightness, contrast, saturation) or, for a
//     blur, the word where its weights start;
//   a blur's weights: (k / 2 + 1)^2 doubles, weight (i, j) = k1[i] * k1[j] (a float32 product)
//     at i * (k / 2 + 1) + j.

#define GF_VIEW_BRIGHTNESS 1
#define GF_VIEW_CONTRAST 2
#define GF_VIEW_SATURATION 3
#define GF_VIEW_HUE 4
#define GF_VIEW_GRAYSCALE 5
#define GF_VIEW_BLUR 6
#define GF_VIEW_SOLARIZE 7

// Pillow's convert("L") of one pixel: ITU-R 601-2 in 16-bit fixed point, rounded.
__device__ __forceinline__ unsigned int gf_view_luma(const unsigned char* px) {
    const unsigned int l = (unsigned int)px[0] * 19595u + (unsigned int)px[1] * 38470u +
                           (unsigned int)px[2] * 7471u;
    return (l + 0x8000u) >> 16;
}

// ImagingBlend(degenerate, image, alpha) of one sample: in1 + alpha * (in2 - in1) in float32,
// clipped to 0..255, truncated.
__device__ __forceinline__ unsigned char gf_view_blend(unsigned int degenerate, unsigned int sample,
                                                       float alpha) {
    const float diff = (float)((int)sample - (int)degenerate);
    const float t = __fadd_rn((float)degenerate, __fmul_rn(alpha, diff));
    if (t <= 0.0f) return 0;
    if (t >= 255.0f) return 255;
    return (unsigned char)(int)t;
}

// (int)v clamped to 0..255: Rust's `(v as i32).clamp(0, 255)`.
__device__ __forceinline__ unsigned char gf_view_clip(double v) {
    const int i = (int)v;
    return (unsigned char)(i < 0 ? 0 : (i > 255 ? 255 : i));
}

// Convert.c's rgb2hsv of one pixel, shifted by `shift` (wrapping), and hsv2rgb back.
__device__ void gf_view_hue(unsigned char* px, unsigned int shift) {
    const unsigned int r = px[0], g = px[1], b = px[2];
    const unsigned int maxc = max(max(r, g), b);
    const unsigned int minc = min(min(r, g), b);
    unsigned int h, s;
    const unsigned int v = maxc;
    if (maxc == minc) {
        h = 0;
        s = 0;
    } else {
        const float cr = (float)(maxc - minc);
        const float sf = __fdiv_rn(cr, (float)maxc);
        const float rc = __fdiv_rn((float)(maxc - r), cr);
        const float gc = __fdiv_rn((float)(maxc - g), cr);
        const float bc = __fdiv_rn((float)(maxc - b), cr);
        float hf;
        if (r == maxc) {
            hf = __fsub_rn(bc, gc);
        } else if (g == maxc) {
            hf = __double2float_rn(__dsub_rn(__dadd_rn(2.0, (double)rc), (double)bc));
        } else {
            hf = __double2float_rn(__dsub_rn(__dadd_rn(4.0, (double)gc), (double)rc));
        }
        hf = __double2float_rn(fmod(__dadd_rn(__ddiv_rn((double)hf, 6.0), 1.0), 1.0));
        h = gf_view_clip(__dmul_rn((double)hf, 255.0));
        s = gf_view_clip(__dmul_rn((double)sf, 255.0));
    }
    h = (h + shift) & 255u;
    if (s == 0) {
        px[0] = (unsigned char)v;
        px[1] = (unsigned char)v;
        px[2] = (unsigned char)v;
        return;
    }
    const double hd = __ddiv_rn(__dmul_rn((double)h, 6.0), 255.0);
    const int i = (int)floor(hd);
    const float f = __double2float_rn(__dsub_rn(hd, (double)(float)i));
    const float fs = __double2float_rn(__ddiv_rn((double)s, 255.0));
    const double vf = (double)v;
    const unsigned char p = gf_view_clip(round(__dmul_rn(vf, __dsub_rn(1.0, (double)fs))));
    const unsigned char q =
        gf_view_clip(round(__dmul_rn(vf, __dsub_rn(1.0, (double)__fmul_rn(fs, f)))));
    const unsigned char t = gf_view_clip(round(
        __dmul_rn(vf, __dsub_rn(1.0, __dmul_rn((double)fs, __dsub_rn(1.0, (double)f))))));
    const unsigned char vv = (unsigned char)v;
    unsigned char o0, o1, o2;
    switch (i % 6) {
        case 0: o0 = vv; o1 = t; o2 = p; break;
        case 1: o0 = q; o1 = vv; o2 = p; break;
        case 2: o0 = p; o1 = vv; o2 = t; break;
        case 3: o0 = p; o1 = q; o2 = vv; break;
        case 4: o0 = t; o1 = p; o2 = vv; break;
        default: o0 = vv; o1 = p; o2 = q; break;
    }
    px[0] = o0;
    px[1] = o1;
    px[2] = o2;
}

// torch's reflect padding of index i into 0..n (the edge not repeated).
__device__ __forceinline__ int gf_view_reflect(int i, int n) {
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
    return i < 0 ? 0 : (i > n - 1 ? n - 1 : i);
}

// torchvision's gaussian_blur of pixel (y, x) of `src` into `dst`: the symmetric taps' samples
// added first (exact integers), each quarter-kernel weight times its sum added to a double in
// the CPU rendition's order (rows i, then columns j), rounded half to even.
__device__ void gf_view_blur_pixel(const unsigned char* src, unsigned char* dst, int y, int x,
                                   int height, int width, int k, const double* weights) {
    const int half = k / 2;
    const int q = half + 1;
    double acc0 = 0.0, acc1 = 0.0, acc2 = 0.0;
    for (int i = 0; i <= half; i++) {
        const int top = i, bottom = k - 1 - i;
        const unsigned char* ra = src + (size_t)gf_view_reflect(y + top - half, height) * width * 3;
        const unsigned char* rb =
            src + (size_t)gf_view_reflect(y + bottom - half, height) * width * 3;
        const bool two_rows = top != bottom;
        for (int j = 0; j <= half; j++) {
            const int l = j, r = k - 1 - j;
            const int xl = gf_view_reflect(x + l - half, width) * 3;
            const int xr = gf_view_reflect(x + r - half, width) * 3;
            int s0 = ra[xl], s1 = ra[xl + 1], s2 = ra[xl + 2];
            if (two_rows) {
                s0 += rb[xl];
                s1 += rb[xl + 1];
                s2 += rb[xl + 2];
            }
            if (l != r) {
                s0 += ra[xr];
                s1 += ra[xr + 1];
                s2 += ra[xr + 2];
                if (two_rows) {
                    s0 += rb[xr];
                    s1 += rb[xr + 1];
                    s2 += rb[xr + 2];
                }
            }
            const double w = weights[i * q + j];
            acc0 = __dadd_rn(acc0, __dmul_rn(w, (double)s0));
            acc1 = __dadd_rn(acc1, __dmul_rn(w, (double)s1));
            acc2 = __dadd_rn(acc2, __dmul_rn(w, (double)s2));
        }
    }
    unsigned char* out = dst + ((size_t)y * width + x) * 3;
    out[0] = (unsigned char)(int)fmin(fmax(rint(acc0), 0.0), 255.0);
    out[1] = (unsigned char)(int)fmin(fmax(rint(acc1), 0.0), 255.0);
    out[2] = (unsigned char)(int)fmin(fmax(rint(acc2), 0.0), 255.0);
}

// At most 512 threads a block (src/cuda/views.rs gives large views 512): registers fit them.
extern "C" __global__ void __launch_bounds__(512) gpufeed_views_colour(unsigned char* images, unsigned char* scratch,
                                                const unsigned long long* __restrict__ plan,
                                                int height, int width) {
    __shared__ unsigned long long s_sum;
    const int n = height * width;
    const size_t bytes = (size_t)n * 3;
    unsigned char* view = images + (size_t)blockIdx.x * bytes;
    unsigned char* other = scratch + (size_t)blockIdx.x * bytes;
    unsigned char* img = view;
    const unsigned long long first = plan[blockIdx.x];
    const unsigned long long last = plan[blockIdx.x + 1];
    for (unsigned long long w = first; w + 1 < last; w += 2) {
        const unsigned long long head = plan[w];
        const unsigned long long body = plan[w + 1];
        const unsigned int kind = (unsigned int)(head & 0xFFFFFFFFull);
        const unsigned int arg = (unsigned int)(head >> 32);
        const float factor = __uint_as_float((unsigned int)(body & 0xFFFFFFFFull));
        switch (kind) {
            case GF_VIEW_BRIGHTNESS:
                for (int i = threadIdx.x; i < (int)bytes; i += blockDim.x)
                    img[i] = gf_view_blend(0u, img[i], factor);
                break;
            case GF_VIEW_CONTRAST: {
                if (threadIdx.x == 0) s_sum = 0ull;
                __syncthreads();
                unsigned long long sum = 0ull;
                for (int p = threadIdx.x; p < n; p += blockDim.x)
                    sum += gf_view_luma(img + (size_t)p * 3);
                atomicAdd(&s_sum, sum);
                __syncthreads();
                // ImageStat's mean (a double sum of whole numbers: exact), int(mean + 0.5).
                const double m = __dadd_rn(__ddiv_rn((double)s_sum, (double)n), 0.5);
                const unsigned int mean = min((unsigned int)m, 255u);
                for (int i = threadIdx.x; i < (int)bytes; i += blockDim.x)
                    img[i] = gf_view_blend(mean, img[i], factor);
                break;
            }
            case GF_VIEW_SATURATION:
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    unsigned char* px = img + (size_t)p * 3;
                    const unsigned int l = gf_view_luma(px);
                    px[0] = gf_view_blend(l, px[0], factor);
                    px[1] = gf_view_blend(l, px[1], factor);
                    px[2] = gf_view_blend(l, px[2], factor);
                }
                break;
            case GF_VIEW_HUE:
                for (int p = threadIdx.x; p < n; p += blockDim.x)
                    gf_view_hue(img + (size_t)p * 3, arg & 255u);
                break;
            case GF_VIEW_GRAYSCALE:
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    unsigned char* px = img + (size_t)p * 3;
                    const unsigned char l = (unsigned char)gf_view_luma(px);
                    px[0] = l;
                    px[1] = l;
                    px[2] = l;
                }
                break;
            case GF_VIEW_BLUR: {
                const double* weights = (const double*)(plan + body);
                unsigned char* dst = img == view ? other : view;
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    const int y = p / width, x = p - (p / width) * width;
                    gf_view_blur_pixel(img, dst, y, x, height, width, (int)arg, weights);
                }
                img = dst;
                break;
            }
            case GF_VIEW_SOLARIZE:
                for (int i = threadIdx.x; i < (int)bytes; i += blockDim.x)
                    if (img[i] >= arg) img[i] = (unsigned char)(255u - img[i]);
                break;
            default:
                break;
        }
        // The next call reads what this one wrote.
        __syncthreads();
    }
    if (img != view) {
        for (int i = threadIdx.x; i < (int)bytes; i += blockDim.x) view[i] = img[i];
    }
}

// gpufeed_views_unpack: a batch's records of views (one record an image, its views one after
// another, as the lanes working ahead write them) copied into the groups' blocks, each group
// packed as [count, n, size, size, 3]. Grid (chunks, views, n): block (c, v, p) copies chunk c
// of view v of the image in place p. table[4 v ..]: the view's offset in a record, its group
// block's offset, its number j in the group, its bytes.
extern "C" __global__ void __launch_bounds__(256)
    gpufeed_views_unpack(const unsigned char* __restrict__ records,
                         unsigned char* __restrict__ blocks,
                         const unsigned long long* __restrict__ table,
                         unsigned long long record_bytes, unsigned int n) {
    const unsigned int v = blockIdx.y, place = blockIdx.z;
    const unsigned long long record_at = table[4 * v], block_at = table[4 * v + 1];
    const unsigned long long j = table[4 * v + 2], bytes = table[4 * v + 3];
    const unsigned char* src = records + place * record_bytes + record_at;
    unsigned char* dst = blocks + block_at + (j * n + place) * bytes;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (((record_bytes | record_at | block_at | bytes) & 15ull) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (unsigned long long i = first; i < bytes / 16; i += step) d[i] = s[i];
    } else {
        for (unsigned long long i = first; i < bytes; i += step) dst[i] = src[i];
    }
}
