//! `kernels/entropy.cu` run on the host: the kernel source compiled as C++ by the machine's C++
//! compiler, with a few macros standing in for CUDA's, and every thread of every launch run one
//! after another over the exact descriptors the GPU side launches ([`EntropyPlan`]). No launch
//! synchronises inside itself or reads what another thread of the same launch writes (the status
//! words aside, which only gain bits), so this is the result the GPU computes. It is compared
//! with libjpeg-turbo's coefficients (`jpeg_read_coefficients`), bit for bit, on every baseline
//! case, real photos and a large image; broken files must be refused or flagged. Without a C++
//! compiler (`$CXX`, else `c++`) the test says it skipped.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use turbojpeg_region::{
    encode, CoefficientReader, Colorspace, EncodeOptions, Format, Restart, Sampling,
};

use super::cases::{cases, photos_folder, repo_file, tiled, turbo_decode};
use super::entropy::{parse, ParsedJpeg};
use super::entropy_batch::{
    copy_plane, stage, staged_len, EntropyPlan, HUFF_THREADS, PASSES, QUANT_SECTIONS,
};
use super::pack::PackedImage;
use super::{Error, Layout, Window};
use gpufeed_bench::upload::random_bytes;

const HARNESS: &str = r#"
#include "entropy.cu"

template <typename F> static void launch(unsigned int threads, unsigned int total, F f) {
    blockDim = {threads, 1, 1};
    gridDim = {(total + threads - 1) / threads, 1, 1};
    for (unsigned int b = 0; b < gridDim.x; b++)
        for (unsigned int t = 0; t < threads; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            f();
        }
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    if (!in) return 2;
    size_t data_bytes = u64(in), table_words = u64(in), n_images = u64(in), n_subs = u64(in);
    size_t n_intervals = u64(in), coef_len = u64(in);
    unsigned int passes = u64(in), threads = u64(in);
    // Exact sizes, so that a sanitized run catches any read past them.
    std::vector<unsigned int> data(data_bytes / 4), tables(table_words);
    std::vector<GfHuffImage> images(n_images);
    std::vector<GfHuffSub> subs(n_subs);
    std::vector<GfHuffInterval> intervals(n_intervals);
    bytes(in, data.data(), data_bytes);
    bytes(in, tables.data(), table_words * 4);
    bytes(in, images.data(), n_images * sizeof(GfHuffImage));
    bytes(in, subs.data(), n_subs * sizeof(GfHuffSub));
    bytes(in, intervals.data(), n_intervals * sizeof(GfHuffInterval));
    fclose(in);
    // Poisoned: every coefficient must be written by the zeroing launch or the decode.
    std::vector<short> coef(coef_len, (short)0x5A5A);
    std::vector<GfHuffExit> exits(2 * n_subs);
    std::vector<GfHuffBase> bases(n_subs);
    std::vector<unsigned int> changed(passes, 0), status(n_images, 0);
    unsigned int n = (unsigned int)n_subs;

    unsigned long long words = coef_len / 2;
    blockDim = {threads, 1, 1};
    gridDim = {64, 1, 1};
    for (unsigned int b = 0; b < gridDim.x; b++)
        for (unsigned int t = 0; t < threads; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            gpufeed_huff_zero((unsigned int*)coef.data(), words);
        }
    for (unsigned int p = 0; p < passes; p++) {
        launch(threads, n, [&] {
            gpufeed_huff_sync(data.data(), tables.data(), images.data(), subs.data(), n,
                              exits.data(), changed.data(), p);
        });
        if (getenv("GF_DIAG") && (p == 0 || changed[p - 1])) {
            unsigned int c = 0;
            std::vector<unsigned int> per(n_images, 0);
            for (unsigned int i = 0; i < n; i++)
                if (exits[(size_t)(p & 1) * n + i].changed) { c++; per[subs[i].image]++; }
            fprintf(stderr, "pass %u: %u changed;", p, c);
            if (p > 0)
                for (size_t m = 0; m < n_images; m++)
                    if (per[m]) fprintf(stderr, " %zu:%u", m, per[m]);
            fprintf(stderr, "\n");
        }
    }
    unsigned int n_groups = (n + GF_GROUP_SUBS - 1) / GF_GROUP_SUBS;
    std::vector<GfHuffExit> groups(n_groups);
    std::vector<GfHuffBase> group_bases(n_groups);
    launch(threads, n_groups, [&] {
        gpufeed_huff_group(images.data(), subs.data(), n, exits.data(), changed.data(), passes,
                           groups.data());
    });
    launch(threads, (unsigned int)n_intervals, [&] {
        gpufeed_huff_scan(images.data(), intervals.data(), (unsigned int)n_intervals, n,
                          exits.data(), changed.data(), passes, groups.data(),
                          group_bases.data(), bases.data(), status.data());
    });
    launch(threads, n_groups, [&] {
        gpufeed_huff_expand(images.data(), subs.data(), n, exits.data(), changed.data(), passes,
                            group_bases.data(), bases.data());
    });
    launch(threads, n, [&] {
        gpufeed_huff_write(data.data(), tables.data(), images.data(), subs.data(),
                           intervals.data(), n, exits.data(), changed.data(), passes,
                           bases.data(), coef.data(), status.data());
    });
    unsigned int final_pass = gf_final_pass(changed.data(), passes);

    FILE* o = fopen(argv[2], "wb");
    if (!o) return 2;
    fwrite(coef.data(), 2, coef_len, o);
    fwrite(status.data(), 4, n_images, o);
    fwrite(&final_pass, 4, 1, o);
    fclose(o);
    return 0;
}
"#;

/// The harness built in `dir`, or `None` without a C++ compiler; with `sanitize`, under
/// AddressSanitizer and UndefinedBehaviorSanitizer where the compiler has them.
fn build_harness_with(dir: &Path, sanitize: bool) -> Option<PathBuf> {
    super::host_check::build_cpp_harness(dir, "entropy.cu", HARNESS, sanitize)
}

/// The harness built in `dir` without sanitizers.
fn build_harness(dir: &Path) -> Option<PathBuf> {
    build_harness_with(dir, false)
}

fn u32s(out: &mut Vec<u8>, values: &[u32]) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The batch's descriptors as the kernel's structures lay them out.
fn descriptor_bytes(plan: &EntropyPlan) -> Vec<u8> {
    let mut out = Vec::new();
    for im in &plan.images {
        out.extend_from_slice(&im.data.to_le_bytes());
        out.extend_from_slice(&im.coef.to_le_bytes());
        u32s(
            &mut out,
            &[im.words, im.tables, im.mcus_wide, im.blocks_in_mcu],
        );
        for a in [im.plane, im.plane_wide, im.h, im.v] {
            u32s(&mut out, &a);
        }
        u32s(&mut out, &im.block);
        u32s(&mut out, &[im.status, im.period]);
    }
    for s in &plan.subs {
        u32s(
            &mut out,
            &[s.image, s.interval, s.start, s.end, s.limit, s.first],
        );
    }
    for iv in &plan.intervals {
        u32s(
            &mut out,
            &[
                iv.image,
                iv.first_sub,
                iv.subs,
                iv.first_block,
                iv.blocks,
                iv.unused,
            ],
        );
    }
    out
}

/// What a host run gives back.
struct Run {
    coefficients: Vec<i16>,
    status: Vec<u32>,
    final_pass: u32,
    plan: EntropyPlan,
}

/// Runs `images` through the host-compiled kernels with `passes` synchronisation passes, staged
/// as the GPU side stages them ([`stage`]: one buffer holding each image's multiplier tables,
/// Huffman tables and data, at multiples of 8 bytes); returns the result and the staged buffer
/// with each image's offset.
fn run_staged(
    harness: &Path,
    dir: &Path,
    images: &[&ParsedJpeg],
    passes: u32,
) -> (Run, Vec<u8>, Vec<usize>) {
    let mut staged = Vec::new();
    let mut plan = EntropyPlan::default();
    let mut offsets = Vec::new();
    for image in images {
        let at = staged.len();
        staged.resize(at + staged_len(image), 0xEE);
        let parts = stage(image, &mut staged[at..]).expect("stage");
        plan.push(
            image,
            (at + parts.data) as u64 / 4,
            (at + parts.tables) as u64 / 4,
        )
        .expect("plan");
        offsets.push(at);
    }
    let words: Vec<u32> = staged
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let result = run_plan(harness, dir, &staged, &words, plan, passes);
    (result, staged, offsets)
}

/// Runs `images` through the host-compiled kernels, with the passes the GPU side launches.
fn run(harness: &Path, dir: &Path, images: &[&ParsedJpeg]) -> Run {
    run_staged(harness, dir, images, PASSES).0
}

/// Runs `plan` through the host-compiled kernels with `data` and `tables` as their buffers and
/// `passes` synchronisation passes.
fn run_plan(
    harness: &Path,
    dir: &Path,
    data: &[u8],
    tables: &[u32],
    plan: EntropyPlan,
    passes: u32,
) -> Run {
    let mut input = Vec::new();
    for v in [
        data.len() as u64,
        tables.len() as u64,
        plan.images.len() as u64,
        plan.subs.len() as u64,
        plan.intervals.len() as u64,
        plan.coefficients,
        u64::from(passes),
        u64::from(HUFF_THREADS),
    ] {
        input.extend_from_slice(&v.to_le_bytes());
    }
    input.extend_from_slice(data);
    u32s(&mut input, tables);
    input.extend(descriptor_bytes(&plan));
    let out = super::host_check::run_harness(harness, dir, &input);
    let n = plan.coefficients as usize;
    let coefficients = out[..2 * n]
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    let words: Vec<u32> = out[2 * n..]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (status, final_pass) = words.split_at(plan.images.len());
    Run {
        coefficients,
        status: status.to_vec(),
        final_pass: final_pass[0],
        plan,
    }
}

/// Whether image `i` of `run` has libjpeg-turbo's coefficients of `jpeg`; `Err` says where not.
fn compare(run: &Run, i: usize, jpeg: &[u8], reader: &mut CoefficientReader) -> Result<(), String> {
    let read = reader.open(jpeg).unwrap().read(None).unwrap();
    let header = read.header().clone();
    let mut got = Vec::new();
    for (c, info) in header.components().iter().enumerate() {
        copy_plane(
            &run.coefficients,
            &run.plan.planes[i],
            c,
            info.blocks_wide,
            info.blocks_high,
            &mut got,
        )
        .map_err(|e| e.to_string())?;
        let mut expected = vec![0; got.len()];
        read.copy_component(c, &mut expected)
            .map_err(|e| e.to_string())?;
        if got != expected {
            let at = got.iter().zip(&expected).position(|(a, b)| a != b);
            return Err(format!(
                "component {c}: coefficient {at:?} of {} differs",
                got.len()
            ));
        }
    }
    Ok(())
}

/// The test's own scratch folder, removed afterwards.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("gpufeed-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    Scratch(dir)
}

/// Large and restart-coded files made by libjpeg-turbo from a real photo.
pub(crate) fn larger_cases() -> Vec<(String, Vec<u8>)> {
    let (pixels, w, h) = super::cases::turbo_decode(&repo_file("assets/retina.jpg"), false);
    let mut out = Vec::new();
    for (name, options) in [
        ("retina 420 q90", EncodeOptions::default()),
        (
            "retina 444 q100",
            EncodeOptions {
                quality: 100,
                sampling: Sampling::S444,
                ..EncodeOptions::default()
            },
        ),
        (
            "retina 422 restart 7 optimized",
            EncodeOptions {
                sampling: Sampling::S422,
                restart: Restart::Mcus(7),
                optimize: true,
                ..EncodeOptions::default()
            },
        ),
    ] {
        let jpeg = encode(&pixels, w, h, Format::Rgb, &options).expect("encode");
        out.push((name.to_string(), jpeg));
    }
    out
}

#[test]
fn the_entropy_kernels_run_on_the_host_equal_libjpeg_turbo() {
    let scratch = scratch("entropy-host");
    let Some(harness) = build_harness(&scratch.0) else {
        return;
    };
    let mut reader = CoefficientReader::new().unwrap();
    let mut named: Vec<(String, Vec<u8>)> =
        cases(5).into_iter().map(|c| (c.name, c.jpeg)).collect();
    named.extend(larger_cases());
    named.push(("assets/retina.jpg".into(), repo_file("assets/retina.jpg")));
    let mut parsed = Vec::new();
    let mut refused = Vec::new();
    for (name, jpeg) in &named {
        let header = reader.open(jpeg).unwrap().header().clone();
        match parse(jpeg) {
            Ok(p) => parsed.push((name.clone(), jpeg.clone(), p)),
            Err(Error::Unsupported(reason)) => {
                assert!(
                    header.progressive || header.arithmetic,
                    "{name}: a baseline file refused: {reason}"
                );
                refused.push(name.clone());
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    assert!(parsed.len() >= 100, "{} baseline cases", parsed.len());
    let images: Vec<&ParsedJpeg> = parsed.iter().map(|(_, _, p)| p).collect();
    let result = run(&harness, &scratch.0, &images);
    for (i, (name, _, p)) in parsed.iter().enumerate() {
        if std::env::var_os("GF_DIAG").is_some() {
            eprintln!(
                "{i}: {name} period {}",
                super::entropy_batch::table_period(p)
            );
        }
    }
    for (i, (name, jpeg, _)) in parsed.iter().enumerate() {
        assert_eq!(result.status[i], 0, "{name}: flagged");
        if let Err(e) = compare(&result, i, jpeg, &mut reader) {
            panic!("{name}: {e}");
        }
    }
    eprintln!(
        "{} images exact, {} subsequences, final pass {}; refused: {refused:?}",
        parsed.len(),
        result.plan.subs.len(),
        result.final_pass
    );
}

#[test]
fn too_few_passes_flag_every_unsettled_image_and_no_other() {
    let scratch = scratch("entropy-passes");
    let Some(harness) = build_harness(&scratch.0) else {
        return;
    };
    let named: Vec<(String, Vec<u8>, ParsedJpeg)> = cases(5)
        .into_iter()
        .map(|c| (c.name, c.jpeg))
        .chain(larger_cases())
        .filter_map(|(name, jpeg)| parse(&jpeg).ok().map(|p| (name, jpeg, p)))
        .collect();
    let images: Vec<&ParsedJpeg> = named.iter().map(|(_, _, p)| p).collect();
    // Each image alone, with every pass: how many passes its chains need.
    let needed: Vec<u32> = images
        .iter()
        .map(|image| {
            run_staged(&harness, &scratch.0, &[*image], PASSES)
                .0
                .final_pass
        })
        .collect();
    let mut reader = CoefficientReader::new().unwrap();
    for passes in [2, 4] {
        let (result, _, _) = run_staged(&harness, &scratch.0, &images, passes);
        let mut flagged = 0;
        for (i, (name, jpeg, _)) in named.iter().enumerate() {
            // The first pass that changes nothing must fall within the passes launched.
            let settled = needed[i] < passes;
            if result.status[i] != 0 {
                assert!(
                    !settled,
                    "{name}: settled in pass {} of {passes}, flagged",
                    needed[i]
                );
                flagged += 1;
            } else {
                assert!(
                    settled,
                    "{name}: needs pass {} of {passes}, not flagged",
                    needed[i]
                );
                if let Err(e) = compare(&result, i, jpeg, &mut reader) {
                    panic!("{name}, {passes} passes: {e}");
                }
            }
        }
        assert!(
            flagged > 0 && flagged < named.len(),
            "{passes} passes: {flagged} flagged"
        );
    }
}

#[test]
fn broken_files_are_refused_or_flagged_never_a_crash() {
    let scratch = scratch("entropy-broken");
    let Some(harness) = build_harness_with(&scratch.0, true) else {
        return;
    };
    let sources: Vec<Vec<u8>> = larger_cases()
        .into_iter()
        .map(|(_, j)| j)
        .chain(cases(6).into_iter().take(30).map(|c| c.jpeg))
        .collect();
    let noise = random_bytes(4096, 17);
    let mut flagged = 0;
    let mut exact = 0;
    let mut refused = 0;
    let mut batch = Vec::new();
    for (n, jpeg) in sources.iter().enumerate() {
        let r = |k: usize| usize::from(noise[(n * 8 + k) % noise.len()]);
        // Cut short, a byte flipped in the data, a byte flipped anywhere.
        let cut = jpeg[..jpeg.len() * (64 + r(0) % 160) / 256].to_vec();
        let mut data_flip = jpeg.clone();
        let at = jpeg.len() - 3 - (r(1) * 256 + r(2)) % (jpeg.len() / 3);
        data_flip[at] ^= 1 << (r(3) % 8);
        let mut any_flip = jpeg.clone();
        let at = (r(4) * 256 + r(5)) % jpeg.len();
        any_flip[at] = any_flip[at].wrapping_add(1 + r(6) as u8 % 255);
        // Four more bytes changed in the data.
        let mut many = jpeg.clone();
        for k in 0..4 {
            let at = jpeg.len() / 2 + (r(7 + k) * 97) % (jpeg.len() / 2 - 2);
            many[at] ^= 1 << (r(11 + k) % 8);
        }
        for broken in [cut, data_flip, any_flip, many] {
            match parse(&broken) {
                Ok(p) => batch.push((broken, p)),
                Err(_) => refused += 1,
            }
        }
    }
    let images: Vec<&ParsedJpeg> = batch.iter().map(|(_, p)| p).collect();
    let result = run(&harness, &scratch.0, &images);
    let mut reader = CoefficientReader::new().unwrap();
    for (i, (jpeg, _)) in batch.iter().enumerate() {
        if result.status[i] != 0 {
            flagged += 1;
            continue;
        }
        // Not flagged: libjpeg's coefficients, whatever it warns about (extraneous bytes after
        // an interval's last MCU change nothing).
        let readable = reader.open(jpeg).is_ok_and(|o| o.read(None).is_ok());
        assert!(
            readable,
            "broken file {i}: libjpeg cannot read it, the kernels flag nothing"
        );
        compare(&result, i, jpeg, &mut reader)
            .unwrap_or_else(|e| panic!("broken file {i}: unflagged and wrong: {e}"));
        exact += 1;
    }
    eprintln!("broken files: {refused} refused, {flagged} flagged, {exact} still exact");
    assert!(flagged > 0 && refused > 0);
}

/// The window `pick` (4 random bytes) chooses in a `w` x `h` image, as `cases::prepare` does.
fn pick_window(pick: &[u8], w: u32, h: u32) -> Window {
    let p = |k: usize| u32::from(pick[k]);
    let (x, y) = (p(0) * w / 256, p(1) * h / 256);
    Window {
        x,
        y,
        width: (1 + p(2) * (w - x) / 256).min(w - x),
        height: (1 + p(3) * (h - y) / 256).min(h - y),
    }
}

#[test]
fn entropy_decoded_windows_through_the_idct_kernels_equal_libjpeg_turbo() {
    let scratch = scratch("entropy-idct-host");
    let (entropy_dir, idct_dir) = (scratch.0.join("entropy"), scratch.0.join("idct"));
    std::fs::create_dir_all(&entropy_dir).expect("scratch folder");
    std::fs::create_dir_all(&idct_dir).expect("scratch folder");
    let (Some(entropy), Some(idct)) = (
        build_harness(&entropy_dir),
        super::host_check::build_harness(&idct_dir),
    ) else {
        return;
    };
    let mut reader = CoefficientReader::new().unwrap();
    let mut named: Vec<(String, Vec<u8>)> =
        cases(7).into_iter().map(|c| (c.name, c.jpeg)).collect();
    named.extend(larger_cases());
    let parsed: Vec<(String, Vec<u8>, ParsedJpeg)> = named
        .into_iter()
        .filter_map(|(name, jpeg)| parse(&jpeg).ok().map(|p| (name, jpeg, p)))
        .collect();
    let images: Vec<&ParsedJpeg> = parsed.iter().map(|(_, _, p)| p).collect();
    let (decoded, staged, offsets) = run_staged(&entropy, &entropy_dir, &images, PASSES);
    assert!(decoded.status.iter().all(|&s| s == 0));
    let picks = random_bytes(parsed.len() * 4, 23);
    for windows in [false, true] {
        let mut batch = Vec::new();
        let mut dense = Vec::new();
        let mut expected = Vec::new();
        for (i, (name, jpeg, p)) in parsed.iter().enumerate() {
            let header = reader.open(jpeg).unwrap().header().clone();
            let gray = header.colorspace == Colorspace::Gray;
            let layout = Layout::new(&header).unwrap();
            let (w, h) = (layout.width, layout.height);
            let window = if windows {
                pick_window(&picks[i * 4..i * 4 + 4], w, h)
            } else {
                Window::whole(w, h)
            };
            let image =
                PackedImage::dense(&layout, &window, QUANT_SECTIONS, staged_len(p)).unwrap();
            batch.push((image, offsets[i] as u64));
            dense.push((i, decoded.plan.planes[i]));
            let (whole, _, _) = turbo_decode(jpeg, gray);
            let channels = layout.channels();
            let mut window_pixels = Vec::new();
            for row in window.y..window.y + window.height {
                let start = (row * w + window.x) as usize * channels;
                window_pixels
                    .extend_from_slice(&whole[start..start + window.width as usize * channels]);
            }
            expected.push((name, window_pixels));
        }
        let (output, plan) = super::host_check::run(
            &idct,
            &idct_dir,
            &staged,
            &batch,
            &decoded.coefficients,
            &dense,
        );
        for ((name, reference), rendered) in expected.iter().zip(&plan.rendered) {
            let start = rendered.offset as usize;
            let got = &output[start..start + reference.len()];
            assert!(
                got == &reference[..],
                "{name} (windows: {windows}): differs from libjpeg-turbo at byte {:?}",
                got.iter().zip(reference).position(|(a, b)| a != b)
            );
        }
    }
}

#[test]
fn large_photos_re_encoded_equal_libjpeg_turbo() {
    let Some(folder) = photos_folder() else {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: large_photos_re_encoded_equal_libjpeg_turbo: no photos folder"
        );
        return;
    };
    let scratch = scratch("entropy-photos");
    let Some(harness) = build_harness(&scratch.0) else {
        return;
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&folder)
        .expect("photos folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "jpg"))
        .collect();
    paths.sort();
    let sizes = [(1920, 1280), (3000, 2000), (4000, 3000)];
    let mut named = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let Ok(decoded) = image::open(path) else {
            continue;
        };
        let gray = decoded.color().channel_count() == 1;
        let rgb = decoded.to_rgb8();
        let (w, h) = rgb.dimensions();
        let (tw, th) = sizes[i % sizes.len()];
        let pixels = tiled(rgb.as_raw(), w, h, tw, th);
        let options = match i % 4 {
            _ if gray => EncodeOptions {
                colorspace: turbojpeg_region::Colorspace::Gray,
                sampling: Sampling::S444,
                quality: 85,
                ..EncodeOptions::default()
            },
            0 => EncodeOptions {
                quality: 90,
                ..EncodeOptions::default()
            },
            1 => EncodeOptions {
                quality: 95,
                sampling: Sampling::S444,
                ..EncodeOptions::default()
            },
            2 => EncodeOptions {
                sampling: Sampling::S422,
                restart: Restart::Rows(1),
                optimize: true,
                ..EncodeOptions::default()
            },
            _ => EncodeOptions {
                quality: 75,
                sampling: Sampling::S411,
                ..EncodeOptions::default()
            },
        };
        let jpeg = encode(&pixels, tw, th, Format::Rgb, &options).expect("encode");
        let name = format!("{} as {tw}x{th}", path.display());
        named.push((name, jpeg));
    }
    assert!(!named.is_empty(), "no photos in {}", folder.display());
    let parsed: Vec<ParsedJpeg> = named
        .iter()
        .map(|(name, jpeg)| parse(jpeg).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    let images: Vec<&ParsedJpeg> = parsed.iter().collect();
    let result = run(&harness, &scratch.0, &images);
    let mut reader = CoefficientReader::new().unwrap();
    for (i, (name, jpeg)) in named.iter().enumerate() {
        assert_eq!(result.status[i], 0, "{name}: flagged");
        if let Err(e) = compare(&result, i, jpeg, &mut reader) {
            panic!("{name}: {e}");
        }
    }
    let mpx: f64 = parsed
        .iter()
        .map(|p| f64::from(p.width) * f64::from(p.height) / 1e6)
        .sum();
    eprintln!(
        "{} photos re-encoded ({mpx:.1} Mpx) exact, {} subsequences, final pass {}",
        named.len(),
        result.plan.subs.len(),
        result.final_pass
    );
}
