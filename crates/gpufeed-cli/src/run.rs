//! `gpufeed run`: the pipeline over a folder, a summary in words or as one JSON object, and the
//! output saved on request.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufeed::{
    Augment, AugmentOptions, Batch, BatchOptions, BatchPatches, ChannelOrder, ColorJitter, DType,
    Decode, DecodeOptions, Device, DrawRange, EpochReport, Extras, Gray16, Interpolation,
    LastBatch, Launch, Layout, OnError, Options, OutputOptions, ParquetOptions, Pipeline,
    PipelineState, RandomErasing, ReadReport, Recipe, RemoteOptions, ResizeMode, ResizeOptions,
    RuntimeOptions, Shard, ShardBalance, Source, UrlLayout, WaitedBatch, DEFAULT_DECODE_MEMORY,
    DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, RANDOM_CROP_RATIO, RANDOM_CROP_SCALE,
    RANDOM_FLIP_CHANCE,
};
use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use serde_json::{json, Value};

use gpufeed::patches::{EvalPreset, Patches, Preset};

use crate::save::{escape_bytes, escape_line, set_files, Saver, PATCH_FILES};
use crate::Result;

/// `gpufeed run`'s arguments. `--help` shows the main ones in a line each; `--help-all` shows
/// every one with all it does (the first paragraph of each doc comment is its short help).
#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Every option, with what it does in full: gpufeed run --help-all"
)]
pub struct RunArgs {
    /// Folder of images or URL [default: the bundled assets/]
    ///
    /// A folder of images, searched recursively; or a URL in object storage: a prefix
    /// (s3://bucket/train/, gs://..., az://...), one object, or a brace pattern
    /// (https://host/train-{0000..0127}.tar).
    #[arg(default_value = "assets", hide_default_value = true)]
    dir: PathBuf,
    /// DIR is an ImageFolder: a class per subfolder
    ///
    /// Treat DIR as an ImageFolder: each subfolder (or first key component under a URL's
    /// prefix) is a class, labels from sorted names.
    #[arg(long, conflicts_with = "webdataset", help_heading = "Input")]
    image_folder: bool,
    /// DIR holds WebDataset tar shards
    ///
    /// Read the WebDataset tar shards in DIR (its .tar files, in sorted order): a sample's image
    /// member by extension, its label from its .cls member.
    #[arg(long, help_heading = "Input")]
    webdataset: bool,
    /// DIR is Parquet: a file, a glob, a folder, a Hugging Face dataset or a URL
    ///
    /// Read DIR as Parquet files, a row an image: one file, a glob over file names
    /// ('data/train-*.parquet'), a folder of .parquet files, or a Hugging Face dataset folder
    /// (data/<split>-*.parquet, class names from the files or the README); or a URL in object
    /// storage, one object or a prefix (read by range requests). Row groups are shuffled and
    /// sharded as tar shards are.
    #[arg(long, conflicts_with_all = ["webdataset", "image_folder"], help_heading = "Input")]
    parquet: bool,
    /// For --parquet: the image column (binary, or a struct with a binary `bytes` field).
    #[arg(
        long,
        default_value = "image",
        hide_short_help = true,
        help_heading = "Input"
    )]
    image_column: String,
    /// For --parquet: the label column (integers, or text numbered in sorted order); default
    /// `label` if the files have it.
    #[arg(long, hide_short_help = true, help_heading = "Input")]
    label_column: Option<String>,
    /// For --parquet: columns written beside each row by --save (FILE.extra.tsv), comma
    /// separated.
    #[arg(
        long,
        value_delimiter = ',',
        hide_short_help = true,
        help_heading = "Input"
    )]
    extra_columns: Vec<String>,
    /// For a Hugging Face dataset folder with --parquet: the split read.
    #[arg(
        long,
        default_value = "train",
        hide_short_help = true,
        help_heading = "Input"
    )]
    split: String,
    /// For a URL: a folder keeping whole shards and images read, for later epochs, runs and
    /// processes.
    #[arg(long, hide_short_help = true, help_heading = "Object storage")]
    cache_dir: Option<PathBuf>,
    /// For a URL: the most bytes --cache-dir holds (e.g. 200G; default no limit).
    #[arg(long, value_parser = parse_bytes, hide_short_help = true, help_heading = "Object storage")]
    cache_limit: Option<u64>,
    /// For a URL: the most bytes read ahead of the decoders (e.g. 2G).
    #[arg(long, value_parser = parse_bytes, default_value = "1G", hide_short_help = true, help_heading = "Object storage")]
    read_budget: u64,
    /// For a URL: the most requests in flight at once.
    #[arg(
        long,
        default_value_t = 64,
        hide_short_help = true,
        help_heading = "Object storage"
    )]
    max_requests: usize,
    /// For WebDataset shards at a URL: consecutive shards whose samples are shuffled together
    /// (default: as many as half the read budget holds, 1 to 8).
    #[arg(long, hide_short_help = true, help_heading = "Object storage")]
    shuffle_window: Option<usize>,
    /// Images per batch
    #[arg(long, default_value_t = 256, help_heading = "Output")]
    batch_size: usize,
    /// How images reach the output size: center-crop (torchvision's Resize + CenterCrop),
    /// stretch, letterbox, or random-resized-crop (torchvision's RandomResizedCrop, to the
    /// --crop or --size output).
    #[arg(long, default_value = "center-crop", value_parser = ["center-crop", "stretch", "letterbox", "random-resized-crop"], hide_short_help = true, help_heading = "Output")]
    resize_mode: String,
    /// torchvision's ImageNet training transform (random crops, flips, shuffle)
    ///
    /// torchvision's ImageNet training transform: RandomResizedCrop to the --crop (or --size)
    /// output, RandomHorizontalFlip, and a new shuffle every epoch, all drawn from --seed.
    #[arg(long, conflicts_with_all = ["resize_mode", "shuffle"], help_heading = "Training")]
    train: bool,
    /// Augmentation: trivial-augment-wide, rand-augment[:N:M], auto-augment or none
    ///
    /// torchvision's automatic augmentation of every image: trivial-augment-wide,
    /// rand-augment (2 operations at magnitude 9), rand-augment:N:M, auto-augment (its ImageNet
    /// policy) or none; nearest sampling, drawn from --seed.
    #[arg(long, default_value_t = Augment::None, help_heading = "Training")]
    augment: Augment,
    /// torchvision's ColorJitter(B, C, S, H), before the --augment policy.
    #[arg(long, num_args = 4, value_names = ["B", "C", "S", "H"], hide_short_help = true, help_heading = "Training")]
    color_jitter: Option<Vec<f64>>,
    /// torchvision's RandomErasing(P), after the --augment policy.
    #[arg(
        long,
        value_name = "P",
        hide_short_help = true,
        help_heading = "Training"
    )]
    random_erasing: Option<f64>,
    /// torchvision's MixUp(ALPHA) across each batch (needs labels)
    ///
    /// torchvision's MixUp(ALPHA) across each batch (needs labels: --image-folder or tar shards
    /// with .cls members); soft labels over --num-classes.
    #[arg(long, value_name = "ALPHA", help_heading = "Training")]
    mixup: Option<f64>,
    /// torchvision's CutMix(ALPHA) across each batch; with --mixup, each batch takes one of the
    /// two.
    #[arg(
        long,
        value_name = "ALPHA",
        hide_short_help = true,
        help_heading = "Training"
    )]
    cutmix: Option<f64>,
    /// Classes of the soft labels (default: the image folder's class count).
    #[arg(long, hide_short_help = true, help_heading = "Training")]
    num_classes: Option<usize>,
    /// A training recipe: torchvision-imagenet
    ///
    /// A training recipe: torchvision-imagenet (--train, trivial-augment-wide, random erasing
    /// 0.1 to the mean colour, MixUp 0.2 or CutMix 1.0 per batch).
    #[arg(long, conflicts_with_all = ["augment", "random_erasing", "mixup", "cutmix", "resize_mode", "shuffle"], help_heading = "Training")]
    recipe: Option<Recipe>,
    /// Seed of the random transforms
    ///
    /// Seed of the random transforms (and of the shuffle, with --train).
    #[arg(long, default_value_t = 0, help_heading = "Training")]
    seed: u64,
    /// RandomResizedCrop's area range MIN,MAX (or MIN MAX), as shares of the image's.
    #[arg(long, value_delimiter = ',', num_args = 1..=2, value_name = "MIN,MAX", default_values_t = [RANDOM_CROP_SCALE.min, RANDOM_CROP_SCALE.max], hide_short_help = true, help_heading = "Training")]
    scale: Vec<f64>,
    /// RandomResizedCrop's aspect-ratio range MIN,MAX (or MIN MAX), width / height.
    #[arg(long, value_delimiter = ',', num_args = 1..=2, value_name = "MIN,MAX", default_values_t = [RANDOM_CROP_RATIO.min, RANDOM_CROP_RATIO.max], hide_short_help = true, help_heading = "Training")]
    ratio: Vec<f64>,
    /// Chance, 0 to 1, that an image is mirrored left to right (RandomHorizontalFlip; 0.5 with
    /// --train).
    #[arg(long, hide_short_help = true, help_heading = "Training")]
    hflip: Option<f64>,
    /// Shorter side after resizing (torchvision's Resize)
    ///
    /// Shorter side after resizing (torchvision's Resize), for center-crop.
    #[arg(long, default_value_t = 256, help_heading = "Output")]
    resize: u32,
    /// Side of the centre crop and of the output (torchvision's CenterCrop)
    ///
    /// Side of the centre crop (torchvision's CenterCrop), and of the output unless --size.
    #[arg(long, default_value_t = 224, help_heading = "Output")]
    crop: u32,
    /// Output size HEIGHTxWIDTH (e.g. 640x640) [default: CROPxCROP]
    ///
    /// Output size HEIGHTxWIDTH (e.g. 640x640), for any mode; default CROPxCROP.
    #[arg(long, value_parser = parse_size, help_heading = "Output")]
    size: Option<(u32, u32)>,
    /// Value of padded pixels, for letterbox.
    #[arg(
        long,
        default_value_t = 114,
        hide_short_help = true,
        help_heading = "Output"
    )]
    pad: u8,
    /// Resampling filter: bilinear, bicubic, nearest, lanczos, box or hamming (as Pillow's).
    #[arg(long, default_value_t = Interpolation::Bilinear, hide_short_help = true, help_heading = "Output")]
    interpolation: Interpolation,
    /// The Pillow version MAJOR.MINOR whose rounding to reproduce (its pass order changed in
    /// 12.2 and 13.0); default 13.0.
    #[arg(long, value_parser = parse_version, default_value = "13.0", hide_short_help = true, help_heading = "Output")]
    pillow_version: (u32, u32),
    /// Per-channel mean in 0..1 units, R,G,B (or R G B; default ImageNet's).
    #[arg(long, value_delimiter = ',', num_args = 1..=3, value_name = "R,G,B", default_values_t = gpufeed::IMAGENET_MEAN, hide_short_help = true, help_heading = "Output")]
    mean: Vec<f32>,
    /// Per-channel standard deviation in 0..1 units, R,G,B (or R G B; default ImageNet's).
    #[arg(long, value_delimiter = ',', num_args = 1..=3, value_name = "R,G,B", default_values_t = gpufeed::IMAGENET_STD, hide_short_help = true, help_heading = "Output")]
    std: Vec<f32>,
    /// Output element type: f16, bf16 or f32
    #[arg(long, default_value_t = DType::F16, help_heading = "Output")]
    dtype: DType,
    /// Output layout: nchw or nhwc
    #[arg(long, default_value_t = Layout::Nchw, help_heading = "Output")]
    layout: Layout,
    /// Output channels in BGR order.
    #[arg(long, hide_short_help = true, help_heading = "Output")]
    bgr: bool,
    /// Patch sequences for ViTs/VLMs: qwen2-vl, qwen3-vl, siglip2-naflex, timm-naflex
    ///
    /// Patch sequences instead of fixed-size images, for vision transformers and
    /// vision-language models: qwen2-vl (transformers' Qwen2VLImageProcessor: pixel_values and
    /// image_grid_thw, packed with cu_seqlens), qwen3-vl (the same processor with Qwen3-VL's
    /// settings: patches of 16, mean and std 0.5, 256 x 256 to 4096 x 4096 pixels; give
    /// --max-pixels for batches of many images), siglip2-naflex (Siglip2ImageProcessor:
    /// pixel_values padded to --max-patches, pixel_attention_mask, spatial_shapes), timm-naflex
    /// (timm's NaFlex training loader: a sequence length per batch from --seq-lens, as many
    /// images as --tokens-per-batch holds, random crops and flips from --seed, a mask and patch
    /// coordinates), or qwen2-vl-torchvision, qwen3-vl-torchvision and siglip2-naflex-torchvision
    /// for transformers' torchvision processors. Each image keeps its aspect ratio; the resize
    /// and crop options of fixed-size images are refused beside it.
    #[arg(long, value_name = "PRESET", value_parser = parse_patches, conflicts_with_all = ["train", "recipe", "resize_mode"], help_heading = "Patches")]
    patches: Option<Patches>,
    /// qwen2-vl, qwen3-vl: the fewest pixels of a resized image (min_pixels; default 56 x 56,
    /// qwen3-vl 256 x 256).
    #[arg(
        long,
        value_name = "N",
        hide_short_help = true,
        help_heading = "Patches"
    )]
    min_pixels: Option<u64>,
    /// siglip2-naflex: the most patches of an image, and the padded length (default 256).
    #[arg(
        long,
        value_name = "N",
        hide_short_help = true,
        help_heading = "Patches"
    )]
    max_patches: Option<u32>,
    /// Pixels per patch side (default: the preset's, 14 or 16).
    #[arg(
        long,
        value_name = "N",
        hide_short_help = true,
        help_heading = "Patches"
    )]
    patch_size: Option<u32>,
    /// timm-naflex: the sequence lengths a batch draws from, L,L,... (default
    /// 128,256,576,784,1024).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "L,L,...",
        hide_short_help = true,
        help_heading = "Patches"
    )]
    seq_lens: Option<Vec<u32>>,
    /// timm-naflex: tokens per batch, which sets each batch's size (default 32768).
    #[arg(
        long,
        value_name = "N",
        hide_short_help = true,
        help_heading = "Patches"
    )]
    tokens_per_batch: Option<u64>,
    /// With --patches: packed (the images' tokens one after another, with offsets) or padded
    /// (each image padded to the batch's length, with a mask) [default: the preset's: Qwen2-VL
    /// packed, SigLIP2 and timm padded].
    #[arg(long, value_parser = ["packed", "padded"], hide_short_help = true, help_heading = "Patches")]
    packing: Option<String>,
    /// A fixed-size evaluation transform: clip, siglip-384, siglip-224 or dinov2 (resize, crop,
    /// filter, mean and std).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["patches", "train", "recipe", "resize_mode", "resize", "crop", "size", "interpolation", "mean", "std"], hide_short_help = true, help_heading = "Output")]
    eval_preset: Option<EvalPreset>,
    /// Batches prepared ahead.
    #[arg(
        long,
        default_value_t = 2,
        hide_short_help = true,
        help_heading = "Decoding"
    )]
    prefetch: usize,
    /// CPU threads (0: one per core).
    #[arg(
        long,
        default_value_t = 0,
        hide_short_help = true,
        help_heading = "Decoding"
    )]
    threads: usize,
    /// CUDA device ordinal [default: 0 when present, else the CPU]
    ///
    /// CUDA device ordinal; without it (and without --cpu) device 0 is used when present, the
    /// CPU otherwise.
    #[arg(long, conflicts_with = "cpu", help_heading = "Decoding")]
    device: Option<usize>,
    /// Stay on the CPU: CPU stages and the CPU normalize
    #[arg(long, help_heading = "Decoding")]
    cpu: bool,
    /// What a bad image does: skip (listed with its reason) or fail
    ///
    /// What a bad image does: skip (listed in the summary with its reason) or fail.
    #[arg(long, default_value_t = OnError::Skip, help_heading = "Decoding")]
    on_error: OnError,
    /// Drop a last partial batch.
    #[arg(long, hide_short_help = true, help_heading = "Output")]
    drop_last: bool,
    /// Shuffle with this seed (a new order each epoch); alone, with --seed's
    #[arg(long, help_heading = "Training", value_name = "SEED", num_args = 0..=1, default_missing_value = "seed", value_parser = parse_shuffle)]
    shuffle: Option<ShuffleArg>,
    /// This process's part of DIR: RANK/WORLD (e.g. 0/4), or env (torchrun, Slurm)
    ///
    /// This process's part of DIR: RANK/WORLD (e.g. 0/4), or env to read it from torchrun's
    /// (RANK, WORLD_SIZE, LOCAL_RANK) or Slurm's variables (with the GPU LOCAL_RANK unless
    /// --device or --cpu).
    #[arg(long, value_parser = parse_shard, help_heading = "Run")]
    shard: Option<ShardArg>,
    /// How the ranks' parts are evened out: pad (every rank the same number of images, repeats
    /// flagged), drop (cut to equal length) or uneven.
    #[arg(long, default_value_t = ShardBalance::Pad, hide_short_help = true, help_heading = "Run")]
    shard_balance: ShardBalance,
    /// Epochs to run
    ///
    /// Epochs to run: the run ends when epoch EPOCHS would begin (so with --resume, the epochs
    /// before the saved state count too). Also the run's length for --decode auto, which opens
    /// the GPU lane's assisted path alone for a run shorter than the JPEG engines' opening
    /// (about 2 s), and leaves one shorter than the lane's (about 0.3 s) to the CPU threads.
    #[arg(long, default_value_t = 1, help_heading = "Run")]
    epochs: u64,
    /// Keep the run's state in FILE, for --resume
    ///
    /// Write the pipeline's state to FILE after each batch handed out (and at each epoch's end),
    /// atomically: to a temporary file beside it, renamed over it. `--resume FILE` goes on from
    /// there, after a kill too.
    #[arg(long, value_name = "FILE", help_heading = "Run")]
    state: Option<PathBuf>,
    /// Begin where the state in FILE says (written by --state)
    ///
    /// Begin where the state in FILE says (written by --state): the rows are those the run that
    /// wrote it would have given next. Refused, naming what differs, for another folder listing
    /// or other options that decide the output.
    #[arg(long, value_name = "FILE", help_heading = "Run")]
    resume: Option<PathBuf>,
    /// Stop cleanly after N batches in all (--save then holds exactly their rows, and --state
    /// the place to resume from).
    #[arg(long, value_name = "N", hide_short_help = true, help_heading = "Run")]
    max_batches: Option<u64>,
    /// Refuse images claiming more pixels than this (default 178956970); with --patches
    /// qwen2-vl or qwen3-vl, the model's max_pixels instead: the most pixels of a resized image
    /// (default 28 x 28 x 1280; qwen3-vl 4096 x 4096).
    #[arg(
        long,
        value_name = "N",
        hide_short_help = true,
        help_heading = "Decoding"
    )]
    max_pixels: Option<u64>,
    /// Refuse files larger than this many bytes.
    #[arg(long, value_parser = parse_bytes, default_value_t = DEFAULT_MAX_FILE_BYTES, hide_short_help = true, help_heading = "Decoding")]
    max_file_bytes: u64,
    /// The most bytes the decode threads hold together for images in flight.
    #[arg(long, value_parser = parse_bytes, default_value_t = DEFAULT_DECODE_MEMORY, hide_short_help = true, help_heading = "Decoding")]
    decode_memory: u64,
    /// Turn images as their EXIF orientation tag says (torchvision does not).
    #[arg(long, hide_short_help = true, help_heading = "Decoding")]
    exif_orientation: bool,
    /// 16-bit gray to 8 bits: clip (torchvision's) or scale.
    #[arg(long, default_value_t = Gray16::Clip, hide_short_help = true, help_heading = "Decoding")]
    gray16: Gray16,
    /// Which decoders fill the batches: auto, cpu or hybrid
    ///
    /// Which decoders fill the batches: auto (hybrid on a CUDA device whose JPEG engines nvJPEG
    /// drives, for runs that repay opening them, else cpu), cpu (the CPU threads), or hybrid (the
    /// GPU's JPEG engines and its assisted path beside them, for baseline JPEGs).
    #[arg(long, default_value_t = Decode::Auto, help_heading = "Decoding")]
    decode: Decode,
    /// With the GPU decode lane, its share of the images it can take, 0 to 1 (default: starts at
    /// 1, follows the lanes' measured rates and is printed; give it back to decode every image
    /// in the same lane again).
    #[arg(long, hide_short_help = true, help_heading = "Decoding")]
    gpu_share: Option<f32>,
    /// With the share following the lanes' rates, the least it falls to, 0 to 1 (default: none;
    /// with `--shard env` and four ranks or more on this machine, by LOCAL_WORLD_SIZE or
    /// SLURM_NTASKS_PER_NODE, 1: the GPU lane takes every image it can, its assisted path until
    /// the JPEG engines join).
    #[arg(long, hide_short_help = true, help_heading = "Decoding")]
    min_gpu_share: Option<f32>,
    /// Of the GPU lane's baseline JPEGs of 1 Mpx or more, the share its assisted path decodes
    /// on the GPU's cores (exactly as libjpeg-turbo does) beside the JPEG engines, 0 to 1 (of
    /// smaller ones three in four at most, unless a --gpu-share below 1 is given; at 1, with
    /// the share following the rates, the engines stay closed on small files); it also takes
    /// the progressive ones, unless the share is 0.
    #[arg(long, default_value_t = gpufeed::DEFAULT_ASSISTED_SHARE, hide_short_help = true, help_heading = "Decoding")]
    assisted_share: f32,
    /// Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the output keeps a 2x
    /// margin (faster on big photos; further from torchvision).
    #[arg(long, hide_short_help = true, help_heading = "Decoding")]
    dct_scaling: bool,
    /// Write the images to FILE.npy, the path of each row beside it
    ///
    /// Write every processed image, in order, to FILE.npy (output dtype and layout; bf16 as its
    /// raw u16 bits) and the path of each row to FILE.paths.txt (one a line: backslash, tab,
    /// newline and carriage return written \\, \t, \n and \r, and bytes that are not UTF-8
    /// as \xNN, so Python's codecs.escape_decode gives the name's bytes back); with labels,
    /// FILE.labels.txt, and for an ImageFolder FILE.classes.txt (the class name of each label,
    /// one a line); with random transforms, FILE.crops.tsv (path, top, left, height, width,
    /// flipped: the arguments of torchvision's F.resized_crop and F.hflip); with augmentations,
    /// FILE.augment.jsonl (a JSON object a row: the torchvision.transforms.v2.functional calls
    /// that reproduce it, and its mixing). They appear only once the run has succeeded.
    #[arg(long, value_name = "FILE.npy", help_heading = "Run")]
    save: Option<PathBuf>,
    /// Cut every image into views: dinov2, simclr, or a JSON spec (a file or the text)
    ///
    /// Decode every image once and cut it into the preset's views (dinov2: 2 global views of 224
    /// and 8 local of 96; simclr: 2 of 224), or a recipe's of its own: a JSON list of view
    /// groups, as a file (FILE.json) or the text itself (docs/views.md: size, count, scale,
    /// ratio, interpolation, flip, color_jitter, grayscale, blur, solarize per group); each view
    /// with its own crop, flip and colour operations
    /// drawn from --seed, the epoch, the image and the view, as torchvision runs them on a PIL
    /// image: on a GPU, decoded and resized by the GPU decode lane or the CPU threads as
    /// --decode says, coloured and normalized on the GPU; with --cpu, all on the CPU. With --save FILE.npy: FILE.view<K>.npy (uint8, [images, size, size, 3]) for
    /// each view K and FILE.views.jsonl (what each view drew). Images go in the order --shuffle
    /// and --shard give; --resume and --state work as for images.
    #[arg(long, value_name = "PRESET|SPEC", help_heading = "Training", conflicts_with_all = ["train", "augment", "random_erasing", "mixup", "cutmix", "recipe", "max_batches"])]
    views: Option<String>,
    /// Let --save replace existing files (never an image the run reads).
    #[arg(long, hide_short_help = true, help_heading = "Run")]
    overwrite: bool,
    /// Print only the summary, as one JSON object on stdout
    #[arg(long, help_heading = "Run")]
    json: bool,
    /// Print where the time went, stage by stage
    ///
    /// Print where the time went: each stage's seconds (summed over the threads that ran it),
    /// how many times it ran, and the time each took (the JSON summary always has them).
    #[arg(long, help_heading = "Run")]
    profile: bool,
    /// Print the main options
    #[arg(short = 'h', long = "help", action = clap::ArgAction::HelpShort)]
    help: Option<bool>,
    /// Print every option, with what it does in full
    #[arg(long = "help-all", action = clap::ArgAction::HelpLong)]
    help_all: Option<bool>,
}

/// `--shuffle`: with its own seed, or alone (with `--seed`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShuffleArg {
    Seed(u64),
    FromSeed,
}

fn parse_shuffle(text: &str) -> std::result::Result<ShuffleArg, String> {
    match text.trim() {
        "seed" => Ok(ShuffleArg::FromSeed),
        t => t
            .parse()
            .map(ShuffleArg::Seed)
            .map_err(|_| format!("{text:?}: expected a seed (a whole number), or nothing")),
    }
}

/// `--shuffle` followed by a word that is not its seed (DIR, or nothing) is `--shuffle` alone:
/// the arguments with such a `--shuffle` written `--shuffle=seed`, so that it does not take
/// the word as its value.
pub fn bare_shuffle(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut out = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        let seed_follows = args
            .get(i + 1)
            .and_then(|next| next.to_str())
            .is_some_and(|next| next.trim().parse::<u64>().is_ok());
        if arg == "--shuffle" && !seed_follows {
            out.push("--shuffle=seed".into());
        } else {
            out.push(arg.clone());
        }
    }
    out
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

/// `--patches`: a name of [`Patches::NAMES`].
fn parse_patches(text: &str) -> std::result::Result<Patches, String> {
    Patches::from_name(text).map_err(|e| e.to_string())
}

fn parse_version(text: &str) -> Result<(u32, u32), String> {
    let (major, minor) = text.split_once('.').unwrap_or((text, "0"));
    match (major.trim().parse(), minor.trim().parse()) {
        (Ok(major), Ok(minor)) => Ok((major, minor)),
        _ => Err(format!("{text:?} is not a version MAJOR.MINOR (e.g. 12.1)")),
    }
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
    /// The source DIR names: a local folder, or a URL in object storage (whose opening stops
    /// when `interrupt` is set).
    fn source(&self, interrupt: &Arc<AtomicBool>) -> Result<Source> {
        let text = self.dir.to_string_lossy();
        let remote = || {
            RemoteOptions::default()
                .cache_dir(self.cache_dir.clone())
                .cache_limit(self.cache_limit.unwrap_or(u64::MAX))
                .read_budget(self.read_budget)
                .max_requests(self.max_requests)
                .shuffle_window(self.shuffle_window)
                .interrupt(Some(gpufeed::Interrupt::from(interrupt.clone())))
        };
        if self.parquet {
            let options = ParquetOptions::default()
                .image_column(self.image_column.clone())
                .label_column(self.label_column.clone())
                .extra_columns(self.extra_columns.clone())
                .split(self.split.clone());
            if text.contains("://") {
                return Ok(Source::parquet_url(&text, &options, &remote())?);
            }
            return Ok(Source::parquet([&self.dir], &options)?);
        }
        if !self.extra_columns.is_empty() || self.label_column.is_some() {
            return Err("--label-column and --extra-columns are for --parquet".into());
        }
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
        Ok(Source::url(&text, layout, &remote())?)
    }

    /// The library's options for these arguments on `device`, for this process's `shard`.
    fn options(&self, device: Device, shard: Shard) -> Result<Options> {
        let (height, width) = self.size.unwrap_or((self.crop, self.crop));
        let range = |values: &[f64], name: &str| -> Result<DrawRange> {
            match values {
                [min, max] => Ok(DrawRange::new(*min, *max)),
                _ => Err(format!(
                    "--{name} takes two values, MIN,MAX (or MIN MAX); got {}",
                    values.len()
                )
                .into()),
            }
        };
        let random = ResizeMode::RandomResizedCrop {
            height,
            width,
            scale: range(&self.scale, "scale")?,
            ratio: range(&self.ratio, "ratio")?,
        };
        let train = self.train || self.recipe.is_some();
        let mode = match self.resize_mode.as_str() {
            _ if train => random,
            "stretch" => ResizeMode::stretch(height, width),
            "letterbox" => ResizeMode::letterbox(height, width, self.pad),
            "random-resized-crop" => random,
            _ => ResizeMode::ShorterSideThenCenterCrop {
                shorter_side: self.resize,
                height,
                width,
            },
        };
        let patches = self.patch_output()?;
        // timm's flip is the patch output's own.
        let hflip = match patches {
            Some(p) if p.preset == Preset::TimmNaflex => None,
            _ => self.hflip,
        };
        let flip = hflip.unwrap_or(if train { RANDOM_FLIP_CHANCE } else { 0.0 });
        let shuffle = match self.shuffle {
            _ if train => Some(self.seed),
            Some(ShuffleArg::Seed(seed)) => Some(seed),
            Some(ShuffleArg::FromSeed) => Some(self.seed),
            None => None,
        };
        let three = |values: &[f32], name: &str| -> Result<[f32; 3]> {
            <[f32; 3]>::try_from(values).map_err(|_| {
                format!(
                    "--{name} takes three values, R,G,B (or R G B); got {}",
                    values.len()
                )
                .into()
            })
        };
        let augment = match self.recipe {
            Some(recipe) => recipe.augment_options(),
            None => AugmentOptions::default()
                .policy(self.augment)
                .random_erasing(self.random_erasing.map(RandomErasing::new))
                .mixup(self.mixup)
                .cutmix(self.cutmix),
        };
        let jitter = match self.color_jitter.as_deref() {
            None => ColorJitter::default(),
            Some([b, c, s, h]) => ColorJitter {
                brightness: *b,
                contrast: *c,
                saturation: *s,
                hue: *h,
            },
            Some(_) => return Err("--color-jitter takes four values, B C S H".into()),
        };
        let augment = augment.color_jitter(jitter).num_classes(self.num_classes);
        // A patch output reproduces its own Pillow version's rounding.
        let pillow = match patches {
            Some(_) => ResizeOptions::default().pillow_version,
            None => self.pillow_version,
        };
        let max_pixels = match (patches, self.max_pixels) {
            (Some(p), _) if p.preset == Preset::Qwen2Vl => DEFAULT_MAX_PIXELS,
            (_, given) => given.unwrap_or(DEFAULT_MAX_PIXELS),
        };
        let mut options = Options::default()
            .patches(patches)
            .augment(augment)
            .decode(
                DecodeOptions::default()
                    .max_pixels(max_pixels)
                    .max_file_bytes(self.max_file_bytes)
                    .memory_limit(self.decode_memory)
                    .exif_orientation(self.exif_orientation)
                    .gray16(self.gray16)
                    .dct_scaling(self.dct_scaling)
                    .lanes(self.decode)
                    .gpu_share(self.gpu_share)
                    .min_gpu_share(self.min_gpu_share)
                    .assisted_share(self.assisted_share)
                    .planned_epochs(Some(self.epochs)),
            )
            .resize(
                ResizeOptions::default()
                    .mode(mode)
                    .interpolation(self.interpolation)
                    .horizontal_flip(flip)
                    .seed(self.seed)
                    .pillow_version(pillow.0, pillow.1),
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
            );
        if let Some(preset) = self.eval_preset {
            options.resize.mode = preset.resize().mode;
            options.resize.interpolation = preset.resize().interpolation;
            options.output = preset.output(options.output);
        }
        Ok(options)
    }

    /// `--patches` with its settings: each setting given must be one the preset has.
    fn patch_output(&self) -> Result<Option<Patches>> {
        let qwen = self.min_pixels.is_some();
        let siglip = self.max_patches.is_some();
        let timm = self.seq_lens.is_some() || self.tokens_per_batch.is_some();
        let Some(mut patches) = self.patches else {
            if qwen || siglip || timm || self.patch_size.is_some() || self.packing.is_some() {
                return Err("--min-pixels, --max-patches, --patch-size, --seq-lens, \
                            --tokens-per-batch and --packing set a patch-sequence output: give \
                            --patches"
                    .into());
            }
            return Ok(None);
        };
        let refused = |flags: &str, preset: &str| -> Result<Option<Patches>> {
            Err(format!(
                "{flags} applies to --patches {preset}, not {}",
                patches.name()
            )
            .into())
        };
        match patches.preset {
            Preset::Qwen2Vl if siglip || timm => {
                return refused(
                    "--max-patches, --seq-lens or --tokens-per-batch",
                    "siglip2-naflex or timm-naflex",
                )
            }
            Preset::Siglip2Naflex if qwen || timm => {
                return refused(
                    "--min-pixels, --seq-lens or --tokens-per-batch",
                    "qwen2-vl or timm-naflex",
                )
            }
            Preset::TimmNaflex if qwen || siglip => {
                return refused(
                    "--min-pixels or --max-patches",
                    "qwen2-vl or siglip2-naflex",
                )
            }
            Preset::Qwen2Vl => {
                patches.min_pixels = self.min_pixels.unwrap_or(patches.min_pixels);
                patches.max_pixels = self.max_pixels.unwrap_or(patches.max_pixels);
            }
            Preset::Siglip2Naflex => {
                patches.max_patches = self.max_patches.unwrap_or(patches.max_patches);
            }
            Preset::TimmNaflex => {
                if let Some(lens) = &self.seq_lens {
                    patches = patches.seq_lens(lens);
                }
                patches.tokens_per_batch =
                    self.tokens_per_batch.unwrap_or(patches.tokens_per_batch);
                patches.horizontal_flip = self.hflip.unwrap_or(patches.horizontal_flip);
            }
            _ => {}
        }
        patches.patch_size = self.patch_size.unwrap_or(patches.patch_size);
        patches.pillow_version = self.pillow_version;
        if let Some(packing) = &self.packing {
            patches.packed = packing == "packed";
        }
        Ok(Some(patches))
    }

    /// This process's shard, and its launcher (with `--shard env`).
    fn shard(&self) -> Result<(Shard, Option<Launch>)> {
        Ok(match self.shard {
            None => (Shard::default(), None),
            Some(ShardArg::Fixed(shard)) => (shard, None),
            Some(ShardArg::Env) => {
                let launch = Launch::from_env()?;
                (launch.shard(), Some(launch))
            }
        })
    }

    /// The device: explicit `--device N` must work; `--cpu` is the CPU; otherwise the first GPU
    /// (or the launcher's, `local_gpu`), the pipeline falling back to the CPU where no GPU can
    /// be used ([`RunArgs::falls_back`]).
    fn device(&self, local_gpu: Option<usize>) -> Device {
        match self.cpu {
            true => Device::Cpu,
            false => Device::Cuda(self.device.or(local_gpu).unwrap_or(0)),
        }
    }

    /// Whether the device was left to the command line: the pipeline then runs on the CPU where
    /// no GPU can be used, and the command line says why. The pipeline looks for the GPU while
    /// its CPU threads start, so the driver's start (about 0.1 s) does not hold them back.
    fn falls_back(&self) -> bool {
        !self.cpu && self.device.is_none()
    }
}

/// The suffix of the labels file `--save` writes for a source with labels.
const LABELS: &str = ".labels.txt";

/// The suffix of the class names file `--save` writes for an ImageFolder.
const CLASSES: &str = ".classes.txt";

/// The suffix of the extra columns file `--save` writes for a Parquet source with
/// `--extra-columns`.
const EXTRAS: &str = ".extra.tsv";

/// The suffix of the draws file `--save` writes with random transforms.
const CROPS: &str = ".crops.tsv";

/// The suffix of the augmentations file `--save` writes with augmentations.
const AUGMENT: &str = ".augment.jsonl";

/// The suffix of the soft labels file `--save` writes with MixUp or CutMix.
const SOFT_LABELS: &str = ".soft_labels.npy";

/// What one run did, for the summary.
struct Tally {
    reports: Vec<EpochReport>,
    seconds: Vec<f64>,
    uploaded_bytes: usize,
    /// A patch sequence's image tokens, padding aside.
    tokens: usize,
    /// A patch sequence's rows, padding included.
    token_rows: usize,
    /// Seconds the pipeline's build took.
    setup_seconds: f64,
    /// Seconds to the first batch's tensor: the build's, then the first epoch's up to it.
    first_batch_seconds: Option<f64>,
}

/// The run was stopped by Ctrl-C (SIGINT) or SIGTERM: the command line exits with 128 and the
/// signal's number (130, 143), as a shell reports a program the signal ended.
#[derive(Debug)]
pub struct Interrupted {
    /// The signal's number.
    pub signal: i32,
}

impl Interrupted {
    /// The exit status: 128 and the signal's number.
    pub fn status(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(130)
    }
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.signal {
            15 => write!(f, "interrupted (SIGTERM)"),
            _ => write!(f, "interrupted (Ctrl-C)"),
        }
    }
}

impl std::error::Error for Interrupted {}

/// A mistake in the arguments, found before anything ran: the command line exits with 2.
#[derive(Debug)]
pub struct ArgumentError(pub String);

impl std::fmt::Display for ArgumentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgumentError {}

/// Ctrl-C and SIGTERM: the first sets the flag (and the signal's number), which every wait of the
/// run looks at; a second one ends the program at once, with 128 and its number.
struct Signals {
    flag: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

impl Signals {
    fn register() -> Signals {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let flag = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for number in [SIGINT, SIGTERM] {
            // Registering can only fail for a signal that cannot be caught; these can.
            let _ = signal_hook::flag::register_conditional_shutdown(
                number,
                128 + number,
                flag.clone(),
            );
            let _ = signal_hook::flag::register_usize(number, signal.clone(), number as usize);
            let _ = signal_hook::flag::register(number, flag.clone());
        }
        Signals { flag, signal }
    }

    /// The interruption, once a signal came.
    fn interrupted(&self) -> Option<Interrupted> {
        self.flag.load(Ordering::SeqCst).then(|| Interrupted {
            signal: match self.signal.load(Ordering::SeqCst) {
                0 => 2,
                n => n as i32,
            },
        })
    }

    /// `Err(Interrupted)` once a signal came.
    fn check(&self) -> Result<()> {
        match self.interrupted() {
            Some(interrupted) => Err(interrupted.into()),
            None => Ok(()),
        }
    }
}

/// Runs the pipeline as `args` say and prints the summary; returns the device used. With
/// `--json`, stdout is one JSON object whatever happens: the summary (with an `error` field
/// when the run stopped), or, when the run could not start, `{"error": ..., "dir": ...}`. A
/// first Ctrl-C or SIGTERM, wherever the run waits (listing, opening, batches), stops it within
/// moments, removes what `--save` had begun to write and prints the summary so far
/// ([`Interrupted`]); a second one ends it at once.
pub fn run(args: &RunArgs) -> Result<Device> {
    let signals = Signals::register();
    let mut summarized = false;
    let mut outcome = run_and_summarize(args, &signals, &mut summarized);
    // Whatever failed once a signal came (a listing cut short, say), the run was interrupted.
    if let (Err(_), Some(interrupted)) = (&outcome, signals.interrupted()) {
        outcome = Err(interrupted.into());
    }
    if let Err(e) = &outcome {
        if args.json && !summarized {
            out!(
                "{}",
                json!({"error": e.to_string(), "dir": args.dir.display().to_string(),
                       "interrupted": e.is::<Interrupted>()})
            );
        }
    }
    outcome
}

/// The state `--resume` names: at the run's end (epoch E, the beginning of the epoch
/// `--epochs E` ends at) it has nothing left to run; one past it is not this run's.
fn load_resume(args: &RunArgs) -> Result<Option<PipelineState>> {
    let Some(path) = &args.resume else {
        return Ok(None);
    };
    let state = PipelineState::load(path)?;
    if state.epoch() > args.epochs {
        return Err(ArgumentError(format!(
            "--resume: the state is in epoch {}, past the end of this run (it ends where epoch \
             {} would begin, --epochs {}): not a state of this run; give --epochs above {} to \
             go on from it",
            state.epoch(),
            args.epochs,
            args.epochs,
            state.epoch()
        ))
        .into());
    }
    Ok(Some(state))
}

/// The files of `--save`, when asked for: the `.npy` and the paths file; with labels,
/// FILE.labels.txt, one label a row, and for an ImageFolder FILE.classes.txt (written here);
/// with random transforms, FILE.crops.tsv, one row of draws a row; with augmentations
/// FILE.augment.jsonl, and with mixing FILE.soft_labels.npy.
fn open_saver(args: &RunArgs, source: &Source, options: &Options) -> Result<Option<Saver>> {
    let Some(path) = &args.save else {
        return Ok(None);
    };
    let mut extra = Vec::new();
    if source.has_labels() {
        extra.push(LABELS);
    }
    if options.resize.is_random() {
        extra.push(CROPS);
    }
    if options.augment.is_on() {
        extra.push(AUGMENT);
    }
    if options.augment.mixes() {
        extra.push(SOFT_LABELS);
    }
    let classes = source.class_names();
    if classes.is_some() {
        extra.push(CLASSES);
    }
    if let Some(patches) = &options.patches {
        extra.extend(patch_files(patches));
    }
    if source.extras().is_some() {
        extra.push(EXTRAS);
    }
    let mut saver = Saver::create(path, options.output.dtype, source, args.overwrite, &extra)?;
    if options.patches.is_some() {
        // Where the first image's rows begin; each batch adds where the next ones do.
        saver.append_values::<i64>(".cu_seqlens.npy", &[0], &[])?;
    }
    if let Some(extras) = source.extras() {
        let header: Vec<String> = extras.names.iter().map(|n| escape_line(n)).collect();
        saver.append_lines(EXTRAS, &[header.join("\t")])?;
    }
    if let Some(classes) = classes {
        let lines: Vec<String> = classes.iter().map(|c| escape_line(c)).collect();
        saver.append_lines(CLASSES, &lines)?;
    }
    Ok(Some(saver))
}

/// The files of [`PATCH_FILES`] a patch sequence of `patches` has: each image's grid and the
/// rows' offsets always; padded, each row's mask and patch (row, column); SigLIP2's spatial
/// shapes.
fn patch_files(patches: &Patches) -> Vec<&'static str> {
    PATCH_FILES
        .iter()
        .map(|&(suffix, _)| suffix)
        .filter(|&suffix| match suffix {
            ".mask.npy" | ".coordinates.npy" => !patches.packed,
            ".spatial_shapes.npy" => patches.preset == Preset::Siglip2Naflex,
            _ => true,
        })
        .collect()
}

/// Removes the temporary files (`STATE.partial-PID`) that runs killed while writing `--state`
/// left beside it: those of processes that no longer run.
fn clean_state_partials(state: &Path) {
    let (Some(name), folder) = (state.file_name(), state.parent()) else {
        return;
    };
    let folder = match folder {
        Some(f) if !f.as_os_str().is_empty() => f,
        _ => Path::new("."),
    };
    let prefix = format!("{}.partial-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let pid = file
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Refuses `--state` naming a file `--save` writes (or the file `--resume` reads beside it).
fn check_paths(args: &RunArgs) -> Result<()> {
    let (Some(state), Some(save)) = (&args.state, &args.save) else {
        return Ok(());
    };
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let state_path = absolute(state);
    if let Some(clash) = set_files(save).iter().find(|f| absolute(f) == state_path) {
        return Err(ArgumentError(format!(
            "--state {} is a file --save {} writes ({}): give the state another name",
            state.display(),
            save.display(),
            clash.display()
        ))
        .into());
    }
    Ok(())
}

fn run_and_summarize(args: &RunArgs, signals: &Signals, summarized: &mut bool) -> Result<Device> {
    check_paths(args)?;
    if let Some(state) = &args.state {
        clean_state_partials(state);
    }
    if args.epochs == 0 {
        return Err(ArgumentError("--epochs must be at least 1".into()).into());
    }
    if let Some(spec) = &args.views {
        let views = gpufeed::views::Views::load(spec).map_err(flag_names)?;
        let resume = load_resume(args)?;
        let (shard, launch) = args.shard()?;
        let device = args.device(launch.map(|l| l.local_rank));
        let mut options = args
            .options(device, shard)
            .map_err(|e| ArgumentError(e.to_string()))?;
        options.runtime.cpu_fallback = args.falls_back();
        let source = args.source(&signals.flag)?;
        let device = crate::views::run_views(crate::views::ViewsRun {
            source,
            views: views
                .seed(args.seed)
                .pillow_version(args.pillow_version.0, args.pillow_version.1),
            options,
            resume,
            state: args.state.as_deref(),
            epochs: args.epochs,
            save: args.save.as_deref(),
            overwrite: args.overwrite,
            json: args.json,
            profile: args.profile,
            stop: &signals.flag,
        })?;
        *summarized = true;
        return Ok(device);
    }
    let resume = load_resume(args)?;
    let (shard, launch) = args.shard()?;
    let local_gpu = launch.map(|l| l.local_rank);
    // The device's context is made while the source is listed.
    let device_opening = args.device(local_gpu).open_early();
    let opening = Instant::now();
    let source = args.source(&signals.flag)?;
    signals.check()?;
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
    let left_out = source.left_out().to_vec();
    let mut options = args
        .options(args.device(local_gpu), shard)
        .map_err(|e| ArgumentError(e.to_string()))?;
    options.runtime.cpu_fallback = args.falls_back();
    if let Some(launch) = launch {
        options.decode = launch.decode_options(options.decode);
    }
    let mut saver = open_saver(args, &source, &options)?;
    let extras = source.extras().cloned();
    // The name of each row in the files `--save` writes: the file's bytes, escaped.
    let row_names: Vec<String> = match &args.save {
        Some(_) => (0..source.len()).map(|i| row_name(&source, i)).collect(),
        None => Vec::new(),
    };
    signals.check()?;
    let setup = Instant::now();
    let mut pipeline = match &resume {
        Some(state) => Pipeline::with_options_from(source, options, state),
        None => Pipeline::with_options(source, options),
    }
    .map_err(flag_names)?;
    let setup_seconds = setup.elapsed().as_secs_f64();
    drop(device_opening);
    if let Some(why) = pipeline.cpu_fallback() {
        eprintln!(
            "gpufeed: CUDA is not available: {why}\ngpufeed: running the CPU stages and the CPU \
             normalize instead (--device N requires a GPU, --cpu silences this)"
        );
    }
    let device = pipeline.options().runtime.device;
    let progress = if std::io::stderr().is_terminal() && !args.json {
        let bar = ProgressBar::new(pipeline.len() as u64 * args.epochs);
        let rate = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.0} images/s", state.per_sec());
        };
        if let Ok(style) =
            ProgressStyle::default_bar().template("{bar:40} {pos}/{len} images {rate} {eta}")
        {
            bar.set_style(style.with_key("rate", rate));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut tally = Tally {
        reports: Vec::new(),
        seconds: Vec::new(),
        uploaded_bytes: 0,
        tokens: 0,
        token_rows: 0,
        setup_seconds,
        first_batch_seconds: None,
    };
    let rows = Rows {
        saver: saver.as_mut(),
        names: &row_names,
        extras,
        saved: 0,
        token_rows: 0,
    };
    let mut outcome = run_epochs(args, &mut pipeline, rows, &progress, signals, &mut tally);
    progress.finish_and_clear();
    let interrupted = signals.interrupted();
    if let (Err(_), Some(signal)) = (&outcome, &interrupted) {
        outcome = Err(Interrupted {
            signal: signal.signal,
        }
        .into());
    }
    let summary = Summary {
        args,
        pipeline: &pipeline,
        tally: &tally,
        unreadable,
        left_out,
        saved: Vec::new(),
        interrupted: interrupted.is_some(),
        opened,
        open_seconds,
    };
    let skipped = summary.skipped().len();
    let mut every_skipped = false;
    if outcome.is_ok() && summary.images() == 0 && skipped > 0 {
        every_skipped = true;
        outcome = Err(format!(
            "every image was skipped ({skipped}), none was delivered: see the reasons above"
        )
        .into());
    }
    let mut saved = Vec::new();
    if outcome.is_ok() {
        if let Some(saver) = saver.take() {
            match saver.finish() {
                Ok(files) => saved = files,
                Err(e) => outcome = Err(e),
            }
        }
    }
    // A run that did not finish leaves no file behind.
    drop(saver);
    let summary = Summary { saved, ..summary };
    if args.json {
        let mut value = summary.json();
        if let Err(e) = &outcome {
            value["error"] = json!(e.to_string());
        }
        out!("{value}");
        *summarized = true;
    } else if outcome.is_ok() || summary.interrupted || every_skipped {
        // Under --on-error fail, the error alone: it names the image that stopped the run.
        summary.print();
    }
    outcome?;
    Ok(device)
}

/// The name `--save` writes for row `index` of `source`: a file's path as its bytes, escaped
/// ([`escape_bytes`]), else the id.
fn row_name(source: &Source, index: usize) -> String {
    use std::os::unix::ffi::OsStrExt;
    match source.path(index) {
        Some(path) => escape_bytes(path.as_os_str().as_bytes()),
        None => escape_line(source.id(index).unwrap_or_default()),
    }
}

/// The library's option names in an error as this command line's flags: an
/// [`ArgumentError`].
pub(crate) fn flag_names(error: gpufeed::Error) -> Box<dyn std::error::Error> {
    match error {
        gpufeed::Error::InvalidOption { option, reason } => {
            let flag = match option {
                "horizontal_flip" => "--hflip".to_string(),
                "resize" => "--size (or --crop, --resize)".to_string(),
                "mean/std" => "--mean/--std".to_string(),
                "shard" => "--shard".to_string(),
                "mixup/cutmix" => "--mixup/--cutmix".to_string(),
                "memory_limit" => "--decode-memory".to_string(),
                other => format!("--{}", other.replace('_', "-")),
            };
            ArgumentError(format!("invalid option {flag}: {reason}")).into()
        }
        other => other.into(),
    }
}

/// Where the rows go: the files of `--save`, with each source image's name in them.
struct Rows<'a> {
    saver: Option<&'a mut Saver>,
    names: &'a [String],
    /// A Parquet source's extra columns, a row per source image.
    extras: Option<Arc<Extras>>,
    /// Rows saved so far: a mixed row's partner is named by its row in the saved files.
    saved: usize,
    /// A patch sequence's token rows saved so far.
    token_rows: usize,
}

/// Runs the epochs up to `args.epochs` (from the resumed one on), saving the rows and the state
/// on request, up to `args.max_batches` batches, until done, failed or interrupted.
fn run_epochs(
    args: &RunArgs,
    pipeline: &mut Pipeline,
    mut rows: Rows,
    progress: &ProgressBar,
    signals: &Signals,
    tally: &mut Tally,
) -> Result<()> {
    let save_state = |pipeline: &Pipeline| -> Result<()> {
        if let Some(path) = &args.state {
            pipeline.state().save(path)?;
        }
        Ok(())
    };
    let mut batches = 0;
    let first = pipeline.epoch();
    for epoch in first..args.epochs {
        if args.max_batches.is_some_and(|max| batches >= max) {
            break;
        }
        let augments = pipeline.options().augment.is_on();
        let size = pipeline.options().resize.output_size();
        let start = Instant::now();
        let mut last = None;
        let outcome: Result<()> = (|| {
            if epoch > first {
                pipeline.next_epoch()?;
            }
            loop {
                signals.check()?;
                let batch = match pipeline.wait_batch(Duration::from_millis(20))? {
                    WaitedBatch::Ready(batch) => *batch,
                    WaitedBatch::NotYet => continue,
                    WaitedBatch::EpochEnd => break,
                };
                tally.uploaded_bytes += batch.uploaded_bytes();
                if let Some(patches) = batch.patches() {
                    tally.tokens += patches.tokens_per_image().iter().sum::<usize>();
                    tally.token_rows += patches.layout().rows;
                }
                if tally.first_batch_seconds.is_none() {
                    batch.images().synchronize()?;
                    tally.first_batch_seconds =
                        Some(tally.setup_seconds + start.elapsed().as_secs_f64());
                }
                progress.inc((batch.len() + batch.skipped().len()) as u64);
                if let Some(saver) = rows.saver.as_deref_mut() {
                    if let Some(patches) = batch.patches() {
                        save_patches(saver, &batch, patches, rows.names, rows.token_rows)?;
                        save_extras(saver, &batch, rows.extras.as_deref())?;
                        rows.token_rows += patches.layout().rows;
                    } else {
                        let augmented = augments.then_some((rows.saved, size));
                        save_batch(saver, &batch, rows.names, rows.extras.as_deref(), augmented)?;
                    }
                    rows.saved += batch.len();
                }
                save_state(pipeline)?;
                last = Some(batch);
                batches += 1;
                if args.max_batches.is_some_and(|max| batches >= max) {
                    break;
                }
            }
            // Once the epoch's end is seen, the state is the next epoch's beginning.
            save_state(pipeline)?;
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

/// Appends a batch to the files of `--save`: its rows, their names, labels and draws, and with
/// `augmented` (the rows saved before it, and the output size) its augmentations' calls.
fn save_batch(
    saver: &mut Saver,
    batch: &Batch,
    names: &[String],
    extras: Option<&Extras>,
    augmented: Option<(usize, (u32, u32))>,
) -> Result<()> {
    let name = |i: usize| names.get(i).map_or("", String::as_str);
    let row_names: Vec<&str> = batch.indices().iter().map(|&i| name(i)).collect();
    saver.append(&batch.images().to_host()?, &row_names)?;
    if let Some(labels) = batch.labels() {
        let lines: Vec<String> = labels.iter().map(u32::to_string).collect();
        saver.append_lines(LABELS, &lines)?;
    }
    save_extras(saver, batch, extras)?;
    if let Some(soft) = batch.soft_labels() {
        saver.append_npy(SOFT_LABELS, &soft.to_host()?)?;
    }
    if let Some(crops) = batch.crops() {
        let lines: Vec<String> = row_names
            .iter()
            .zip(crops)
            .map(|(row, c)| {
                format!(
                    "{row}\t{}\t{}\t{}\t{}\t{}",
                    c.top,
                    c.left,
                    c.height,
                    c.width,
                    u8::from(c.flipped)
                )
            })
            .collect();
        saver.append_lines(CROPS, &lines)?;
    }
    if let Some((first, (height, width))) = augmented {
        saver.append_lines(AUGMENT, &augment_lines(batch, first, height, width))?;
    }
    Ok(())
}

/// Appends the Parquet source's extra columns of a batch's rows to `--save`'s `.extra.tsv`.
fn save_extras(saver: &mut Saver, batch: &Batch, extras: Option<&Extras>) -> Result<()> {
    let Some(extras) = extras else {
        return Ok(());
    };
    let lines: Vec<String> = batch
        .indices()
        .iter()
        .map(|&i| {
            let values = extras.rows.get(i).map_or(&[][..], Vec::as_slice);
            let cells: Vec<String> = values.iter().map(|v| escape_line(&v.to_string())).collect();
            cells.join("\t")
        })
        .collect();
    saver.append_lines(EXTRAS, &lines)
}

/// Appends a patch-sequence batch to the files of `--save`: its tokens as rows of the
/// `.npy` (`[rows, patch_dim]`, padding included), its images' names and labels, and the side
/// tensors of [`patch_files`] (`first_row`: the token rows saved before it).
fn save_patches(
    saver: &mut Saver,
    batch: &Batch,
    patches: &BatchPatches,
    names: &[String],
    first_row: usize,
) -> Result<()> {
    let name = |i: usize| names.get(i).map_or("", String::as_str);
    let row_names: Vec<String> = batch
        .indices()
        .iter()
        .map(|&i| name(i).to_string())
        .collect();
    saver.append_vectors("", &batch.images().to_host()?)?;
    saver.append_lines(".paths.txt", &row_names)?;
    if let Some(labels) = batch.labels() {
        let lines: Vec<String> = labels.iter().map(u32::to_string).collect();
        saver.append_lines(LABELS, &lines)?;
    }
    let grids: Vec<i64> = patches.grids().into_iter().flatten().collect();
    saver.append_values(".grids.npy", &grids, &[3])?;
    let starts: Vec<i64> = patches
        .cu_seqlens()
        .iter()
        .skip(1)
        .map(|&row| (first_row + row as usize) as i64)
        .collect();
    saver.append_values(".cu_seqlens.npy", &starts, &[])?;
    if saver.has(".mask.npy") {
        saver.append_values(".mask.npy", &patches.mask(), &[])?;
    }
    if saver.has(".coordinates.npy") {
        let coordinates: Vec<i64> = patches.coordinates().into_iter().flatten().collect();
        saver.append_values(".coordinates.npy", &coordinates, &[2])?;
    }
    if saver.has(".spatial_shapes.npy") {
        let shapes: Vec<i64> = patches.spatial_shapes().into_iter().flatten().collect();
        saver.append_values(".spatial_shapes.npy", &shapes, &[2])?;
    }
    Ok(())
}

/// One JSON line per row of `batch` (whose first row is row `first` of the saved files): its
/// id, the `torchvision.transforms.v2.functional` calls that reproduce it in order, from
/// `resized_crop` (and `horizontal_flip`) of the source image through its augmentations, and
/// the batch's mixing with the partner row.
fn augment_lines(batch: &Batch, first: usize, height: u32, width: u32) -> Vec<String> {
    let n = batch.len();
    (0..n)
        .map(|row| {
            let mut calls = Vec::new();
            if let Some(c) = batch.crops().and_then(|c| c.get(row)) {
                calls.push(format!(
                    "[\"resized_crop\", {{\"top\": {}, \"left\": {}, \"height\": {}, \"width\": {}, \
                     \"size\": [{height}, {width}]}}]",
                    c.top, c.left, c.height, c.width
                ));
                if c.flipped {
                    calls.push("[\"horizontal_flip\", {}]".to_string());
                }
            }
            if let Some(ops) = batch.augmentations().and_then(|a| a.get(row)) {
                for op in ops {
                    calls.push(format!("[\"{}\", {}]", op.function(), op.json_arguments()));
                }
            }
            let mix = batch.mix().map_or("null".to_string(), |m| {
                m.json(first + gpufeed::Mix::partner(row, n))
            });
            format!(
                "{{\"row\": {}, \"id\": {}, \"calls\": [{}], \"mix\": {mix}}}",
                first + row,
                Value::from(batch.ids()[row].as_str()),
                calls.join(", ")
            )
        })
        .collect()
}

/// The summary of a run, in words or as JSON.
struct Summary<'a> {
    args: &'a RunArgs,
    pipeline: &'a Pipeline,
    tally: &'a Tally,
    unreadable: Vec<Value>,
    /// Files the listing left out, by extension.
    left_out: Vec<(String, usize)>,
    /// The files `--save` wrote.
    saved: Vec<PathBuf>,
    /// Whether Ctrl-C stopped the run.
    interrupted: bool,
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
        "cache_rejected": reads.cache_rejected,
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

    /// What the output would have uploaded as `f32`: the images, or a patch sequence's tokens.
    fn f32_bytes(&self) -> usize {
        match &self.pipeline.options().patches {
            Some(patches) => self.tally.token_rows * patches.patch_dim() * 4,
            None => self.images() * self.image_bytes() * 4,
        }
    }

    /// What the output would have uploaded as `u8` on a GPU: the images' pixels (a patch
    /// sequence's tokens each hold `patch_size`² of them, once, whatever its temporal frames).
    fn u8_bytes(&self) -> usize {
        match &self.pipeline.options().patches {
            Some(patches) => {
                let side = patches.patch_size as usize;
                self.tally.tokens * side * side * 3
            }
            None => self.images() * self.image_bytes(),
        }
    }

    /// The patch-sequence output, as JSON (`null` for images).
    fn patches_json(&self) -> Value {
        self.pipeline.options().patches.map_or(Value::Null, |p| {
            json!({"preset": p.name(), "patch_size": p.patch_size, "patch_dim": p.patch_dim(),
                       "packed": p.packed, "min_pixels": p.min_pixels, "max_pixels": p.max_pixels,
                       "max_patches": p.max_patches, "seq_lens": p.seq_lens.as_slice(),
                       "tokens_per_batch": p.tokens_per_batch})
        })
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
        let epochs = epochs_json(
            self.tally
                .reports
                .iter()
                .zip(self.tally.seconds.iter().copied()),
        );
        json!({
            "dir": self.args.dir.display().to_string(),
            "device": self.pipeline.device_description(),
            "decode": self.pipeline.decode_description(),
            "images": images,
            "skipped": errors.len(),
            "errors": errors,
            "unreadable_folders": self.unreadable,
            "left_out": self
                .left_out
                .iter()
                .map(|(extension, count)| (extension.clone(), json!(count)))
                .collect::<serde_json::Map<String, Value>>(),
            "interrupted": self.interrupted,
            "class_names": self.pipeline.class_names(),
            "saved": self.saved.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "dropped": self.tally.reports.iter().map(|r| r.dropped).sum::<usize>(),
            "padded": self.tally.reports.iter().map(|r| r.padded).sum::<usize>(),
            "shard": options.batching.shard.to_string(),
            "batches": self.tally.reports.iter().map(|r| r.batches).sum::<usize>(),
            "epochs": epochs,
            "batch_size": options.batching.batch_size,
            "dtype": options.output.dtype.name(),
            "layout": options.output.layout.name(),
            "setup_seconds": self.tally.setup_seconds,
            "first_batch_seconds": self.tally.first_batch_seconds,
            "seconds": self.seconds(),
            "images_per_s": self.images_per_s(),
            "uploaded_bytes": self.tally.uploaded_bytes,
            "decoded_by": decoded_by_json(&self.tally.reports),
            "gpu_share": self.pipeline.gpu_share(),
            "state": self.state_json(),
            "f32_bytes": self.f32_bytes(),
            "u8_bytes": self.u8_bytes(),
            "tokens": self.tally.tokens,
            "token_rows": self.tally.token_rows,
            "patches": self.patches_json(),
            "peak_rss_bytes": peak_rss_bytes(),
            "profile": profile_json(&self.pipeline.profile()),
            "open_seconds": self.open_seconds,
            "opened": self.opened.as_ref().map(|r| reads_json(r, self.open_seconds)),
        })
    }

    /// Where the run ended, as `--resume` would go on from it.
    fn state_json(&self) -> Value {
        let state = self.pipeline.state();
        json!({"epoch": state.epoch(), "batches": state.batches(), "rows": state.rows(),
               "position": state.position(), "global_position": state.global_position()})
    }

    fn print(&self) {
        let options = self.pipeline.options();
        let (height, width) = options.resize.output_size();
        let images = self.images();
        let skipped = self.skipped();
        let f32_bytes = self.f32_bytes();
        out!(
            "gpufeed run: {} on {}",
            self.args.dir.display(),
            self.pipeline.device_description()
        );
        match &options.patches {
            Some(patches) => out!(
                "  output      {images} images as {} tokens of {} values ({}, {}; {} rows) {}",
                self.tally.tokens,
                patches.patch_dim(),
                patches.name(),
                if patches.packed { "packed" } else { "padded" },
                self.tally.token_rows,
                options.output.dtype
            ),
            None => out!(
                "  output      {images} x [{}] {} {}{}",
                match options.output.layout {
                    Layout::Nhwc => format!("{height}, {width}, 3"),
                    _ => format!("3, {height}, {width}"),
                },
                options.output.dtype,
                options.output.layout,
                if self.args.bgr { " bgr" } else { "" }
            ),
        }
        let batches: usize = self.tally.reports.iter().map(|r| r.batches).sum();
        out!("  images      {images} in {batches} batches");
        if self.tally.reports.len() > 1 {
            out!("  epochs      {}", self.tally.reports.len());
        }
        let by_gpu: usize = self.tally.reports.iter().map(|r| r.decoded_by_gpu).sum();
        out!("  decode      {}", self.pipeline.decode_description());
        if by_gpu > 0 || self.pipeline.gpu_share().is_some() {
            let assisted: usize = self
                .tally
                .reports
                .iter()
                .map(|r| r.decoded_by_assisted)
                .sum();
            out!(
                "  decoded     {} by the CPU threads, {by_gpu} by the GPU decode lane \
                 ({} by the JPEG engines, {assisted} by the assisted path)",
                images - by_gpu,
                by_gpu - assisted
            );
        }
        if !self.left_out.is_empty() {
            let counts: Vec<String> = self
                .left_out
                .iter()
                .map(|(extension, count)| match extension.as_str() {
                    "" => format!("{count} without an extension"),
                    _ => format!("{count} .{extension}"),
                })
                .collect();
            out!(
                "  left out    {} (not image files by their extension)",
                counts.join(", ")
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
            self.tally.setup_seconds
        );
        if let Some(first) = self.tally.first_batch_seconds {
            out!("  first batch {first:.3} s (the build, then the first epoch up to it)");
        }
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
                human_bytes(self.u8_bytes()),
                human_bytes(f32_bytes)
            );
        }
        if let Some(path) = &self.args.state {
            let state = self.pipeline.state();
            out!(
                "  state       {}: epoch {}, {} batches in (--resume goes on from there)",
                path.display(),
                state.epoch(),
                state.batches()
            );
        }
        if !self.saved.is_empty() {
            let names: Vec<String> = self.saved.iter().map(|p| p.display().to_string()).collect();
            out!("  saved       {}", names.join(", "));
        }
        if self.interrupted {
            out!("  interrupted (Ctrl-C): the figures above are the run's so far; nothing saved");
        }
        if self.args.profile {
            out!("  where the time went (seconds summed over threads):");
            for line in self.pipeline.profile().to_string().lines() {
                out!("    {line}");
            }
        }
    }
}

/// Each epoch's entry of a summary's `epochs`, from its report and seconds.
pub(crate) fn epochs_json<'a>(
    epochs: impl Iterator<Item = (&'a gpufeed::EpochReport, f64)>,
) -> Vec<Value> {
    epochs
        .map(|(r, s)| {
            let mut epoch = json!({"epoch": r.epoch, "images": r.images,
                   "batches": r.batches, "padded": r.padded, "skipped": r.skipped.len(),
                   "dropped": r.dropped, "seconds": s, "complete": r.complete,
                   "decoded_by": {"cpu": r.decoded_by_cpu, "gpu": r.decoded_by_gpu,
                                  "gpu_assisted": r.decoded_by_assisted}});
            if let Some(reads) = &r.reads {
                epoch["reads"] = reads_json(reads, s);
            }
            epoch
        })
        .collect()
}

/// A summary's `decoded_by`: the images each lane decoded over `reports`.
pub(crate) fn decoded_by_json<'a>(
    reports: impl IntoIterator<Item = &'a gpufeed::EpochReport> + Clone,
) -> Value {
    let sum = |lane: fn(&gpufeed::EpochReport) -> usize| -> usize {
        reports.clone().into_iter().map(lane).sum()
    };
    json!({
        "cpu": sum(|r| r.decoded_by_cpu),
        "gpu": sum(|r| r.decoded_by_gpu),
        "gpu_assisted": sum(|r| r.decoded_by_assisted),
    })
}

/// Where the time went, for the JSON summary: each stage's seconds and count by its name.
pub(crate) fn profile_json(profile: &gpufeed::Profile) -> Value {
    profile
        .stages
        .iter()
        .map(|s| {
            (
                s.stage.name().to_string(),
                json!({"seconds": s.seconds, "count": s.count}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
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
