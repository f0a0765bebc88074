// gpufeed: u8 HWC image batch -> normalized f16 / bf16 / f32 tensor, NCHW or NHWC, RGB or BGR.
//
// Compiled at run time by NVRTC (src/gpu/kernel.rs), which has no include path here: no headers,
// halves are written as raw 16-bit patterns.
//
// Every output element is  y = fmaf(x, scale[c], bias[c])  for the u8 sample x of source channel c
// (torchvision's Normalize on x / 255, folded on the host), rounded to nearest-even into the output
// type. src/reference.rs computes the very same thing on the CPU; the two agree bit for bit.
//
// The fast kernels read and write whole 16-byte runs, with neighbouring threads on neighbouring
// addresses, so every access is coalesced (see gf_nchw and gf_nhwc). They need the pixel count per
// image to be a multiple of 8 (f16/bf16) or 4 (f32) for NCHW, and the batch's bytes a multiple of
// 16 for NHWC; the host falls back to the one-pixel-per-thread kernels otherwise.

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

// Ordinary stores; GF_STREAMING_STORES selects evict-first stores (__stcs), which measured no
// faster on the H100 (see the README's figures).
#ifdef GF_STREAMING_STORES
#define GF_STORE(ptr, value) __stcs((ptr), (value))
#else
#define GF_STORE(ptr, value) (*(ptr) = (value))
#endif

// Stores v[0..COUNT) at element offset i (16-byte aligned) with 16-byte stores.
template <int KIND, int COUNT>
__device__ __forceinline__ void gf_store_run(void* out, size_t i, const float* v) {
    if (KIND == GF_F32) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(out) + i);
#pragma unroll
        for (int q = 0; q < COUNT / 4; q++) {
            GF_STORE(dst + q, make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]));
        }
    } else {
        uint4* dst = reinterpret_cast<uint4*>(static_cast<unsigned short*>(out) + i);
#pragma unroll
        for (int q = 0; q < COUNT / 8; q++) {
            GF_STORE(dst + q, make_uint4(gf_pack2<KIND>(v[8 * q], v[8 * q + 1]),
                                         gf_pack2<KIND>(v[8 * q + 2], v[8 * q + 3]),
                                         gf_pack2<KIND>(v[8 * q + 4], v[8 * q + 5]),
                                         gf_pack2<KIND>(v[8 * q + 6], v[8 * q + 7])));
        }
    }
}

// Groups each thread of the NCHW kernel handles, their loads all issued before any store (more
// bytes in flight per thread); the host passes the same number (src/gpu/kernel.rs).
#ifndef GF_NCHW_GROUPS
#define GF_NCHW_GROUPS 2
#endif

// NCHW: a group is PIX whole pixels (3*PIX bytes, read as three PIX-byte words), written as PIX
// elements to each of the three channel planes with one 16-byte store: PIX = 8 for 16-bit
// outputs, 4 for f32. A warp's store to a plane is 512 contiguous bytes. A block of B threads
// handles B * GF_NCHW_GROUPS consecutive groups, thread j the groups j, j + B, ...
template <int KIND>
__device__ __forceinline__ void gf_nchw(const unsigned char* __restrict__ in, void* __restrict__ out,
                                        unsigned int groups, unsigned int groups_per_image,
                                        unsigned int hw, GfAffine p, int bgr) {
    constexpr int PIX = KIND == GF_F32 ? 4 : 8;
    constexpr int G = GF_NCHW_GROUPS;
    const unsigned int first = blockIdx.x * blockDim.x * G + threadIdx.x;
    unsigned int w[G][3 * PIX / 4];
#pragma unroll
    for (int j = 0; j < G; j++) {
        const unsigned int g = first + j * blockDim.x;
        if (g >= groups) break;
        const size_t at = (size_t)g * PIX * 3;  // groups never straddle images (hw % PIX == 0)
        if (PIX == 8) {
            const uint2* src = reinterpret_cast<const uint2*>(in + at);
#pragma unroll
            for (int q = 0; q < 3; q++) {
                const uint2 v = __ldg(src + q);
                w[j][2 * q] = v.x;
                w[j][2 * q + 1] = v.y;
            }
        } else {
            const unsigned int* src = reinterpret_cast<const unsigned int*>(in + at);
#pragma unroll
            for (int q = 0; q < 3; q++) w[j][q] = __ldg(src + q);
        }
    }
#pragma unroll
    for (int j = 0; j < G; j++) {
        const unsigned int g = first + j * blockDim.x;
        if (g >= groups) return;
        const unsigned int n = g / groups_per_image;
        const unsigned int pix = (g - n * groups_per_image) * PIX;
        float y[3][PIX];
#pragma unroll
        for (int i = 0; i < PIX; i++) {
#pragma unroll
            for (int ch = 0; ch < 3; ch++) {
                const int k = 3 * i + ch;
                y[ch][i] = fmaf(gf_byte(w[j][k >> 2], k & 3), p.scale[ch], p.bias[ch]);
            }
        }
#pragma unroll
        for (int ch = 0; ch < 3; ch++) {
            const int oc = bgr ? 2 - ch : ch;
            gf_store_run<KIND, PIX>(out, ((size_t)n * 3 + oc) * hw + pix, y[ch]);
        }
    }
}

// The output values of an NHWC chunk of N bytes whose first element has channel C0; w holds the
// input bytes from 4 before the chunk to 4 after it.
template <int N, int C0, bool BGR>
__device__ __forceinline__ void gf_nhwc_values(const unsigned int* w, const GfAffine& p, float* y) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int oc = (C0 + i) % 3;
        const int sc = BGR ? 2 - oc : oc;
        const int k = 4 + i + sc - oc;
        y[i] = fmaf(gf_byte(w[k >> 2], k & 3), p.scale[sc], p.bias[sc]);
    }
}

// NHWC is the input order: thread t maps input bytes [N t, N t + N) to the same output elements,
// N = 16 / sizeof(output), so each thread ends with one 16-byte store and a warp's loads and stores
// are contiguous. Element e belongs to channel e % 3; with BGR output it takes the byte
// 2 - 2 (e % 3) places away, which for the first and last two elements lives in the neighbouring
// thread's bytes (fetched by warp shuffle, or from memory at the warp's edges).
template <int KIND>
__device__ __forceinline__ void gf_nhwc(const unsigned char* __restrict__ in, void* __restrict__ out,
                                        unsigned int chunks, GfAffine p, int bgr) {
    constexpr int N = KIND == GF_F32 ? 4 : 8;
    constexpr int W = N / 4;
    const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = t < chunks;
    const unsigned int* words = reinterpret_cast<const unsigned int*>(in);
    unsigned int w[W + 2];  // w[0]: the 4 bytes before the chunk, w[W + 1]: the 4 after
#pragma unroll
    for (int q = 0; q < W; q++) w[1 + q] = 0;
    if (active) {
        if (W == 2) {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(in) + t);
            w[1] = v.x;
            w[W] = v.y;
        } else {
            w[1] = __ldg(words + t);
        }
    }
    w[0] = 0;
    w[W + 1] = 0;
    if (bgr) {
        const unsigned int lane = threadIdx.x & 31;
        const unsigned int left = __shfl_up_sync(0xFFFFFFFFu, w[W], 1);
        const unsigned int right = __shfl_down_sync(0xFFFFFFFFu, w[1], 1);
        if (active) {
            w[0] = lane == 0 ? (t > 0 ? __ldg(words + W * t - 1) : 0u) : left;
            w[W + 1] = (lane == 31 || t + 1 >= chunks)
                           ? (t + 1 < chunks ? __ldg(words + W * (t + 1)) : 0u)
                           : right;
        }
    }
    if (!active) return;
    float y[N];
    // The channel of element N t is (N t) % 3; each case unrolls with constant indices.
    switch ((N * t) % 3) {
        case 0: bgr ? gf_nhwc_values<N, 0, true>(w, p, y) : gf_nhwc_values<N, 0, false>(w, p, y); break;
        case 1: bgr ? gf_nhwc_values<N, 1, true>(w, p, y) : gf_nhwc_values<N, 1, false>(w, p, y); break;
        default: bgr ? gf_nhwc_values<N, 2, true>(w, p, y) : gf_nhwc_values<N, 2, false>(w, p, y); break;
    }
    gf_store_run<KIND, N>(out, (size_t)t * N, y);
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
    extern "C" __global__ void gpufeed_nchw_##NAME(                                              \
        const unsigned char* __restrict__ in, void* __restrict__ out, unsigned int groups,       \
        unsigned int groups_per_image, unsigned int hw, GfAffine p, int bgr) {                   \
        gf_nchw<KIND>(in, out, groups, groups_per_image, hw, p, bgr);                            \
    }                                                                                            \
    extern "C" __global__ void gpufeed_nhwc_##NAME(const unsigned char* __restrict__ in,         \
                                                   void* __restrict__ out, unsigned int chunks,  \
                                                   GfAffine p, int bgr) {                        \
        gf_nhwc<KIND>(in, out, chunks, p, bgr);                                                  \
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
