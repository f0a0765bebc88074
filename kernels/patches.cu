// gpufeed: resized u8 HWC images of different sizes -> one patch-sequence token tensor, f16 /
// bf16 / f32, packed or padded, in the model's token order (src/patches/layout.rs).
//
// Compiled at run time by NVRTC (no headers: halves are written as raw 16-bit patterns).
//
// Block row blockIdx.y is image i; its threads walk the image's rows x patch_dim values. Value d
// of token k reads sample (channel c, row y, column x) of patch (pr, pc):
//   Qwen2-VL (merge > 0): tokens in merge x merge blocks, values (c, t, y, x);
//   SigLIP2 / timm (merge == 0): tokens row by row, values (y, x, c).
// The value is the reference's float arithmetic with IEEE rounding at each step and no fused
// multiply-add (src/patches/normalize.rs): v = rescale ? float(double(s) * (1/255)) : float(s),
// then (v - sub[c]) / div[c]. Rows past an image's tokens (padding) get pad[c].

struct GfPatchImage {
    unsigned long long offset;     // first byte of the image in the input
    unsigned long long first_row;  // first output row
    unsigned int width;            // pixels per image row
    unsigned int tokens;           // grid_h * grid_w
    unsigned int rows;             // output rows owned: tokens, or the padded length
    unsigned int grid_w;           // patches across
};

struct GfPatchNorm {
    float sub[3];
    float div[3];
    float pad[3];
    int rescale;
};

#define GF_F32 0
#define GF_F16 1
#define GF_BF16 2

template <int KIND>
__device__ __forceinline__ void gf_patch_store(void* out, size_t i, float v) {
    if (KIND == GF_F32) {
        static_cast<float*>(out)[i] = v;
    } else if (KIND == GF_F16) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        static_cast<unsigned short*>(out)[i] = h;
    } else {
        // Round to nearest even; the values are finite.
        unsigned int u = __float_as_uint(v);
        u += 0x7FFFu + ((u >> 16) & 1u);
        static_cast<unsigned short*>(out)[i] = (unsigned short)(u >> 16);
    }
}

template <int KIND>
__device__ __forceinline__ void gf_patches(const unsigned char* __restrict__ in,
                                           const GfPatchImage* __restrict__ images,
                                           void* __restrict__ out, unsigned int patch,
                                           unsigned int merge, unsigned int temporal,
                                           unsigned int dim, double rescale, GfPatchNorm p) {
    const GfPatchImage im = images[blockIdx.y];
    const unsigned long long values = (unsigned long long)im.rows * dim;
    const unsigned int area = patch * patch;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         e < values; e += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int k = (unsigned int)(e / dim);
        const unsigned int d = (unsigned int)(e - (unsigned long long)k * dim);
        unsigned int c, y, x, pr, pc;
        if (merge > 0) {
            c = d / (temporal * area);
            const unsigned int within = d % area;
            y = within / patch;
            x = within - y * patch;
            const unsigned int per_block = merge * merge;
            const unsigned int block = k / per_block, in_block = k - block * per_block;
            const unsigned int blocks_wide = im.grid_w / merge;
            const unsigned int bh = block / blocks_wide, bw = block - bh * blocks_wide;
            pr = bh * merge + in_block / merge;
            pc = bw * merge + in_block % merge;
        } else {
            const unsigned int pixel = d / 3;
            c = d - pixel * 3;
            y = pixel / patch;
            x = pixel - y * patch;
            pr = k / im.grid_w;
            pc = k - pr * im.grid_w;
        }
        const size_t o = (size_t)(im.first_row * dim + e);
        if (k >= im.tokens) {
            gf_patch_store<KIND>(out, o, p.pad[c]);
            continue;
        }
        const size_t at = im.offset +
                          ((size_t)(pr * patch + y) * im.width + (size_t)(pc * patch + x)) * 3 + c;
        const unsigned int s = in[at];
        const float v = p.rescale ? __double2float_rn(__dmul_rn((double)s, rescale)) : (float)s;
        gf_patch_store<KIND>(out, o, __fdiv_rn(__fsub_rn(v, p.sub[c]), p.div[c]));
    }
}

#define GF_PATCH_ENTRY(NAME, KIND)                                                            \
    extern "C" __global__ void gpufeed_patches_##NAME(                                        \
        const unsigned char* __restrict__ in, const GfPatchImage* __restrict__ images,        \
        void* __restrict__ out, unsigned int patch, unsigned int merge, unsigned int temporal, \
        unsigned int dim, double rescale, GfPatchNorm p) {                                    \
        gf_patches<KIND>(in, images, out, patch, merge, temporal, dim, rescale, p);           \
    }

GF_PATCH_ENTRY(f32, GF_F32)
GF_PATCH_ENTRY(f16, GF_F16)
GF_PATCH_ENTRY(bf16, GF_BF16)
