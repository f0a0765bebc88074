// gpufeed: u8 HWC image batch -> normalized f16 / bf16 / f32 tensor, NCHW or NHWC, RGB or BGR.
//
// Compiled at run time by NVRTC (src/gpu/kernel.rs), which has no include path here: no headers,
// halves are written as raw 16-bit patterns.
//
// Every output element is  y = fmaf(x, scale[c], bias[c])  for the u8 sample x of source channel c
// (torchvision's Normalize on x / 255, folded on the host), rounded to nearest-even into the output
// type. src/reference.rs computes the very same thing on the CPU; the two agree bit for bit.
//
// The fast kernels give each thread 16 whole pixels: three 16-byte loads bring in 48 bytes, and
// the results leave in 16-byte stores, one run per output channel plane (NCHW) or one contiguous
// run (NHWC). Neighbouring threads touch neighbouring addresses, so every access is coalesced.
// They need the pixel count per image (NCHW) or per batch (NHWC) to be a multiple of 16; the host
// falls back to the one-pixel-per-thread kernels otherwise.

struct GfAffine {
    float scale[3];
    float bias[3];
};

#define GF_F32 0
#define GF_F16 1
#define GF_BF16 2

// u8 -> f32 without the quarter-rate integer-to-float unit: 0x4B0000xx is 2^23 + xx exactly.
__device__ __forceinline__ float gf_byte(unsigned int word, unsigned int k) {
    return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | k)) - 8388608.0f;
}

__device__ __forceinline__ unsigned int gf_f16_bits(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ unsigned int gf_bf16_bits(float x) {
    // Round to nearest even; inputs are finite (std > 0 and finite is checked on the host).
    unsigned int u = __float_as_uint(x);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return u >> 16;
}

// Two values packed as one 32-bit word, lo in the low half.
template <int KIND>
__device__ __forceinline__ unsigned int gf_pack2(float lo, float hi) {
    if (KIND == GF_F16) {
#if __CUDA_ARCH__ >= 800
        unsigned int d;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
#else
        return gf_f16_bits(lo) | (gf_f16_bits(hi) << 16);
#endif
    } else {
        return gf_bf16_bits(lo) | (gf_bf16_bits(hi) << 16);
    }
}

template <int KIND>
__device__ __forceinline__ void gf_store_one(void* out, size_t i, float v) {
    if (KIND == GF_F32) {
        static_cast<float*>(out)[i] = v;
    } else if (KIND == GF_F16) {
        static_cast<unsigned short*>(out)[i] = (unsigned short)gf_f16_bits(v);
    } else {
        static_cast<unsigned short*>(out)[i] = (unsigned short)gf_bf16_bits(v);
    }
}

// Stores v[0..COUNT) at element offset i (16-byte aligned) with 16-byte stores.
template <int KIND, int COUNT>
__device__ __forceinline__ void gf_store_run(void* out, size_t i, const float* v) {
    if (KIND == GF_F32) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(out) + i);
#pragma unroll
        for (int q = 0; q < COUNT / 4; q++) {
            dst[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        }
    } else {
        uint4* dst = reinterpret_cast<uint4*>(static_cast<unsigned short*>(out) + i);
#pragma unroll
        for (int q = 0; q < COUNT / 8; q++) {
            dst[q] = make_uint4(gf_pack2<KIND>(v[8 * q], v[8 * q + 1]),
                                gf_pack2<KIND>(v[8 * q + 2], v[8 * q + 3]),
                                gf_pack2<KIND>(v[8 * q + 4], v[8 * q + 5]),
                                gf_pack2<KIND>(v[8 * q + 6], v[8 * q + 7]));
        }
    }
}

// Loads the 16 pixels at byte offset `at` and normalizes them: y[c][i] for source channel c.
__device__ __forceinline__ void gf_load16(const unsigned char* __restrict__ in, size_t at,
                                          const GfAffine& p, float y[3][16]) {
    const uint4* src = reinterpret_cast<const uint4*>(in + at);
    const uint4 a = __ldg(src), b = __ldg(src + 1), c = __ldg(src + 2);
    const unsigned int w[12] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
#pragma unroll
        for (int ch = 0; ch < 3; ch++) {
            const int k = 3 * i + ch;
            y[ch][i] = fmaf(gf_byte(w[k >> 2], k & 3), p.scale[ch], p.bias[ch]);
        }
    }
}

template <int KIND>
__device__ __forceinline__ void gf_nchw16(const unsigned char* __restrict__ in, void* __restrict__ out,
                                          unsigned int groups, unsigned int groups_per_image,
                                          unsigned int hw, GfAffine p, int bgr) {
    const unsigned int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    const unsigned int n = g / groups_per_image;
    const unsigned int pix = (g - n * groups_per_image) * 16;
    float y[3][16];
    gf_load16(in, ((size_t)n * hw + pix) * 3, p, y);
#pragma unroll
    for (int ch = 0; ch < 3; ch++) {
        const int oc = bgr ? 2 - ch : ch;
        gf_store_run<KIND, 16>(out, ((size_t)n * 3 + oc) * hw + pix, y[ch]);
    }
}

template <int KIND>
__device__ __forceinline__ void gf_nhwc16(const unsigned char* __restrict__ in, void* __restrict__ out,
                                          unsigned int groups, GfAffine p, int bgr) {
    const unsigned int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    const size_t at = (size_t)g * 48;
    float y[3][16];
    gf_load16(in, at, p, y);
    float v[48];
#pragma unroll
    for (int i = 0; i < 16; i++) {
#pragma unroll
        for (int ch = 0; ch < 3; ch++) {
            v[3 * i + (bgr ? 2 - ch : ch)] = y[ch][i];
        }
    }
    gf_store_run<KIND, 48>(out, at, v);
}

// One thread per pixel: any size, any alignment.
template <int KIND>
__device__ __forceinline__ void gf_pixel(const unsigned char* __restrict__ in, void* __restrict__ out,
                                         unsigned int pixels, unsigned int hw, GfAffine p, int bgr,
                                         int nchw) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) return;
    const unsigned int n = i / hw;
    const unsigned int pix = i - n * hw;
#pragma unroll
    for (int ch = 0; ch < 3; ch++) {
        const float v = fmaf((float)in[(size_t)i * 3 + ch], p.scale[ch], p.bias[ch]);
        const int oc = bgr ? 2 - ch : ch;
        const size_t o = nchw ? ((size_t)n * 3 + oc) * hw + pix : (size_t)i * 3 + oc;
        gf_store_one<KIND>(out, o, v);
    }
}

#define GF_ENTRIES(NAME, KIND)                                                                   \
    extern "C" __global__ void gpufeed_nchw16_##NAME(                                            \
        const unsigned char* __restrict__ in, void* __restrict__ out, unsigned int groups,       \
        unsigned int groups_per_image, unsigned int hw, GfAffine p, int bgr) {                   \
        gf_nchw16<KIND>(in, out, groups, groups_per_image, hw, p, bgr);                          \
    }                                                                                            \
    extern "C" __global__ void gpufeed_nhwc16_##NAME(const unsigned char* __restrict__ in,       \
                                                     void* __restrict__ out, unsigned int groups, \
                                                     GfAffine p, int bgr) {                      \
        gf_nhwc16<KIND>(in, out, groups, p, bgr);                                                \
    }                                                                                            \
    extern "C" __global__ void gpufeed_pixel_##NAME(const unsigned char* __restrict__ in,        \
                                                    void* __restrict__ out, unsigned int pixels, \
                                                    unsigned int hw, GfAffine p, int bgr,        \
                                                    int nchw) {                                  \
        gf_pixel<KIND>(in, out, pixels, hw, p, bgr, nchw);                                       \
    }

GF_ENTRIES(f32, GF_F32)
GF_ENTRIES(f16, GF_F16)
GF_ENTRIES(bf16, GF_BF16)
