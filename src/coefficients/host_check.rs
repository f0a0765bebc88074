//! `kernels/idct.cu` run on the host: the kernel source compiled as C++ by the machine's C++
//! compiler, with a few macros standing in for CUDA's, and every thread of both launches run one
//! after another over the exact grids and descriptors the GPU side uses ([`BatchPlan`]). The
//! kernels use no shared memory, synchronisation or warp functions, so this is the result the GPU
//! computes; it is compared with the CPU rendition and libjpeg-turbo's decode, bit for bit, on
//! every case. Without a C++ compiler (`$CXX`, else `c++`) the test says it skipped.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use turbojpeg_region::CoefficientReader;

use super::batch::{BatchPlan, COLOR_THREADS, IDCT_THREADS};
use super::cases::{cases, prepare, repo_file, turbo_decode};
use super::entropy_batch::DensePlanes;
use super::pack::{pack, PackedImage};
use super::{Layout, Window};
use gpufeed_bench::upload::random_bytes;

/// What every host harness starts with: CUDA's names as host C++ (a sequential run: the
/// block and thread indices are globals the harness sets, an atomic is a plain update) and the
/// readers of its input file.
const PRELUDE: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct gf_dim3 { unsigned int x, y, z; };
struct uint4 { unsigned int x, y, z, w; };
static gf_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define GF_HOST 1
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline unsigned int atomicOr(unsigned int* p, unsigned int v) {
    unsigned int old = *p; *p = old | v; return old;
}

static unsigned long long u64(FILE* f) {
    unsigned long long v = 0;
    if (fread(&v, 8, 1, f) != 1) { fprintf(stderr, "short input\n"); exit(2); }
    return v;
}

static void bytes(FILE* f, void* p, size_t n) {
    if (n && fread(p, 1, n, f) != n) { fprintf(stderr, "short input\n"); exit(2); }
}

// The input file of a harness run as `harness INPUT OUTPUT` (exit status 2 otherwise).
static inline FILE* harness_input(int argc, char** argv) {
    if (argc != 3) exit(2);
    FILE* in = fopen(argv[1], "rb");
    if (!in) exit(2);
    return in;
}

static inline int write_output(const char* path, const void* p, size_t n) {
    FILE* o = fopen(path, "wb");
    if (!o) return 2;
    fwrite(p, 1, n, o);
    fclose(o);
    return 0;
}
"#;

/// The harness (after [`PRELUDE`]): the kernel source included, and a main that reads a batch,
/// runs every thread of both launches and writes the planes and the output.
const HARNESS: &str = r#"
#include "idct.cu"

int main(int argc, char** argv) {
    FILE* in = harness_input(argc, argv);
    size_t coef_len = u64(in), plane_len = u64(in), out_len = u64(in);
    size_t n_idct = u64(in), n_color = u64(in), dense_len = u64(in);
    unsigned int idct_grid_x = u64(in), color_grid_x = u64(in);
    unsigned int idct_threads = u64(in), color_threads = u64(in);
    std::vector<unsigned char> coef(coef_len + 8);
    std::vector<GfIdctJob> idct(n_idct);
    std::vector<GfColorJob> color(n_color);
    bytes(in, coef.data(), coef_len);
    bytes(in, idct.data(), n_idct * sizeof(GfIdctJob));
    bytes(in, color.data(), n_color * sizeof(GfColorJob));
    std::vector<short> dense(dense_len + 1);
    bytes(in, dense.data(), dense_len * 2);
    fclose(in);
    std::vector<unsigned char> planes(plane_len, 0xA5), out(out_len, 0xA5);

    gridDim = {idct_grid_x, (unsigned int)n_idct, 1};
    blockDim = {idct_threads, 1, 1};
    for (unsigned int by = 0; by < gridDim.y; by++)
        for (unsigned int bx = 0; bx < gridDim.x; bx++)
            for (unsigned int t = 0; t < blockDim.x; t++) {
                blockIdx = {bx, by, 0};
                threadIdx = {t, 0, 0};
                gpufeed_idct_islow(coef.data(), dense.data(), planes.data(), idct.data());
            }
    gridDim = {color_grid_x, (unsigned int)n_color, 1};
    blockDim = {color_threads, 1, 1};
    for (unsigned int by = 0; by < gridDim.y; by++)
        for (unsigned int bx = 0; bx < gridDim.x; bx++)
            for (unsigned int t = 0; t < blockDim.x; t++) {
                blockIdx = {bx, by, 0};
                threadIdx = {t, 0, 0};
                gpufeed_upsample_color(planes.data(), out.data(), color.data());
            }

    return write_output(argv[2], out.data(), out.size());
}
"#;

/// A harness of the IDCT alone: `n` blocks of 64 coefficients and 64 multipliers (i16) in, each
/// block's 8 x 8 samples out, through the kernel's `gf_idct_islow`.
const IDCT_HARNESS: &str = r#"
#include "idct.cu"

int main(int argc, char** argv) {
    FILE* in = harness_input(argc, argv);
    size_t n = u64(in);
    std::vector<short> blocks(n * 128);
    bytes(in, blocks.data(), n * 256);
    fclose(in);
    std::vector<unsigned char> out(n * 64);
    for (size_t b = 0; b < n; b++)
        gf_idct_islow(blocks.data() + b * 128, blocks.data() + b * 128 + 64, out.data() + b * 64, 8);
    return write_output(argv[2], out.data(), out.size());
}
"#;

/// The harness built in `dir`, or `None` (said on stderr) without a C++ compiler.
pub(super) fn build_harness(dir: &Path) -> Option<PathBuf> {
    build_cpp_harness(dir, "idct.cu", HARNESS, false)
}

/// [`PRELUDE`] and `harness` (C++ including `kernel`, a file of `kernels/`) built in `dir`, or `None` (said on
/// stderr) without a C++ compiler (`$CXX`, else `c++`); with `sanitize`, under AddressSanitizer
/// and UndefinedBehaviorSanitizer (any finding aborts), where the compiler has them. Warnings
/// are errors: the kernel source must be clean C++.
pub(super) fn build_cpp_harness(
    dir: &Path,
    kernel: &str,
    harness: &str,
    sanitize: bool,
) -> Option<PathBuf> {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&compiler).arg("--version").output().is_err() {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: the host run of kernels/{kernel}: no C++ compiler ({compiler})"
        );
        return None;
    }
    let kernels = std::env::current_dir()
        .expect("current directory")
        .ancestors()
        .map(|d| d.join("kernels"))
        .find(|d| d.join(kernel).is_file())
        .unwrap_or_else(|| panic!("kernels/{kernel} above the current directory"));
    let source = dir.join("harness.cpp");
    std::fs::write(&source, format!("{PRELUDE}{harness}")).expect("harness source");
    let binary = dir.join("harness");
    let sanitizers = [
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
    ];
    let sanitize = sanitize && {
        // Only where the compiler and its runtime have them.
        let probe = dir.join("probe.cpp");
        std::fs::write(&probe, "int main() { return 0; }\n").expect("probe source");
        Command::new(&compiler)
            .args(sanitizers)
            .arg(&probe)
            .arg("-o")
            .arg(dir.join("probe"))
            .status()
            .is_ok_and(|s| s.success())
    };
    let status = Command::new(&compiler)
        .args(if sanitize { &sanitizers[..] } else { &[] })
        .args([
            "-std=c++17",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unknown-pragmas",
        ])
        .arg("-I")
        .arg(&kernels)
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status()
        .expect("running the C++ compiler");
    assert!(status.success(), "kernels/{kernel} does not compile as C++");
    Some(binary)
}

/// The descriptors' bytes as the kernel's structures lay them out (little-endian, fields in
/// order, no padding).
fn descriptor_bytes(plan: &BatchPlan) -> Vec<u8> {
    let mut out = Vec::new();
    let u32s = |out: &mut Vec<u8>, values: &[u32]| {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    };
    for j in &plan.idct {
        out.extend_from_slice(&j.section.to_le_bytes());
        out.extend_from_slice(&j.plane.to_le_bytes());
        u32s(
            &mut out,
            &[j.blocks, j.blocks_wide, j.dc, j.masks, j.groups, j.ac],
        );
    }
    for c in &plan.color {
        for p in &c.comp {
            out.extend_from_slice(&p.offset.to_le_bytes());
            u32s(
                &mut out,
                &[p.pitch, p.x0, p.y0, p.last_i, p.last_j, p.method, p.h, p.v],
            );
        }
        out.extend_from_slice(&c.out.to_le_bytes());
        u32s(
            &mut out,
            &[
                c.out_pitch,
                c.x,
                c.y,
                c.width,
                c.height,
                c.conversion,
                c.unused[0],
                c.unused[1],
            ],
        );
    }
    out
}

/// Runs the batch `images` (packed into `coefficients`, or dense in `dense` for the images
/// `dense_images` names, as [`BatchPlan::point_at_dense`] takes them) through the host-compiled
/// kernels; returns the output buffer and the plan.
pub(super) fn run(
    harness: &Path,
    dir: &Path,
    coefficients: &[u8],
    images: &[(PackedImage, u64)],
    dense: &[i16],
    dense_images: &[(usize, DensePlanes)],
) -> (Vec<u8>, BatchPlan) {
    let mut plan = BatchPlan::default();
    plan.plan(images).expect("plan");
    plan.point_at_dense(images, dense_images);
    let mut input = Vec::new();
    for v in [
        coefficients.len() as u64,
        plan.plane_bytes,
        plan.output_bytes,
        plan.idct.len() as u64,
        plan.color.len() as u64,
        dense.len() as u64,
        u64::from(plan.idct_grid_x),
        u64::from(plan.color_grid_x),
        u64::from(IDCT_THREADS),
        u64::from(COLOR_THREADS),
    ] {
        input.extend_from_slice(&v.to_le_bytes());
    }
    input.extend_from_slice(coefficients);
    input.extend(descriptor_bytes(&plan));
    for v in dense {
        input.extend_from_slice(&v.to_le_bytes());
    }
    (run_harness(harness, dir, &input), plan)
}

/// Runs `harness` on `input` (written to a file in `dir`); returns what it wrote.
pub(super) fn run_harness(harness: &Path, dir: &Path, input: &[u8]) -> Vec<u8> {
    let (input_path, output_path) = (dir.join("batch.in"), dir.join("batch.out"));
    std::fs::write(&input_path, input).expect("harness input");
    let status = Command::new(harness)
        .arg(&input_path)
        .arg(&output_path)
        .status()
        .expect("running the harness");
    assert!(status.success(), "the harness failed");
    std::fs::read(&output_path).expect("harness output")
}

/// The test's own scratch folder, removed afterwards.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_kernels_run_on_the_host_equal_the_cpu_rendition_and_libjpeg_turbo() {
    let dir = std::env::temp_dir().join(format!("gpufeed-idct-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let scratch = Scratch(dir);
    let Some(harness) = build_harness(&scratch.0) else {
        return;
    };
    let mut reader = CoefficientReader::new().unwrap();
    let all = cases(4);
    let picks = random_bytes(all.len() * 4, 9);
    // Two batches: the whole images, then random windows read with an early stop.
    for windows in [false, true] {
        let mut coefficients = Vec::new();
        let mut images = Vec::new();
        let mut expected = Vec::new();
        for (n, case) in all.iter().enumerate() {
            let pick = windows.then(|| &picks[n * 4..n * 4 + 4]);
            let prepared = prepare(&mut reader, case, pick);
            images.push((prepared.image, coefficients.len() as u64));
            coefficients.extend_from_slice(&prepared.bytes);
            expected.push((prepared.name, prepared.expected));
        }
        let (output, plan) = run(&harness, &scratch.0, &coefficients, &images, &[], &[]);
        for ((name, reference), rendered) in expected.iter().zip(&plan.rendered) {
            let start = rendered.offset as usize;
            let got = &output[start..start + reference.len()];
            assert!(
                got == &reference[..],
                "{name} (windows: {windows}): the kernels differ at byte {:?}",
                got.iter().zip(reference).position(|(a, b)| a != b)
            );
        }
    }
    // A real photo alone, whole: the larger grids and group offsets of a 2-megapixel image.
    let jpeg = repo_file("assets/retina.jpg");
    let read = reader.open(&jpeg).unwrap().read(None).unwrap();
    let layout = Layout::new(read.header()).unwrap();
    let window = Window::whole(layout.width, layout.height);
    let mut coefficients = Vec::new();
    let image = pack(&read, &layout, &window, &mut coefficients).unwrap();
    let (output, plan) = run(&harness, &scratch.0, &coefficients, &[(image, 0)], &[], &[]);
    let (turbo, _, _) = turbo_decode(&jpeg, false);
    assert_eq!(plan.rendered[0].offset, 0);
    assert!(output[..turbo.len()] == turbo[..], "assets/retina.jpg");
}

/// The IDCT's passes in `int` give the JLONG passes' samples: blocks whose dequantized values
/// lie just inside and just outside the bound the `int` passes take (`GF_IDCT_INT_INPUT`), and
/// blocks of extreme values (coefficients and multipliers up to 32,767, whose sums need 64
/// bits), each against the CPU rendition.
#[test]
fn the_idct_in_int_equals_the_jlong_idct_inside_its_bound_and_beyond() {
    let dir = std::env::temp_dir().join(format!("gpufeed-idct-int-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let scratch = Scratch(dir);
    let Some(harness) = build_cpp_harness(&scratch.0, "idct.cu", IDCT_HARNESS, true) else {
        return;
    };
    let random = random_bytes(4 * 64 * 3000, 17);
    let value = |at: usize| u32::from_le_bytes(random[4 * at..4 * at + 4].try_into().unwrap());
    let mut blocks: Vec<([i16; 64], [i16; 64])> = Vec::new();
    for b in 0..3000usize {
        // Magnitudes of the dequantized values: small, about the bound, and anything.
        let (coef_max, quant_max): (u32, u32) = match b % 3 {
            0 => (64, 255),
            1 => (12_100, 1),
            _ => (32_767, 32_767),
        };
        let mut coef = [0i16; 64];
        let mut quant = [0i16; 64];
        for k in 0..64 {
            let r = value(b * 64 + k);
            // About half the AC terms zero, so the zero-column and zero-row shortcuts run too.
            let zero = k > 0 && r & 1 == 1 && b % 5 != 0;
            let magnitude = (r >> 1) % (coef_max + 1);
            coef[k] = if zero {
                0
            } else if r & 2 == 0 {
                magnitude as i16
            } else {
                -(magnitude as i16)
            };
            quant[k] = (1 + (r >> 8) % quant_max) as i16;
        }
        blocks.push((coef, quant));
    }
    let mut input = (blocks.len() as u64).to_le_bytes().to_vec();
    for (coef, quant) in &blocks {
        for v in coef.iter().chain(quant) {
            input.extend_from_slice(&v.to_le_bytes());
        }
    }
    let output = run_harness(&harness, &scratch.0, &input);
    assert_eq!(output.len(), blocks.len() * 64);
    for (b, (coef, quant)) in blocks.iter().enumerate() {
        let mut expected = [0u8; 64];
        super::reference::idct_islow(coef, quant, &mut expected, 8);
        assert_eq!(
            &output[b * 64..b * 64 + 64],
            &expected[..],
            "block {b} (coefficients {:?}, multipliers {:?})",
            &coef[..8],
            &quant[..8]
        );
    }
}
