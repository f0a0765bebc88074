//! `cargo bench --bench coefficients -- FOLDER`: where the time of the exact GPU-assisted JPEG
//! path goes on a folder of JPEGs (camera-size photos: `benches/make-large.py`).
//!
//! CPU, one thread, per megapixel: libjpeg-turbo's full decode (with turbojpeg-region's faster
//! Huffman decoder and with the library's own, in turn) against reading the
//! coefficients only, whole or stopped after the rows a centre crop needs, and packing them
//! into the transfer format; for progressive files, gpufeed's own progressive decoder against
//! libjpeg-turbo's reading of their coefficients; then N threads reading and packing (images/s,
//! Mpx/s), with libjpeg-turbo alone and with the progressive decoder taking the progressive
//! files; the bytes a megapixel of the JPEG, of dense coefficients and of the transfer format,
//! and the share of zero coefficients. GPU (skipped without one): the upload of the packed batches and the
//! kernels (inverse DCT, upsampling, colour), timed with CUDA events, and the whole path with
//! the CPU threads packing the next batch while the GPU runs the last. Then the GPU's entropy
//! decoding of the baseline files (`kernels/entropy.cu`): libjpeg-turbo's entropy decoding on
//! the same threads for comparison, the entropy kernels alone, with the IDCT and colour kernels,
//! and the whole path from JPEG bytes on the host to RGB windows on the device (Mpx/s and MB/s
//! of entropy-coded data).
//!
//! FOLDER is read with its subfolders (`benches/make-large.py`'s sets are folders of parts).
//! Options: `--threads N` (default: all cores), `--rounds R` (3), `--batch-mpx M` (64: the
//! megapixels of windows in one GPU batch), `--crop` (the GPU runs the centre-crop windows
//! instead of whole images). Files that are not JPEGs the path takes (CMYK, 12-bit...) are
//! counted and left out.

use std::path::{Path, PathBuf};
use std::time::Instant;

use gpufeed::coefficients::entropy::ParsedJpeg;
use gpufeed::coefficients::gpu::{Budget, GpuDecoder};
use gpufeed::coefficients::pack::{pack, PackedImage};
use gpufeed::coefficients::progressive::ProgressiveDecoder;
use gpufeed::coefficients::{Layout, Window};
use gpufeed::cudarc::driver::sys::CUevent_flags;
use gpufeed::Source;
use rayon::prelude::*;
use turbojpeg_region::{CoefficientReader, Decoder, Format, Request};

struct Options {
    folder: PathBuf,
    threads: usize,
    rounds: usize,
    batch_mpx: f64,
    crop: bool,
}

fn options() -> Option<Options> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut options = Options {
        folder: PathBuf::new(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        rounds: 3,
        batch_mpx: 64.0,
        crop: false,
    };
    let mut folder = std::env::var_os("GPUFEED_BENCH_FOLDER").map(PathBuf::from);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> Option<String> {
            let v = args.next();
            if v.is_none() {
                eprintln!("bench coefficients: {name} needs a value");
            }
            v
        };
        match arg.as_str() {
            "--threads" => options.threads = value("--threads")?.parse().ok()?,
            "--rounds" => options.rounds = value("--rounds")?.parse().ok()?,
            "--batch-mpx" => options.batch_mpx = value("--batch-mpx")?.parse().ok()?,
            "--crop" => options.crop = true,
            other if !other.starts_with("--") => folder = Some(PathBuf::from(other)),
            other => {
                eprintln!("bench coefficients: unknown option {other}");
                return None;
            }
        }
    }
    options.folder = folder?;
    Some(options)
}

/// The window torchvision's `Resize(256)` + `CenterCrop(224)` reads of a `w` x `h` image: the
/// centre 224/256 of the shorter side on both axes, plus the bilinear filter's reach.
fn centre_crop(w: u32, h: u32) -> Window {
    let short = w.min(h);
    let reach = short.div_ceil(256) + 1;
    let side = (short * 224 / 256 + 2 * reach).min(short);
    let (cw, ch) = (side.min(w), side.min(h));
    Window {
        x: (w - cw) / 2,
        y: (h - ch) / 2,
        width: cw,
        height: ch,
    }
}

/// One file as the path sees it.
struct File {
    jpeg: Vec<u8>,
    layout: Layout,
}

/// The `.jpg` and `.jpeg` files under `folder`, listed as `gpufeed run` lists a folder
/// ([`Source::directory`]: subfolders included, links followed, each folder read once).
fn jpeg_paths(folder: &Path) -> Vec<PathBuf> {
    let source = Source::directory(folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
    (0..source.len())
        .filter_map(|i| source.path(i))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
        })
        .map(Path::to_path_buf)
        .collect()
}

fn load(folder: &Path) -> (Vec<File>, usize) {
    let paths = jpeg_paths(folder);
    let mut reader = CoefficientReader::new().expect("reader");
    let mut files = Vec::new();
    let mut refused = 0;
    for path in paths {
        let Ok(jpeg) = std::fs::read(&path) else {
            refused += 1;
            continue;
        };
        let layout = reader
            .open(&jpeg)
            .map_err(|e| e.to_string())
            .and_then(|o| Layout::new(o.header()).map_err(|e| e.to_string()));
        match layout {
            Ok(layout) => files.push(File { jpeg, layout }),
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                refused += 1;
            }
        }
    }
    (files, refused)
}

fn megapixels(files: &[File]) -> f64 {
    files
        .iter()
        .map(|f| f64::from(f.layout.width) * f64::from(f.layout.height))
        .sum::<f64>()
        / 1e6
}

/// A thread's readers: libjpeg-turbo's, and gpufeed's progressive decoder when it is used.
struct Readers {
    libjpeg: CoefficientReader,
    progressive: Option<ProgressiveDecoder>,
}

impl Readers {
    fn new(progressive: bool) -> Readers {
        Readers {
            libjpeg: CoefficientReader::new().expect("reader"),
            progressive: progressive.then(ProgressiveDecoder::new),
        }
    }
}

/// Reads and packs `file` (the window the options say) into `out`: with gpufeed's progressive
/// decoder if `readers` has one and it takes the file, else with libjpeg-turbo.
fn read_and_pack(
    readers: &mut Readers,
    file: &File,
    crop: bool,
    out: &mut Vec<u8>,
) -> Option<PackedImage> {
    let window = if crop {
        centre_crop(file.layout.width, file.layout.height)
    } else {
        Window::whole(file.layout.width, file.layout.height)
    };
    if let Some(decoder) = &mut readers.progressive {
        if let Ok(image) = decoder.decode_packed(&file.jpeg, &file.layout, &window, out) {
            return Some(image);
        }
    }
    let stop = file.layout.imcu_rows_for(&window);
    let coefficients = readers
        .libjpeg
        .open(&file.jpeg)
        .ok()?
        .read(Some(stop))
        .ok()?;
    pack(&coefficients, &file.layout, &window, out).ok()
}

/// Every file of `files` read and packed on `pool`'s threads, each with its packed bytes (the
/// files that fail are left out).
fn pack_all(pool: &rayon::ThreadPool, files: &[File], crop: bool) -> Vec<(PackedImage, Vec<u8>)> {
    pool.install(|| {
        files
            .par_iter()
            .map_init(
                || Readers::new(true),
                |readers, file| {
                    let mut out = Vec::new();
                    read_and_pack(readers, file, crop, &mut out).map(|i| (i, out))
                },
            )
            .flatten()
            .collect()
    })
}

/// The median run of `rates` (images/s, Mpx/s), by images/s.
fn median(mut rates: Vec<(f64, f64)>) -> (f64, f64) {
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    rates[rates.len() / 2]
}

fn per_mpx(seconds: f64, mpx: f64) -> String {
    format!("{:8.2} ms/Mpx", 1e3 * seconds / mpx)
}

fn cpu_single_thread(files: &[File], mpx: f64) {
    let mut decoder = Decoder::new().expect("decoder");
    let mut library = Decoder::new().expect("decoder");
    library.set_fast_huffman(false);
    let mut reader = CoefficientReader::new().expect("reader");
    let mut progressive = ProgressiveDecoder::new();
    let (mut full, mut full_library, mut read, mut read_crop, mut packing) =
        (0.0, 0.0, 0.0, 0.0, 0.0);
    // The files gpufeed's progressive decoder takes: its time, libjpeg-turbo's, their Mpx.
    let (mut ours, mut theirs, mut progressive_mpx) = (0.0, 0.0, 0.0);
    let (mut jpeg_bytes, mut packed_bytes, mut dense_bytes, mut zeros, mut coefficients) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut crop_mpx = 0.0;
    let mut pixels = Vec::new();
    let mut out = Vec::new();
    for file in files {
        let header = decoder.read_header(&file.jpeg).expect("header");
        let format = if file.layout.channels() == 1 {
            Format::Gray
        } else {
            Format::Rgb
        };
        let request = Request {
            format,
            reduction: 1,
            region: None,
        };
        pixels.resize(request.output_len(&header), 0);
        let t = Instant::now();
        let _ = decoder.decompress(&file.jpeg, &request, &mut pixels);
        full += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let _ = library.decompress(&file.jpeg, &request, &mut pixels);
        full_library += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let taken = progressive.decode(&file.jpeg).is_ok();
        let decoding = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let whole = reader
            .open(&file.jpeg)
            .expect("open")
            .read(None)
            .expect("read");
        read += t.elapsed().as_secs_f64();
        if taken {
            ours += decoding;
            theirs += t.elapsed().as_secs_f64();
            progressive_mpx += f64::from(file.layout.width) * f64::from(file.layout.height) / 1e6;
        }
        let window = Window::whole(file.layout.width, file.layout.height);
        out.clear();
        let t = Instant::now();
        let image = pack(&whole, &file.layout, &window, &mut out).expect("pack");
        packing += t.elapsed().as_secs_f64();
        jpeg_bytes += file.jpeg.len() as u64;
        packed_bytes += image.bytes as u64;
        for (c, info) in whole.header().components().iter().enumerate() {
            dense_bytes += u64::from(info.blocks_wide * info.blocks_high) * 128;
            for row in 0..info.blocks_high {
                let blocks = whole.block_row(c, row).expect("row");
                coefficients += blocks.len() as u64;
                zeros += blocks.iter().filter(|&&v| v == 0).count() as u64;
            }
        }
        drop(whole);

        let crop = centre_crop(file.layout.width, file.layout.height);
        crop_mpx += crop.pixels() as f64 / 1e6;
        let stop = file.layout.imcu_rows_for(&crop);
        let t = Instant::now();
        let _ = reader.open(&file.jpeg).expect("open").read(Some(stop));
        read_crop += t.elapsed().as_secs_f64();
    }
    println!("CPU, one thread ({} files, {mpx:.1} Mpx):", files.len());
    println!(
        "  full decode (libjpeg-turbo, RGB)      {}   (with its own Huffman decoder: {}, {:.2}x)",
        per_mpx(full, mpx),
        per_mpx(full_library, mpx),
        full_library / full
    );
    println!(
        "  coefficients only, whole image        {}",
        per_mpx(read, mpx)
    );
    println!(
        "  coefficients, stopped for centre crop {}   (of the whole image's Mpx; crop windows \
         are {:.0}% of the pixels)",
        per_mpx(read_crop, mpx),
        100.0 * crop_mpx / mpx
    );
    println!(
        "  packing the transfer format           {}",
        per_mpx(packing, mpx)
    );
    if progressive_mpx > 0.0 {
        println!(
            "  progressive files ({progressive_mpx:.1} Mpx): coefficients by gpufeed's decoder {}, \
             by libjpeg-turbo {} ({:.2}x)",
            per_mpx(ours, progressive_mpx),
            per_mpx(theirs, progressive_mpx),
            theirs / ours.max(1e-9)
        );
    }
    println!(
        "  bytes a Mpx: JPEG {:.3} MB, dense coefficients {:.3} MB, transfer format {:.3} MB; \
         {:.1}% of coefficients zero",
        jpeg_bytes as f64 / 1e6 / mpx,
        dense_bytes as f64 / 1e6 / mpx,
        packed_bytes as f64 / 1e6 / mpx,
        100.0 * zeros as f64 / coefficients.max(1) as f64
    );
}

fn cpu_threads(files: &[File], mpx: f64, options: &Options) -> rayon::ThreadPool {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads)
        .build()
        .expect("thread pool");
    for progressive in [false, true] {
        let mut rates = Vec::new();
        for _ in 0..options.rounds {
            let t = Instant::now();
            let made: usize = pool.install(|| {
                files
                    .par_iter()
                    .map_init(
                        || (Readers::new(progressive), Vec::new()),
                        |(readers, out), file| {
                            out.clear();
                            usize::from(read_and_pack(readers, file, options.crop, out).is_some())
                        },
                    )
                    .sum()
            });
            let s = t.elapsed().as_secs_f64();
            rates.push((made as f64 / s, mpx / s));
        }
        let (images, mpxs) = median(rates);
        println!(
            "CPU, {} threads, read + pack ({}, {}): {images:.1} images/s, {mpxs:.1} Mpx/s \
             (median of {})",
            options.threads,
            if options.crop {
                "centre crops"
            } else {
                "whole images"
            },
            if progressive {
                "progressive files by gpufeed's decoder"
            } else {
                "libjpeg-turbo"
            },
            options.rounds
        );
    }
    pool
}

fn gpu(files: &[File], mpx: f64, options: &Options, pool: &rayon::ThreadPool) {
    if let Err(e) = gpufeed::cuda::probe() {
        println!("GPU: skipped ({e})");
        return;
    }
    let stream = gpufeed::cuda::new_stream(0).expect("stream");
    let device = gpufeed::cuda::describe_device(0).unwrap_or_default();
    let budget = Budget::for_megapixels(options.batch_mpx, 1024);
    let mut decoder = GpuDecoder::new(&stream, budget).expect("decoder");
    // Everything packed once, for the upload and kernel timings.
    let packed = pack_all(pool, files, options.crop);
    let (mut upload_ms, mut kernel_ms, mut bytes, mut window_mpx) = (0.0f64, 0.0f64, 0u64, 0.0);
    let mut batches = 0;
    let mut next = 0;
    while next < packed.len() {
        decoder.clear();
        while next < packed.len() && decoder.fits(&packed[next].0) {
            decoder.add(&packed[next].0, &packed[next].1).expect("add");
            window_mpx += packed[next].0.window.pixels() as f64 / 1e6;
            next += 1;
        }
        if decoder.is_empty() {
            eprintln!("an image larger than the batch budget: raise --batch-mpx");
            return;
        }
        bytes += decoder.staged_bytes() as u64;
        let (upload, kernels) = timed_batch(&mut decoder);
        upload_ms += upload;
        kernel_ms += kernels;
        batches += 1;
    }
    println!(
        "GPU: {device}, batches of up to {} Mpx ({batches} batches):",
        options.batch_mpx
    );
    println!(
        "  upload of the packed coefficients: {:.3} ms/Mpx, {:.1} GB/s, {:.0} Mpx/s",
        upload_ms / window_mpx,
        bytes as f64 / 1e6 / upload_ms,
        window_mpx / (upload_ms / 1e3)
    );
    println!(
        "  kernels (IDCT, upsampling, colour): {:.3} ms/Mpx, {:.0} Mpx/s, {:.0} images/s",
        kernel_ms / window_mpx,
        window_mpx / (kernel_ms / 1e3),
        packed.len() as f64 / (kernel_ms / 1e3)
    );

    // The whole path: the CPU threads pack batch k+1 while the GPU runs batch k.
    let mut rates = Vec::new();
    for _ in 0..options.rounds {
        let t = Instant::now();
        let mut done = 0usize;
        let chunk = budget.images.min(files.len().max(1));
        let mut pending: Option<Vec<(PackedImage, Vec<u8>)>> = None;
        let mut chunks = files.chunks(chunk);
        loop {
            // Queue the packed chunk on the GPU (asynchronous), then pack the next one on the
            // pool while the GPU runs.
            if let Some(batch) = pending.take() {
                let mut i = 0;
                while i < batch.len() {
                    decoder.clear();
                    while i < batch.len() && decoder.fits(&batch[i].0) {
                        decoder.add(&batch[i].0, &batch[i].1).expect("add");
                        i += 1;
                    }
                    done += decoder.len();
                    decoder.upload().expect("upload");
                    decoder.transform().expect("transform");
                }
            }
            let Some(files) = chunks.next() else {
                break;
            };
            pending = Some(pack_all(pool, files, options.crop));
        }
        stream.synchronize().expect("sync");
        let s = t.elapsed().as_secs_f64();
        rates.push((done as f64 / s, mpx / s));
    }
    let (images, mpxs) = median(rates);
    println!(
        "whole path ({} CPU threads + GPU, {}): {images:.1} images/s, {mpxs:.1} Mpx/s of \
         source images (median of {})",
        options.threads,
        if options.crop {
            "centre crops"
        } else {
            "whole images"
        },
        options.rounds
    );
}

/// The baseline files parsed for the GPU's entropy decoding (the others are left to the CPU).
fn parse_all(pool: &rayon::ThreadPool, files: &[File]) -> Vec<(usize, ParsedJpeg)> {
    pool.install(|| {
        files
            .par_iter()
            .enumerate()
            .filter_map(|(i, f)| {
                gpufeed::coefficients::entropy::parse(&f.jpeg)
                    .ok()
                    .map(|p| (i, p))
            })
            .collect()
    })
}

/// The GPU's entropy decoding of the baseline files: CPU threads reading the same files'
/// coefficients with libjpeg-turbo for comparison, the entropy kernels alone (8x8 windows, so
/// the IDCT and colour kernels do next to nothing), the kernels with the whole windows, and the
/// whole path from JPEG bytes on the host to RGB windows on the device (CPU threads parse the
/// next batch while the GPU decodes the last).
/// Uploads and transforms the batch added to `decoder`, timed with events on its stream:
/// milliseconds of the upload and of the kernels.
fn timed_batch(decoder: &mut GpuDecoder) -> (f64, f64) {
    let stream = decoder.stream().clone();
    let timed = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .expect("event")
    };
    let a = timed();
    decoder.upload().expect("upload");
    let b = timed();
    decoder.transform().expect("transform");
    let c = timed();
    c.synchronize().expect("sync");
    (
        f64::from(a.elapsed_ms(&b).expect("elapsed")),
        f64::from(b.elapsed_ms(&c).expect("elapsed")),
    )
}

/// Starts a new batch on `decoder` with `parsed[from..]` (each with its file's index in `files`),
/// rendering `window(file)` of each, until one does not fit; returns the index of the first left
/// out.
fn fill_batch(
    decoder: &mut GpuDecoder,
    parsed: &[(usize, ParsedJpeg)],
    from: usize,
    files: &[File],
    window: impl Fn(&File) -> Window,
) -> usize {
    decoder.clear();
    let mut next = from;
    while let Some((i, p)) = parsed.get(next) {
        let f = &files[*i];
        let window = window(f);
        if !decoder.fits_entropy_coded(p, &f.layout, &window) {
            break;
        }
        decoder
            .add_entropy_coded(p, &f.layout, &window)
            .expect("add_entropy_coded");
        next += 1;
    }
    next
}

fn gpu_entropy(files: &[File], options: &Options, pool: &rayon::ThreadPool) {
    let parsed = parse_all(pool, files);
    if parsed.is_empty() {
        println!("GPU entropy decoding: no baseline JPEG in the folder");
        return;
    }
    let baseline: Vec<&File> = parsed.iter().map(|(i, _)| &files[*i]).collect();
    let mpx = baseline
        .iter()
        .map(|f| f64::from(f.layout.width) * f64::from(f.layout.height))
        .sum::<f64>()
        / 1e6;
    let scan_mb = parsed.iter().map(|(_, p)| p.data.len() as f64).sum::<f64>() / 1e6;
    println!(
        "entropy decoding: {} baseline files of {} ({mpx:.1} Mpx, {scan_mb:.1} MB of entropy-coded \
         data, {:.2} bits a pixel)",
        parsed.len(),
        files.len(),
        scan_mb * 8.0 / mpx
    );
    // libjpeg-turbo's entropy decoding of the same files on the CPU threads.
    let mut rates = Vec::new();
    for _ in 0..options.rounds {
        let t = Instant::now();
        pool.install(|| {
            baseline.par_iter().for_each_init(
                || CoefficientReader::new().expect("reader"),
                |reader, file| {
                    let _ = reader
                        .open(&file.jpeg)
                        .and_then(|o| o.read(None).map(|_| ()));
                },
            )
        });
        rates.push(t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let s = rates[rates.len() / 2];
    println!(
        "  CPU, {} threads, libjpeg-turbo coefficients (whole): {:.0} Mpx/s, {:.0} MB/s of \
         entropy-coded data",
        options.threads,
        mpx / s,
        scan_mb / s
    );
    if let Err(e) = gpufeed::cuda::probe() {
        println!("  GPU: skipped ({e})");
        return;
    }
    let stream = gpufeed::cuda::new_stream(0).expect("stream");
    let budget = Budget::for_megapixels(options.batch_mpx, 1024);
    let mut decoder = GpuDecoder::new(&stream, budget).expect("decoder");
    let window_of = |f: &File, small: bool| {
        if small {
            Window {
                x: 0,
                y: 0,
                width: f.layout.width.min(8),
                height: f.layout.height.min(8),
            }
        } else if options.crop {
            centre_crop(f.layout.width, f.layout.height)
        } else {
            Window::whole(f.layout.width, f.layout.height)
        }
    };
    for small in [true, false] {
        let (mut upload_ms, mut kernel_ms, mut batches, mut failed) = (0.0f64, 0.0f64, 0, 0);
        for _ in 0..options.rounds {
            let mut next = 0;
            while next < parsed.len() {
                next = fill_batch(&mut decoder, &parsed, next, files, |f| window_of(f, small));
                if decoder.is_empty() {
                    eprintln!("an image larger than the batch budget: raise --batch-mpx");
                    return;
                }
                let (upload, kernels) = timed_batch(&mut decoder);
                upload_ms += upload;
                kernel_ms += kernels;
                failed += decoder.entropy_failures().expect("status").len();
                batches += 1;
            }
        }
        let rounds = options.rounds as f64;
        let what = if small {
            "entropy kernels (8x8 windows)"
        } else {
            "entropy + IDCT + colour kernels"
        };
        println!(
            "  GPU {what}: {:.0} Mpx/s, {:.0} MB/s of entropy-coded data, {:.0} images/s \
             ({} batches; upload {:.1} GB/s; {failed} images flagged)",
            mpx * rounds / (kernel_ms / 1e3),
            scan_mb * rounds / (kernel_ms / 1e3),
            parsed.len() as f64 * rounds / (kernel_ms / 1e3),
            batches / options.rounds.max(1),
            scan_mb * rounds / upload_ms,
        );
    }

    // The whole path: JPEG bytes on the host to RGB windows on the device. The threads parse
    // chunk k+1 while the GPU decodes chunk k.
    let mut rates = Vec::new();
    for _ in 0..options.rounds {
        let t = Instant::now();
        let mut done = 0usize;
        let chunk = budget.images.min(baseline.len().max(1)).min(64);
        let indices: Vec<usize> = parsed.iter().map(|(i, _)| *i).collect();
        let mut pending: Option<Vec<(usize, ParsedJpeg)>> = None;
        let mut chunks = indices.chunks(chunk);
        loop {
            if let Some(batch) = pending.take() {
                let mut k = 0;
                while k < batch.len() {
                    k = fill_batch(&mut decoder, &batch, k, files, |f| window_of(f, false));
                    if decoder.is_empty() {
                        // Larger than an empty batch's budget (said by the kernel timings).
                        k += 1;
                        continue;
                    }
                    done += decoder.len();
                    decoder.upload().expect("upload");
                    decoder.transform().expect("transform");
                }
            }
            let Some(next) = chunks.next() else {
                break;
            };
            pending = Some(pool.install(|| {
                next.par_iter()
                    .filter_map(|&i| {
                        gpufeed::coefficients::entropy::parse(&files[i].jpeg)
                            .ok()
                            .map(|p| (i, p))
                    })
                    .collect()
            }));
        }
        stream.synchronize().expect("sync");
        let s = t.elapsed().as_secs_f64();
        rates.push((done as f64 / s, mpx / s));
    }
    let (images, mpxs) = median(rates);
    println!(
        "  whole path, JPEG bytes to {} on the GPU ({} CPU threads parsing): {images:.1} \
         images/s, {mpxs:.0} Mpx/s of source images (median of {})",
        if options.crop {
            "centre-crop windows"
        } else {
            "whole RGB images"
        },
        options.threads,
        options.rounds
    );
}

fn main() {
    let Some(options) = options() else {
        println!(
            "bench coefficients: usage: cargo bench --bench coefficients -- FOLDER [--threads N] \
             [--rounds R] [--batch-mpx M] [--crop]   (or GPUFEED_BENCH_FOLDER); skipped"
        );
        return;
    };
    let (files, refused) = load(&options.folder);
    if files.is_empty() {
        println!(
            "bench coefficients: no JPEG the path takes in {}",
            options.folder.display()
        );
        return;
    }
    let mpx = megapixels(&files);
    println!(
        "{}: {} JPEGs ({refused} left out), {mpx:.1} Mpx, {:.2} Mpx on average",
        options.folder.display(),
        files.len(),
        mpx / files.len() as f64
    );
    cpu_single_thread(&files, mpx);
    let pool = cpu_threads(&files, mpx, &options);
    gpu(&files, mpx, &options, &pool);
    gpu_entropy(&files, &options, &pool);
}
