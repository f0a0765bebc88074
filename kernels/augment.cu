// The augmentations of training on the u8 batch, after the resize and before the normalize:
// torchvision v2's functional calls on uint8 images, their float32 arithmetic operation by
// operation (products, sums and fused multiply-adds written out with their rounding, so nothing
// is contracted differently), line for line the CPU rendition in src/augment/ops.rs.
//
// gpufeed_augment: one block per image, the image's operations in order, each a pass of the
// block's threads over the pixels (HWC, 3 bytes each), with the image copied to its scratch
// first where an operation reads other pixels, and block-wide sums, minima, maxima and
// histograms in shared memory where it needs them.
// gpufeed_mix_<dtype>: MixUp or CutMix across the batch, fused with the normalize.
// gpufeed_soft_labels: the mixed one-hot labels.

#define GF_AFFINE 1
#define GF_ROT90 2
#define GF_BRIGHTNESS 3
#define GF_SATURATION 4
#define GF_CONTRAST 5
#define GF_SHARPNESS 6
#define GF_POSTERIZE 7
#define GF_SOLARIZE 8
#define GF_AUTOCONTRAST 9
#define GF_EQUALIZE 10
#define GF_INVERT 11
#define GF_HUE 12
#define GF_ERASE 13

// struct KernelOp of src/augment/ops.rs, field for field.
struct GfOp {
    int kind;
    int a, b, c, d, e;
    float f[6];
};

__device__ __forceinline__ unsigned char gf_to_u8(float v) {
    // clamp_(0, 255), then .to(torch.uint8): truncation.
    v = fminf(fmaxf(v, 0.0f), 255.0f);
    return (unsigned char)(int)v;
}

// rgb_to_grayscale(preserve_dtype=False).floor_(): r * 0.2989, + g * 0.587, + b * 0.114.
__device__ __forceinline__ float gf_gray(const unsigned char* px) {
    float l = __fmul_rn((float)px[0], 0.2989f);
    l = __fmaf_rn((float)px[1], 0.587f, l);
    l = __fmaf_rn((float)px[2], 0.114f, l);
    return floorf(l);
}

// _blend(x, other, ratio): x * ratio, + other * (1 - ratio), clamped, truncated.
__device__ __forceinline__ unsigned char gf_blend(unsigned char x, float other, float ratio,
                                                  float one_minus_ratio) {
    return gf_to_u8(__fmaf_rn(other, one_minus_ratio, __fmul_rn((float)x, ratio)));
}

// adjust_hue of one pixel (src/augment/ops.rs hue_pixel).
__device__ void gf_hue(unsigned char* px, float factor) {
    const float scale = (float)(1.0 / 255.0);
    const float r = __fmul_rn((float)px[0], scale);
    const float g = __fmul_rn((float)px[1], scale);
    const float b = __fmul_rn((float)px[2], scale);
    const float maxc = fmaxf(fmaxf(r, g), b);
    const float minc = fminf(fminf(r, g), b);
    const bool eqc = maxc == minc;
    const float range = __fsub_rn(maxc, minc);
    const float s = __fdiv_rn(range, eqc ? 1.0f : maxc);
    const float divisor = eqc ? 1.0f : range;
    const float rc = __fdiv_rn(__fsub_rn(maxc, r), divisor);
    const float gc = __fdiv_rn(__fsub_rn(maxc, g), divisor);
    const float bc = __fdiv_rn(__fsub_rn(maxc, b), divisor);
    const float hg = __fmul_rn(__fsub_rn(__fadd_rn(rc, 2.0f), bc), (maxc == g && maxc != r) ? 1.0f : 0.0f);
    const float hr = __fmul_rn(__fsub_rn(bc, gc), maxc == r ? 1.0f : 0.0f);
    const float hb = __fmul_rn(__fsub_rn(__fadd_rn(gc, 4.0f), rc), (maxc != r && maxc != g) ? 1.0f : 0.0f);
    float h = __fadd_rn(__fadd_rn(hr, hg), hb);
    h = fmodf(__fadd_rn(__fmul_rn(h, (float)(1.0 / 6.0)), 1.0f), 1.0f);
    h = __fadd_rn(h, factor);
    h = __fsub_rn(h, floorf(h));
    const float v = maxc;
    const float h6 = __fmul_rn(h, 6.0f);
    const float i = floorf(h6);
    const float f = __fsub_rn(h6, i);
    const float sxf = __fmul_rn(s, f);
    const float one_minus_s = __fsub_rn(1.0f, s);
    const float q = fminf(fmaxf(__fmul_rn(__fsub_rn(1.0f, sxf), v), 0.0f), 1.0f);
    const float t = fminf(fmaxf(__fmul_rn(__fadd_rn(sxf, one_minus_s), v), 0.0f), 1.0f);
    const float p = fminf(fmaxf(__fmul_rn(one_minus_s, v), 0.0f), 1.0f);
    int k = ((int)i) % 6;
    if (k < 0) k += 6;
    float o[3];
    switch (k) {
        case 0: o[0] = v; o[1] = t; o[2] = p; break;
        case 1: o[0] = q; o[1] = v; o[2] = p; break;
        case 2: o[0] = p; o[1] = v; o[2] = t; break;
        case 3: o[0] = p; o[1] = q; o[2] = v; break;
        case 4: o[0] = t; o[1] = p; o[2] = v; break;
        default: o[0] = v; o[1] = p; o[2] = q; break;
    }
    const float up = 255.0f + 1.0f - 1e-3f;
#pragma unroll
    for (int c = 0; c < 3; c++) px[c] = (unsigned char)(int)__fmul_rn(o[c], up);
}

// The copy every operation that reads other pixels starts from.
__device__ __forceinline__ void gf_copy(const unsigned char* from, unsigned char* to, int bytes) {
    for (int i = threadIdx.x; i < bytes; i += blockDim.x) to[i] = from[i];
    __syncthreads();
}

extern "C" __global__ void gpufeed_augment(unsigned char* __restrict__ batch,
                                           unsigned char* __restrict__ scratch,
                                           const GfOp* __restrict__ ops,
                                           const unsigned int* __restrict__ starts, int height,
                                           int width) {
    __shared__ unsigned int s_hist[3][256];
    __shared__ unsigned char s_lut[3][256];
    __shared__ int s_use_lut[3];
    __shared__ unsigned int s_low[3], s_high[3];
    __shared__ unsigned long long s_sum;
    const int n = height * width;
    const size_t image = (size_t)n * 3;
    unsigned char* img = batch + (size_t)blockIdx.x * image;
    unsigned char* src = scratch + (size_t)blockIdx.x * image;
    const unsigned int first = starts[blockIdx.x];
    const unsigned int last = starts[blockIdx.x + 1];
    for (unsigned int o = first; o < last; o++) {
        const GfOp op = ops[o];
        switch (op.kind) {
            case GF_AFFINE: {
                gf_copy(img, src, (int)image);
                const float wf = (float)width, hf = (float)height;
                const float x0 = __fmul_rn(__fsub_rn(1.0f, wf), 0.5f);
                const float y0 = __fmul_rn(__fsub_rn(1.0f, hf), 0.5f);
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    const int y = p / width, x = p - (p / width) * width;
                    const float bx = __fadd_rn(x0, (float)x);
                    const float by = __fadd_rn(y0, (float)y);
                    const float gx = __fadd_rn(__fmaf_rn(by, op.f[1], __fmul_rn(bx, op.f[0])), op.f[2]);
                    const float gy = __fadd_rn(__fmaf_rn(by, op.f[4], __fmul_rn(bx, op.f[3])), op.f[5]);
                    const float ix = rintf(__fmul_rn(__fsub_rn(__fmul_rn(__fadd_rn(gx, 1.0f), wf), 1.0f), 0.5f));
                    const float iy = rintf(__fmul_rn(__fsub_rn(__fmul_rn(__fadd_rn(gy, 1.0f), hf), 1.0f), 0.5f));
                    unsigned char* out = img + (size_t)p * 3;
                    if (ix >= 0.0f && ix < wf && iy >= 0.0f && iy < hf) {
                        const unsigned char* in = src + ((size_t)(int)iy * width + (int)ix) * 3;
                        out[0] = in[0]; out[1] = in[1]; out[2] = in[2];
                    } else {
                        out[0] = (unsigned char)(op.a & 255);
                        out[1] = (unsigned char)((op.a >> 8) & 255);
                        out[2] = (unsigned char)((op.a >> 16) & 255);
                    }
                }
                break;
            }
            case GF_ROT90: {
                gf_copy(img, src, (int)image);
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    const int y = p / width, x = p - (p / width) * width;
                    int sy, sx;
                    if (op.a == 1) { sy = x; sx = width - 1 - y; }
                    else if (op.a == 2) { sy = height - 1 - y; sx = width - 1 - x; }
                    else { sy = height - 1 - x; sx = y; }
                    const unsigned char* in = src + ((size_t)sy * width + sx) * 3;
                    unsigned char* out = img + (size_t)p * 3;
                    out[0] = in[0]; out[1] = in[1]; out[2] = in[2];
                }
                break;
            }
            case GF_BRIGHTNESS:
                for (int i = threadIdx.x; i < (int)image; i += blockDim.x)
                    img[i] = gf_to_u8(__fmul_rn((float)img[i], op.f[0]));
                break;
            case GF_SATURATION:
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    unsigned char* px = img + (size_t)p * 3;
                    const float g = gf_gray(px);
#pragma unroll
                    for (int c = 0; c < 3; c++) px[c] = gf_blend(px[c], g, op.f[0], op.f[1]);
                }
                break;
            case GF_CONTRAST: {
                if (threadIdx.x == 0) s_sum = 0;
                __syncthreads();
                unsigned long long sum = 0;
                for (int p = threadIdx.x; p < n; p += blockDim.x) sum += (unsigned long long)gf_gray(img + (size_t)p * 3);
                atomicAdd(&s_sum, sum);
                __syncthreads();
                // The sum rounded to float32, divided by the pixel count.
                const float mean = __fdiv_rn((float)s_sum, (float)n);
                for (int i = threadIdx.x; i < (int)image; i += blockDim.x)
                    img[i] = gf_blend(img[i], mean, op.f[0], op.f[1]);
                break;
            }
            case GF_SHARPNESS: {
                gf_copy(img, src, (int)image);
                for (int p = threadIdx.x; p < n; p += blockDim.x) {
                    const int y = p / width, x = p - (p / width) * width;
                    if (y == 0 || x == 0 || y == height - 1 || x == width - 1) continue;
#pragma unroll
                    for (int c = 0; c < 3; c++) {
                        const unsigned char* at = src + c;
                        const unsigned int centre = at[((size_t)y * width + x) * 3];
                        unsigned int ring = 0;
                        for (int dy = -1; dy <= 1; dy++)
                            for (int dx = -1; dx <= 1; dx++)
                                if (dy != 0 || dx != 0) ring += at[((size_t)(y + dy) * width + (x + dx)) * 3];
                        const unsigned int blurred = (2 * (ring + 5 * centre) + 13) / 26;
                        const float diff = __fsub_rn((float)blurred, (float)centre);
                        img[(size_t)p * 3 + c] = gf_to_u8(__fmaf_rn(diff, op.f[1], (float)centre));
                    }
                }
                break;
            }
            case GF_POSTERIZE:
                for (int i = threadIdx.x; i < (int)image; i += blockDim.x) img[i] &= (unsigned char)op.a;
                break;
            case GF_SOLARIZE:
                for (int i = threadIdx.x; i < (int)image; i += blockDim.x)
                    if ((float)img[i] >= op.f[0]) img[i] = 255 - img[i];
                break;
            case GF_AUTOCONTRAST: {
                for (int c = threadIdx.x; c < 3; c += blockDim.x) { s_low[c] = 255; s_high[c] = 0; }
                __syncthreads();
                unsigned int low[3] = {255, 255, 255}, high[3] = {0, 0, 0};
                for (int p = threadIdx.x; p < n; p += blockDim.x)
#pragma unroll
                    for (int c = 0; c < 3; c++) {
                        const unsigned int v = img[(size_t)p * 3 + c];
                        low[c] = min(low[c], v);
                        high[c] = max(high[c], v);
                    }
#pragma unroll
                for (int c = 0; c < 3; c++) { atomicMin(&s_low[c], low[c]); atomicMax(&s_high[c], high[c]); }
                __syncthreads();
                float minimum[3], inv_scale[3];
#pragma unroll
                for (int c = 0; c < 3; c++) {
                    if (s_low[c] == s_high[c]) { minimum[c] = 0.0f; inv_scale[c] = 1.0f; }
                    else {
                        minimum[c] = (float)s_low[c];
                        inv_scale[c] = __fmul_rn(__fsub_rn((float)s_high[c], (float)s_low[c]), (float)(1.0 / 255.0));
                    }
                }
                for (int p = threadIdx.x; p < n; p += blockDim.x)
#pragma unroll
                    for (int c = 0; c < 3; c++) {
                        unsigned char* v = img + (size_t)p * 3 + c;
                        *v = gf_to_u8(__fdiv_rn(__fsub_rn((float)*v, minimum[c]), inv_scale[c]));
                    }
                break;
            }
            case GF_EQUALIZE: {
                for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) (&s_hist[0][0])[i] = 0;
                __syncthreads();
                for (int p = threadIdx.x; p < n; p += blockDim.x)
#pragma unroll
                    for (int c = 0; c < 3; c++) atomicAdd(&s_hist[c][img[(size_t)p * 3 + c]], 1u);
                __syncthreads();
                for (int c = threadIdx.x; c < 3; c += blockDim.x) {
                    // src/augment/ops.rs equalize_lut, one thread per channel.
                    int last_bin = 0;
                    for (int i = 255; i >= 0; i--) if (s_hist[c][i] > 0) { last_bin = i; break; }
                    const unsigned int step = ((unsigned int)n - s_hist[c][last_bin]) / 255;
                    s_use_lut[c] = step != 0;
                    if (step != 0) {
                        unsigned int cumulative = 0;
                        s_lut[c][0] = 0;
                        for (int i = 0; i < 255; i++) {
                            cumulative += s_hist[c][i];
                            s_lut[c][i + 1] = (unsigned char)min((cumulative + step / 2) / step, 255u);
                        }
                    }
                }
                __syncthreads();
                for (int p = threadIdx.x; p < n; p += blockDim.x)
#pragma unroll
                    for (int c = 0; c < 3; c++)
                        if (s_use_lut[c]) img[(size_t)p * 3 + c] = s_lut[c][img[(size_t)p * 3 + c]];
                break;
            }
            case GF_INVERT:
                for (int i = threadIdx.x; i < (int)image; i += blockDim.x) img[i] = 255 - img[i];
                break;
            case GF_HUE:
                for (int p = threadIdx.x; p < n; p += blockDim.x) gf_hue(img + (size_t)p * 3, op.f[0]);
                break;
            case GF_ERASE: {
                const int rows = op.c, cols = op.d;
                for (int q = threadIdx.x; q < rows * cols; q += blockDim.x) {
                    const int y = op.a + q / cols, x = op.b + q % cols;
                    unsigned char* out = img + ((size_t)y * width + x) * 3;
                    out[0] = (unsigned char)(op.e & 255);
                    out[1] = (unsigned char)((op.e >> 8) & 255);
                    out[2] = (unsigned char)((op.e >> 16) & 255);
                }
                break;
            }
            default:
                break;
        }
        // The next operation reads what this one wrote (and may overwrite the scratch).
        __syncthreads();
    }
}

#define GF_F32 0
#define GF_F16 1
#define GF_BF16 2

struct GfMixAffine {
    float scale[3];
    float bias[3];
};

template <int KIND>
__device__ __forceinline__ void gf_mix_store(void* out, size_t i, float v) {
    if (KIND == GF_F32) {
        static_cast<float*>(out)[i] = v;
    } else if (KIND == GF_F16) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        static_cast<unsigned short*>(out)[i] = h;
    } else {
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        static_cast<unsigned short*>(out)[i] = h;
    }
}

// One thread per pixel of the batch: its row's own sample, or the previous row's (the last for
// row 0) inside CutMix's box, or both mixed (MixUp), normalized: fma(x, scale, bias), MixUp's
// n(partner) * (1 - lam) + n(own) * lam. kind 1 MixUp, 2 CutMix. Box x1, y1, x2, y2.
template <int KIND>
__device__ __forceinline__ void gf_mix(const unsigned char* __restrict__ in, void* __restrict__ out,
                                       unsigned int pixels, unsigned int hw, unsigned int rows,
                                       unsigned int width, GfMixAffine p, int bgr, int nchw,
                                       int kind, float lam, float one_minus_lam, int x1, int y1,
                                       int x2, int y2) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) return;
    const unsigned int row = i / hw;
    const unsigned int pix = i - row * hw;
    const unsigned int partner = row == 0 ? rows - 1 : row - 1;
    const size_t own_at = (size_t)i * 3;
    const size_t other_at = ((size_t)partner * hw + pix) * 3;
    const int x = (int)(pix % width), y = (int)(pix / width);
    const bool inside = kind == 2 && x >= x1 && x < x2 && y >= y1 && y < y2;
#pragma unroll
    for (int c = 0; c < 3; c++) {
        float v;
        if (kind == 1) {
            const float own = __fmaf_rn((float)in[own_at + c], p.scale[c], p.bias[c]);
            const float other = __fmaf_rn((float)in[other_at + c], p.scale[c], p.bias[c]);
            v = __fadd_rn(__fmul_rn(other, one_minus_lam), __fmul_rn(own, lam));
        } else {
            const unsigned char s = inside ? in[other_at + c] : in[own_at + c];
            v = __fmaf_rn((float)s, p.scale[c], p.bias[c]);
        }
        const int oc = bgr ? 2 - c : c;
        const size_t o = nchw ? ((size_t)row * 3 + oc) * hw + pix : own_at + oc;
        gf_mix_store<KIND>(out, o, v);
    }
}

#define GF_MIX_ENTRY(NAME, KIND)                                                                 \
    extern "C" __global__ void gpufeed_mix_##NAME(                                               \
        const unsigned char* __restrict__ in, void* __restrict__ out, unsigned int pixels,       \
        unsigned int hw, unsigned int rows, unsigned int width, GfMixAffine p, int bgr,          \
        int nchw, int kind, float lam, float one_minus_lam, int x1, int y1, int x2, int y2) {    \
        gf_mix<KIND>(in, out, pixels, hw, rows, width, p, bgr, nchw, kind, lam, one_minus_lam,   \
                     x1, y1, x2, y2);                                                            \
    }

GF_MIX_ENTRY(f32, GF_F32)
GF_MIX_ENTRY(f16, GF_F16)
GF_MIX_ENTRY(bf16, GF_BF16)

// The soft labels, [rows, classes] float32: one_hot(previous row's label) * (1 - lam) +
// one_hot(own label) * lam, one thread per element.
extern "C" __global__ void gpufeed_soft_labels(const unsigned int* __restrict__ labels,
                                               float* __restrict__ out, unsigned int rows,
                                               unsigned int classes, float lam,
                                               float one_minus_lam) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * classes) return;
    const unsigned int row = i / classes, c = i - row * classes;
    const unsigned int partner = row == 0 ? rows - 1 : row - 1;
    const float a = labels[partner] == c ? one_minus_lam : 0.0f;
    const float b = labels[row] == c ? lam : 0.0f;
    out[i] = __fadd_rn(a, b);
}
