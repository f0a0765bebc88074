// gpufeed: JPEG Y, Cb, Cr planes (as stored, chroma subsampled) -> interleaved RGB, exactly as
// libjpeg-turbo makes RGB of them with its defaults: "fancy" chroma upsampling (the triangle
// filters of jdsample.c: h2v1, h2v2 and h1v2, with their rounding) and the fixed-point YCbCr to
// RGB conversion of jdcolor.c (16 fractional bits, the same constants and rounding).
//
// Compiled at run time by NVRTC (src/cuda/ycc.rs); no headers. One launch converts a batch: the
// grid's y is the image, its x covers the image's pixels (each thread loops over its share).

struct GfYccImage {
    unsigned long long y;   // Y plane
    unsigned long long cb;  // Cb plane
    unsigned long long cr;  // Cr plane
    unsigned long long out; // RGB, 3 bytes a pixel, rows packed (width * 3)
    unsigned int y_pitch;
    unsigned int c_pitch;
    unsigned int width;
    unsigned int height;
    unsigned int c_width;
    unsigned int c_height;
    unsigned int kind;      // 0: 4:4:4, 1: 4:2:2 (h2v1), 2: 4:2:0 (h2v2), 3: 4:4:0 (h1v2)
    unsigned int unused;
};

// Chroma sample of output pixel (x, y) from plane `c` of c_width x c_height.
__device__ __forceinline__ int gf_chroma(const unsigned char* c, unsigned int pitch,
                                         unsigned int cw, unsigned int ch, unsigned int kind,
                                         unsigned int x, unsigned int y) {
    if (kind == 0) {
        return c[y * pitch + x];
    }
    if (kind == 1) {
        // h2v1_fancy_upsample: out[2i] = (3 c[i] + c[i-1] + 1) >> 2,
        // out[2i+1] = (3 c[i] + c[i+1] + 2) >> 2; the outermost columns copy their sample.
        const unsigned char* row = c + y * pitch;
        unsigned int i = x >> 1;
        int here = row[i];
        if ((x & 1) == 0) {
            return i == 0 ? here : (here * 3 + row[i - 1] + 1) >> 2;
        }
        return i + 1 >= cw ? here : (here * 3 + row[i + 1] + 2) >> 2;
    }
    // Vertical context: the row above for even output rows, below for odd ones, the edge rows
    // repeated (libjpeg's context rows).
    unsigned int r = y >> 1;
    unsigned int rn = (y & 1) ? (r + 1 < ch ? r + 1 : ch - 1) : (r > 0 ? r - 1 : 0);
    if (kind == 3) {
        // h1v2_fancy_upsample: (3 nearer + farther + bias) >> 2, bias 1 above, 2 below.
        int sum = c[r * pitch + x] * 3 + c[rn * pitch + x];
        return (sum + ((y & 1) ? 2 : 1)) >> 2;
    }
    // h2v2_fancy_upsample: column sums 3 nearer + farther, then across:
    // out[2i] = (3 s[i] + s[i-1] + 8) >> 4, out[2i+1] = (3 s[i] + s[i+1] + 7) >> 4, and
    // (4 s + 8) >> 4, (4 s + 7) >> 4 at the first and last columns.
    const unsigned char* p0 = c + r * pitch;
    const unsigned char* p1 = c + rn * pitch;
    unsigned int i = x >> 1;
    int here = p0[i] * 3 + p1[i];
    if ((x & 1) == 0) {
        if (i == 0) return (here * 4 + 8) >> 4;
        int last = p0[i - 1] * 3 + p1[i - 1];
        return (here * 3 + last + 8) >> 4;
    }
    if (i + 1 >= cw) return (here * 4 + 7) >> 4;
    int next = p0[i + 1] * 3 + p1[i + 1];
    return (here * 3 + next + 7) >> 4;
}

__device__ __forceinline__ unsigned char gf_clamp(int v) {
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

extern "C" __global__ void gpufeed_ycc_to_rgb(const GfYccImage* images) {
    const GfYccImage im = images[blockIdx.y];
    const unsigned char* yp = (const unsigned char*)im.y;
    const unsigned char* cbp = (const unsigned char*)im.cb;
    const unsigned char* crp = (const unsigned char*)im.cr;
    unsigned char* out = (unsigned char*)im.out;
    unsigned int n = im.width * im.height;
    for (unsigned int p = blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += blockDim.x * gridDim.x) {
        unsigned int x = p % im.width;
        unsigned int y = p / im.width;
        int luma = yp[y * im.y_pitch + x];
        int cb = gf_chroma(cbp, im.c_pitch, im.c_width, im.c_height, im.kind, x, y) - 128;
        int cr = gf_chroma(crp, im.c_pitch, im.c_width, im.c_height, im.kind, x, y) - 128;
        // jdcolor.c build_ycc_rgb_table: FIX(1.40200) = 91881, FIX(1.77200) = 116130,
        // FIX(0.71414) = 46802, FIX(0.34414) = 22554, ONE_HALF = 1 << 15, SCALEBITS = 16;
        // RIGHT_SHIFT is an arithmetic shift.
        int r = luma + ((91881 * cr + 32768) >> 16);
        int g = luma + ((-22554 * cb + 32768 - 46802 * cr) >> 16);
        int b = luma + ((116130 * cb + 32768) >> 16);
        out[p * 3 + 0] = gf_clamp(r);
        out[p * 3 + 1] = gf_clamp(g);
        out[p * 3 + 2] = gf_clamp(b);
    }
}
