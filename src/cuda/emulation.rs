//! A kernel source run on the CPU: built as C++ with shims for what it takes of CUDA, so that
//! its arithmetic is checked against the host's where there is no GPU (the GPU tests check the
//! device's).

/// What a kernel source needs of CUDA as plain C++: a block's threads as threads of the process
/// (5 unless the harness says otherwise) meeting at each `__syncthreads`, shared memory as
/// statics, the read-only loads as loads, the rounding intrinsics as IEEE operations the
/// compiler may not contract; so that a kernel's arithmetic, and its barriers, are checked
/// against the host's where there is no GPU.
const EMULATION: &str = r#"#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstddef>
#include <algorithm>
#include <mutex>
#include <condition_variable>
#include <thread>
#define __device__
#define __global__
#define __launch_bounds__(...)
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __ldg(p) (*(p))
#define GF_VIEW_TILE static unsigned int s_tile[1 << 16]
struct Dim { unsigned x, y, z; };
static thread_local Dim threadIdx = {0, 0, 0};
static Dim blockIdx = {0, 0, 0}, blockDim = {5, 1, 1}, gridDim = {1, 1, 1};
struct uint4 { unsigned x, y, z, w; };
static std::mutex gf_lock;
static std::condition_variable gf_turn;
static unsigned gf_waiting = 0, gf_round = 0;
static inline void __syncthreads() {
    std::unique_lock<std::mutex> hold(gf_lock);
    const unsigned round = gf_round;
    if (++gf_waiting == blockDim.x) { gf_waiting = 0; gf_round++; gf_turn.notify_all(); }
    else gf_turn.wait(hold, [&] { return gf_round != round; });
}
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    std::lock_guard<std::mutex> hold(gf_lock); auto o = *p; *p += v; return o;
}
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
static inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
static inline double __ddiv_rn(double a, double b) { volatile double r = a / b; return r; }
static inline double __fma_rn(double a, double b, double c) { volatile double r = std::fma(a, b, c); return r; }
static inline float __double2float_rn(double a) { return (float)a; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline double __hiloint2double(int hi, int lo) {
    const uint64_t bits = ((uint64_t)(uint32_t)hi << 32) | (uint32_t)lo;
    double d; memcpy(&d, &bits, 8); return d;
}
// __fdividef as far off as the GPU's may be (2 ulp), up or down as the operands' bits fall, so
// that the kernel's corrections of its quotients run here too.
static inline float __fdividef(float a, float b) {
    volatile float q = a / b; float r = q;
    unsigned u, x, y; memcpy(&u, &r, 4); memcpy(&x, &a, 4); memcpy(&y, &b, 4);
    u = ((x ^ y) & 1u) ? u + 2u : (u >= 2u ? u - 2u : u);
    memcpy(&r, &u, 4); return r;
}
using std::min; using std::max;
"#;

/// `kernels/{kernel}` built as C++ with `harness` (its `main`), in a folder of its own (`name`):
/// the folder and the program, or `None` (the test skipped) where there is no C++ compiler.
pub(crate) fn emulation(
    name: &str,
    kernel: &str,
    harness: &str,
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    use std::io::Write as _;
    let dir = std::env::temp_dir().join(format!("gpufeed-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("kernels")
        .join(kernel);
    let source = format!("{EMULATION}\n#include \"{}\"\n{harness}", kernel.display());
    std::fs::write(dir.join("emulation.cpp"), source).expect("the harness");
    let binary = dir.join("emulation");
    let compiled = std::process::Command::new("c++")
        .args(["-O2", "-ffp-contract=off", "-std=c++17", "-pthread", "-o"])
        .arg(&binary)
        .arg(dir.join("emulation.cpp"))
        .output();
    let compiled = match compiled {
        Ok(out) => out,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "skipped: {name}: no C++ compiler ({e})");
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
    };
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    Some((dir, binary))
}

/// The emulation's report (its output) on `cases`, each written to a file of the folder and
/// passed after `args`; the folder removed after. Fails where the harness does.
pub(crate) fn emulated(
    dir: &std::path::Path,
    binary: &std::path::Path,
    args: &[String],
    cases: &[Vec<u8>],
) -> String {
    let files: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let file = dir.join(format!("case{i:02}.bin"));
            std::fs::write(&file, case).expect("a case");
            file
        })
        .collect();
    let run = std::process::Command::new(binary)
        .args(args)
        .args(&files)
        .output()
        .expect("the harness runs");
    let _ = std::fs::remove_dir_all(dir);
    let report = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "{report}");
    report
}
