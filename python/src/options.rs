//! Keyword arguments of `gpufeed.Pipeline(...)`: one table, [`KEYWORDS`], with a line per
//! keyword (its name, Python type, default, what it does, and how it is applied). The error for
//! a misspelt keyword, the signature and docstring `help(gpufeed.Pipeline)` shows
//! ([`crate::signature`]) and the `.pyi` stub (checked against it by the tests) all come from
//! it. Defaults are read from the builder's own, and enum names parse with the library's
//! `FromStr`, so they match the command line's.

use std::str::FromStr;

use gpufeed::patches::{EvalPreset, Patches, Preset};
use gpufeed::views::Views;
use gpufeed::{
    Augment, ChannelOrder, DType, Decode, Device, DrawRange, Gray16, Interpolation, LastBatch,
    Layout, OnError, Options, PipelineBuilder, Recipe, RemoteOptions, ResizeMode, ResizeOptions,
    ShardBalance, RANDOM_CROP_RATIO, RANDOM_CROP_SCALE, RANDOM_FLIP_CHANCE,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};

/// What the keywords set so far: the builder, and the parts of the resize mode, which several
/// keywords describe together (`resize_mode`, `resize`, `crop`, `pad`).
pub(crate) struct Keywords {
    builder: Option<PipelineBuilder>,
    mode: String,
    /// The `resize` keyword, if given.
    shorter_side: Option<u32>,
    /// The builder's default shorter side.
    default_shorter_side: Option<u32>,
    size: (u32, u32),
    pad: u8,
    mean: [f32; 3],
    std: [f32; 3],
    /// RandomResizedCrop's ranges.
    scale: DrawRange,
    ratio: DrawRange,
    /// `train=True`: ImageNet's training transform.
    train: bool,
    /// `recipe=`: a training recipe, completed when every keyword is read.
    recipe: Option<Recipe>,
    /// The `hflip`, `seed` and `shuffle` keywords, which `train` completes.
    hflip: Option<f64>,
    seed: u64,
    shuffle: Option<bool>,
    /// Whether `resize_mode` was given.
    mode_given: bool,
    /// The `max_pixels` keyword: the decode limit, or Qwen2-VL's budget.
    max_pixels: Option<u64>,
    /// `patches=`: the preset, its settings applied when every keyword is read.
    patches: Option<Patches>,
    patch_settings: PatchSettings,
    /// `eval_preset=`.
    eval_preset: Option<EvalPreset>,
    /// `views=`: the preset's or the spec's groups, drawn from `seed`.
    views: Option<Views>,
}

/// The patch output's settings given as keywords.
#[derive(Default)]
struct PatchSettings {
    min_pixels: Option<u64>,
    max_patches: Option<u32>,
    patch_size: Option<u32>,
    seq_lens: Option<Vec<u32>>,
    tokens_per_batch: Option<u64>,
    packed: Option<bool>,
}

type Apply = fn(&mut Keywords, &Bound<'_, PyAny>) -> PyResult<()>;

/// One keyword of `gpufeed.Pipeline(...)`.
pub(crate) struct Keyword {
    /// The keyword's name.
    pub(crate) name: &'static str,
    /// Its type, as the stub and the signature write it (names from `typing`, and `os`).
    pub(crate) python_type: &'static str,
    /// Its default, a Python literal: passing it is the same as leaving the keyword out.
    pub(crate) default: fn(&Defaults) -> String,
    /// What it does, in a sentence or two.
    pub(crate) doc: &'static str,
    /// How a value given is applied; `None` for the keywords `Pipeline()` reads itself (the
    /// source, its labels, the state to resume from, the object-storage options).
    apply: Option<Apply>,
}

/// What the keywords default to: the builder's options, the keywords' reading of them, and the
/// object-storage defaults.
pub(crate) struct Defaults {
    options: Options,
    keywords: Keywords,
    remote: RemoteOptions,
}

impl Defaults {
    pub(crate) fn new() -> Defaults {
        let keywords = Keywords::new();
        Defaults {
            options: *PipelineBuilder::default().options(),
            keywords,
            remote: RemoteOptions::default(),
        }
    }
}

/// A value written as a Python literal (the defaults of the signature and the stub).
trait PythonLiteral {
    fn literal(&self) -> String;
}

impl PythonLiteral for bool {
    fn literal(&self) -> String {
        if *self { "True" } else { "False" }.to_string()
    }
}

macro_rules! integer_literal {
    ($($ty:ty),+) => {$(
        impl PythonLiteral for $ty {
            fn literal(&self) -> String {
                self.to_string()
            }
        }
    )+};
}
integer_literal!(u8, u32, u64, usize);

impl PythonLiteral for f32 {
    fn literal(&self) -> String {
        // `{:?}` writes the shortest text that reads back as this value, with a point: "1.0".
        format!("{self:?}")
    }
}

impl PythonLiteral for f64 {
    fn literal(&self) -> String {
        format!("{self:?}")
    }
}

impl PythonLiteral for &str {
    fn literal(&self) -> String {
        format!("{self:?}")
    }
}

impl PythonLiteral for String {
    fn literal(&self) -> String {
        self.as_str().literal()
    }
}

impl<T: PythonLiteral> PythonLiteral for Option<T> {
    fn literal(&self) -> String {
        self.as_ref().map_or_else(|| "None".to_string(), T::literal)
    }
}

impl<A: PythonLiteral, B: PythonLiteral> PythonLiteral for (A, B) {
    fn literal(&self) -> String {
        format!("({}, {})", self.0.literal(), self.1.literal())
    }
}

impl PythonLiteral for [f32; 3] {
    fn literal(&self) -> String {
        format!(
            "({}, {}, {})",
            self[0].literal(),
            self[1].literal(),
            self[2].literal()
        )
    }
}

/// No default of its own: `None`, whose meaning the keyword's doc gives.
struct NoValue;

impl PythonLiteral for NoValue {
    fn literal(&self) -> String {
        "None".to_string()
    }
}

/// `keyword!("name": "type" = |d| default, "doc", |k, v: Type| body)`: a keyword applied to the
/// builder. The value is extracted as `Type` (a `TypeError` naming the keyword otherwise) and
/// `body`, a `PyResult<()>`, applies it. Without the last part, a keyword `Pipeline()` reads
/// itself.
macro_rules! keyword {
    ($name:literal: $ty:literal = |$d:ident| $default:expr, $doc:literal $(,)?) => {
        Keyword {
            name: $name,
            python_type: $ty,
            default: |$d: &Defaults| PythonLiteral::literal(&$default),
            doc: $doc,
            apply: None,
        }
    };
    ($name:literal: $ty:literal = |$d:ident| $default:expr, $doc:literal,
     |$k:ident, $v:ident: $vty:ty| $body:expr $(,)?) => {
        Keyword {
            name: $name,
            python_type: $ty,
            default: |$d: &Defaults| PythonLiteral::literal(&$default),
            doc: $doc,
            apply: Some(
                |$k: &mut Keywords, value: &Bound<'_, PyAny>| -> PyResult<()> {
                    let $v: $vty = extract(value, $name)?;
                    $body
                },
            ),
        }
    };
}

/// Every keyword of `gpufeed.Pipeline(...)`, in the signature's order. The `.pyi` stub lists the
/// same, with the same types and defaults (a test compares them).
pub(crate) const KEYWORDS: &[Keyword] = &[
    keyword!("source": "Union[str, os.PathLike[str], None]" = |_d| NoValue,
        "A folder of images, searched recursively (or of class subfolders, or of tar shards), or \
         a URL in object storage: s3://, gs://, az:// or https://, a prefix, one object or a \
         brace pattern (train-{0000..0127}.tar)."),
    keyword!("paths": "Union[str, os.PathLike[str], Sequence[Union[str, os.PathLike[str]]], None]"
        = |_d| NoValue,
        "The images as a list of paths (or one path), in this order, instead of a folder."),
    keyword!("labels": "Optional[Sequence[int]]" = |_d| NoValue,
        "A class label for each of paths=[...]."),
    keyword!("image_folder": "bool" = |_d| false,
        "The folder is an ImageFolder: each subfolder a class, labels from the sorted names \
         (batch.labels, pipe.class_names)."),
    keyword!("webdataset": "bool" = |_d| false,
        "The folder holds WebDataset tar shards: a sample's image member by extension, its label \
         from its .cls member."),
    keyword!("parquet": "bool" = |_d| false,
        "The source is Parquet: a file, a glob over file names, a folder of .parquet files, a \
         Hugging Face dataset folder (data/<split>-*.parquet) or a URL; a row an image, row \
         groups shuffled and sharded as tar shards are."),
    keyword!("image_column": "str" = |_d| "image",
        "For parquet=True: the image column (binary, or a struct with a binary bytes field)."),
    keyword!("label_column": "Optional[str]" = |_d| NoValue,
        "For parquet=True: the label column, integers or text numbered in sorted order (None: \
         label, if the files have it)."),
    keyword!("extra_columns": "Optional[Sequence[str]]" = |_d| NoValue,
        "For parquet=True: columns carried beside each row (pipe.extras(index))."),
    keyword!("split": "str" = |_d| "train",
        "For a Hugging Face dataset folder with parquet=True: the split read."),
    keyword!("state": "Union[dict[str, Any], str, None]" = |_d| NoValue,
        "A state_dict() (or its JSON text) to go on from: the batches are those the pipeline \
         that saved it would have given next."),
    keyword!("cache_dir": "Union[str, os.PathLike[str], None]" = |_d| NoValue,
        "For a URL: a folder keeping whole shards and images read, for later epochs, runs and \
         processes."),
    keyword!("cache_limit": "Optional[int]" = |_d| NoValue,
        "For a URL: the most bytes cache_dir holds (None: no limit)."),
    keyword!("read_budget": "int" = |d| d.remote.read_budget,
        "For a URL: the most bytes read ahead of the decoders."),
    keyword!("max_requests": "int" = |d| d.remote.max_requests,
        "For a URL: the most requests in flight at once."),
    keyword!("shuffle_window": "Optional[int]" = |d| d.remote.shuffle_window,
        "For WebDataset shards at a URL: consecutive shards whose samples are shuffled together \
         (None: as many as half the read budget holds, 1 to 8)."),
    keyword!("batch_size": "int" = |d| d.options.batching.batch_size, "Images per batch.",
        |k, v: usize| k.with(|b| Ok(b.batch_size(v)))),
    keyword!("resize_mode":
    "Literal[\"center-crop\", \"stretch\", \"letterbox\", \"random-resized-crop\"]"
    = |d| d.keywords.mode.as_str(),
    "How images reach the output size: torchvision's Resize + CenterCrop, a stretch, a \
     letterbox, or torchvision's RandomResizedCrop.",
    |k, v: Name| {
        k.mode_given = true;
        k.set_mode(&v.0)
    }),
    keyword!("resize": "Optional[int]" = |_d| NoValue,
    "The shorter side after resizing (torchvision's Resize), for center-crop (None: 256, or \
     the crop's shorter side when a crop is given).",
    |k, v: Option<u32>| {
        k.shorter_side = v;
        Ok(())
    }),
    keyword!("crop": "Union[int, Tuple[int, int]]" = |d| d.keywords.size,
    "The output size: one side, or (height, width).",
    |k, v: Size| {
        k.size = v.0;
        Ok(())
    }),
    keyword!("pad": "int" = |d| d.keywords.pad, "The value of padded pixels, for letterbox.",
    |k, v: u8| {
        k.pad = v;
        Ok(())
    }),
    keyword!("interpolation":
        "Literal[\"bilinear\", \"bicubic\", \"nearest\", \"lanczos\", \"box\", \"hamming\"]"
        = |d| d.options.resize.interpolation.name(),
        "The resampling filter, antialiased as Pillow's.",
        |k, v: Name| k.with(|b| Ok(b.interpolation(parse::<Interpolation>(&v)?)))),
    keyword!("mean": "Sequence[float]" = |d| d.keywords.mean,
    "Per-channel mean in 0..1 units, R, G, B.",
    |k, v: Triple| {
        k.mean = v.0;
        Ok(())
    }),
    keyword!("std": "Sequence[float]" = |d| d.keywords.std,
    "Per-channel standard deviation in 0..1 units, R, G, B.",
    |k, v: Triple| {
        k.std = v.0;
        Ok(())
    }),
    keyword!("dtype": "Union[str, Any]" = |d| python_dtype(d.options.output.dtype),
        "The output element type: \"float16\" (or \"f16\", \"half\"), \"bfloat16\", \"float32\", \
         or a torch or NumPy dtype.",
        |k, v: Name| k.with(|b| Ok(b.dtype(parse::<DType>(&v)?)))),
    keyword!("layout": "Literal[\"nchw\", \"nhwc\"]" = |d| d.options.output.layout.name(),
        "The output layout.",
        |k, v: Name| k.with(|b| Ok(b.layout(parse::<Layout>(&v)?)))),
    keyword!("channel_order": "Literal[\"rgb\", \"bgr\"]"
        = |d| d.options.output.channel_order.name(),
        "The order of the output's colour channels.",
        |k, v: Name| k.with(|b| Ok(b.channel_order(parse::<ChannelOrder>(&v)?)))),
    keyword!("device": "Union[str, int, Any, None]" = |_d| NoValue,
    "Where the batches land: \"cuda:N\", \"cpu\", an ordinal or a torch.device (None: \
     cuda:0, or with shard=\"env\" the launcher's LOCAL_RANK).",
    |k, v: Option<DeviceName>| match v {
        Some(device) => k.with(|b| Ok(b.device(device.0))),
        None => Ok(()),
    }),
    keyword!("on_error": "Literal[\"skip\", \"fail\"]" = |d| d.options.batching.on_error.name(),
        "What a bad image does: skip it (listed on its batch with the reason) or raise \
         gpufeed.ItemError.",
        |k, v: Name| k.with(|b| Ok(b.on_error(parse::<OnError>(&v)?)))),
    keyword!("drop_last": "bool" = |d| d.options.batching.last_batch == LastBatch::Drop,
    "Drop a last partial batch.",
    |k, v: bool| k.with(|b| Ok(
        b.last_batch(if v { LastBatch::Drop } else { LastBatch::Keep })
    ))),
    keyword!("shuffle": "Optional[bool]" = |_d| NoValue,
    "A new order every epoch, drawn from seed (None: True with train=True, else False).",
    |k, v: Shuffle| {
        k.shuffle = v.0;
        Ok(())
    }),
    keyword!("shard": "Union[Tuple[int, int], Literal[\"env\"], None]" = |_d| NoValue,
    "This process's part of the images: (rank, world), or \"env\" to read it from \
     torchrun's or Slurm's variables (None: all of them).",
    |k, v: ShardKeyword| k.with(|b| Ok(match v {
        ShardKeyword::None => b,
        ShardKeyword::Fixed(rank, world) => b.shard(rank, world),
        ShardKeyword::Env => b.shard_from_env(),
    }))),
    keyword!("shard_balance": "Literal[\"pad\", \"drop\", \"uneven\"]"
        = |d| d.options.batching.shard_balance.name(),
        "How the ranks' parts are evened out: pad (repeats flagged in batch.padded), drop, or \
         uneven.",
        |k, v: Name| k.with(|b| Ok(b.shard_balance(parse::<ShardBalance>(&v)?)))),
    keyword!("pillow_version": "Optional[str]" = |_d| NoValue,
    "The Pillow version \"MAJOR.MINOR\" whose rounding to reproduce (None: the installed \
     Pillow's, else 13.0).",
    |k, v: Option<String>| match v {
        Some(v) => k.set_pillow_version(&v),
        None => Ok(()),
    }),
    keyword!("train": "bool" = |d| d.keywords.train,
    "torchvision's ImageNet training transform: RandomResizedCrop to crop, a flip with chance \
     0.5 and a new shuffle every epoch, all drawn from seed.",
    |k, v: bool| {
        k.train = v;
        Ok(())
    }),
    keyword!("seed": "int" = |d| d.keywords.seed,
    "The seed of every random draw: crops, flips, augmentations and the shuffle.",
    |k, v: u64| {
        k.seed = v;
        k.with(|b| Ok(b.seed(v)))
    }),
    keyword!("hflip": "Optional[float]" = |_d| NoValue,
    "The chance, 0 to 1, that an image is mirrored left to right (None: 0.5 with train=True, \
     else 0).",
    |k, v: Option<f64>| {
        k.hflip = v;
        Ok(())
    }),
    keyword!("scale": "Tuple[float, float]" = |d| (d.keywords.scale.min, d.keywords.scale.max),
    "RandomResizedCrop's range of areas, as shares of the image's.",
    |k, v: (f64, f64)| {
        k.scale = DrawRange::new(v.0, v.1);
        Ok(())
    }),
    keyword!("ratio": "Tuple[float, float]" = |d| (d.keywords.ratio.min, d.keywords.ratio.max),
    "RandomResizedCrop's range of aspect ratios, width / height.",
    |k, v: (f64, f64)| {
        k.ratio = DrawRange::new(v.0, v.1);
        Ok(())
    }),
    keyword!("threads": "int" = |d| d.options.runtime.threads,
        "CPU decode threads (0: one per core).",
        |k, v: usize| k.with(|b| Ok(b.threads(v)))),
    keyword!("prefetch": "int" = |d| d.options.runtime.prefetch, "Batches prepared ahead.",
        |k, v: usize| k.with(|b| Ok(b.prefetch(v)))),
    keyword!("max_pixels": "Optional[int]" = |_d| NoValue,
    "Refuse images that claim more pixels than this (None: 178956970); with \
     patches=\"qwen2-vl\" or \"qwen3-vl\", the model's max_pixels instead: the most pixels of a \
     resized image (None: 28 * 28 * 1280; qwen3-vl 4096 * 4096).",
    |k, v: Option<u64>| {
        k.max_pixels = v;
        Ok(())
    }),
    keyword!("exif_orientation": "bool" = |d| d.options.decode.exif_orientation,
        "Turn images as their EXIF orientation tag says (torchvision does not).",
        |k, v: bool| k.with(|b| Ok(b.exif_orientation(v)))),
    keyword!("dct_scaling": "bool" = |d| d.options.decode.dct_scaling,
        "Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the output keeps a 2x \
         margin (faster on big photos, further from torchvision).",
        |k, v: bool| k.with(|b| Ok(b.dct_scaling(v)))),
    keyword!("max_file_bytes": "int" = |d| d.options.decode.max_file_bytes,
        "Refuse files larger than this many bytes, before reading them.",
        |k, v: u64| k.with(|b| Ok(b.max_file_bytes(v)))),
    keyword!("decode_memory": "int" = |d| d.options.decode.memory_limit,
        "The most bytes the decode threads hold together for images in flight.",
        |k, v: u64| k.with(|b| Ok(b.decode_memory(v)))),
    keyword!("decode": "Literal[\"auto\", \"cpu\", \"hybrid\"]" = |d| d.options.decode.lanes.name(),
        "Which decoders fill the batches: auto (the GPU lane beside the CPU threads on a CUDA \
         device, for runs that repay opening it), cpu, or hybrid.",
        |k, v: Name| k.with(|b| Ok(b.decode(parse::<Decode>(&v)?)))),
    keyword!("gpu_share": "Optional[float]" = |d| d.options.decode.gpu_share,
    "The GPU lane's share of the images it can take, 0 to 1, kept fixed so that every run \
     offers each image to the same lane (None: it follows the lanes' measured rates).",
    |k, v: Option<f32>| k.with(|b| Ok(match v {
        Some(share) => b.gpu_share(share),
        None => b,
    }))),
    keyword!("min_gpu_share": "Optional[float]" = |d| d.options.decode.min_gpu_share,
    "The least the share following the rates falls to (None: no floor; 1 with shard=\"env\" \
     and four ranks or more on the machine).",
    |k, v: Option<f32>| k.with(|b| Ok(match v {
        Some(share) => b.min_gpu_share(share),
        None => b,
    }))),
    keyword!("assisted_share": "float" = |d| d.options.decode.assisted_share,
        "Of the GPU lane's baseline JPEGs of 1 Mpx or more, the share its assisted path decodes \
         exactly on the GPU's cores beside the JPEG engines; at 1 (with the share following the \
         rates) the engines stay closed on small files.",
        |k, v: f32| k.with(|b| Ok(b.assisted_share(v)))),
    keyword!("planned_epochs": "Optional[int]" = |d| d.options.decode.planned_epochs,
    "How many epochs the run takes, if known: automatic decoding leaves a run too short to \
     repay opening the GPU lane (or its JPEG engines) without them.",
    |k, v: Option<u64>| k.with(|b| Ok(match v {
        Some(epochs) => b.planned_epochs(epochs),
        None => b,
    }))),
    keyword!("gray16": "Literal[\"clip\", \"scale\"]" = |d| d.options.decode.gray16.name(),
        "How 16-bit gray images become 8-bit: clipped (torchvision's) or scaled.",
        |k, v: Name| k.with(|b| Ok(b.gray16(parse::<Gray16>(&v)?)))),
    keyword!("augment": "str" = |d| d.options.augment.policy.to_string(),
        "torchvision's automatic augmentation: \"trivial-augment-wide\", \"rand-augment\" (2 \
         operations at magnitude 9), \"rand-augment:N:M\", \"auto-augment\" or \"none\".",
        |k, v: Name| k.with(|b| Ok(b.augment(parse::<Augment>(&v)?)))),
    keyword!("color_jitter": "Optional[Tuple[float, float, float, float]]" = |_d| NoValue,
    "torchvision's ColorJitter(brightness, contrast, saturation, hue), before augment.",
    |k, v: Option<(f64, f64, f64, f64)>| match v {
        Some(v) => k.with(|b| Ok(b.color_jitter(v.0, v.1, v.2, v.3))),
        None => Ok(()),
    }),
    keyword!("random_erasing": "Optional[float]" = |_d| NoValue,
    "torchvision's RandomErasing(p), after augment.",
    |k, v: Option<f64>| match v {
        Some(p) => k.with(|b| Ok(b.random_erasing(p))),
        None => Ok(()),
    }),
    keyword!("mixup": "Optional[float]" = |d| d.options.augment.mixup,
    "torchvision's MixUp(alpha) across each batch (needs labels); batch.soft_labels holds \
     the targets.",
    |k, v: Option<f64>| match v {
        Some(alpha) => k.with(|b| Ok(b.mixup(alpha))),
        None => Ok(()),
    }),
    keyword!("cutmix": "Optional[float]" = |d| d.options.augment.cutmix,
    "torchvision's CutMix(alpha) across each batch; with mixup, each batch takes one of the \
     two.",
    |k, v: Option<f64>| match v {
        Some(alpha) => k.with(|b| Ok(b.cutmix(alpha))),
        None => Ok(()),
    }),
    keyword!("num_classes": "Optional[int]" = |d| d.options.augment.num_classes,
    "Classes of the soft labels (None: the image folder's class count).",
    |k, v: Option<usize>| match v {
        Some(classes) => k.with(|b| Ok(b.num_classes(classes))),
        None => Ok(()),
    }),
    keyword!("recipe": "Optional[Literal[\"torchvision-imagenet\"]]" = |_d| NoValue,
    "A training recipe: \"torchvision-imagenet\" (train=True, trivial-augment-wide, random \
     erasing 0.1, MixUp 0.2 or CutMix 1.0 per batch).",
    |k, v: Option<Name>| {
        if let Some(name) = v {
            k.recipe = Some(parse::<Recipe>(&name)?);
            k.train = true;
        }
        Ok(())
    }),
    keyword!("patches": "Optional[str]" = |_d| NoValue,
    "Patch sequences instead of fixed-size images: \"qwen2-vl\", \"qwen3-vl\" (Qwen2-VL's \
     processor with Qwen3-VL's settings), \"siglip2-naflex\", \"timm-naflex\", or \
     \"qwen2-vl-torchvision\", \"qwen3-vl-torchvision\" and \"siglip2-naflex-torchvision\" for \
     transformers' torchvision processors; batch.tokens and the side tensors hold them.",
    |k, v: Option<String>| {
        k.patches = v
            .map(|name| Patches::from_name(&name))
            .transpose()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(())
    }),
    keyword!("min_pixels": "Optional[int]" = |_d| NoValue,
    "patches=\"qwen2-vl\" or \"qwen3-vl\": the fewest pixels of a resized image (None: 56 * 56; \
     qwen3-vl 256 * 256).",
    |k, v: Option<u64>| {
        k.patch_settings.min_pixels = v;
        Ok(())
    }),
    keyword!("max_patches": "Optional[int]" = |_d| NoValue,
    "patches=\"siglip2-naflex\": the most patches of an image, and the padded length \
     (None: 256).",
    |k, v: Option<u32>| {
        k.patch_settings.max_patches = v;
        Ok(())
    }),
    keyword!("patch_size": "Optional[int]" = |_d| NoValue,
    "With patches: pixels per patch side (None: the preset's, 14 or 16).",
    |k, v: Option<u32>| {
        k.patch_settings.patch_size = v;
        Ok(())
    }),
    keyword!("seq_lens": "Optional[Sequence[int]]" = |_d| NoValue,
    "patches=\"timm-naflex\": the sequence lengths a batch draws from (None: 128, 256, 576, \
     784, 1024).",
    |k, v: Option<Vec<u32>>| {
        k.patch_settings.seq_lens = v;
        Ok(())
    }),
    keyword!("tokens_per_batch": "Optional[int]" = |_d| NoValue,
    "patches=\"timm-naflex\": tokens per batch, which sets each batch's size (None: 32768).",
    |k, v: Option<u64>| {
        k.patch_settings.tokens_per_batch = v;
        Ok(())
    }),
    keyword!("packing": "Optional[Literal[\"packed\", \"padded\"]]" = |_d| NoValue,
    "With patches: \"packed\" (the images' tokens one after another, with cu_seqlens) or \
     \"padded\" (each padded to the batch's length, with a mask) (None: the preset's: \
     Qwen2-VL packed, SigLIP2 and timm padded).",
    |k, v: Option<String>| {
        k.patch_settings.packed = match v.as_deref().map(str::trim) {
            None => None,
            Some("packed") => Some(true),
            Some("padded") => Some(false),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "packing {other:?}: expected \"packed\" or \"padded\""
                )))
            }
        };
        Ok(())
    }),
    keyword!("eval_preset": "Optional[Literal[\"clip\", \"siglip-384\", \"siglip-224\", \"dinov2\"]]"
    = |_d| NoValue,
    "A fixed-size evaluation transform by name: its resize, crop, filter, mean and std.",
    |k, v: Option<Name>| {
        k.eval_preset = v.map(|name| parse::<EvalPreset>(&name)).transpose()?;
        Ok(())
    }),
    keyword!("views": "Union[Literal[\"dinov2\", \"simclr\"], str, os.PathLike[str], Sequence[dict[str, Any]], None]"
    = |_d| NoValue,
    "Several views of each image instead of one: \"dinov2\" (2 global of 224, 8 local of 96), \
     \"simclr\" (2 of 224), or a recipe of its own: a list of view groups, each a dict of size, \
     count, scale, ratio, interpolation, flip, color_jitter, grayscale, blur and solarize (or \
     that list as JSON text, or a .json file's path), drawn from seed; batch.views holds one tensor per view group, \
     [count, N, 3, size, size], and batch.view_draws what each view drew.",
    |k, v: Option<ViewsSpec>| {
        k.views = v.map(|spec| spec.0);
        Ok(())
    }),
];

/// The keyword names, in the signature's order (exported as `gpufeed.KEYWORDS`).
pub(crate) fn keyword_names() -> Vec<&'static str> {
    KEYWORDS.iter().map(|k| k.name).collect()
}

/// The name torch and NumPy give an element type.
fn python_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        other => other.name(),
    }
}

impl Keywords {
    /// The builder's defaults.
    fn new() -> Keywords {
        let builder = PipelineBuilder::default();
        let options = *builder.options();
        let (shorter_side, size, pad) = match options.resize.mode {
            ResizeMode::ShorterSideThenCenterCrop {
                shorter_side,
                height,
                width,
            } => (Some(shorter_side), (height, width), 0),
            ResizeMode::Stretch { height, width } => (None, (height, width), 0),
            ResizeMode::Letterbox { height, width, pad } => (None, (height, width), pad),
            _ => (None, options.resize.output_size(), 0),
        };
        Keywords {
            mode: options.resize.mode.name().to_string(),
            shorter_side: None,
            default_shorter_side: shorter_side,
            size,
            pad,
            mean: options.output.mean,
            std: options.output.std,
            scale: RANDOM_CROP_SCALE,
            ratio: RANDOM_CROP_RATIO,
            train: false,
            recipe: None,
            hflip: None,
            seed: options.resize.seed,
            shuffle: None,
            mode_given: false,
            max_pixels: None,
            patches: None,
            patch_settings: PatchSettings::default(),
            eval_preset: None,
            views: None,
            builder: Some(builder),
        }
    }

    /// Applies `f` to the builder.
    fn with(
        &mut self,
        f: impl FnOnce(PipelineBuilder) -> PyResult<PipelineBuilder>,
    ) -> PyResult<()> {
        let builder = self.builder.take().unwrap_or_default();
        self.builder = Some(f(builder)?);
        Ok(())
    }

    /// `pillow_version="MAJOR.MINOR"`.
    fn set_pillow_version(&mut self, text: &str) -> PyResult<()> {
        let version = text
            .split_once('.')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
        let Some((major, minor)) = version else {
            return Err(PyValueError::new_err(format!(
                "pillow_version {text:?}: expected \"MAJOR.MINOR\", e.g. \"12.3\" (PIL.__version__)"
            )));
        };
        self.with(|b| Ok(b.pillow_version(major, minor)))
    }

    fn set_mode(&mut self, name: &str) -> PyResult<()> {
        let canonical = name.trim().to_ascii_lowercase().replace('_', "-");
        match canonical.as_str() {
            "center-crop" | "stretch" | "letterbox" | "random-resized-crop" => {
                self.mode = canonical;
                Ok(())
            }
            _ => Err(PyValueError::new_err(format!(
                "unknown resize_mode {name:?}: expected one of center-crop stretch letterbox \
                 random-resized-crop"
            ))),
        }
    }

    /// The builder with every keyword applied.
    fn finish(mut self) -> PyResult<PipelineBuilder> {
        let (height, width) = self.size;
        if self.train {
            // ImageNet's training transform: RandomResizedCrop, a coin-flip mirror and a new
            // shuffle every epoch, from the seed.
            if self.mode_given && self.mode != "random-resized-crop" {
                return Err(PyValueError::new_err(format!(
                    "train=True crops as RandomResizedCrop: it cannot go with \
                     resize_mode={:?} (leave train out for that mode, and give hflip, shuffle \
                     and seed as you want them)",
                    self.mode
                )));
            }
            self.mode = "random-resized-crop".into();
        }
        if self.shuffle.unwrap_or(self.train) {
            let seed = self.seed;
            self.with(|b| Ok(b.shuffle(seed)))?;
        }
        let timm = self.patches.is_some_and(|p| p.preset == Preset::TimmNaflex);
        let flip = self
            .hflip
            .unwrap_or(if self.train { RANDOM_FLIP_CHANCE } else { 0.0 });
        // timm's flip is the patch output's own.
        let image_flip = if timm { 0.0 } else { flip };
        self.with(|b| Ok(b.horizontal_flip(image_flip)))?;
        let mode = match self.mode.as_str() {
            "center-crop" => ResizeMode::ShorterSideThenCenterCrop {
                shorter_side: self
                    .shorter_side
                    .or(self.default_shorter_side)
                    .unwrap_or(height.min(width)),
                height,
                width,
            },
            other => {
                if self.shorter_side.is_some() {
                    return Err(PyValueError::new_err(format!(
                        "resize (the shorter side) applies to resize_mode=\"center-crop\", not \
                         {other:?}: crop gives the output size"
                    )));
                }
                match other {
                    "stretch" => ResizeMode::stretch(height, width),
                    "random-resized-crop" => ResizeMode::RandomResizedCrop {
                        height,
                        width,
                        scale: self.scale,
                        ratio: self.ratio,
                    },
                    _ => ResizeMode::letterbox(height, width, self.pad),
                }
            }
        };
        let (mean, std) = (self.mean, self.std);
        self.with(|b| Ok(b.resize(mode).mean_std(mean, std)))?;
        if let Some(preset) = self.eval_preset {
            if self.mode_given
                || self.train
                || self.shorter_side.is_some()
                || self.patches.is_some()
            {
                return Err(PyValueError::new_err(format!(
                    "eval_preset={:?} brings its own resize and crop: leave resize_mode, resize, \
                     train and patches out",
                    preset.name()
                )));
            }
            self.with(|b| Ok(b.eval_preset(preset)))?;
        }
        self.finish_patches(flip)?;
        if let Some(views) = self.views.take() {
            let seed = self.seed;
            self.with(|b| {
                let (major, minor) = b.options().resize.pillow_version;
                let views = views.seed(seed).pillow_version(major, minor);
                Ok(b.views(views))
            })?;
        }
        if let Some(recipe) = self.recipe {
            // The recipe's augmentations replace any given one by one; num_classes stays.
            self.with(|b| {
                let classes = b.options().augment.num_classes;
                Ok(b.augment_options(recipe.augment_options().num_classes(classes)))
            })?;
        }
        Ok(self.builder.take().unwrap_or_default())
    }
}

impl Keywords {
    /// `patches=` with its settings (each must be one the preset has), and `max_pixels`: Qwen2-VL's
    /// budget beside `patches="qwen2-vl"`, the decode limit otherwise. `flip` is `hflip`'s value,
    /// timm's flip.
    fn finish_patches(&mut self, flip: f64) -> PyResult<()> {
        let given = &self.patch_settings;
        let qwen = given.min_pixels.is_some();
        let siglip = given.max_patches.is_some();
        let timm = given.seq_lens.is_some() || given.tokens_per_batch.is_some();
        let Some(mut patches) = self.patches else {
            if qwen || siglip || timm || given.patch_size.is_some() || given.packed.is_some() {
                return Err(PyValueError::new_err(
                    "min_pixels, max_patches, patch_size, seq_lens, tokens_per_batch and packing \
                     set a patch-sequence output: give patches=",
                ));
            }
            if let Some(max) = self.max_pixels {
                self.with(|b| Ok(b.max_pixels(max)))?;
            }
            return Ok(());
        };
        let refused = |keywords: &str, presets: &str| {
            Err(PyValueError::new_err(format!(
                "{keywords} applies to patches={presets}, not {:?}",
                patches.name()
            )))
        };
        match patches.preset {
            Preset::Qwen2Vl if siglip || timm => {
                return refused(
                    "max_patches, seq_lens or tokens_per_batch",
                    "\"siglip2-naflex\" or \"timm-naflex\"",
                )
            }
            Preset::Siglip2Naflex if qwen || timm => {
                return refused(
                    "min_pixels, seq_lens or tokens_per_batch",
                    "\"qwen2-vl\" or \"timm-naflex\"",
                )
            }
            Preset::TimmNaflex if qwen || siglip => {
                return refused(
                    "min_pixels or max_patches",
                    "\"qwen2-vl\" or \"siglip2-naflex\"",
                )
            }
            Preset::Qwen2Vl => {
                patches.min_pixels = given.min_pixels.unwrap_or(patches.min_pixels);
                patches.max_pixels = self.max_pixels.unwrap_or(patches.max_pixels);
            }
            Preset::Siglip2Naflex => {
                patches.max_patches = given.max_patches.unwrap_or(patches.max_patches);
            }
            Preset::TimmNaflex => {
                if let Some(lens) = &given.seq_lens {
                    patches = patches.seq_lens(lens);
                }
                patches.tokens_per_batch =
                    given.tokens_per_batch.unwrap_or(patches.tokens_per_batch);
                patches.horizontal_flip = self.hflip.map_or(patches.horizontal_flip, |_| flip);
            }
            _ => {}
        }
        patches.patch_size = given.patch_size.unwrap_or(patches.patch_size);
        patches.packed = given.packed.unwrap_or(patches.packed);
        if patches.preset != Preset::Qwen2Vl {
            if let Some(max) = self.max_pixels {
                self.with(|b| Ok(b.max_pixels(max)))?;
            }
        }
        self.with(|b| Ok(b.patches(patches)))?;
        let version = self
            .builder
            .as_ref()
            .map(|b| b.options().resize.pillow_version);
        if let Some((major, minor)) = version {
            self.with(|b| Ok(with_pillow_version(b, major, minor)))?;
        }
        Ok(())
    }
}

/// `builder` reproducing Pillow `major.minor`'s rounding: its views' if it has them, and its
/// patch output's, if it has one (the resize of fixed-size images then stays as it was), else
/// its resize's.
pub(crate) fn with_pillow_version(
    builder: PipelineBuilder,
    major: u32,
    minor: u32,
) -> PipelineBuilder {
    // Views resize with their own Pillow rounding: the same version.
    let builder = match builder.views_set().cloned() {
        Some(views) => builder.views(views.pillow_version(major, minor)),
        None => builder,
    };
    match builder.options().patches {
        Some(mut patches) => {
            patches.pillow_version = (major, minor);
            let (default_major, default_minor) = ResizeOptions::default().pillow_version;
            builder
                .pillow_version(default_major, default_minor)
                .patches(patches)
        }
        None => builder.pillow_version(major, minor),
    }
}

/// A builder from the keyword arguments (`None`: none given).
pub(crate) fn builder_from(options: Option<&Bound<'_, PyDict>>) -> PyResult<PipelineBuilder> {
    let mut keywords = Keywords::new();
    if let Some(options) = options {
        for (key, value) in options.iter() {
            let key: String = key.extract()?;
            let Some(keyword) = KEYWORDS.iter().find(|k| k.name == key) else {
                return Err(unexpected_keyword(&key));
            };
            if let Some(apply) = keyword.apply {
                apply(&mut keywords, &value)?;
            }
        }
    }
    keywords.finish()
}

/// The error for a keyword `Pipeline()` does not take: it names the nearest ones, then every
/// keyword.
pub(crate) fn unexpected_keyword(given: &str) -> PyErr {
    let distance = |name: &str| edit_distance(given, name);
    let nearest = KEYWORDS
        .iter()
        .map(|k| distance(k.name))
        .min()
        .unwrap_or(usize::MAX);
    let suggestion = if nearest <= 2.max(given.len() / 4) {
        let names: Vec<&str> = KEYWORDS
            .iter()
            .filter(|k| distance(k.name) == nearest)
            .map(|k| k.name)
            .collect();
        format!(" (did you mean {}?)", names.join(" or "))
    } else {
        String::new()
    };
    PyTypeError::new_err(format!(
        "Pipeline() got an unexpected keyword argument {given:?}{suggestion}; the keywords are: \
         {}",
        keyword_names().join(", ")
    ))
}

/// Levenshtein's distance between two names, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// Whether `name` is one of the keywords `Pipeline()` reads itself, rather than the builder.
pub(crate) fn is_constructor_keyword(name: &str) -> bool {
    KEYWORDS.iter().any(|k| k.name == name && k.apply.is_none())
}

fn extract<'py, T>(value: &Bound<'py, PyAny>, name: &str) -> PyResult<T>
where
    T: FromPyObjectOwned<'py>,
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    value.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        let py = value.py();
        if e.is_instance_of::<PyOverflowError>(py) {
            // A number of the right kind out of the option's range.
            let range = match std::any::type_name::<T>() {
                "u8" => "0 to 255",
                "f32" | "f64" => "a finite number",
                _ => "a whole number from 0",
            };
            PyValueError::new_err(format!("{name}: {value} is out of range ({range})"))
        } else if e.is_instance_of::<PyValueError>(py) {
            // A value of the right type but wrong (an unknown name) stays a ValueError.
            PyValueError::new_err(format!("{name}: {}", e.value(py)))
        } else {
            PyTypeError::new_err(format!("{name}: {}", e.value(py)))
        }
    })
}

/// The library's option names as this package's keywords, in an option mistake's message.
pub(crate) fn keyword_name(option: &str) -> &str {
    match option {
        "horizontal_flip" => "hflip",
        "resize" => "crop/resize",
        "mean/std" => "mean/std",
        other => other,
    }
}

pub(crate) fn parse<T: FromStr>(name: &Name) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    name.0
        .parse::<T>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// An option name: a string, or an object whose name is one (`torch.float16`, `numpy.float32`,
/// `torch.device("cuda:0")`).
pub(crate) struct Name(pub(crate) String);

impl<'py> FromPyObject<'_, 'py> for Name {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if value.is_instance_of::<PyString>() {
            return Ok(Name(value.extract::<String>()?));
        }
        if let Ok(name) = value.getattr("__name__") {
            return Ok(Name(name.str()?.extract::<String>()?));
        }
        let text: String = value.str()?.extract()?;
        let last = text.rsplit('.').next().unwrap_or(&text).to_string();
        Ok(Name(last))
    }
}

/// `device`: `"cpu"`, `"cuda"`, `"cuda:N"`, an ordinal, or a `torch.device`.
struct DeviceName(Device);

impl<'py> FromPyObject<'_, 'py> for DeviceName {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if !value.is_instance_of::<PyBool>() {
            if let Ok(ordinal) = value.extract::<usize>() {
                return Ok(DeviceName(Device::Cuda(ordinal)));
            }
        }
        let text: String = value.str()?.extract()?;
        parse::<Device>(&Name(text)).map(DeviceName)
    }
}

/// `views=`: a preset's name, a JSON spec's text or the path of a file holding one (a `str` or
/// an `os.PathLike`), or the spec itself as Python lists and dicts (written as JSON with the
/// `json` module, then read as the text is).
pub(crate) struct ViewsSpec(pub(crate) Views);

impl<'py> FromPyObject<'_, 'py> for ViewsSpec {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let py = value.py();
        let views = if value.is_instance_of::<PyString>() {
            Views::load(&value.extract::<String>()?)
        } else if value.hasattr("__fspath__")? {
            let path = py.import("os")?.call_method1("fspath", (value,))?;
            Views::load_file(path.str()?.extract::<String>()?)
        } else {
            let json = py.import("json")?;
            let text: String = json
                .call_method1("dumps", (value,))
                .map_err(|e| {
                    PyTypeError::new_err(format!(
                        "views: not a preset's name or a list of view groups ({e})"
                    ))
                })?
                .extract()?;
            Views::parse(&text)
        };
        views
            .map(ViewsSpec)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// `crop`: one side, or `(height, width)`.
struct Size((u32, u32));

impl<'py> FromPyObject<'_, 'py> for Size {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(side) = value.extract::<u32>() {
            return Ok(Size((side, side)));
        }
        Ok(Size(value.extract::<(u32, u32)>()?))
    }
}

/// `mean`, `std`: three numbers, RGB order.
struct Triple([f32; 3]);

impl<'py> FromPyObject<'_, 'py> for Triple {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let values: Vec<f32> = value.extract()?;
        <[f32; 3]>::try_from(values.as_slice())
            .map(Triple)
            .map_err(|_| PyValueError::new_err(format!("expected 3 values, got {}", values.len())))
    }
}

/// `shuffle`: `True` or `False` (`0` and `1` read as Python reads them), or `None` for the
/// default (`True` with `train=True`); the seed is the `seed` keyword. Another number is
/// refused: it would read as a seed.
struct Shuffle(Option<bool>);

impl<'py> FromPyObject<'_, 'py> for Shuffle {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if value.is_none() {
            return Ok(Shuffle(None));
        }
        if let Ok(flag) = value.cast::<PyBool>() {
            return Ok(Shuffle(Some(flag.is_true())));
        }
        match value.extract::<i64>() {
            Ok(0) => Ok(Shuffle(Some(false))),
            Ok(1) => Ok(Shuffle(Some(true))),
            Ok(n) => Err(PyValueError::new_err(format!(
                "shuffle takes True or False; the seed goes in seed= (shuffle=True, seed={n})"
            ))),
            Err(_) => Err(PyTypeError::new_err("shuffle takes True or False")),
        }
    }
}

/// `shard`: `None`, `(rank, world)`, or `"env"` (torchrun's or Slurm's variables).
enum ShardKeyword {
    None,
    Fixed(usize, usize),
    Env,
}

impl<'py> FromPyObject<'_, 'py> for ShardKeyword {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if value.is_none() {
            return Ok(ShardKeyword::None);
        }
        if value.is_instance_of::<PyString>() {
            let text: String = value.extract()?;
            if text.trim().eq_ignore_ascii_case("env") {
                return Ok(ShardKeyword::Env);
            }
            return Err(PyValueError::new_err(format!(
                "{text:?}: expected (rank, world) or \"env\""
            )));
        }
        let (rank, world): (usize, usize) = value.extract()?;
        Ok(ShardKeyword::Fixed(rank, world))
    }
}
