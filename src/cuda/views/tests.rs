use super::*;
use crate::cuda::emulation::{emulated, emulation};
use crate::views::{apply_view_ops, ViewOps, Views};
use gpufeed_bench::upload::random_bytes;

/// Bytes before and after the views in the device buffer, poisoned: a write outside the views
/// shows.
const HEAD: usize = 7;
const TAIL: usize = 5;

#[test]
fn the_kernel_compiles_with_nvrtc() {
    // SAFETY: `is_culib_present` only tries to dlopen NVRTC by its usual names and reports
    // whether that worked; it calls nothing inside it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: the_kernel_compiles_with_nvrtc: NVRTC not found"
        );
        return;
    }
    // The kernel fuses the blur's exact products with their sums and nothing else: built with
    // those apart, no fused multiply-add is left.
    let mut unfused = kernel_source();
    unfused.defines.push("GF_VIEW_BLUR_UNFUSED".into());
    for (major, minor) in [(9, 0), (8, 0)] {
        for (source, f64_fused) in [(kernel_source(), true), (unfused.clone(), false)] {
            let ptx = crate::cuda::compile_ptx(&source, major, minor)
                .unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"));
            let text = ptx.to_src();
            assert!(
                text.contains("gpufeed_views_colour"),
                "compute_{major}{minor}"
            );
            assert!(
                !text.contains("fma.rn.f32"),
                "no fma.rn.f32 may round the values"
            );
            assert_eq!(
                text.contains("fma.rn.f64"),
                f64_fused,
                "fma.rn.f64 only where the blur adds its exact products"
            );
        }
    }
}

#[test]
fn the_plan_lays_out_each_views_calls_and_the_blur_weights() {
    let first = [
        ViewOp::Brightness(1.5),
        ViewOp::Blur {
            kernel_size: 3,
            sigma: 1.0,
        },
    ];
    let third = [ViewOp::Hue(-0.1), ViewOp::Solarize(128)];
    let calls: [&[ViewOp]; 3] = [&first, &[], &third];
    let mut words = vec![99; 3];
    assert_eq!(
        pack_plan(&calls, 8, 8, &mut words).expect("a plan"),
        Some(3)
    );
    // Starts: view 0 at word 4, view 1 (no call) and view 2 at 8, the end at 12.
    assert_eq!(&words[..4], &[4, 8, 8, 12]);
    assert_eq!(words[4], BRIGHTNESS);
    assert_eq!(words[5], u64::from(1.5f32.to_bits()));
    assert_eq!(words[6], BLUR | (3 << 32));
    assert_eq!(words[7], 12, "the blur's weights follow the calls");
    // uint8(-0.1 * 255) = uint8(-25) = 231.
    assert_eq!(words[8], HUE | (231 << 32));
    assert_eq!(words[10], SOLARIZE | (128 << 32));
    let k1 = gaussian_kernel(3, 1.0);
    assert_eq!(words.len(), 12 + 4);
    assert_eq!(words[12], f64::from(k1[0] * k1[0]).to_bits());
    assert_eq!(words[13], f64::from(k1[0] * k1[1]).to_bits());
    assert_eq!(words[15], f64::from(k1[1] * k1[1]).to_bits());
    // No blur: no scratch needed.
    assert_eq!(
        pack_plan(&[&third], 8, 8, &mut words).expect("a plan"),
        None
    );
    assert_eq!(words.len(), 2 + 4);
}

#[test]
fn a_blur_too_large_for_the_views_is_refused_as_on_the_cpu() {
    let mut words = Vec::new();
    for (k, refused) in [(15, false), (17, true), (0, true)] {
        let blur = [ViewOp::Blur {
            kernel_size: k,
            sigma: 1.0,
        }];
        let planned = pack_plan(&[&[], &blur], 8, 12, &mut words);
        assert_eq!(planned.is_err(), refused, "kernel {k}");
        if k > 0 {
            let mut pixels = vec![0u8; 8 * 12 * 3];
            assert_eq!(apply_view_ops(&blur, &mut pixels, 8, 12).is_err(), refused);
        }
    }
    let err = pack_plan(
        &[&[ViewOp::Blur {
            kernel_size: 17,
            sigma: 1.0,
        }]],
        8,
        12,
        &mut words,
    )
    .expect_err("refused");
    assert!(err.to_string().contains("12x8"), "{err}");
}

#[test]
fn the_blur_tile_holds_bands_of_rows_with_their_halo_within_its_budget() {
    // DINOv2's views and blur: 224 x 224 in 44 KB (40 rows a band with the halo of 4 on each
    // side), 96 x 96 whole with its halo.
    assert_eq!(tile_words(224, 224, 9), 11_264);
    assert_eq!(11_264 / (224 + 8) - 8, 40);
    assert_eq!(tile_words(96, 96, 9), (96 + 8) * (96 + 8));
    // A small view whole, with its halo.
    assert_eq!(tile_words(12, 20, 3), (12 + 2) * (20 + 2));
    // Too wide for one row and its halo: no tile, each blur reads the view.
    assert_eq!(tile_words(100, 5_000, 9), 0);
    assert_eq!(tile_words(100, 1_200, 9), 11_264);
    assert_eq!(tile_words(100, 1_300, 9), 0);
}

/// Every call alone, at factors that reach the edges: 0, 1, large; hue shifts at and near the
/// wrap; blurs of small and large sigma; every solarize threshold's kind.
fn every_call() -> Vec<ViewOp> {
    let mut ops = Vec::new();
    for f in [0.0, 0.37, 1.0, 1.4, 1.99, 7.5] {
        ops.push(ViewOp::Brightness(f));
        ops.push(ViewOp::Contrast(f));
        ops.push(ViewOp::Saturation(f));
    }
    for f in [
        -0.5, -0.4999, -0.2, -0.0039, 0.0, 0.0039, 0.004, 0.1, 0.2, 0.4999, 0.5,
    ] {
        ops.push(ViewOp::Hue(f));
    }
    ops.push(ViewOp::Grayscale);
    for t in [0, 1, 128, 255] {
        ops.push(ViewOp::Solarize(t));
    }
    for (kernel_size, sigma) in [(9, 0.1), (9, 0.7), (9, 2.0), (23, 0.1), (23, 2.0), (3, 5.0)] {
        ops.push(ViewOp::Blur { kernel_size, sigma });
    }
    ops
}

/// `views` views' calls, each a random sequence of up to 8 of `every_call`'s (a blur only where
/// it fits `h` x `w`): contrasts first, twice in a row, after a blur; blurs first, last, twice.
fn mixed_calls(views: usize, h: usize, w: usize, seed: u64) -> Vec<Vec<ViewOp>> {
    let pool: Vec<ViewOp> = every_call()
        .into_iter()
        .filter(|op| match op {
            ViewOp::Blur { kernel_size, .. } => (*kernel_size as usize) / 2 < h.min(w),
            _ => true,
        })
        .collect();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    (0..views)
        .map(|_| {
            let len = next(9);
            (0..len).map(|_| pool[next(pool.len())]).collect()
        })
        .collect()
}

/// Pixels that sweep the colour cube (hues on both sides of the wrap, greys, saturated and dull
/// colours), `bytes` long.
fn sweep(bytes: usize, seed: u64) -> Vec<u8> {
    let noise = random_bytes(bytes / 3 + 1, seed);
    (0..bytes / 3)
        .flat_map(|p| {
            let r = (p % 256) as u8;
            let g = ((p / 256) * 37 % 256) as u8;
            match noise[p] % 4 {
                // Grey: every channel equal.
                0 => [r, r, r],
                // Red with a little blue: hues just below the wrap; with a little green: above.
                1 => [255 - (r & 15), noise[p] & 7, r & 7],
                2 => [r, g, noise[p]],
                _ => [g, noise[p], r],
            }
        })
        .collect()
}

/// `apply_view_ops` on each view of `pixels`.
fn on_the_cpu(pixels: &[u8], calls: &[&[ViewOp]], height: usize, width: usize) -> Vec<u8> {
    let bytes = height * width * 3;
    let mut want = pixels.to_vec();
    for (view, ops) in want.chunks_exact_mut(bytes).zip(calls) {
        apply_view_ops(ops, view, height, width).expect("the CPU rendition");
    }
    want
}

/// The views of `pixels` coloured on the GPU, inside a buffer whose bytes around them are
/// poisoned (and checked untouched), with the scratch poisoned before the launch.
fn on_the_gpu(
    stream: &Arc<CudaStream>,
    colour: &mut ViewColourKernel,
    pixels: &[u8],
    calls: &[&[ViewOp]],
    height: usize,
    width: usize,
) -> Vec<u8> {
    let mut host = vec![0xFFu8; HEAD + pixels.len() + TAIL];
    host[HEAD..HEAD + pixels.len()].copy_from_slice(pixels);
    let mut buffer = stream.clone_htod(&host).expect("upload");
    // The scratch poisoned (made here at the size the views need when it is smaller): a read
    // of a byte the kernel did not write first shows.
    let room = colour
        .scratch
        .as_ref()
        .map_or(0, |s| s.len())
        .max(pixels.len());
    let poison: Vec<u8> = (0..room).map(|i| (i * 131 % 251) as u8).collect();
    colour.scratch = Some(stream.clone_htod(&poison).expect("poison"));
    let mut views = buffer.slice_mut(HEAD..HEAD + pixels.len());
    colour
        .apply(&mut views, height, width, calls)
        .expect("the kernel");
    let got = stream.clone_dtoh(&buffer).expect("download");
    assert!(
        got[..HEAD].iter().all(|&v| v == 0xFF),
        "a write before view 0"
    );
    assert!(
        got[HEAD + pixels.len()..].iter().all(|&v| v == 0xFF),
        "a write past the last view"
    );
    got[HEAD..HEAD + pixels.len()].to_vec()
}

/// The test GPU's stream and a colour kernel for it; `None` (the test skipped, or failed under
/// `GPUFEED_REQUIRE_GPU=1`) without a GPU.
fn colour_kernel() -> Option<(Arc<CudaStream>, ViewColourKernel)> {
    let gpu = crate::cuda::test_gpu(module_path!())?;
    let stream = gpu.stream().clone();
    let colour = ViewColourKernel::new(&stream).expect("compile");
    Some((stream, colour))
}

/// Fails naming the first view and byte that differ.
fn same(got: &[u8], want: &[u8], calls: &[&[ViewOp]], bytes: usize, case: &str) {
    if got == want {
        return;
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let differing = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let view = at / bytes;
    panic!(
        "{case}: {differing} bytes differ; first at view {view} ({:?}), byte {} of the view: \
         GPU {} CPU {}",
        calls.get(view),
        at % bytes,
        got[at],
        want[at]
    );
}

#[test]
fn every_call_alone_is_the_cpu_renditions_byte_for_byte() {
    let Some((stream, mut colour)) = colour_kernel() else {
        return;
    };
    let ops = every_call();
    // DINOv2's sizes, odd ones, the blur's smallest, one pixel: one ViewColourKernel for all, its
    // buffers growing and reused.
    for (case, &(h, w)) in [
        (96, 96),
        (224, 224),
        (61, 97),
        (97, 61),
        (12, 12),
        (5, 9),
        (1, 1),
    ]
    .iter()
    .enumerate()
    {
        let bytes = h * w * 3;
        // Each call alone, then a view with no call (left as it is).
        let mut calls: Vec<&[ViewOp]> = ops
            .iter()
            .filter(|op| match op {
                ViewOp::Blur { kernel_size, .. } => (*kernel_size as usize) / 2 < h.min(w),
                _ => true,
            })
            .map(std::slice::from_ref)
            .collect();
        calls.push(&[]);
        for (kind, pixels) in [
            ("noise", random_bytes(calls.len() * bytes, case as u64 + 3)),
            ("sweep", sweep(calls.len() * bytes, case as u64 + 11)),
        ] {
            let want = on_the_cpu(&pixels, &calls, h, w);
            let got = on_the_gpu(&stream, &mut colour, &pixels, &calls, h, w);
            same(&got, &want, &calls, bytes, &format!("{w}x{h} {kind}"));
        }
    }
}

/// Every colour once, red changing fastest: 2^24 pixels, a 4096 x 4096 view.
fn every_colour() -> Vec<u8> {
    (0..1u32 << 24)
        .flat_map(|v| {
            let [r, g, b, _] = v.to_le_bytes();
            [r, g, b]
        })
        .collect()
}

/// Hue shifts for views of every colour: none, a quarter turn, half a turn each way (a
/// negative factor wraps), the smallest.
const EVERY_COLOUR_HUES: [f32; 5] = [0.0, 0.25, 0.5, -0.5, 0.004];

#[test]
fn the_hue_of_every_colour_is_the_cpu_renditions() {
    let Some((stream, mut colour)) = colour_kernel() else {
        return;
    };
    let colours = every_colour();
    let ops: Vec<[ViewOp; 1]> = EVERY_COLOUR_HUES.map(|f| [ViewOp::Hue(f)]).to_vec();
    let calls: Vec<&[ViewOp]> = ops.iter().map(|op| &op[..]).collect();
    let pixels = colours.repeat(calls.len());
    let want = on_the_cpu(&pixels, &calls, 4096, 4096);
    let got = on_the_gpu(&stream, &mut colour, &pixels, &calls, 4096, 4096);
    same(&got, &want, &calls, colours.len(), "every colour");
}

/// The calls of `views`' draws for images `0..images` in two epochs, group by group:
/// `(size, the calls of each view of the group)`.
fn drawn_calls(views: &Views, images: usize) -> Vec<(usize, Vec<Vec<ViewOp>>)> {
    let mut first = 0;
    let mut groups = Vec::new();
    for group in &views.groups {
        let count = group.count as usize;
        let mut calls = Vec::new();
        for epoch in 0..2 {
            for index in 0..images {
                for view in first..first + count {
                    let draw = views
                        .draw(640, 480, index, epoch, view)
                        .expect("a view of the group");
                    calls.push(draw.ops);
                }
            }
        }
        groups.push((group.size as usize, calls));
        first += count;
    }
    groups
}

#[test]
fn the_dinov2_and_simclr_draws_are_the_cpu_renditions_byte_for_byte() {
    let Some((stream, mut colour)) = colour_kernel() else {
        return;
    };
    for (name, views, images) in [
        ("dinov2", Views::dinov2().seed(3), 40),
        ("simclr", Views::simclr().seed(5), 80),
    ] {
        for (size, calls) in drawn_calls(&views, images) {
            let calls: Vec<&[ViewOp]> = calls.iter().map(Vec::as_slice).collect();
            let bytes = size * size * 3;
            let pixels = sweep(calls.len() * bytes, size as u64);
            let want = on_the_cpu(&pixels, &calls, size, size);
            let got = on_the_gpu(&stream, &mut colour, &pixels, &calls, size, size);
            same(&got, &want, &calls, bytes, &format!("{name} {size}"));
        }
    }
}

#[test]
fn mixed_sequences_of_calls_are_the_cpu_renditions_byte_for_byte() {
    let Some((stream, mut colour)) = colour_kernel() else {
        return;
    };
    for (seed, &(h, w)) in [(96, 96), (224, 224), (13, 31), (3, 4)].iter().enumerate() {
        let mixed = mixed_calls(120, h, w, seed as u64 + 5);
        let calls: Vec<&[ViewOp]> = mixed.iter().map(Vec::as_slice).collect();
        let bytes = h * w * 3;
        let pixels = sweep(calls.len() * bytes, seed as u64 + 31);
        let want = on_the_cpu(&pixels, &calls, h, w);
        let got = on_the_gpu(&stream, &mut colour, &pixels, &calls, h, w);
        same(&got, &want, &calls, bytes, &format!("{w}x{h} mixed"));
    }
}

#[test]
fn views_of_photos_are_the_cpu_renditions_byte_for_byte() {
    let Some((stream, mut colour)) = colour_kernel() else {
        return;
    };
    // DINOv2's crops without their colour calls: the photos' views as they reach the calls.
    let mut plain = Views::dinov2().seed(9);
    plain
        .groups
        .iter_mut()
        .for_each(|g| g.ops = ViewOps::none());
    let drawn = Views::dinov2().seed(9);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    for name in [
        "rocket.jpg",
        "retina.jpg",
        "hubble_deep_field.jpg",
        "chelsea.png",
    ] {
        let bytes = std::fs::read(root.join(name)).expect("the photo");
        let mut groups: Vec<(usize, Vec<u8>, Vec<Vec<ViewOp>>)> = Vec::new();
        for index in 0..6 {
            let rendered = crate::cpu::render_views(&bytes, &Default::default(), &plain, index, 0)
                .expect("the photo's views");
            for view in rendered {
                let size = view.draw.size as usize;
                let ops = drawn
                    .draw(640, 480, index, 0, view.draw.view)
                    .expect("a draw")
                    .ops;
                match groups.iter_mut().find(|g| g.0 == size) {
                    Some(g) => {
                        g.1.extend_from_slice(&view.pixels);
                        g.2.push(ops);
                    }
                    None => groups.push((size, view.pixels, vec![ops])),
                }
            }
        }
        for (size, pixels, calls) in &groups {
            let calls: Vec<&[ViewOp]> = calls.iter().map(Vec::as_slice).collect();
            let want = on_the_cpu(pixels, &calls, *size, *size);
            let got = on_the_gpu(&stream, &mut colour, pixels, &calls, *size, *size);
            same(
                &got,
                &want,
                &calls,
                size * size * 3,
                &format!("{name} {size}"),
            );
        }
    }
}

#[test]
fn too_few_bytes_for_the_views_is_an_error() {
    let Some((stream, mut colour)) = colour_kernel() else {
        return;
    };
    let mut buffer = stream
        .clone_htod(&vec![0u8; 2 * 8 * 8 * 3 - 1])
        .expect("upload");
    let calls: [&[ViewOp]; 2] = [&[ViewOp::Grayscale], &[]];
    let err = colour
        .apply(&mut buffer.slice_mut(..), 8, 8, &calls)
        .expect_err("too short");
    assert!(err.to_string().contains("383"), "{err}");
}

/// Reads the cases (`h`, `w`, views, plan words, the plan, the pixels, the CPU's bytes), runs
/// the kernel's blocks one after the other (each on its team of threads), and counts the bytes
/// that differ.
const HARNESS: &str = r#"#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv) {
  int bad = 0;
  // No tile (every blur reads the view), tiles too small for a band of some blurs, bands of a
  // few rows, the sizes src/cuda/views.rs gives, a whole view.
  // `--tile=N` before the cases: that tile alone.
  std::vector<unsigned> tiles = {0, 97, 600, 2000, 5120, 10240, 65536};
  for (int a = 1; a < argc; a++) {
    if (strncmp(argv[a], "--tile=", 7) == 0) { tiles = {(unsigned)atoi(argv[a] + 7)}; continue; }
    FILE* f = fopen(argv[a], "rb");
    uint64_t hdr[4]; fread(hdr, 8, 4, f);
    size_t h = hdr[0], w = hdr[1], views = hdr[2], nw = hdr[3];
    std::vector<unsigned long long> words(nw); fread(words.data(), 8, nw, f);
    size_t bytes = h * w * 3 * views;
    std::vector<unsigned char> original(bytes), want(bytes), scratch(bytes + 1, 0xA5);
    fread(original.data(), 1, bytes, f); fread(want.data(), 1, bytes, f); fclose(f);
    for (unsigned tile : tiles) {
      std::vector<unsigned char> px = original;
      for (unsigned b = 0; b < views; b++) {
        blockIdx.x = b;
        std::vector<std::thread> team;
        for (unsigned t = 0; t < blockDim.x; t++)
          team.emplace_back([&, t] { threadIdx.x = t; gpufeed_views_colour(px.data(), scratch.data(), words.data(), (int)h, (int)w, tile); });
        for (auto& member : team) member.join();
      }
      size_t diff = 0, first = (size_t)-1;
      for (size_t i = 0; i < bytes; i++) if (px[i] != want[i]) { if (!diff) first = i; diff++; }
      printf("%s %zux%zu views %zu tile %u: %zu differ", argv[a], w, h, views, tile, diff);
      if (diff) { size_t v = first / (h*w*3); printf(" first view %zu byte %zu got %d want %d", v, first % (h*w*3), px[first], want[first]); bad = 1; }
      printf("\n");
    }
  }
  return bad;
}
"#;

/// One case for the harness: its header, plan, pixels and the CPU rendition's bytes.
fn emulation_case(pixels: &[u8], calls: &[&[ViewOp]], h: usize, w: usize) -> Vec<u8> {
    let mut words = Vec::new();
    pack_plan(calls, h, w, &mut words).expect("a plan");
    let mut out = Vec::new();
    for v in [h as u64, w as u64, calls.len() as u64, words.len() as u64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in &words {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(pixels);
    out.extend(on_the_cpu(pixels, calls, h, w));
    out
}

#[test]
fn the_kernel_source_run_on_the_cpu_is_the_cpu_rendition() {
    let Some((dir, binary)) = emulation("views-emulation", "views.cu", HARNESS) else {
        return;
    };
    let mut cases = Vec::new();
    let ops = every_call();
    for (case, &(h, w)) in [(96, 96), (61, 97), (12, 12), (5, 9), (1, 1)]
        .iter()
        .enumerate()
    {
        let bytes = h * w * 3;
        let calls: Vec<&[ViewOp]> = ops
            .iter()
            .filter(|op| match op {
                ViewOp::Blur { kernel_size, .. } => (*kernel_size as usize) / 2 < h.min(w),
                _ => true,
            })
            .map(std::slice::from_ref)
            .chain([&[][..]])
            .collect();
        cases.push(emulation_case(
            &random_bytes(calls.len() * bytes, case as u64 + 3),
            &calls,
            h,
            w,
        ));
        cases.push(emulation_case(
            &sweep(calls.len() * bytes, case as u64 + 11),
            &calls,
            h,
            w,
        ));
    }
    for (size, calls) in drawn_calls(&Views::dinov2().seed(3), 4) {
        let calls: Vec<&[ViewOp]> = calls.iter().map(Vec::as_slice).collect();
        let pixels = sweep(calls.len() * size * size * 3, size as u64);
        cases.push(emulation_case(&pixels, &calls, size, size));
    }
    for (seed, &(h, w)) in [(24, 24), (13, 31), (3, 4)].iter().enumerate() {
        let mixed = mixed_calls(40, h, w, seed as u64 + 1);
        let calls: Vec<&[ViewOp]> = mixed.iter().map(Vec::as_slice).collect();
        let pixels = sweep(calls.len() * h * w * 3, seed as u64 + 21);
        cases.push(emulation_case(&pixels, &calls, h, w));
    }
    let report = emulated(&dir, &binary, &[], &cases);
    assert_eq!(
        report.matches(": 0 differ").count(),
        cases.len() * 7,
        "{report}"
    );
}

#[test]
fn the_kernel_source_run_on_the_cpu_gives_the_hue_of_every_colour() {
    let Some((dir, binary)) = emulation("views-hue-emulation", "views.cu", HARNESS) else {
        return;
    };
    // Two shifts of every colour (the GPU test runs five): half a turn back, a quarter on.
    let ops = [[ViewOp::Hue(-0.5)], [ViewOp::Hue(0.25)]];
    let calls: Vec<&[ViewOp]> = ops.iter().map(|op| &op[..]).collect();
    let case = emulation_case(&every_colour().repeat(calls.len()), &calls, 4096, 4096);
    let report = emulated(&dir, &binary, &["--tile=0".into()], &[case]);
    assert_eq!(report.matches(": 0 differ").count(), 1, "{report}");
}
