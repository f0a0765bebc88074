// gpufeed bench only: the "naive" way to normalize a u8 batch on the GPU, one simple kernel per
// step as PyTorch eager runs `x.float().div(255).sub(mean).div(std).permute(0,3,1,2).contiguous()
// .half()`. Each pass reads and writes the whole tensor; the fused kernel in normalize.cu does it
// all in one. Compiled by NVRTC like normalize.cu.

extern "C" __global__ void baseline_cast_u8_f32(const unsigned char* in, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)in[i];
}

extern "C" __global__ void baseline_scale(float* x, float s, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s;
}

// x[..., c] -= mean[c] (NHWC, 3 channels)
extern "C" __global__ void baseline_sub_channel(float* x, float m0, float m1, float m2, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int c = i % 3;
        x[i] = x[i] - (c == 0 ? m0 : (c == 1 ? m1 : m2));
    }
}

// x[..., c] /= std[c] (NHWC, 3 channels)
extern "C" __global__ void baseline_div_channel(float* x, float s0, float s1, float s2, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int c = i % 3;
        x[i] = x[i] / (c == 0 ? s0 : (c == 1 ? s1 : s2));
    }
}

// NHWC -> NCHW, one thread per output element
extern "C" __global__ void baseline_permute_nchw(const float* in, float* out, unsigned int hw, unsigned int n) {
    unsigned int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o < n) {
        unsigned int img = o / (3 * hw);
        unsigned int r = o - img * 3 * hw;
        unsigned int c = r / hw;
        unsigned int p = r - c * hw;
        out[o] = in[((size_t)img * hw + p) * 3 + c];
    }
}

extern "C" __global__ void baseline_cast_f32_f16(const float* in, unsigned short* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(in[i]));
        out[i] = h;
    }
}
