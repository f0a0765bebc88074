// The colour calls of many views (DINOv2's, SimCLR's) on their u8 pixels, in place: Pillow's
// arithmetic as torchvision runs it on a PIL image, line for line the CPU rendition in
// src/views/pillow.rs (apply_view_ops) but for the hue, whose float and double steps give the
// whole-number results gf_view_hue computes instead. Every float and double step is written
// with its rounding (__fmul_rn, __dadd_rn, ...), so nothing is contracted into a fused
// multiply-add and the bytes are the CPU's.
//
// gpufeed_views_colour: one block per view. The view's calls run in passes of the block's
// threads over its pixels (HWC, 3 bytes each), each pixel's three samples held in registers
// from its read to its write: a pass is an optional blur (reading the view where it lies and
// writing its other buffer: the view's room in the scratch, or the view itself) followed by the
// point calls after it, up to the next blur or the next contrast. A contrast's grey level is the
// mean luma of the pixels the pass before it writes, summed as they are written (a block-wide
// integer sum in shared memory), so a view's jitter, grayscale, blur and solarize take one to
// three passes over its pixels instead of one or two per call. Before a blur the pass writes
// the other buffer, so that the blur writes the view back; a view left in the scratch is copied
// back at the end. A blur runs in bands of rows, each read once into a tile of shared memory
// with its halo (reflected at the view's edges as it is filled), a pixel's three samples packed
// in one word: the four samples a pair of symmetric taps adds are four reads of the tile for
// all three channels; for the kernel sizes the presets draw (9 and 23) its loops are unrolled,
// every tap a constant offset in the tile and the weights in shared memory. Without room for a
// band (a very wide view) it reads the view directly, the same sums in the same order.
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

// The hue byte Convert.c's rgb2hsv gives where the quotient gf_view_hue divides is whole, for
// each whole quotient k: computed once per block with Convert.c's float steps.
struct GfHueTables {
    unsigned char whole[256];
};

// Pillow's convert("L") of one pixel: ITU-R 601-2 in 16-bit fixed point, rounded.
__device__ __forceinline__ unsigned int gf_view_luma(const unsigned int* px) {
    const unsigned int l = px[0] * 19595u + px[1] * 38470u + px[2] * 7471u;
    return (l + 0x8000u) >> 16;
}

// ImagingBlend(degenerate, image, alpha) of one sample: in1 + alpha * (in2 - in1) in float32,
// clipped to 0..255, truncated.
__device__ __forceinline__ unsigned int gf_view_blend(unsigned int degenerate, unsigned int sample,
                                                      float alpha) {
    const float diff = (float)((int)sample - (int)degenerate);
    const float t = __fadd_rn((float)degenerate, __fmul_rn(alpha, diff));
    if (t <= 0.0f) return 0u;
    if (t >= 255.0f) return 255u;
    return (unsigned int)(int)t;
}

// (int)v clamped to 0..255: Rust's `(v as i32).clamp(0, 255)`.
__device__ __forceinline__ unsigned int gf_view_clip(double v) {
    const int i = (int)v;
    return (unsigned int)(i < 0 ? 0 : (i > 255 ? 255 : i));
}

// A whole number 0 <= s < 2^31 as a double, exactly, without a conversion instruction (they
// run at a quarter of the double adds' rate): the bits of 2^52 + s, less 2^52.
__device__ __forceinline__ double gf_view_whole(int s) {
    return __dsub_rn(__hiloint2double(0x43300000, s), 4503599627370496.0);
}

// Convert.c's rgb2hsv hue byte of a pixel whose channels differ, as it computes it: h in float
// from the two distances its branch divides, fmod(h / 6 + 1, 1) in double (h lies in [-1, 5],
// so the sum in [5/6, 11/6], and the remainder is the sum, or the sum less 1: exact), times 255,
// truncated.
__device__ __forceinline__ unsigned int gf_view_hue_byte(unsigned int r, unsigned int g,
                                                         unsigned int b) {
    const unsigned int maxc = max(max(r, g), b);
    const unsigned int minc = min(min(r, g), b);
    const float cr = (float)(maxc - minc);
    float hf;
    if (r == maxc) {
        hf = __fsub_rn(__fdiv_rn((float)(maxc - b), cr), __fdiv_rn((float)(maxc - g), cr));
    } else if (g == maxc) {
        const float rc = __fdiv_rn((float)(maxc - r), cr);
        const float bc = __fdiv_rn((float)(maxc - b), cr);
        hf = __double2float_rn(__dsub_rn(__dadd_rn(2.0, (double)rc), (double)bc));
    } else {
        const float gc = __fdiv_rn((float)(maxc - g), cr);
        const float rc = __fdiv_rn((float)(maxc - r), cr);
        hf = __double2float_rn(__dsub_rn(__dadd_rn(4.0, (double)gc), (double)rc));
    }
    double x = __dadd_rn(__ddiv_rn((double)hf, 6.0), 1.0);
    if (x >= 1.0) x = __dsub_rn(x, 1.0);
    return gf_view_clip(__dmul_rn((double)__double2float_rn(x), 255.0));
}

// GfHueTables' entries k = threadIdx.x, threadIdx.x + blockDim.x, ...: the hue byte of a pixel
// whose channels span 0..255 and whose n (see gf_view_hue) is 6k, on the branch of rgb2hsv
// that n falls in (k = 255 never occurs: it is left 255).
__device__ __forceinline__ void gf_view_hue_tables(GfHueTables* t) {
    for (int e = threadIdx.x; e < 256; e += blockDim.x) {
        const unsigned int n = 6u * (unsigned int)e;
        unsigned int r = 255u, g = 0u, b = 0u;
        if (n <= 255u) {
            g = n;
        } else if (n <= 510u) {
            r = 510u - n;
            g = 255u;
        } else if (n <= 765u) {
            r = 0u;
            g = 255u;
            b = n - 510u;
        } else if (n <= 1020u) {
            r = 0u;
            g = 1020u - n;
            b = 255u;
        } else if (n <= 1275u) {
            r = n - 1020u;
            b = 255u;
        } else if (n < 1530u) {
            b = 1530u - n;
        }
        t->whole[e] = (unsigned char)(n < 1530u ? gf_view_hue_byte(r, g, b) : 255u);
    }
}

// floor(n / d) for n < 2^24 and 0 < d < 2^16 whose quotient is at most 255, and whether the
// division leaves nothing: the approximate float quotient (within 2 ulp, so at most one off
// once truncated) corrected by its remainder.
__device__ __forceinline__ unsigned int gf_view_quotient(unsigned int n, unsigned int d,
                                                         bool* whole) {
    unsigned int q = (unsigned int)__fdividef((float)n, (float)d);
    int rest = (int)n - (int)(q * d);
    if (rest < 0) {
        q -= 1u;
        rest += (int)d;
    } else if (rest >= (int)d) {
        q += 1u;
        rest -= (int)d;
    }
    *whole = rest == 0;
    return q;
}

// Convert.c's rgb2hsv of one pixel, its hue shifted by `shift` (wrapping), and hsv2rgb back,
// in whole numbers. For every colour (the tests run all 2^24 of them) its float and double
// steps give:
// - the saturation s = floor(255 c / v), c the channels' span and v their largest;
// - the hue floor(255 n / 6c), where n is 6c times the hue's fraction of the turn (g - b, plus
//   6c when negative, with red the largest; 2c + b - r with green; 4c + r - g with blue),
//   except where that quotient k is whole: there the float steps may fall one below it, and
//   do for the same k whatever the colour (GfHueTables holds what they give);
// - p, q and t: v (255 - s) / 255, v (255^2 - s m) / 255^2 and v (255^2 - s (255 - m)) / 255^2
//   rounded half up, where m = 6h mod 255 is 255 times hsv2rgb's remainder f;
// so the same bytes come out of these integer steps.
__device__ __forceinline__ void gf_view_hue(unsigned int* px, unsigned int shift,
                                            const GfHueTables* tables) {
    const unsigned int r = px[0], g = px[1], b = px[2];
    const unsigned int v = max(max(r, g), b);
    const unsigned int c = v - min(min(r, g), b);
    // A grey (s = 0) stays itself.
    if (c == 0u) return;
    bool whole;
    const unsigned int s = gf_view_quotient(255u * c, v, &whole);
    unsigned int n;
    if (r == v) {
        n = g >= b ? g - b : 6u * c + g - b;
    } else if (g == v) {
        n = 2u * c + b - r;
    } else {
        n = 4u * c + r - g;
    }
    const unsigned int k = gf_view_quotient(255u * n, 6u * c, &whole);
    const unsigned int h = ((whole ? (unsigned int)tables->whole[k] : k) + shift) & 255u;
    // s >= 1 (c >= 1, v <= 255): hsv2rgb takes its sectors.
    const unsigned int sector = 6u * h / 255u;
    const unsigned int m = 6u * h - 255u * sector;
    const unsigned int p = (2u * v * (255u - s) + 255u) / 510u;
    const unsigned int q = (2u * v * (65025u - s * m) + 65025u) / 130050u;
    const unsigned int t = (2u * v * (65025u - s * (255u - m)) + 65025u) / 130050u;
    unsigned int o0, o1, o2;
    switch (sector) {
        case 1: o0 = q; o1 = v; o2 = p; break;
        case 2: o0 = p; o1 = v; o2 = t; break;
        case 3: o0 = p; o1 = q; o2 = v; break;
        case 4: o0 = t; o1 = p; o2 = v; break;
        case 5: o0 = v; o1 = p; o2 = q; break;
        default: o0 = v; o1 = t; o2 = p; break;
    }
    px[0] = o0;
    px[1] = o1;
    px[2] = o2;
}

// A call's kind: the low 32 bits of its first word.
__device__ __forceinline__ unsigned int gf_view_kind(unsigned long long head) {
    return (unsigned int)(head & 0xFFFFFFFFull);
}

// One point call (any call but a blur) on a pixel's samples; a contrast blends toward `grey`.
__device__ __forceinline__ void gf_view_point(unsigned long long head, unsigned long long body,
                                              unsigned int grey, const GfHueTables* tables,
                                              unsigned int* px) {
    const unsigned int kind = gf_view_kind(head);
    const unsigned int arg = (unsigned int)(head >> 32);
    const float factor = __uint_as_float((unsigned int)(body & 0xFFFFFFFFull));
    switch (kind) {
        case GF_VIEW_BRIGHTNESS:
            for (int c = 0; c < 3; c++) px[c] = gf_view_blend(0u, px[c], factor);
            break;
        case GF_VIEW_CONTRAST:
            for (int c = 0; c < 3; c++) px[c] = gf_view_blend(grey, px[c], factor);
            break;
        case GF_VIEW_SATURATION: {
            const unsigned int l = gf_view_luma(px);
            for (int c = 0; c < 3; c++) px[c] = gf_view_blend(l, px[c], factor);
            break;
        }
        case GF_VIEW_HUE:
            gf_view_hue(px, arg & 255u, tables);
            break;
        case GF_VIEW_GRAYSCALE: {
            const unsigned int l = gf_view_luma(px);
            px[0] = l;
            px[1] = l;
            px[2] = l;
            break;
        }
        case GF_VIEW_SOLARIZE:
            for (int c = 0; c < 3; c++)
                if (px[c] >= arg) px[c] = 255u - px[c];
            break;
        default:
            break;
    }
}

// torch's reflect padding of index i into 0..n (the edge not repeated).
__device__ __forceinline__ int gf_view_reflect(int i, int n) {
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
    return i < 0 ? 0 : (i > n - 1 ? n - 1 : i);
}

// The packed samples of a pixel: red, green and blue in bits 0-9, 10-19 and 20-29, so that the
// sum of four pixels (each field at most 4 x 255 = 1020) is the sum of each channel.
__device__ __forceinline__ unsigned int gf_view_pack(const unsigned char* px) {
    return (unsigned int)px[0] | ((unsigned int)px[1] << 10) | ((unsigned int)px[2] << 20);
}

// A blur's pixels read from a tile of packed pixels in shared memory: rows y0 - half .. of the
// view (reflected at its edges when the tile was filled), each `pitch` pixels from column -half.
struct GfViewTile {
    const unsigned int* tile;
    int pitch, y0, half;
    // The packed pixel at row y + dy, column x + dx of the view (|dy|, |dx| <= half).
    __device__ __forceinline__ unsigned int at(int y, int x, int dy, int dx) const {
        return tile[(y - y0 + half + dy) * pitch + x + half + dx];
    }
};

// A blur's pixels read from the view itself, reflected at its edges (torch's reflect padding).
struct GfViewDirect {
    const unsigned char* src;
    int height, width;
    __device__ __forceinline__ unsigned int at(int y, int x, int dy, int dx) const {
        const int yy = gf_view_reflect(y + dy, height), xx = gf_view_reflect(x + dx, width);
        return gf_view_pack(src + ((size_t)yy * width + xx) * 3);
    }
};

// A blur's three sums rounded half to even and clipped to 0..255, into `px`.
__device__ __forceinline__ void gf_view_blur_round(double acc0, double acc1, double acc2,
                                                   unsigned int* px) {
    px[0] = (unsigned int)(int)fmin(fmax(rint(acc0), 0.0), 255.0);
    px[1] = (unsigned int)(int)fmin(fmax(rint(acc1), 0.0), 255.0);
    px[2] = (unsigned int)(int)fmin(fmax(rint(acc2), 0.0), 255.0);
}

// acc + w * s for a blur's float32 weight `w` and whole sample sum `s` below 2^10: their
// product is exact in a double (at most 34 significant bits), so the fused multiply-add rounds
// once, where the CPU rendition rounds the product (exactly) and then the sum: the same bits.
// The kernel's one fused operation: built with GF_VIEW_BLUR_UNFUSED it is the product and the
// sum apart, so that a test can check the compiler fuses nothing else.
__device__ __forceinline__ double gf_view_blur_madd(double w, double s, double acc) {
#ifdef GF_VIEW_BLUR_UNFUSED
    return __dadd_rn(acc, __dmul_rn(w, s));
#else
    return __fma_rn(w, s, acc);
#endif
}

// One weighted term of a blur's sums: the three channels of `sum` (a packed sum of equal taps'
// samples) times weight `w`, added to the accumulators.
__device__ __forceinline__ void gf_view_blur_term(unsigned int sum, double w, double& acc0,
                                                  double& acc1, double& acc2) {
    acc0 = gf_view_blur_madd(w, gf_view_whole((int)(sum & 1023u)), acc0);
    acc1 = gf_view_blur_madd(w, gf_view_whole((int)((sum >> 10) & 1023u)), acc1);
    acc2 = gf_view_blur_madd(w, gf_view_whole((int)(sum >> 20)), acc2);
}

// torchvision's gaussian_blur of pixel (y, x) into `px`: the samples its equal taps weigh added
// first (exact integers, the three channels at once in packed words), each quarter-kernel
// weight times its sum added to a double in the CPU rendition's order (rows i, then columns j),
// rounded half to even.
template <typename Pixels>
__device__ __forceinline__ void gf_view_blur(const Pixels& pixels, int y, int x, int k,
                                             const double* weights, unsigned int* px) {
    const int half = k / 2;
    const int q = half + 1;
    double acc0 = 0.0, acc1 = 0.0, acc2 = 0.0;
    for (int i = 0; i <= half; i++) {
        const int top = i - half, bottom = k - 1 - i - half;
        const bool two_rows = top != bottom;
        for (int j = 0; j <= half; j++) {
            const int l = j - half, r = k - 1 - j - half;
            unsigned int sum = pixels.at(y, x, top, l);
            if (two_rows) sum += pixels.at(y, x, bottom, l);
            if (l != r) {
                sum += pixels.at(y, x, top, r);
                if (two_rows) sum += pixels.at(y, x, bottom, r);
            }
            gf_view_blur_term(sum, weights[i * q + j], acc0, acc1, acc2);
        }
    }
    gf_view_blur_round(acc0, acc1, acc2, px);
}

// Kernel sizes whose tiled blur is compiled with its loops unrolled (DINOv2's 9, SimCLR's 23),
// and the most weights among them: (23 / 2 + 1)^2.
#define GF_VIEW_UNROLLED_WEIGHTS 144
__device__ __forceinline__ bool gf_view_unrolled(int k) { return k == 9 || k == 23; }

// gf_view_blur from the tile for a kernel of K taps known when compiled: the same sums,
// products and order, with every tap's place a constant offset from the window's top-left
// pixel `at` (rows `pitch` apart) and the weights read from shared memory.
template <int K>
__device__ __forceinline__ void gf_view_blur_unrolled(const unsigned int* at, int pitch,
                                                      const double* weights, unsigned int* px) {
    constexpr int half = K / 2, q = half + 1;
    double acc0 = 0.0, acc1 = 0.0, acc2 = 0.0;
#pragma unroll
    for (int i = 0; i <= half; i++) {
        const unsigned int* top = at + i * pitch;
        const unsigned int* bottom = at + (K - 1 - i) * pitch;
#pragma unroll
        for (int j = 0; j <= half; j++) {
            unsigned int sum = top[j];
            if (i != half) sum += bottom[j];
            if (j != half) {
                sum += top[K - 1 - j];
                if (i != half) sum += bottom[K - 1 - j];
            }
            gf_view_blur_term(sum, weights[i * q + j], acc0, acc1, acc2);
        }
    }
    gf_view_blur_round(acc0, acc1, acc2, px);
}

// The end of a pass for one pixel: the point calls at plan words [a, b), the write (when the
// pass writes); its luma when a contrast follows (to be summed), else 0.
__device__ __forceinline__ unsigned int gf_view_finish(const unsigned long long* __restrict__ plan,
                                                       unsigned long long a, unsigned long long b,
                                                       unsigned int grey,
                                                       const GfHueTables* tables,
                                                       unsigned int* px, unsigned char* out,
                                                       bool writes, bool sum_next) {
    for (unsigned long long c = a; c < b; c += 2)
        gf_view_point(plan[c], plan[c + 1], grey, tables, px);
    if (writes) {
        out[0] = (unsigned char)px[0];
        out[1] = (unsigned char)px[1];
        out[2] = (unsigned char)px[2];
    }
    return sum_next ? gf_view_luma(px) : 0u;
}

// The tile a blur reads, in dynamic shared memory: `tile_words` packed pixels (src/cuda/views.rs
// sizes it from the views' width and their largest blur; 0: none, every blur reads the view).
#ifndef GF_VIEW_TILE
#define GF_VIEW_TILE extern __shared__ unsigned int s_tile[]
#endif

// At most 512 threads a block (src/cuda/views.rs gives large views 512), two such blocks a
// multiprocessor: at most 64 registers a thread.
extern "C" __global__ void __launch_bounds__(512, 2)
    gpufeed_views_colour(unsigned char* images, unsigned char* scratch,
                         const unsigned long long* __restrict__ plan, int height, int width,
                         unsigned int tile_words) {
    __shared__ unsigned long long s_sum;
    __shared__ GfHueTables s_hue;
    __shared__ double s_weights[GF_VIEW_UNROLLED_WEIGHTS];
    GF_VIEW_TILE;
    const int n = height * width;
    const size_t bytes = (size_t)n * 3;
    unsigned char* view = images + (size_t)blockIdx.x * bytes;
    unsigned char* other = scratch + (size_t)blockIdx.x * bytes;
    const unsigned long long first = plan[blockIdx.x];
    const unsigned long long last = plan[blockIdx.x + 1];
    // A view without calls is left as it is (the whole block returns together).
    if (first + 1 >= last) return;
    // The hue's tables, where a call needs them (the same answer in every thread).
    bool hue = false;
    for (unsigned long long w = first; w + 1 < last; w += 2)
        hue = hue || gf_view_kind(plan[w]) == GF_VIEW_HUE;
    if (hue) {
        gf_view_hue_tables(&s_hue);
        __syncthreads();
    }
    unsigned char* src = view;
    // The grey level of the contrast at `w`, once `summed`.
    unsigned int grey = 0;
    bool summed = false;
    unsigned long long w = first;
    while (w + 1 < last) {
        const unsigned int kind = gf_view_kind(plan[w]);
        const bool blur = kind == GF_VIEW_BLUR;
        // The pass's point calls are words [a, b): those after its blur, or from w, up to the
        // next blur or contrast (the contrast at w itself, once its grey level is known). A
        // contrast first whose level is not known yet makes a pass that only sums it.
        const unsigned long long a = blur ? w + 2 : w;
        unsigned long long b = a;
        if (blur || kind != GF_VIEW_CONTRAST || summed) {
            while (b + 1 < last) {
                const unsigned int next = gf_view_kind(plan[b]);
                if (next == GF_VIEW_BLUR || (next == GF_VIEW_CONTRAST && b != w)) break;
                b += 2;
            }
        }
        const unsigned int after = b + 1 < last ? gf_view_kind(plan[b]) : 0u;
        const bool sum_next = after == GF_VIEW_CONTRAST;
        const bool writes = blur || b > a;
        unsigned char* dst = src;
        if (blur) {
            dst = src == view ? other : view;
        } else if (after == GF_VIEW_BLUR && src == view) {
            dst = other;
        }
        if (sum_next) {
            // Every thread has read the last sum (it ended a pass before this barrier).
            __syncthreads();
            if (threadIdx.x == 0) s_sum = 0ull;
            __syncthreads();
        }
        const int ksize = blur ? (int)(plan[w] >> 32) : 0;
        const double* weights = blur ? (const double*)(plan + plan[w + 1]) : (const double*)0;
        // A blur's bands of rows: as many as the tile holds with their halo.
        const int half = ksize / 2;
        const int pitch = width + 2 * half;
        const int band = blur ? (int)(tile_words / (unsigned int)pitch) - 2 * half : 0;
        unsigned long long sum = 0ull;
        // An unrolled blur reads its weights from shared memory (the first band's barrier
        // orders this copy before the reads; the pass before has ended with a barrier).
        const bool unrolled = band >= 1 && gf_view_unrolled(ksize);
        if (unrolled) {
            for (int e = threadIdx.x; e < (half + 1) * (half + 1); e += blockDim.x)
                s_weights[e] = weights[e];
        }
        if (band >= 1) {
            for (int y0 = 0; y0 < height; y0 += band) {
                const int rows = min(band, height - y0);
                const GfViewTile tile = {s_tile, pitch, y0, half};
                const int tile_rows = rows + 2 * half;
                // The band before has read the tile.
                __syncthreads();
                for (int e = threadIdx.x; e < tile_rows * pitch; e += blockDim.x) {
                    const int ty = e / pitch, tx = e - ty * pitch;
                    const int yy = gf_view_reflect(y0 - half + ty, height);
                    const int xx = gf_view_reflect(tx - half, width);
                    s_tile[e] = gf_view_pack(src + ((size_t)yy * width + xx) * 3);
                }
                __syncthreads();
                for (int e = threadIdx.x; e < rows * width; e += blockDim.x) {
                    const int ty = e / width, x = e - ty * width;
                    unsigned int px[3];
                    const unsigned int* at = s_tile + ty * pitch + x;
                    if (unrolled && ksize == 9) {
                        gf_view_blur_unrolled<9>(at, pitch, s_weights, px);
                    } else if (unrolled && ksize == 23) {
                        gf_view_blur_unrolled<23>(at, pitch, s_weights, px);
                    } else {
                        gf_view_blur(tile, y0 + ty, x, ksize, weights, px);
                    }
                    sum += gf_view_finish(plan, a, b, grey, &s_hue, px,
                                          dst + ((size_t)(y0 + ty) * width + x) * 3, writes,
                                          sum_next);
                }
            }
        } else {
            const GfViewDirect direct = {src, height, width};
            for (int p = threadIdx.x; p < n; p += blockDim.x) {
                unsigned int px[3];
                const unsigned char* at = src + (size_t)p * 3;
                if (blur) {
                    const int y = p / width;
                    gf_view_blur(direct, y, p - y * width, ksize, weights, px);
                } else {
                    px[0] = at[0];
                    px[1] = at[1];
                    px[2] = at[2];
                }
                sum += gf_view_finish(plan, a, b, grey, &s_hue, px, dst + (size_t)p * 3, writes,
                                      sum_next);
            }
        }
        if (sum_next) atomicAdd(&s_sum, sum);
        // The next pass reads what this one wrote, and the sum is whole.
        __syncthreads();
        if (sum_next) {
            // ImageStat's mean (a double sum of whole numbers: exact), int(mean + 0.5).
            const double m = __dadd_rn(__ddiv_rn((double)s_sum, (double)n), 0.5);
            grey = min((unsigned int)m, 255u);
        }
        summed = sum_next;
        src = dst;
        w = b;
    }
    if (src != view) {
        for (int i = threadIdx.x; i < (int)bytes; i += blockDim.x) view[i] = src[i];
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
