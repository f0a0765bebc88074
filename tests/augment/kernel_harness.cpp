// Runs kernels/augment.cu's gpufeed_augment on the CPU, one thread per block, through shims of
// the CUDA built-ins (each __f*_rn one IEEE float operation, nothing contracted), on the golden
// calls of tests/augment/vectors.*: the kernel's arithmetic against torchvision's own outputs,
// where no GPU is at hand.
//
// The unit test every_call_matches_torchvision_v2 (src/augment/tests.rs) compiles and runs it
// where g++ is installed. By hand:
//        GPUFEED_KERNEL_CASES=/tmp/cases.bin cargo test --release --lib every_call_matches
//        g++ -O1 -ffp-contract=off -Wno-unknown-pragmas -o /tmp/harness tests/augment/kernel_harness.cpp
//        /tmp/harness /tmp/cases.bin
// (the cases: per call, height, width, operation count (u32 each), the KernelOps, the input
// image and torchvision's output.) Prints the calls that differ; exit status 1 if any.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define asm(...) ((void)0)
#define __syncthreads() ((void)0)

struct GfIndex {
    unsigned int x, y, z;
};
static GfIndex threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1};

static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
static float __fdiv_rn(float a, float b) { return a / b; }
static float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static void atomicAdd(unsigned long long* p, unsigned long long v) { *p += v; }
static void atomicAdd(unsigned int* p, unsigned int v) { *p += v; }
static void atomicMin(unsigned int* p, unsigned int v) { *p = min(*p, v); }
static void atomicMax(unsigned int* p, unsigned int v) { *p = max(*p, v); }

#include "../../kernels/augment.cu"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CASES\n", argv[0]);
        return 2;
    }
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 2;
    }
    int cases = 0, failed = 0;
    unsigned int head[3];
    while (std::fread(head, sizeof head, 1, f) == 1) {
        const unsigned int h = head[0], w = head[1], count = head[2];
        std::vector<GfOp> ops(count);
        std::vector<unsigned char> img(h * w * 3), want(h * w * 3), scratch(h * w * 3, 0xA5);
        if ((count && std::fread(ops.data(), sizeof(GfOp), count, f) != count) ||
            std::fread(img.data(), 1, img.size(), f) != img.size() ||
            std::fread(want.data(), 1, want.size(), f) != want.size()) {
            std::fprintf(stderr, "truncated case file\n");
            return 2;
        }
        unsigned int starts[2] = {0, count};
        gpufeed_augment(img.data(), scratch.data(), ops.data(), starts, (int)h, (int)w);
        int differ = 0;
        for (size_t i = 0; i < img.size(); i++) differ += img[i] != want[i];
        if (differ) {
            failed++;
            std::printf("case %d (%ux%u, kind %d): %d samples differ\n", cases, h, w,
                        count ? ops[0].kind : 0, differ);
        }
        cases++;
    }
    std::printf("%d calls, %d differ\n", cases, failed);
    return failed ? 1 : 0;
}
