//! `gpufeed run`: the pipeline over a folder, a summary in words or as one JSON object, and the
//! output saved on request.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use gpufeed::{
    BatchOptions, ChannelOrder, DType, Decode, DecodeOptions, Device, DrawRange, EpochReport,
    Gray16, Interpolation, LastBatch, Launch, Layout, OnError, Options, OutputOptions, Pipeline,
    ReadReport, RemoteOptions, ResizeMode, ResizeOptions, RuntimeOptions, Shard, ShardBalance,
    Source, UrlLayout, DEFAULT_DECODE_MEMORY, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS,
    RANDOM_CROP_RATIO, RANDOM_CROP_SCALE, RANDOM_FLIP_CHANCE,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::save::{paths_file, Saver};
use crate::Result;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Folder of images, searched recursively (default: the bundled assets/); or a URL in
    /// object storage: a prefix (s3://bucket/train/, gs://..., az://...), one object, or a
    /// brace pattern (https://host/train-{0000..0127}.tar).
    #[arg(default_value = "assets")]
    dir: PathBuf,
    /// Treat DIR as an ImageFolder: each subfolder (or first key component under a URL's
    /// prefix) is a class, labels from sorted names.
    #[arg(long, conflicts_with = "webdataset")]
    image_folder: bool,
    /// Read the WebDataset tar shards in DIR (its .tar files, in sorted order): a sample's image
    /// member by extension, its label from its .cls member.
    #[arg(long)]
    webdataset: bool,
    /// For a URL: a folder keeping whole shards and images read, for later epochs, runs and
    /// processes.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// For a URL: the most bytes --cache-dir holds (e.g. 200G; default no limit).
    #[arg(long, value_parser = parse_bytes)]
    cache_limit: Option<u64>,
    /// For a URL: the most bytes read ahead of the decoders (e.g. 2G).
    #[arg(long, value_parser = parse_bytes, default_value = "1G")]
    read_budget: u64,
    /// For a URL: the most requests in flight at once.
    #[arg(long, default_value_t = 64)]
    max_requests: usize,
    /// For WebDataset shards at a URL: consecutive shards whose samples are shuffled together
    /// (default: as many as half the read budget holds, 1 to 8).
    #[arg(long)]
    shuffle_window: Option<usize>,
    /// Images per batch.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// How images reach the output size: center-crop (torchvision's Resize + CenterCrop),
    /// stretch, letterbox, or random-resized-crop (torchvision's RandomResizedCrop, to the
    /// --crop or --size output).
    #[arg(long, default_value = "center-crop", value_parser = ["center-crop", "stretch", "letterbox", "random-resized-crop"])]
    resize_mode: String,
    /// torchvision's ImageNet training transform: RandomResizedCrop to the --crop (or --size)
    /// output, RandomHorizontalFlip, and a new shuffle every epoch, all drawn from --seed.
    #[arg(long, conflicts_with_all = ["resize_mode", "shuffle"])]
    train: bool,
    /// Seed of the random transforms (and of the shuffle, with --train).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// RandomResizedCrop's area range MIN,MAX, as shares of the image's.
    #[arg(long, value_delimiter = ',', num_args = 2, default_values_t = [RANDOM_CROP_SCALE.min, RANDOM_CROP_SCALE.max])]
    scale: Vec<f64>,
    /// RandomResizedCrop's aspect-ratio range MIN,MAX (width / height).
    #[arg(long, value_delimiter = ',', num_args = 2, default_values_t = [RANDOM_CROP_RATIO.min, RANDOM_CROP_RATIO.max])]
    ratio: Vec<f64>,
    /// Chance, 0 to 1, that an image is mirrored left to right (RandomHorizontalFlip; 0.5 with
    /// --train).
    #[arg(long)]
    hflip: Option<f64>,
    /// Shorter side after resizing (torchvision's Resize), for center-crop.
    #[arg(long, default_value_t = 256)]
    resize: u32,
    /// Side of the centre crop (torchvision's CenterCrop), and of the output unless --size.
    #[arg(long, default_value_t = 224)]
    crop: u32,
    /// Output size HEIGHTxWIDTH (e.g. 640x640), for any mode; default CROPxCROP.
    #[arg(long, value_parser = parse_size)]
    size: Option<(u32, u32)>,
    /// Value of padded pixels, for letterbox.
    #[arg(long, default_value_t = 114)]
    pad: u8,
    /// Resampling filter: bilinear, bicubic, nearest or lanczos (antialiased like Pillow's).
    #[arg(long, default_value_t = Interpolation::Bilinear)]
    interpolation: Interpolation,
    /// Per-channel mean in 0..1 units, R,G,B (default ImageNet's).
    #[arg(long, value_delimiter = ',', num_args = 3, default_values_t = gpufeed::IMAGENET_MEAN)]
    mean: Vec<f32>,
    /// Per-channel standard deviation in 0..1 units, R,G,B (default ImageNet's).
    #[arg(long, value_delimiter = ',', num_args = 3, default_values_t = gpufeed::IMAGENET_STD)]
    std: Vec<f32>,
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
    /// Stay on the CPU: CPU stages and the CPU normalize.
    #[arg(long)]
    cpu: bool,
    /// What a bad image does: skip or fail.
    #[arg(long, default_value_t = OnError::Skip)]
    on_error: OnError,
    /// Drop a last partial batch.
    #[arg(long)]
    drop_last: bool,
    /// Shuffle with this seed (a new order each epoch).
    #[arg(long)]
    shuffle: Option<u64>,
    /// This process's part of DIR: RANK/WORLD (e.g. 0/4), or env to read it from torchrun's
    /// (RANK, WORLD_SIZE, LOCAL_RANK) or Slurm's variables (with the GPU LOCAL_RANK unless
    /// --device or --cpu).
    #[arg(long, value_parser = parse_shard)]
    shard: Option<ShardArg>,
    /// How the ranks' parts are evened out: pad (every rank the same number of images, repeats
    /// flagged), drop (cut to equal length) or uneven.
    #[arg(long, default_value_t = ShardBalance::Pad)]
    shard_balance: ShardBalance,
    /// Epochs to run.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Refuse images claiming more pixels than this.
    #[arg(long, default_value_t = DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
    /// Refuse files larger than this many bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_FILE_BYTES)]
    max_file_bytes: u64,
    /// The most bytes the decode threads hold together for images in flight.
    #[arg(long, default_value_t = DEFAULT_DECODE_MEMORY)]
    decode_memory: u64,
    /// Turn images as their EXIF orientation tag says (torchvision does not).
    #[arg(long)]
    exif_orientation: bool,
    /// 16-bit gray to 8 bits: clip (torchvision's) or scale.
    #[arg(long, default_value_t = Gray16::Clip)]
    gray16: Gray16,
    /// Which decoders fill the batches: cpu (the CPU threads), or hybrid (the GPU's JPEG
    /// engines beside them, for baseline colour JPEGs).
    #[arg(long, default_value_t = Decode::Cpu)]
    decode: Decode,
    /// With --decode hybrid, the GPU lane's share of the images it can take, 0 to 1 (default:
    /// measured on the first batch and printed; give it back to decode every image in the same
    /// lane again).
    #[arg(long)]
    gpu_share: Option<f32>,
    /// Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the output keeps a 2x
    /// margin (faster on big photos; further from torchvision).
    #[arg(long)]
    dct_scaling: bool,
    /// Write every processed image, in order, to FILE.npy (output dtype and layout; bf16 as its
    /// raw u16 bits) and the id of each row to FILE.paths.txt (one a line, with backslash,
    /// newline and carriage return written \\, \n and \r); with labels, FILE.labels.txt; with
    /// random transforms, FILE.crops.tsv (path, top, left, height, width, flipped: the arguments
    /// of torchvision's F.resized_crop and F.hflip). They appear only once the run has
    /// succeeded.
    #[arg(long, value_name = "FILE.npy")]
    save: Option<PathBuf>,
    /// Let --save replace existing files (never an image the run reads).
    #[arg(long)]
    overwrite: bool,
    /// Print only the summary, as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// `--shard`: a fixed part, or the launcher's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardArg {
    Fixed(Shard),
    Env,
}

fn parse_shard(text: &str) -> std::result::Result<ShardArg, String> {
    if text.trim().eq_ignore_ascii_case("env") {
        return Ok(ShardArg::Env);
    }
    text.parse::<Shard>()
        .map(ShardArg::Fixed)
        .map_err(|e| format!("{e}, or env"))
}

/// A byte count: a number with an optional K, M, G or T (powers of 1024; `KiB`, `KB` and the
/// like read the same).
fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a byte count such as 512M or 20G"))?;
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{text:?}: unknown unit (K, M, G or T)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

fn parse_size(text: &str) -> std::result::Result<(u32, u32), String> {
    let (h, w) = text
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("{text:?}: expected HEIGHTxWIDTH, e.g. 224x224"))?;
    let side = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|e| format!("{text:?}: {e}"))
    };
    Ok((side(h)?, side(w)?))
}

impl RunArgs {
    /// The source DIR names: a local folder, or a URL in object storage.
    fn source(&self) -> Result<Source> {
        let text = self.dir.to_string_lossy();
        if !text.contains("://") {
            if self.cache_dir.is_some() || self.cache_limit.is_some() {
                return Err("--cache-dir and --cache-limit are for URLs; DIR is a folder".into());
            }
            return Ok(if self.image_folder {
                Source::image_folder(&self.dir)?
            } else if self.webdataset {
                Source::webdataset(&self.dir)?
            } else {
                Source::directory(&self.dir)?
            });
        }
        let layout = if self.image_folder {
            UrlLayout::ImageFolder
        } else if self.webdataset {
            UrlLayout::WebDataset
        } else {
            UrlLayout::Images
        };
        let options = RemoteOptions::default()
            .cache_dir(self.cache_dir.clone())
            .cache_limit(self.cache_limit.unwrap_or(u64::MAX))
            .read_budget(self.read_budget)
            .max_requests(self.max_requests)
            .shuffle_window(self.shuffle_window);
        Ok(Source::url(&text, layout, &options)?)
    }

    /// The library's options for these arguments on `device`, for this process's `shard`.
    fn options(&self, device: Device, shard: Shard) -> Result<Options> {
        let (height, width) = self.size.unwrap_or((self.crop, self.crop));
        let range = |values: &[f64], name: &str| -> Result<DrawRange> {
            match values {
                [min, max] => Ok(DrawRange::new(*min, *max)),
                _ => Err(format!("--{name} takes two values, MIN,MAX").into()),
            }
        };
        let random = ResizeMode::RandomResizedCrop {
            height,
            width,
            scale: range(&self.scale, "scale")?,
            ratio: range(&self.ratio, "ratio")?,
        };
        let mode = match self.resize_mode.as_str() {
            _ if self.train => random,
            "stretch" => ResizeMode::stretch(height, width),
            "letterbox" => ResizeMode::letterbox(height, width, self.pad),
            "random-resized-crop" => random,
            _ => ResizeMode::ShorterSideThenCenterCrop {
                shorter_side: self.resize,
                height,
                width,
            },
        };
        let flip = self
            .hflip
            .unwrap_or(if self.train { RANDOM_FLIP_CHANCE } else { 0.0 });
        let shuffle = if self.train {
            Some(self.seed)
        } else {
            self.shuffle
        };
        let three = |values: &[f32], name: &str| -> Result<[f32; 3]> {
            <[f32; 3]>::try_from(values)
                .map_err(|_| format!("--{name} takes three values, R,G,B").into())
        };
        Ok(Options::default()
            .decode(
                DecodeOptions::default()
                    .max_pixels(self.max_pixels)
                    .max_file_bytes(self.max_file_bytes)
                    .memory_limit(self.decode_memory)
                    .exif_orientation(self.exif_orientation)
                    .gray16(self.gray16)
                    .dct_scaling(self.dct_scaling)
                    .lanes(self.decode)
                    .gpu_share(self.gpu_share),
            )
            .resize(
                ResizeOptions::default()
                    .mode(mode)
                    .interpolation(self.interpolation)
                    .horizontal_flip(flip)
                    .seed(self.seed),
            )
            .output(
                OutputOptions::default()
                    .mean_std(three(&self.mean, "mean")?, three(&self.std, "std")?)
                    .dtype(self.dtype)
                    .layout(self.layout)
                    .channel_order(if self.bgr {
                        ChannelOrder::Bgr
                    } else {
                        ChannelOrder::Rgb
                    }),
            )
            .batching(
                BatchOptions::default()
                    .batch_size(self.batch_size)
                    .on_error(self.on_error)
                    .last_batch(if self.drop_last {
                        LastBatch::Drop
                    } else {
                        LastBatch::Keep
                    })
                    .shuffle_seed(shuffle)
                    .shard(shard)
                    .shard_balance(self.shard_balance),
            )
            .runtime(
                RuntimeOptions::default()
                    .device(device)
                    .prefetch(self.prefetch)
                    .threads(self.threads),
            ))
    }

    /// This process's shard, and the GPU its launcher gives it (with `--shard env`).
    fn shard(&self) -> Result<(Shard, Option<usize>)> {
        Ok(match self.shard {
            None => (Shard::default(), None),
            Some(ShardArg::Fixed(shard)) => (shard, None),
            Some(ShardArg::Env) => {
                let launch = Launch::from_env()?;
                (launch.shard(), Some(launch.local_rank))
            }
        })
    }

    /// The device: explicit `--device N` must work; `--cpu` is the CPU; otherwise the first GPU
    /// (or the launcher's, `local_gpu`) if there is one, else the CPU with a message saying why.
    fn device(&self, local_gpu: Option<usize>) -> Device {
        if self.cpu {
            return Device::Cpu;
        }
        if let Some(ordinal) = self.device {
            return Device::Cuda(ordinal);
        }
        match gpufeed::cuda::probe() {
            Ok(_) => Device::Cuda(local_gpu.unwrap_or(0)),
            Err(e) => {
                eprintln!(
                    "gpufeed: {e}\ngpufeed: running the CPU stages and the CPU normalize instead \
                     (--device N requires a GPU, --cpu silences this)"
                );
                Device::Cpu
            }
        }
    }
}

/// The suffix of the labels file `--save` writes for a source with labels.
const LABELS: &str = ".labels.txt";

/// The suffix of the draws file `--save` writes with random transforms.
const CROPS: &str = ".crops.tsv";

/// What one run did, for the summary.
struct Tally {
    reports: Vec<EpochReport>,
    seconds: Vec<f64>,
    uploaded_bytes: usize,
}

/// Runs the pipeline as `args` say and prints the summary; returns the device used. With
/// `--json`, stdout is one JSON object whatever happens: the summary (with an `error` field
/// when the run stopped), or, when the run could not start, `{"error": ..., "dir": ...}`.
pub fn run(args: &RunArgs) -> Result<Device> {
    let mut summarized = false;
    let outcome = run_and_summarize(args, &mut summarized);
    if let Err(e) = &outcome {
        if args.json && !summarized {
            out!(
                "{}",
                json!({"error": e.to_string(), "dir": args.dir.display().to_string()})
            );
        }
    }
    outcome
}

fn run_and_summarize(args: &RunArgs, summarized: &mut bool) -> Result<Device> {
    let (shard, local_gpu) = args.shard()?;
    let device = args.device(local_gpu);
    let opening = Instant::now();
    let source = args.source()?;
    let open_seconds = opening.elapsed().as_secs_f64();
    let opened = source.opening_report().cloned();
    for (folder, reason) in source.unreadable_folders() {
        eprintln!("gpufeed: skipped {}: {reason}", folder.display());
    }
    let unreadable: Vec<Value> = source
        .unreadable_folders()
        .iter()
        .map(|(folder, reason)| json!({"path": folder.display().to_string(), "reason": reason}))
        .collect();
    let options = args.options(device, shard)?;
    if args.epochs == 0 {
        return Err("--epochs must be at least 1".into());
    }
    // With labels, `--save` also writes FILE.labels.txt, one label a row; with random
    // transforms, FILE.crops.tsv, one row of draws a row.
    let mut extra = Vec::new();
    if source.has_labels() {
        extra.push(LABELS);
    }
    if options.resize.is_random() {
        extra.push(CROPS);
    }
    let mut saver = match &args.save {
        Some(path) => Some(Saver::create(
            path,
            options.output.dtype,
            &source,
            args.overwrite,
            &extra,
        )?),
        None => None,
    };
    let setup = Instant::now();
    let mut pipeline = Pipeline::with_options(source, options)?;
    let setup_seconds = setup.elapsed().as_secs_f64();
    let progress = if std::io::stderr().is_terminal() && !args.json {
        let bar = ProgressBar::new(pipeline.len() as u64 * args.epochs);
        if let Ok(style) =
            ProgressStyle::default_bar().template("{bar:40} {pos}/{len} images {per_sec} {eta}")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut tally = Tally {
        reports: Vec::new(),
        seconds: Vec::new(),
        uploaded_bytes: 0,
    };
    let outcome = run_epochs(args, &mut pipeline, saver.as_mut(), &progress, &mut tally);
    progress.finish_and_clear();
    if outcome.is_ok() {
        if let Some(saver) = saver.take() {
            saver.finish()?;
        }
    }
    drop(saver);
    let summary = Summary {
        args,
        pipeline: &pipeline,
        tally: &tally,
        setup_seconds,
        unreadable,
        opened,
        open_seconds,
    };
    if args.json {
        let mut value = summary.json();
        if let Err(e) = &outcome {
            value["error"] = json!(e.to_string());
        }
        out!("{value}");
        *summarized = true;
    } else if outcome.is_ok() {
        summary.print();
    }
    // Under --on-error fail the first bad image stops the run here, naming the image.
    outcome?;
    Ok(device)
}

/// Runs `args.epochs` epochs, saving on request.
fn run_epochs(
    args: &RunArgs,
    pipeline: &mut Pipeline,
    mut saver: Option<&mut Saver>,
    progress: &ProgressBar,
    tally: &mut Tally,
) -> Result<()> {
    for _ in 0..args.epochs {
        let start = Instant::now();
        let mut last = None;
        let outcome: Result<()> = (|| {
            for batch in &mut *pipeline {
                let batch = batch?;
                tally.uploaded_bytes += batch.uploaded_bytes();
                progress.inc((batch.len() + batch.skipped().len()) as u64);
                if let Some(saver) = saver.as_deref_mut() {
                    saver.append(&batch.images().to_host()?, batch.ids())?;
                    let mut extra = 0;
                    if let Some(labels) = batch.labels() {
                        let lines: Vec<String> = labels.iter().map(u32::to_string).collect();
                        saver.append_extra(extra, &lines)?;
                        extra += 1;
                    }
                    if let Some(crops) = batch.crops() {
                        let lines: Vec<String> = batch
                            .ids()
                            .iter()
                            .zip(crops)
                            .map(|(id, c)| {
                                format!(
                                    "{}\t{}\t{}\t{}\t{}\t{}",
                                    crate::save::escape_line(id),
                                    c.top,
                                    c.left,
                                    c.height,
                                    c.width,
                                    u8::from(c.flipped)
                                )
                            })
                            .collect();
                        saver.append_extra(extra, &lines)?;
                    }
                }
                last = Some(batch);
            }
            // The last batch is ready only once the stream has run its kernel.
            if let Some(batch) = &last {
                batch.images().synchronize()?;
            }
            Ok(())
        })();
        tally.seconds.push(start.elapsed().as_secs_f64());
        tally.reports.push(pipeline.epoch_report().clone());
        outcome?;
    }
    Ok(())
}

/// The summary of a run, in words or as JSON.
struct Summary<'a> {
    args: &'a RunArgs,
    pipeline: &'a Pipeline,
    tally: &'a Tally,
    setup_seconds: f64,
    unreadable: Vec<Value>,
    /// What opening a source in object storage read.
    opened: Option<ReadReport>,
    /// Seconds listing (and indexing) the source took.
    open_seconds: f64,
}

/// A [`ReadReport`] of `seconds` as JSON: requests, bytes, MB/s and the cache's part.
fn reads_json(reads: &ReadReport, seconds: f64) -> Value {
    json!({
        "requests": reads.requests,
        "bytes": reads.bytes,
        "mb_per_s": if seconds > 0.0 { reads.bytes as f64 / 1e6 / seconds } else { 0.0 },
        "objects_fetched": reads.fetched,
        "cache_hits": reads.cache_hits,
        "cache_bytes": reads.cache_bytes,
        "kept_in_memory": reads.kept,
        "cache_hit_rate": reads.cache_hit_rate(),
        "failed": reads.failed,
        "waits": reads.waits,
        "waited_seconds": reads.waited.as_secs_f64(),
    })
}

impl Summary<'_> {
    fn images(&self) -> usize {
        self.tally.reports.iter().map(|r| r.images).sum()
    }

    fn seconds(&self) -> f64 {
        self.tally.seconds.iter().sum()
    }

    fn images_per_s(&self) -> f64 {
        let seconds = self.seconds();
        if seconds > 0.0 {
            self.images() as f64 / seconds
        } else {
            0.0
        }
    }

    fn image_bytes(&self) -> usize {
        self.pipeline.options().resize.image_bytes().unwrap_or(0)
    }

    fn skipped(&self) -> Vec<&gpufeed::ItemError> {
        self.tally
            .reports
            .iter()
            .flat_map(|r| r.skipped.iter())
            .collect()
    }

    fn json(&self) -> Value {
        let options = self.pipeline.options();
        let images = self.images();
        let errors: Vec<Value> = self
            .skipped()
            .iter()
            .map(|e| json!({"path": e.id, "reason": e.kind.to_string()}))
            .collect();
        let epochs: Vec<Value> = self
            .tally
            .reports
            .iter()
            .zip(&self.tally.seconds)
            .map(|(r, &s)| {
                let mut epoch = json!({"epoch": r.epoch, "images": r.images,
                       "batches": r.batches, "padded": r.padded, "skipped": r.skipped.len(),
                       "dropped": r.dropped, "seconds": s, "complete": r.complete});
                if let Some(reads) = &r.reads {
                    epoch["reads"] = reads_json(reads, s);
                }
                epoch
            })
            .collect();
        json!({
            "dir": self.args.dir.display().to_string(),
            "device": self.pipeline.device_description(),
            "images": images,
            "skipped": errors.len(),
            "errors": errors,
            "unreadable_folders": self.unreadable,
            "dropped": self.tally.reports.iter().map(|r| r.dropped).sum::<usize>(),
            "padded": self.tally.reports.iter().map(|r| r.padded).sum::<usize>(),
            "shard": options.batching.shard.to_string(),
            "batches": self.tally.reports.iter().map(|r| r.batches).sum::<usize>(),
            "epochs": epochs,
            "batch_size": options.batching.batch_size,
            "dtype": options.output.dtype.name(),
            "layout": options.output.layout.name(),
            "setup_seconds": self.setup_seconds,
            "seconds": self.seconds(),
            "images_per_s": self.images_per_s(),
            "uploaded_bytes": self.tally.uploaded_bytes,
            "decoded_by": {
                "cpu": self.tally.reports.iter().map(|r| r.decoded_by_cpu).sum::<usize>(),
                "gpu": self.tally.reports.iter().map(|r| r.decoded_by_gpu).sum::<usize>(),
            },
            "gpu_share": self.pipeline.gpu_share(),
            "f32_bytes": images * self.image_bytes() * 4,
            "peak_rss_bytes": peak_rss_bytes(),
            "open_seconds": self.open_seconds,
            "opened": self.opened.as_ref().map(|r| reads_json(r, self.open_seconds)),
        })
    }

    fn print(&self) {
        let options = self.pipeline.options();
        let (height, width) = options.resize.output_size();
        let images = self.images();
        let skipped = self.skipped();
        let f32_bytes = images * self.image_bytes() * 4;
        out!(
            "gpufeed run: {} on {}",
            self.args.dir.display(),
            self.pipeline.device_description()
        );
        out!(
            "  output      {images} x [{}] {} {}{}",
            match options.output.layout {
                Layout::Nhwc => format!("{height}, {width}, 3"),
                _ => format!("3, {height}, {width}"),
            },
            options.output.dtype,
            options.output.layout,
            if self.args.bgr { " bgr" } else { "" }
        );
        let batches: usize = self.tally.reports.iter().map(|r| r.batches).sum();
        out!("  images      {images} in {batches} batches");
        if self.tally.reports.len() > 1 {
            out!("  epochs      {}", self.tally.reports.len());
        }
        let by_gpu: usize = self.tally.reports.iter().map(|r| r.decoded_by_gpu).sum();
        if self.pipeline.options().decode.lanes == Decode::Hybrid {
            let share = self
                .pipeline
                .gpu_share()
                .map_or(String::new(), |s| format!(" (GPU share {s})"));
            out!(
                "  decoded     {} by the CPU threads, {by_gpu} by the GPU's JPEG engines{share}",
                images - by_gpu
            );
        }
        out!("  skipped     {}", skipped.len());
        for e in &skipped {
            out!("    {}: {}", e.id, e.kind);
        }
        let dropped: usize = self.tally.reports.iter().map(|r| r.dropped).sum();
        if dropped > 0 {
            out!("  dropped     {dropped} (partial last batch)");
        }
        let padded: usize = self.tally.reports.iter().map(|r| r.padded).sum();
        if options.batching.shard.world > 1 {
            out!(
                "  shard       {} ({padded} rows padding it to the other ranks' length)",
                options.batching.shard
            );
        }
        out!(
            "  setup       {:.3} s (device, kernel compile, staging)",
            self.setup_seconds
        );
        out!("  seconds     {:.3}", self.seconds());
        out!("  images/s    {:.1}", self.images_per_s());
        if let Some(opened) = &self.opened {
            out!(
                "  opened      in {:.3} s: {} in {} requests, {} objects from the cache",
                self.open_seconds,
                human_bytes(opened.bytes as usize),
                opened.requests,
                opened.cache_hits
            );
        }
        for (reads, seconds) in self
            .tally
            .reports
            .iter()
            .zip(&self.tally.seconds)
            .filter_map(|(r, s)| Some((r.reads.as_ref()?, s)))
        {
            out!(
                "  read        {} in {} requests ({:.1} MB/s), cache hit rate {:.0}%, decoders \
                 waited {:.2} s",
                human_bytes(reads.bytes as usize),
                reads.requests,
                reads.bytes as f64 / 1e6 / seconds.max(1e-9),
                reads.cache_hit_rate() * 100.0,
                reads.waited.as_secs_f64()
            );
        }
        if self.tally.uploaded_bytes > 0 {
            out!(
                "  uploaded    {} as u8; f32 would have uploaded {} ({:.2}x less)",
                human_bytes(self.tally.uploaded_bytes),
                human_bytes(f32_bytes),
                f32_bytes as f64 / self.tally.uploaded_bytes.max(1) as f64
            );
        } else {
            out!(
                "  uploaded    nothing (CPU device); on a GPU: {} as u8 instead of {} as f32",
                human_bytes(images * self.image_bytes()),
                human_bytes(f32_bytes)
            );
        }
        if let Some(path) = &self.args.save {
            out!(
                "  saved       {} and {}",
                path.display(),
                paths_file(path).display()
            );
        }
    }
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

/// Peak resident set size of this process in bytes (`VmHWM`), 0 where unknown.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
