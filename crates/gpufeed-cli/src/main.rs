//! `gpufeed`: run the pipeline over a folder, or measure what the u8 upload saves.
//!
//! With no arguments it runs the pipeline over the bundled `assets/` and, when a GPU is present,
//! the u8-vs-f32 upload comparison.

mod npy;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use gpufeed::{
    BatchOptions, ChannelOrder, DType, DecodeOptions, Device, LastBatch, Layout, OnError, Options,
    OutputOptions, Pipeline, ResizeMode, ResizeOptions, RuntimeOptions, Source,
};
use gpufeed_bench::upload::{self as bench, BenchOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

/// The command line's errors: the library's, the bench's, and its own files'.
type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

#[derive(Parser, Debug)]
#[command(
    name = "gpufeed",
    version,
    about = "Feed images to a GPU as u8, normalize them there. With no command: `run assets` \
             and, with a GPU, the u8-vs-f32 upload comparison."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the pipeline over every image under DIR and print a summary.
    Run(RunArgs),
    /// Measure bytes and time of u8 vs f32 uploads and of the normalize kernel.
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Folder of images, searched recursively (default: the bundled assets/).
    #[arg(default_value = "assets")]
    dir: PathBuf,
    /// Treat DIR as an ImageFolder: each subfolder is a class, labels from sorted names.
    #[arg(long)]
    image_folder: bool,
    /// Images per batch.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Shorter side after resizing (torchvision's Resize).
    #[arg(long, default_value_t = 256)]
    resize: u32,
    /// Side of the centre crop (torchvision's CenterCrop).
    #[arg(long, default_value_t = 224)]
    crop: u32,
    /// Output element type: f16, bf16 or f32.
    #[arg(long, default_value_t = DType::F16)]
    dtype: DType,
    /// Output layout: nchw or nhwc.
    #[arg(long, default_value_t = Layout::Nchw)]
    layout: Layout,
    /// Output channels in BGR order.
    #[arg(long)]
    bgr: bool,
    /// Batches prepared ahead.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// CPU threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// CUDA device ordinal; without it (and without --cpu) device 0 is used when present, the
    /// CPU otherwise.
    #[arg(long, conflicts_with = "cpu")]
    device: Option<usize>,
    /// Stay on the CPU: CPU stages and the CPU reference normalize.
    #[arg(long)]
    cpu: bool,
    /// What a bad image does: skip or fail.
    #[arg(long, default_value_t = OnError::Skip)]
    on_error: OnError,
    /// Drop a last partial batch.
    #[arg(long)]
    drop_last: bool,
    /// Shuffle with this seed.
    #[arg(long)]
    shuffle: Option<u64>,
    /// Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the output keeps a 2x
    /// margin (faster on big photos; slightly further from torchvision).
    #[arg(long)]
    dct_scaling: bool,
    /// Write every processed image, in order, to FILE.npy (output dtype and layout; bf16 as its
    /// raw u16 bits) and the source path of each row to FILE.paths.txt.
    #[arg(long, value_name = "FILE.npy")]
    save: Option<PathBuf>,
    /// Print the summary as one JSON object on the last line of stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Batch sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256")]
    batch_sizes: Vec<usize>,
    /// Image side (images are SIZE x SIZE x 3).
    #[arg(long, default_value_t = 224)]
    size: usize,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Also write the table as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Also draw time per batch against batch size as an SVG chart here.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Some(Command::Run(args)) => run(&args).map(|_| ()),
        Some(Command::Bench(args)) => bench_command(&args),
        None => default_job(),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpufeed: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `gpufeed` alone: the pipeline over assets/, then the upload comparison if there is a GPU.
fn default_job() -> Result<()> {
    let device = match Cli::parse_from(["gpufeed", "run"]).command {
        Some(Command::Run(args)) => run(&args)?,
        _ => return Err("default arguments did not parse".into()),
    };
    if let Device::Cuda(ordinal) = device {
        println!();
        let options = BenchOptions {
            device: ordinal,
            runs: 30,
            ..BenchOptions::default()
        };
        let report = bench::run(&options)?;
        print!("{}", report.table());
    }
    Ok(())
}

fn bench_command(args: &BenchArgs) -> Result<()> {
    let options = BenchOptions {
        batch_sizes: args.batch_sizes.clone(),
        height: args.size,
        width: args.size,
        runs: args.runs,
        device: args.device,
        ..BenchOptions::default()
    };
    if let Err(e) = gpufeed::cuda::probe() {
        println!("gpufeed bench: {e}");
        println!("The bench measures GPU uploads and kernels; nothing to measure here.");
        return Ok(());
    }
    let report = bench::run(&options)?;
    print!("{}", report.table());
    if let Some(path) = &args.csv {
        std::fs::write(path, report.csv())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        report.write_svg(path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Picks the device: explicit `--device N` must work; `--cpu` is the CPU; otherwise the first
/// GPU if there is one, else the CPU with a message saying why.
fn choose_device(args: &RunArgs) -> Device {
    if args.cpu {
        return Device::Cpu;
    }
    if let Some(ordinal) = args.device {
        return Device::Cuda(ordinal);
    }
    match gpufeed::cuda::probe() {
        Ok(_) => Device::Cuda(0),
        Err(e) => {
            eprintln!(
                "gpufeed: {e}\ngpufeed: running the CPU stages and the CPU normalize instead \
                 (--device N requires a GPU, --cpu silences this)"
            );
            Device::Cpu
        }
    }
}

fn run(args: &RunArgs) -> Result<Device> {
    let device = choose_device(args);
    let source = if args.image_folder {
        Source::image_folder(&args.dir)?
    } else {
        Source::directory(&args.dir)?
    };
    let options = Options::default()
        .decode(DecodeOptions::default().dct_scaling(args.dct_scaling))
        .resize(ResizeOptions::default().mode(ResizeMode::center_crop(args.resize, args.crop)))
        .output(
            OutputOptions::default()
                .dtype(args.dtype)
                .layout(args.layout)
                .channel_order(if args.bgr {
                    ChannelOrder::Bgr
                } else {
                    ChannelOrder::Rgb
                }),
        )
        .batching(
            BatchOptions::default()
                .batch_size(args.batch_size)
                .on_error(args.on_error)
                .last_batch(if args.drop_last {
                    LastBatch::Drop
                } else {
                    LastBatch::Keep
                })
                .shuffle_seed(args.shuffle),
        )
        .runtime(
            RuntimeOptions::default()
                .device(device)
                .prefetch(args.prefetch)
                .threads(args.threads),
        );
    let setup = Instant::now();
    let mut pipeline = Pipeline::with_options(source, options)?;
    let setup_seconds = setup.elapsed().as_secs_f64();
    let config = *pipeline.options();
    let (height, width) = config.resize.output_size();
    let image_bytes = config.resize.image_bytes()?;

    let progress = if std::io::stderr().is_terminal() && !args.json {
        let bar = ProgressBar::new(pipeline.len() as u64);
        if let Ok(style) =
            ProgressStyle::default_bar().template("{bar:40} {pos}/{len} images {per_sec} {eta}")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut saver = match &args.save {
        Some(path) => Some(Saver::create(path, config.output.dtype)?),
        None => None,
    };
    let start = Instant::now();
    let mut uploaded_bytes = 0usize;
    let mut last = None;
    let outcome: Result<()> = (|| {
        while let Some(batch) = pipeline.next_batch()? {
            uploaded_bytes += batch.uploaded_bytes();
            progress.inc((batch.len() + batch.skipped().len()) as u64);
            if let Some(saver) = &mut saver {
                saver.append(&batch.images().to_host()?, batch.ids())?;
            }
            last = Some(batch);
        }
        // The last batch is ready only once the stream has run its kernel.
        if let Some(batch) = &last {
            batch.images().synchronize()?;
        }
        Ok(())
    })();
    let seconds = start.elapsed().as_secs_f64();
    progress.finish_and_clear();
    let report = pipeline.epoch_report().clone();
    // Under --on-error fail the first bad image stops the run here, naming the image.
    outcome?;
    if let Some(saver) = saver {
        saver.finish()?;
    }
    let images = report.images;
    let f32_bytes = images * image_bytes * 4;
    let images_per_s = if seconds > 0.0 {
        images as f64 / seconds
    } else {
        0.0
    };
    let errors: Vec<_> = report
        .skipped
        .iter()
        .map(|e| json!({"path": e.id, "reason": e.kind.to_string()}))
        .collect();
    println!(
        "gpufeed run: {} on {}",
        args.dir.display(),
        pipeline.device_description()
    );
    println!(
        "  output      {} x [{}] {} {}{}",
        config.batching.batch_size,
        match config.output.layout {
            Layout::Nhwc => format!("{height}, {width}, 3"),
            _ => format!("3, {height}, {width}"),
        },
        config.output.dtype,
        config.output.layout,
        if args.bgr { " bgr" } else { "" }
    );
    println!("  images      {images} in {} batches", report.batches);
    println!("  skipped     {}", report.skipped.len());
    for e in &report.skipped {
        println!("    {}: {}", e.id, e.kind);
    }
    if report.dropped > 0 {
        println!("  dropped     {} (partial last batch)", report.dropped);
    }
    println!("  setup       {setup_seconds:.3} s (device, kernel compile, staging)");
    println!("  seconds     {seconds:.3}");
    println!("  images/s    {images_per_s:.1}");
    if matches!(device, Device::Cuda(_)) {
        println!(
            "  uploaded    {} as u8; f32 would have uploaded {} ({:.2}x less)",
            human_bytes(uploaded_bytes),
            human_bytes(f32_bytes),
            f32_bytes as f64 / uploaded_bytes.max(1) as f64
        );
    } else {
        println!(
            "  uploaded    nothing (CPU device); on a GPU: {} as u8 instead of {} as f32",
            human_bytes(images * image_bytes),
            human_bytes(f32_bytes)
        );
    }
    if let Some(path) = &args.save {
        println!(
            "  saved       {} and {}",
            path.display(),
            paths_file(path).display()
        );
    }
    if args.json {
        let summary = json!({
            "dir": args.dir.display().to_string(),
            "device": pipeline.device_description(),
            "images": images,
            "skipped": report.skipped.len(),
            "errors": errors,
            "dropped": report.dropped,
            "batches": report.batches,
            "batch_size": config.batching.batch_size,
            "dtype": config.output.dtype.name(),
            "layout": config.output.layout.name(),
            "setup_seconds": setup_seconds,
            "seconds": seconds,
            "images_per_s": images_per_s,
            "uploaded_bytes": uploaded_bytes,
            "f32_bytes": f32_bytes,
        });
        println!("{summary}");
    }
    Ok(device)
}

fn human_bytes(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

fn paths_file(npy: &Path) -> PathBuf {
    let mut name = npy.as_os_str().to_owned();
    let text = name.to_string_lossy();
    if let Some(stem) = text.strip_suffix(".npy") {
        name = format!("{stem}.paths.txt").into();
    } else {
        name.push(".paths.txt");
    }
    PathBuf::from(name)
}

/// `--save`: the .npy and its paths file.
struct Saver {
    npy: npy::NpyWriter,
    paths: Vec<String>,
    paths_file: PathBuf,
}

impl Saver {
    fn create(path: &Path, dtype: DType) -> Result<Saver> {
        Ok(Saver {
            npy: npy::NpyWriter::create(path, dtype)?,
            paths: Vec::new(),
            paths_file: paths_file(path),
        })
    }

    fn append(&mut self, images: &gpufeed::HostTensor, ids: &[String]) -> Result<()> {
        self.npy.append(images)?;
        self.paths.extend(ids.iter().cloned());
        Ok(())
    }

    fn finish(self) -> Result<()> {
        self.npy.finish()?;
        let mut text = self.paths.join("\n");
        text.push('\n');
        std::fs::write(&self.paths_file, text)
            .map_err(|e| format!("cannot write {}: {e}", self.paths_file.display()).into())
    }
}
