//! JPEGs of every kind the path meets, made fresh with libjpeg-turbo's encoder, and real ones:
//! the cases the CPU rendition and the kernels are checked on against libjpeg-turbo's decode.

use std::path::PathBuf;

use turbojpeg_region::{
    encode, Colorspace, Decoder, EncodeOptions, Format, Request, Restart, Sampling,
};

use gpufeed_bench::upload::random_bytes;

/// A named JPEG.
pub(crate) struct Case {
    pub name: String,
    pub jpeg: Vec<u8>,
}

/// A file of the repository, found from wherever the tests run.
pub(crate) fn repo_file(relative: &str) -> Vec<u8> {
    let cwd = std::env::current_dir().expect("current directory");
    let path = cwd
        .ancestors()
        .map(|dir| dir.join(relative))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{relative} not found above {}", cwd.display()));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// libjpeg-turbo's own decode: RGB, or gray for a gray JPEG.
pub(crate) fn turbo_decode(jpeg: &[u8], gray: bool) -> (Vec<u8>, u32, u32) {
    let mut decoder = Decoder::new().expect("decoder");
    let header = decoder.read_header(jpeg).expect("header");
    let request = Request {
        format: if gray { Format::Gray } else { Format::Rgb },
        reduction: 1,
        region: None,
    };
    let mut out = vec![0; request.output_len(&header)];
    let decoded = decoder
        .decompress(jpeg, &request, &mut out)
        .expect("decode");
    assert!(decoded.warning.is_none(), "{:?}", decoded.warning);
    (out, header.width, header.height)
}

/// A picture with smooth areas, edges and grain: every frequency gets coefficients, and
/// quality 100 with the grain drives the inverse DCT to its clamps.
pub(crate) fn picture(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let grain = random_bytes((width * height * 3) as usize, seed);
    let mut pixels = Vec::with_capacity(grain.len());
    for y in 0..height {
        for x in 0..width {
            for c in 0..3u32 {
                let i = ((y * width + x) * 3 + c) as usize;
                let ramp = (x * (150 + 40 * c) / width.max(1) + y * 90 / height.max(1)) as i32;
                let edge = if (x / 5 + y / 3 + c).is_multiple_of(4) {
                    120
                } else {
                    0
                };
                let v = ramp + edge + (i32::from(grain[i]) - 128) / 2;
                pixels.push(v.clamp(0, 255) as u8);
            }
        }
    }
    pixels
}

/// Crop `(x, y, w, h)` of an RGB image `width` wide.
fn crop(pixels: &[u8], width: u32, x: u32, y: u32, w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity((w * h * 3) as usize);
    for row in y..y + h {
        let start = ((row * width + x) * 3) as usize;
        out.extend_from_slice(&pixels[start..start + (w * 3) as usize]);
    }
    out
}

/// Sampling factor sets: the usual ones, and the odd ones that take other routines
/// (`int_upsample`, a luma smaller than its chroma, two chroma components upsampled by two
/// routines, row groups of two rows).
pub(crate) fn samplings() -> Vec<(&'static str, Sampling)> {
    vec![
        ("444", Sampling::S444),
        ("422", Sampling::S422),
        ("420", Sampling::S420),
        ("440", Sampling::S440),
        ("411", Sampling::S411),
        ("y1x1-c2x2", Sampling([(1, 1), (2, 2), (2, 2)])),
        ("y2x2-cb1x1-cr2x1", Sampling([(2, 2), (1, 1), (2, 1)])),
        ("y3x1", Sampling([(3, 1), (1, 1), (1, 1)])),
        ("y4x2", Sampling([(4, 2), (1, 1), (1, 1)])),
        ("y1x4-c1x2", Sampling([(1, 4), (1, 2), (1, 2)])),
        ("y2x2-c1x2", Sampling([(2, 2), (1, 2), (1, 2)])),
        ("y3x2-cb1x1-cr3x1", Sampling([(3, 2), (1, 1), (3, 1)])),
    ]
}

/// The cases: fresh files of every sampling, entropy coding and colour space, at sizes from
/// 1x1 up (odd ones, one sample of chroma, two, a partial MCU), and real photos.
pub(crate) fn cases(seed: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut push = |name: String, pixels: &[u8], w: u32, h: u32, options: EncodeOptions| {
        let jpeg =
            encode(pixels, w, h, Format::Rgb, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
        cases.push(Case { name, jpeg });
    };
    let sizes = [
        (1, 1),
        (2, 2),
        (3, 5),
        (4, 3),
        (5, 4),
        (8, 8),
        (17, 9),
        (33, 17),
        (50, 31),
    ];
    for (s, &(w, h)) in sizes.iter().enumerate() {
        let pixels = picture(w, h, seed * 1000 + s as u64);
        for (name, sampling) in samplings() {
            let options = EncodeOptions {
                sampling,
                quality: [100, 90, 75][s % 3],
                ..EncodeOptions::default()
            };
            push(format!("{name} {w}x{h}"), &pixels, w, h, options);
        }
    }
    // Entropy codings, restart intervals, colour spaces and qualities on real content.
    let (rocket, rw, _) = turbo_decode(&repo_file("assets/rocket.jpg"), false);
    let part = crop(&rocket, rw, 101, 53, 211, 145);
    let (pw, ph) = (211, 145);
    let modes = coding_modes();
    for (name, options) in modes {
        push(format!("rocket {name}"), &part, pw, ph, options);
    }
    // One large odd size, baseline and progressive.
    let large = picture(1001, 667, seed + 7);
    push(
        "1001x667".into(),
        &large,
        1001,
        667,
        EncodeOptions::default(),
    );
    push(
        "1001x667 progressive 422".into(),
        &large,
        1001,
        667,
        EncodeOptions {
            progressive: true,
            sampling: Sampling::S422,
            ..EncodeOptions::default()
        },
    );
    // Real files as they were published or made by Pillow.
    for file in [
        "assets/rocket.jpg",
        "assets/hubble_deep_field.jpg",
        "tests/fixtures/gray.jpg",
        "tests/fixtures/progressive.jpg",
        "tests/fixtures/rgb420.jpg",
        "tests/fixtures/rgb444.jpg",
        "tests/fixtures/sampling_2x1_all.jpg",
        "tests/fixtures/exif_rotate6.jpg",
    ] {
        cases.push(Case {
            name: file.into(),
            jpeg: repo_file(file),
        });
    }
    cases
}

/// The entropy codings, restart intervals, colour spaces and qualities the real content of the
/// cases is encoded with, named.
fn coding_modes() -> Vec<(&'static str, EncodeOptions)> {
    vec![
        (
            "baseline q95",
            EncodeOptions {
                quality: 95,
                ..EncodeOptions::default()
            },
        ),
        (
            "progressive",
            EncodeOptions {
                progressive: true,
                ..EncodeOptions::default()
            },
        ),
        (
            "progressive 444",
            EncodeOptions {
                progressive: true,
                sampling: Sampling::S444,
                ..EncodeOptions::default()
            },
        ),
        (
            "arithmetic 422",
            EncodeOptions {
                arithmetic: true,
                sampling: Sampling::S422,
                ..EncodeOptions::default()
            },
        ),
        (
            "restart every 3 MCUs",
            EncodeOptions {
                restart: Restart::Mcus(3),
                ..EncodeOptions::default()
            },
        ),
        (
            "restart every row, optimized",
            EncodeOptions {
                restart: Restart::Rows(1),
                optimize: true,
                sampling: Sampling::S440,
                ..EncodeOptions::default()
            },
        ),
        (
            "rgb",
            EncodeOptions {
                colorspace: Colorspace::Rgb,
                sampling: Sampling::S444,
                ..EncodeOptions::default()
            },
        ),
        (
            "rgb subsampled",
            EncodeOptions {
                colorspace: Colorspace::Rgb,
                sampling: Sampling::S420,
                ..EncodeOptions::default()
            },
        ),
        (
            "gray",
            EncodeOptions {
                colorspace: Colorspace::Gray,
                sampling: Sampling::S444,
                quality: 80,
                ..EncodeOptions::default()
            },
        ),
        (
            "gray progressive",
            EncodeOptions {
                colorspace: Colorspace::Gray,
                sampling: Sampling::S444,
                progressive: true,
                ..EncodeOptions::default()
            },
        ),
        (
            "q30",
            EncodeOptions {
                quality: 30,
                ..EncodeOptions::default()
            },
        ),
    ]
}

/// One case made ready for a kernel run: its packed coefficients (a window of it, read with an
/// early stop) and the pixels expected, which the CPU rendition and libjpeg-turbo agree on.
pub(crate) struct Prepared {
    pub name: String,
    pub image: super::pack::PackedImage,
    pub bytes: Vec<u8>,
    pub expected: Vec<u8>,
}

/// `case` read, packed and rendered by the CPU: the whole image, or with `pick` (4 random bytes)
/// a window of it. Panics when the CPU rendition and libjpeg-turbo's decode disagree.
pub(crate) fn prepare(
    reader: &mut turbojpeg_region::CoefficientReader,
    case: &Case,
    pick: Option<&[u8]>,
) -> Prepared {
    use super::{pack::pack, reference::render, Layout, Window};
    let header = reader.open(&case.jpeg).expect("header").header().clone();
    let gray = header.colorspace == Colorspace::Gray;
    let layout = Layout::new(&header).expect("layout");
    let (w, h) = (layout.width, layout.height);
    let window = match pick {
        Some(p) => {
            let p = |k: usize| u32::from(p[k]);
            let (x, y) = (p(0) * w / 256, p(1) * h / 256);
            Window {
                x,
                y,
                width: (1 + p(2) * (w - x) / 256).min(w - x),
                height: (1 + p(3) * (h - y) / 256).min(h - y),
            }
        }
        None => Window::whole(w, h),
    };
    let stop = layout.imcu_rows_for(&window);
    let read = reader
        .open(&case.jpeg)
        .expect("header")
        .read(Some(stop))
        .expect("coefficients");
    let mut bytes = Vec::new();
    let image = pack(&read, &layout, &window, &mut bytes).expect("pack");
    let channels = layout.channels();
    let mut expected = vec![0; window.pixels() as usize * channels];
    render(
        &read,
        &layout,
        &window,
        &mut expected,
        window.width as usize * channels,
    )
    .expect("render");
    let (whole, _, _) = turbo_decode(&case.jpeg, gray);
    let mut turbo = Vec::with_capacity(expected.len());
    for row in window.y..window.y + window.height {
        let start = (row * w + window.x) as usize * channels;
        turbo.extend_from_slice(&whole[start..start + window.width as usize * channels]);
    }
    assert!(expected == turbo, "{}: the CPU rendition", case.name);
    Prepared {
        name: case.name.clone(),
        image,
        bytes,
        expected,
    }
}

/// The photos folder (`../shared/photos` beside the repository, or the GPU bundle's
/// `.gpu/photos`), if there is one.
pub(crate) fn photos_folder() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .flat_map(|d| [d.join("shared/photos"), d.join(".gpu/photos")])
        .find(|d| d.is_dir())
}

/// `pixels` (RGB, `w` x `h`) mirrored and tiled to `tw` x `th`.
pub(crate) fn tiled(pixels: &[u8], w: u32, h: u32, tw: u32, th: u32) -> Vec<u8> {
    let mirror = |v: u32, n: u32| {
        let m = v % (2 * n);
        if m < n {
            m
        } else {
            2 * n - 1 - m
        }
    };
    let mut out = Vec::with_capacity((tw * th * 3) as usize);
    for y in 0..th {
        let row = mirror(y, h);
        for x in 0..tw {
            let at = ((row * w + mirror(x, w)) * 3) as usize;
            out.extend_from_slice(&pixels[at..at + 3]);
        }
    }
    out
}
