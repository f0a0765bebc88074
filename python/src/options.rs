//! Keyword arguments of `gpufeed.Pipeline(...)`: one table line per keyword. A keyword the Rust
//! builder gains is one line in [`KEYWORDS`] (and one in the `.pyi` stub); defaults are the
//! builder's own, and enum names parse with the library's `FromStr`, so they match the command
//! line's.

use std::str::FromStr;

use gpufeed::{
    Augment, ChannelOrder, DType, Decode, Device, DrawRange, Gray16, Interpolation, LastBatch,
    Layout, OnError, PipelineBuilder, Recipe, ResizeMode, ShardBalance, RANDOM_CROP_RATIO,
    RANDOM_CROP_SCALE, RANDOM_FLIP_CHANCE,
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
}

type Apply = fn(&mut Keywords, &Bound<'_, PyAny>) -> PyResult<()>;

/// `keyword!("name", |k, v: Type| body)`: extracts the value as `Type` (a `TypeError` naming
/// the keyword otherwise) and runs `body`, a `PyResult<()>`.
macro_rules! keyword {
    ($name:literal, |$k:ident, $v:ident: $ty:ty| $body:expr) => {
        (
            $name,
            (|$k: &mut Keywords, value: &Bound<'_, PyAny>| -> PyResult<()> {
                let $v: $ty = extract(value, $name)?;
                $body
            }) as Apply,
        )
    };
}

/// Every keyword, with what it does. Keep `python/gpufeed/_native.pyi` in step.
const KEYWORDS: &[(&str, Apply)] = &[
    keyword!("batch_size", |k, v: usize| k.with(|b| Ok(b.batch_size(v)))),
    keyword!("resize_mode", |k, v: Name| {
        k.mode_given = true;
        k.set_mode(&v.0)
    }),
    keyword!("resize", |k, v: u32| {
        k.shorter_side = Some(v);
        Ok(())
    }),
    keyword!("crop", |k, v: Size| {
        k.size = v.0;
        Ok(())
    }),
    keyword!("pad", |k, v: u8| {
        k.pad = v;
        Ok(())
    }),
    keyword!("interpolation", |k, v: Name| k
        .with(|b| Ok(b.interpolation(parse::<Interpolation>(&v)?)))),
    keyword!("mean", |k, v: Triple| {
        k.mean = v.0;
        Ok(())
    }),
    keyword!("std", |k, v: Triple| {
        k.std = v.0;
        Ok(())
    }),
    keyword!("dtype", |k, v: Name| k
        .with(|b| Ok(b.dtype(parse::<DType>(&v)?)))),
    keyword!("layout", |k, v: Name| k
        .with(|b| Ok(b.layout(parse::<Layout>(&v)?)))),
    keyword!("channel_order", |k, v: Name| k
        .with(|b| Ok(b.channel_order(parse::<ChannelOrder>(&v)?)))),
    keyword!("device", |k, v: DeviceName| k.with(|b| Ok(b.device(v.0)))),
    keyword!("on_error", |k, v: Name| k
        .with(|b| Ok(b.on_error(parse::<OnError>(&v)?)))),
    keyword!("drop_last", |k, v: bool| k.with(|b| Ok(
        b.last_batch(if v { LastBatch::Drop } else { LastBatch::Keep })
    ))),
    keyword!("shuffle", |k, v: Shuffle| {
        k.shuffle = Some(v.0);
        Ok(())
    }),
    keyword!("shard", |k, v: ShardKeyword| k.with(|b| Ok(match v {
        ShardKeyword::None => b,
        ShardKeyword::Fixed(rank, world) => b.shard(rank, world),
        ShardKeyword::Env => b.shard_from_env(),
    }))),
    keyword!("shard_balance", |k, v: Name| k
        .with(|b| Ok(b.shard_balance(parse::<ShardBalance>(&v)?)))),
    keyword!("pillow_version", |k, v: String| {
        let version = v
            .split_once('.')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
        let Some((major, minor)) = version else {
            return Err(PyValueError::new_err(format!(
                "pillow_version {v:?}: expected \"MAJOR.MINOR\", e.g. \"12.3\" (PIL.__version__)"
            )));
        };
        k.with(|b| Ok(b.pillow_version(major, minor)))
    }),
    keyword!("train", |k, v: bool| {
        k.train = v;
        Ok(())
    }),
    keyword!("seed", |k, v: u64| {
        k.seed = v;
        k.with(|b| Ok(b.seed(v)))
    }),
    keyword!("hflip", |k, v: f64| {
        k.hflip = Some(v);
        Ok(())
    }),
    keyword!("scale", |k, v: (f64, f64)| {
        k.scale = DrawRange::new(v.0, v.1);
        Ok(())
    }),
    keyword!("ratio", |k, v: (f64, f64)| {
        k.ratio = DrawRange::new(v.0, v.1);
        Ok(())
    }),
    keyword!("threads", |k, v: usize| k.with(|b| Ok(b.threads(v)))),
    keyword!("prefetch", |k, v: usize| k.with(|b| Ok(b.prefetch(v)))),
    keyword!("max_pixels", |k, v: u64| k.with(|b| Ok(b.max_pixels(v)))),
    keyword!("exif_orientation", |k, v: bool| k
        .with(|b| Ok(b.exif_orientation(v)))),
    keyword!("dct_scaling", |k, v: bool| k.with(|b| Ok(b.dct_scaling(v)))),
    keyword!("max_file_bytes", |k, v: u64| k
        .with(|b| Ok(b.max_file_bytes(v)))),
    keyword!("decode_memory", |k, v: u64| k
        .with(|b| Ok(b.decode_memory(v)))),
    keyword!("decode", |k, v: Name| k
        .with(|b| Ok(b.decode(parse::<Decode>(&v)?)))),
    keyword!("gpu_share", |k, v: Option<f32>| k.with(|b| Ok(match v {
        Some(share) => b.gpu_share(share),
        None => b,
    }))),
    keyword!("min_gpu_share", |k, v: Option<f32>| k.with(|b| Ok(
        match v {
            Some(share) => b.min_gpu_share(share),
            None => b,
        }
    ))),
    keyword!("assisted_share", |k, v: f32| k
        .with(|b| Ok(b.assisted_share(v)))),
    keyword!("planned_epochs", |k, v: Option<u64>| k.with(|b| Ok(
        match v {
            Some(epochs) => b.planned_epochs(epochs),
            None => b,
        }
    ))),
    keyword!("gray16", |k, v: Name| k
        .with(|b| Ok(b.gray16(parse::<Gray16>(&v)?)))),
    keyword!("augment", |k, v: Name| k
        .with(|b| Ok(b.augment(parse::<Augment>(&v)?)))),
    keyword!("color_jitter", |k, v: (f64, f64, f64, f64)| k
        .with(|b| Ok(b.color_jitter(v.0, v.1, v.2, v.3)))),
    keyword!("random_erasing", |k, v: f64| k
        .with(|b| Ok(b.random_erasing(v)))),
    keyword!("mixup", |k, v: f64| k.with(|b| Ok(b.mixup(v)))),
    keyword!("cutmix", |k, v: f64| k.with(|b| Ok(b.cutmix(v)))),
    keyword!("num_classes", |k, v: usize| k
        .with(|b| Ok(b.num_classes(v)))),
    keyword!("recipe", |k, v: Name| {
        k.recipe = Some(parse::<Recipe>(&v)?);
        k.train = true;
        Ok(())
    }),
];

/// The keyword names, in table order (exported as `gpufeed.KEYWORDS`).
pub(crate) fn keyword_names() -> Vec<&'static str> {
    KEYWORDS.iter().map(|(name, _)| *name).collect()
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
        let flip = self
            .hflip
            .unwrap_or(if self.train { RANDOM_FLIP_CHANCE } else { 0.0 });
        self.with(|b| Ok(b.horizontal_flip(flip)))?;
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

/// A builder from the keyword arguments (`None`: none given).
pub(crate) fn builder_from(options: Option<&Bound<'_, PyDict>>) -> PyResult<PipelineBuilder> {
    let mut keywords = Keywords::new();
    if let Some(options) = options {
        for (key, value) in options.iter() {
            let key: String = key.extract()?;
            let Some((_, apply)) = KEYWORDS.iter().find(|(name, _)| *name == key) else {
                return Err(PyTypeError::new_err(format!(
                    "Pipeline() got an unexpected keyword argument {key:?}; the keywords are: \
                     source, paths, image_folder, {}",
                    keyword_names().join(", ")
                )));
            };
            apply(&mut keywords, &value)?;
        }
    }
    keywords.finish()
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

fn parse<T: FromStr>(name: &Name) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    name.0
        .parse::<T>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// An option name: a string, or an object whose name is one (`torch.float16`, `numpy.float32`,
/// `torch.device("cuda:0")`).
struct Name(String);

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

/// `shuffle`: `True` or `False` (`None`, `0` and `1` read as Python reads them); the seed is
/// the `seed` keyword. Another number is refused: it would read as a seed.
struct Shuffle(bool);

impl<'py> FromPyObject<'_, 'py> for Shuffle {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if value.is_none() {
            return Ok(Shuffle(false));
        }
        if let Ok(flag) = value.cast::<PyBool>() {
            return Ok(Shuffle(flag.is_true()));
        }
        match value.extract::<i64>() {
            Ok(0) => Ok(Shuffle(false)),
            Ok(1) => Ok(Shuffle(true)),
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
