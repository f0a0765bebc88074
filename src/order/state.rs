//! A pipeline's place in its run, saved and resumed ([`PipelineState`]).
//!
//! Everything a pipeline draws (the order, the shards, the crops, the flips) comes from the seed,
//! the epoch and the image's index alone, so a place in the run is a handful of numbers: the
//! epoch, the part of the epoch's order this rank takes, the position in it after the last batch
//! handed out, and the rows and batches handed out before. Resuming computes the epoch's order
//! and begins at that position: nothing before it is read or decoded.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::error::{OptionDifference, ResumeError};
use crate::options::{Options, ResizeMode, Shard};

/// The value of a state's `format` field.
const FORMAT: &str = "gpufeed pipeline state";

/// The format version this build writes and reads.
const VERSION: u64 = 1;

/// Where the batches of an epoch begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct EpochStart {
    /// The epoch.
    pub epoch: u64,
    /// The epoch's order is the global order from this entry on, split over the ranks: 0 for a
    /// whole epoch, more for an epoch resumed on another number of ranks.
    pub from: usize,
    /// The position in this rank's order where the next batch begins.
    pub position: usize,
    /// Rows this rank handed out of that order before the position (padding rows included).
    pub rows: usize,
    /// Batches this rank handed out of the epoch before the position.
    pub batches: usize,
}

impl EpochStart {
    /// The beginning of `epoch`.
    pub fn beginning(epoch: u64) -> EpochStart {
        EpochStart {
            epoch,
            ..EpochStart::default()
        }
    }
}

/// What a listing is, in brief: its length, its fingerprint, its first and last ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListingSummary {
    /// Images listed.
    pub images: usize,
    /// The fingerprint of every id and label, in order.
    pub fingerprint: u64,
    /// The first image's id (empty for an empty listing).
    pub first: String,
    /// The last image's id.
    pub last: String,
}

impl std::fmt::Display for ListingSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} images from {:?} to {:?} (listing {:016x})",
            self.images, self.first, self.last, self.fingerprint
        )
    }
}

/// What a saved state must match to resume a pipeline: the source's listing and the options that
/// decide the output (each by the builder's name, with its value in words).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fingerprint {
    source: ListingSummary,
    options: Vec<(String, String)>,
}

impl Fingerprint {
    /// The fingerprint of a pipeline of a source listed as `listing`, under `options`.
    pub fn new(listing: &ListingSummary, options: &Options) -> Fingerprint {
        Fingerprint {
            source: listing.clone(),
            options: output_options(options),
        }
    }

    /// The same fingerprint with a pipeline of views' views, described in full (`views`):
    /// they decide every row (a state of a pipeline without views has no such entry).
    pub fn with_views(mut self, views: Option<String>) -> Fingerprint {
        if let Some(views) = views {
            self.options.push(("views".into(), views));
            self.options.sort_by(|a, b| a.0.cmp(&b.0));
        }
        self
    }
}

/// The options that decide which image each row holds and what its bytes are: the transforms
/// and the Pillow rounding they reproduce, the augmentations, the seeds, the normalization and
/// the tensor's type, the decoders and their limits (which decide which images are skipped),
/// and how shards are evened out; with MixUp or CutMix, the batch size too (each batch mixes
/// its own rows). Left out: otherwise the batch size, and the last-batch and error policies (a
/// resumed run cuts its batches anew from the same rows), the rank and world (see
/// [`PipelineState`]), the device, threads, prefetch depth and memory budget, and the partial
/// decode (which gives the same bytes).
fn output_options(options: &Options) -> Vec<(String, String)> {
    let floats = |values: &[f32; 3]| {
        values
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (decode, resize, output, batching) = (
        &options.decode,
        &options.resize,
        &options.output,
        &options.batching,
    );
    let augment = &options.augment;
    let alpha = |a: Option<f64>| a.map_or_else(|| "none".to_string(), |a| a.to_string());
    let jitter = augment.color_jitter;
    let mut described: Vec<(&str, String)> = vec![
        (
            "pillow_version",
            format!("{}.{}", resize.pillow_version.0, resize.pillow_version.1),
        ),
        ("augment", augment.policy.to_string()),
        (
            "augment_fill",
            augment.fill.map(|v| v.to_string()).join(","),
        ),
        (
            "color_jitter",
            format!(
                "{},{},{},{}",
                jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue
            ),
        ),
        (
            "random_erasing",
            augment.random_erasing.map_or_else(
                || "none".to_string(),
                |e| {
                    format!(
                        "p {} scale {}..{} ratio {}..{} value {}",
                        e.p,
                        e.scale.min,
                        e.scale.max,
                        e.ratio.min,
                        e.ratio.max,
                        e.value.map(|v| v.to_string()).join(",")
                    )
                },
            ),
        ),
        ("mixup", alpha(augment.mixup)),
        ("cutmix", alpha(augment.cutmix)),
        (
            "num_classes",
            augment
                .num_classes
                .map_or_else(|| "the source's".to_string(), |n| n.to_string()),
        ),
    ];
    if augment.mixes() {
        described.push(("batch_size", batching.batch_size.to_string()));
    }
    if decode.lanes != crate::options::Decode::Cpu {
        described.push(("assisted_share", decode.assisted_share.to_string()));
    }
    [
        ("resize", describe_resize(resize.mode)),
        ("interpolation", resize.interpolation.to_string()),
        ("horizontal_flip", resize.horizontal_flip.to_string()),
        ("seed", resize.seed.to_string()),
        (
            "shuffle_seed",
            batching
                .shuffle_seed
                .map_or_else(|| "none".to_string(), |s| s.to_string()),
        ),
        ("shard_balance", batching.shard_balance.to_string()),
        ("mean", floats(&output.mean)),
        ("std", floats(&output.std)),
        ("dtype", output.dtype.to_string()),
        ("layout", output.layout.to_string()),
        ("channel_order", output.channel_order.to_string()),
        ("decode", decode.lanes.to_string()),
        ("max_pixels", decode.max_pixels.to_string()),
        ("max_file_bytes", decode.max_file_bytes.to_string()),
        ("exif_orientation", decode.exif_orientation.to_string()),
        ("dct_scaling", decode.dct_scaling.to_string()),
        ("gray16", decode.gray16.to_string()),
    ]
    .into_iter()
    .chain(described)
    // A patch-sequence output decides every row (a state of a pipeline without one has no such
    // entry, so those states still resume).
    .chain(
        options
            .patches
            .as_ref()
            .map(|patches| ("patches", format!("{patches:?}"))),
    )
    .map(|(name, value)| (name.to_string(), value))
    // In the order of their names, as the text form keeps them.
    .collect::<std::collections::BTreeMap<_, _>>()
    .into_iter()
    .collect()
}

/// A resize mode with every parameter, exactly (floats in their shortest exact form).
fn describe_resize(mode: ResizeMode) -> String {
    match mode {
        ResizeMode::ShorterSideThenCenterCrop {
            shorter_side,
            height,
            width,
        } => format!("center-crop {shorter_side} {height}x{width}"),
        ResizeMode::Stretch { height, width } => format!("stretch {height}x{width}"),
        ResizeMode::Letterbox { height, width, pad } => {
            format!("letterbox {height}x{width} pad {pad}")
        }
        ResizeMode::RandomResizedCrop {
            height,
            width,
            scale,
            ratio,
        } => format!(
            "random-resized-crop {height}x{width} scale {}..{} ratio {}..{}",
            scale.min, scale.max, ratio.min, ratio.max
        ),
    }
}

/// Where a pipeline stands in its run, as its consumer saw it: the epoch, the position in the
/// epoch's order after the last batch handed out (batches prepared ahead do not count), the
/// rows and batches handed out, the rank and world, the GPU lane's share, and what it must be
/// resumed with (a fingerprint of the source's listing and the options that decide the output).
///
/// [`crate::Pipeline::state`] takes it; [`crate::PipelineBuilder::resume`] (or
/// [`crate::Pipeline::resume`]) goes on from it: the batches are then the rows, ids, labels,
/// padding flags, crop draws and skipped images the uninterrupted run would have given from
/// that point on, across epochs, whatever the thread count or prefetch depth. Resuming costs the
/// same as starting an epoch: its order is computed, and nothing before the position is read.
/// The text form is JSON ([`PipelineState::to_json`], [`PipelineState::save`]).
///
/// A state taken once an epoch has ended is the beginning of the next one. Taken after an error
/// ended an epoch early, it is the position after the last batch handed out.
///
/// **Several ranks.** Ranks hand out batches in lockstep, as data-parallel training does (every
/// rank takes a batch per step, and a checkpoint is taken after the same step on every rank);
/// with equal shards ([`crate::ShardBalance::Pad`] or [`crate::ShardBalance::Drop`]) every
/// batch has the same number of rows on every rank, so every rank's state names the same
/// [`PipelineState::global_position`]: the epoch's global order is taken up to there. A state is
/// resumed:
/// - by the rank that saved it, with the same world: exactly where that rank stood;
/// - by another rank of the same world: at the same number of rows into its own part, which is
///   exact unless that rank skipped images (bad files) before the checkpoint;
/// - with another world: the new ranks split what is left of the epoch's global order after the
///   global position among themselves (evened out by the shard balance as usual), and later
///   epochs are the new world's. With [`crate::ShardBalance::Uneven`] every image of the epoch
///   is then delivered exactly once across the two runs, unless images were skipped before the
///   checkpoint: each rank replaced its bad images with the next of its own, which a state of
///   one rank cannot know of, so as many images as were skipped may come twice.
///
/// Refused, naming what differs: a state of another source listing, of other options that
/// decide the output, or of an unknown format version. With hybrid decoding the state records
/// the GPU lane's share and a resumed pipeline takes it (an explicit other share is refused), so
/// every image is decoded by the same lane as before.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineState {
    start: EpochStart,
    shard: Shard,
    gpu_share: Option<f32>,
    fingerprint: Fingerprint,
}

impl PipelineState {
    /// The state of a pipeline about to begin its next batch at `start`.
    pub(crate) fn new(
        start: EpochStart,
        shard: Shard,
        gpu_share: Option<f32>,
        fingerprint: &Fingerprint,
    ) -> PipelineState {
        PipelineState {
            start,
            shard,
            gpu_share,
            fingerprint: fingerprint.clone(),
        }
    }

    /// The epoch the next batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.start.epoch
    }

    /// Batches the saving rank handed out of this epoch.
    pub fn batches(&self) -> usize {
        self.start.batches
    }

    /// Rows the saving rank handed out of this epoch's order (padding rows included; counted
    /// from the resume for an epoch resumed on another world).
    pub fn rows(&self) -> usize {
        self.start.rows
    }

    /// The position in the saving rank's order of the epoch where its next batch begins: the
    /// rows handed out, and the images skipped on the way.
    pub fn position(&self) -> usize {
        self.start.position
    }

    /// The saving rank and world.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The entry of the epoch's global order (the shuffled source, before it is split over the
    /// ranks) up to which the ranks have taken their images, as far as this rank can tell: the
    /// same on every rank with equal shards (see the type's description). A state resumed on
    /// another world goes on from here.
    pub fn global_position(&self) -> usize {
        let world = self.shard.world.max(1);
        self.start
            .rows
            .saturating_mul(world)
            .saturating_add(self.start.from)
            .min(self.fingerprint.source.images)
    }

    /// The GPU lane's share with hybrid decoding, once it was known.
    pub fn gpu_share(&self) -> Option<f32> {
        self.gpu_share
    }

    /// Images in the source the state was saved from.
    pub fn source_len(&self) -> usize {
        self.fingerprint.source.images
    }

    /// Where the pipeline of `here` (this process's `shard`, a GPU share given in its options or
    /// none) begins, and the share it takes; an error names everything that does not fit.
    pub(crate) fn resume_start(
        &self,
        here: &Fingerprint,
        shard: Shard,
        configured_share: Option<f32>,
    ) -> Result<(EpochStart, Option<f32>), ResumeError> {
        if here.source != self.fingerprint.source {
            return Err(ResumeError::Source {
                here: here.source.to_string(),
                saved: self.fingerprint.source.to_string(),
            });
        }
        let mut differences = Vec::new();
        // A state written before an option was recorded had it at its default.
        let defaults = output_options(&Options::default());
        let value = |options: &[(String, String)], name: &str| {
            options
                .iter()
                .chain(defaults.iter())
                .find(|(n, _)| n == name)
                .map_or_else(|| "not set".to_string(), |(_, v)| v.clone())
        };
        let mut names: Vec<&str> = here.options.iter().map(|(n, _)| n.as_str()).collect();
        for (name, _) in &self.fingerprint.options {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        for name in names {
            let (mine, saved) = (
                value(&here.options, name),
                value(&self.fingerprint.options, name),
            );
            if mine != saved {
                differences.push(OptionDifference {
                    option: name.to_string(),
                    here: mine,
                    saved,
                });
            }
        }
        if let (Some(mine), Some(saved)) = (configured_share, self.gpu_share) {
            if mine != saved {
                differences.push(OptionDifference {
                    option: "gpu_share".into(),
                    here: mine.to_string(),
                    saved: saved.to_string(),
                });
            }
        }
        if !differences.is_empty() {
            return Err(ResumeError::Options(differences));
        }
        let start = if shard.world != self.shard.world {
            // Another world: what is left of the epoch's global order, split anew.
            EpochStart {
                epoch: self.start.epoch,
                from: self.global_position(),
                position: 0,
                rows: 0,
                batches: self.start.batches,
            }
        } else if shard.rank != self.shard.rank {
            // Another rank of the same world: as many rows into its own part.
            EpochStart {
                position: self.start.rows,
                ..self.start
            }
        } else {
            self.start
        };
        Ok((start, configured_share.or(self.gpu_share)))
    }

    /// Refuses a start past the end of its epoch's order for this rank (`reach` positions,
    /// with one more round of its images where batches refill): a position no pipeline saves,
    /// which would skip the rest of the epoch without a word.
    pub(crate) fn check_reach(
        start: EpochStart,
        shard: Shard,
        reach: usize,
    ) -> Result<(), ResumeError> {
        if start.position > reach {
            return Err(ResumeError::Malformed(format!(
                "position {} is past the end of epoch {} for rank {} of {} (its order reaches \
                 position {reach})",
                start.position, start.epoch, shard.rank, shard.world
            )));
        }
        Ok(())
    }

    /// The state as JSON text (an object, printed on several lines).
    pub fn to_json(&self) -> String {
        let source = &self.fingerprint.source;
        let options: Map<String, Value> = self
            .fingerprint
            .options
            .iter()
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect();
        let state = json!({
            "format": FORMAT,
            "version": VERSION,
            "epoch": self.start.epoch,
            "batches": self.start.batches,
            "rows": self.start.rows,
            "position": self.start.position,
            "order_from": self.start.from,
            "global_position": self.global_position(),
            "rank": self.shard.rank,
            "world": self.shard.world,
            "gpu_share": self.gpu_share,
            "source": {
                "images": source.images,
                "listing": format!("{:016x}", source.fingerprint),
                "first": source.first,
                "last": source.last,
            },
            "options": options,
        });
        format!("{state:#}")
    }

    /// A state from its JSON text. Refuses text that is not a pipeline state (naming the field
    /// that is missing or wrong) and a state of another format version.
    pub fn from_json(text: &str) -> Result<PipelineState, ResumeError> {
        let value = strict_json(text)?;
        let root = Fields::of(&value, "the state")?;
        if root.text("format").ok() != Some(FORMAT) {
            return Err(ResumeError::Malformed(format!(
                "no \"format\": \"{FORMAT}\" field"
            )));
        }
        let version = root.number("version")?;
        if version != VERSION {
            return Err(ResumeError::Version {
                found: version,
                supported: VERSION,
            });
        }
        let source = Fields::of(root.get("source")?, "source")?;
        let listing = source.text("listing")?;
        let fingerprint = u64::from_str_radix(listing, 16).map_err(|_| {
            ResumeError::Malformed(format!(
                "source.listing {listing:?} is not a hexadecimal number"
            ))
        })?;
        let options = match root.get("options")? {
            Value::Object(map) => map
                .iter()
                .map(|(name, value)| match value {
                    Value::String(text) => Ok((name.clone(), text.clone())),
                    _ => Err(ResumeError::Malformed(format!(
                        "options.{name} is not a string"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(ResumeError::Malformed("options is not an object".into())),
        };
        let gpu_share = match root.get("gpu_share")? {
            Value::Null => None,
            share => Some(
                share
                    .as_f64()
                    .filter(|s| (0.0..=1.0).contains(s))
                    .ok_or_else(|| {
                        ResumeError::Malformed(format!(
                            "gpu_share {share} is not null or a share from 0 to 1"
                        ))
                    })? as f32,
            ),
        };
        let state = PipelineState {
            start: EpochStart {
                epoch: root.number("epoch")?,
                from: root.size("order_from")?,
                position: root.size("position")?,
                rows: root.size("rows")?,
                batches: root.size("batches")?,
            },
            shard: Shard::new(root.size("rank")?, root.size("world")?),
            gpu_share,
            fingerprint: Fingerprint {
                source: ListingSummary {
                    images: source.size("images")?,
                    fingerprint,
                    first: source.text("first")?.to_string(),
                    last: source.text("last")?.to_string(),
                },
                options,
            },
        };
        state.check()?;
        let global = root.size("global_position")?;
        if global != state.global_position() {
            return Err(ResumeError::Malformed(format!(
                "global_position {global} does not follow from order_from {}, rows {} and \
                 world {} ({})",
                state.start.from,
                state.start.rows,
                state.shard.world,
                state.global_position()
            )));
        }
        Ok(state)
    }

    /// Refuses numbers no pipeline writes.
    fn check(&self) -> Result<(), ResumeError> {
        let Shard { rank, world } = self.shard;
        let wrong = |what: String| Err(ResumeError::Malformed(what));
        if world == 0 || rank >= world {
            return wrong(format!("rank {rank} of world {world}: need rank < world"));
        }
        if self.start.rows > self.start.position {
            return wrong(format!(
                "{} rows handed out before position {}: each row takes a position",
                self.start.rows, self.start.position
            ));
        }
        if self.start.from > self.fingerprint.source.images {
            return wrong(format!(
                "order_from {} is past the source's {} images",
                self.start.from, self.fingerprint.source.images
            ));
        }
        Ok(())
    }

    /// Writes the state to `path` atomically: to a temporary file beside it, then renamed over
    /// it, so `path` holds this state or the one before, whenever the process is stopped. (The
    /// file is not flushed to the disk: that a power cut may lose.)
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), ResumeError> {
        let path = path.as_ref();
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(format!(".partial-{}", std::process::id()));
        let temporary = PathBuf::from(temporary);
        let failed = |source| ResumeError::File {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&temporary, self.to_json() + "\n").map_err(failed)?;
        std::fs::rename(&temporary, path).map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            failed(e)
        })
    }

    /// The state saved in `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<PipelineState, ResumeError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ResumeError::File {
            path: path.to_path_buf(),
            source,
        })?;
        PipelineState::from_json(&text).map_err(|e| match e {
            ResumeError::Malformed(reason) => {
                ResumeError::Malformed(format!("{}: {reason}", path.display()))
            }
            other => other,
        })
    }
}

impl std::str::FromStr for PipelineState {
    type Err = ResumeError;

    /// [`PipelineState::from_json`].
    fn from_str(text: &str) -> Result<PipelineState, ResumeError> {
        PipelineState::from_json(text)
    }
}

/// JSON text as a value, refusing an object that names a field twice (which `serde_json` would
/// read as its last value: a state edited or joined by hand is refused, not half-read).
fn strict_json(text: &str) -> Result<Value, ResumeError> {
    struct Strict(Value);

    struct Visitor;

    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Strict;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
            Ok(Strict(Value::Bool(v)))
        }

        fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
            Ok(Strict(Value::from(v)))
        }

        fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
            Ok(Strict(Value::from(v)))
        }

        fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
            Ok(Strict(Value::from(v)))
        }

        fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
            Ok(Strict(Value::String(v.to_string())))
        }

        fn visit_string<E>(self, v: String) -> Result<Strict, E> {
            Ok(Strict(Value::String(v)))
        }

        fn visit_unit<E>(self) -> Result<Strict, E> {
            Ok(Strict(Value::Null))
        }

        fn visit_none<E>(self) -> Result<Strict, E> {
            Ok(Strict(Value::Null))
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
            let mut items = Vec::new();
            while let Some(Strict(item)) = seq.next_element()? {
                items.push(item);
            }
            Ok(Strict(Value::Array(items)))
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
            let mut fields = Map::new();
            while let Some((key, Strict(value))) = map.next_entry::<String, Strict>()? {
                if fields.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!(
                        "the field {key:?} is given twice"
                    )));
                }
                fields.insert(key, value);
            }
            Ok(Strict(Value::Object(fields)))
        }
    }

    impl<'de> serde::Deserialize<'de> for Strict {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Strict, D::Error> {
            deserializer.deserialize_any(Visitor)
        }
    }

    serde_json::from_str::<Strict>(text)
        .map(|Strict(value)| value)
        .map_err(|e| ResumeError::Malformed(format!("not JSON: {e}")))
}

/// The fields of a JSON object, read with errors that name them.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    name: &'a str,
}

impl<'a> Fields<'a> {
    fn of(value: &'a Value, name: &'a str) -> Result<Fields<'a>, ResumeError> {
        match value {
            Value::Object(map) => Ok(Fields { map, name }),
            _ => Err(ResumeError::Malformed(format!("{name} is not an object"))),
        }
    }

    fn get(&self, field: &str) -> Result<&'a Value, ResumeError> {
        self.map
            .get(field)
            .ok_or_else(|| ResumeError::Malformed(format!("{} has no field {field:?}", self.name)))
    }

    fn number(&self, field: &str) -> Result<u64, ResumeError> {
        self.get(field)?.as_u64().ok_or_else(|| {
            ResumeError::Malformed(format!(
                "{field} is not a whole number from 0 to {}",
                u64::MAX
            ))
        })
    }

    fn size(&self, field: &str) -> Result<usize, ResumeError> {
        usize::try_from(self.number(field)?)
            .map_err(|_| ResumeError::Malformed(format!("{field} does not fit this machine")))
    }

    fn text(&self, field: &str) -> Result<&'a str, ResumeError> {
        self.get(field)?
            .as_str()
            .ok_or_else(|| ResumeError::Malformed(format!("{field} is not a string")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{DType, ResizeOptions, ShardBalance};
    use crate::source::Source;

    fn fingerprint(options: &Options) -> Fingerprint {
        let source = Source::paths(["a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg"]);
        Fingerprint::new(source.listing(), options)
    }

    fn state(start: EpochStart, shard: Shard) -> PipelineState {
        PipelineState::new(start, shard, Some(0.25), &fingerprint(&Options::default()))
    }

    #[test]
    fn the_text_form_reads_back_as_the_same_state() {
        let saved = state(
            EpochStart {
                epoch: 3,
                from: 1,
                position: 3,
                rows: 2,
                batches: 1,
            },
            Shard::new(1, 2),
        );
        let text = saved.to_json();
        assert_eq!(PipelineState::from_json(&text).expect("reads"), saved);
        assert_eq!(saved.global_position(), 5);
        let value: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value["global_position"], 5);
        assert_eq!(value["options"]["dtype"], "f16");
    }

    #[test]
    fn unknown_versions_and_damaged_text_are_refused() {
        let text = state(EpochStart::beginning(0), Shard::default()).to_json();
        let edited = |field: &str, to: Value| {
            let mut value: Value = serde_json::from_str(&text).expect("JSON");
            value[field] = to;
            PipelineState::from_json(&value.to_string())
        };
        assert!(matches!(
            edited("version", json!(2)),
            Err(ResumeError::Version {
                found: 2,
                supported: 1
            })
        ));
        for (field, to, says) in [
            ("format", json!("other"), "format"),
            ("epoch", json!(-1), "epoch"),
            ("rank", json!(2), "rank 2 of world 1"),
            ("rows", json!(9), "rows"),
            ("global_position", json!(4), "global_position"),
            ("gpu_share", json!(1.5), "gpu_share"),
        ] {
            match edited(field, to) {
                Err(ResumeError::Malformed(reason)) => assert!(reason.contains(says), "{reason}"),
                other => panic!("{field}: expected a malformed state, got {other:?}"),
            }
        }
        assert!(matches!(
            PipelineState::from_json("{"),
            Err(ResumeError::Malformed(_))
        ));
        // A field twice, at the top or inside: refused, naming it.
        let twice = text.replacen("\"epoch\": 0,", "\"epoch\": 0, \"epoch\": 7,", 1);
        assert_ne!(twice, text);
        match PipelineState::from_json(&twice) {
            Err(ResumeError::Malformed(reason)) => {
                assert!(reason.contains("\"epoch\" is given twice"), "{reason}")
            }
            other => panic!("a field twice must be refused, got {other:?}"),
        }
        let inside = text.replacen(
            "\"dtype\": \"f16\",",
            "\"dtype\": \"f16\", \"dtype\": \"f32\",",
            1,
        );
        assert_ne!(inside, text);
        assert!(matches!(
            PipelineState::from_json(&inside),
            Err(ResumeError::Malformed(_))
        ));
    }

    #[test]
    fn every_option_that_changes_the_rows_is_in_the_state_and_refused_by_name() {
        use crate::augment::{Augment, AugmentOptions, RandomErasing};
        let options = Options::default();
        let trained = options.augment(
            AugmentOptions::default()
                .policy(Augment::TrivialAugmentWide)
                .mixup(Some(0.8)),
        );
        let saved = PipelineState::new(
            EpochStart::beginning(0),
            Shard::default(),
            None,
            &fingerprint(&trained),
        );
        let refused = |here: Options| -> Vec<String> {
            match saved.resume_start(&fingerprint(&here), Shard::default(), None) {
                Err(ResumeError::Options(d)) => {
                    let mut names: Vec<String> = d.into_iter().map(|d| d.option).collect();
                    names.sort();
                    names
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        };
        assert_eq!(refused(options), ["augment", "batch_size", "mixup"]);
        let other_policy = trained.augment(trained.augment.policy(Augment::RandAugment {
            num_ops: 2,
            magnitude: 9,
        }));
        assert_eq!(refused(other_policy), ["augment"]);
        assert_eq!(
            refused(trained.augment(trained.augment.mixup(Some(0.3)))),
            ["mixup"]
        );
        // Under mixing, each batch mixes its own rows: another batch size is another output.
        assert_eq!(
            refused(trained.batching(trained.batching.batch_size(7))),
            ["batch_size"]
        );
        let erased = trained.augment(
            trained
                .augment
                .random_erasing(Some(RandomErasing::new(0.25))),
        );
        assert_eq!(refused(erased), ["random_erasing"]);
        let pillow = trained.resize(trained.resize.pillow_version(12, 1));
        assert_eq!(refused(pillow), ["pillow_version"]);
        // A state written before augmentations were recorded resumes a pipeline without them.
        let plain = PipelineState::new(
            EpochStart::beginning(0),
            Shard::default(),
            None,
            &fingerprint(&options),
        );
        let mut value: Value = serde_json::from_str(&plain.to_json()).expect("JSON");
        for name in [
            "augment",
            "mixup",
            "cutmix",
            "color_jitter",
            "pillow_version",
        ] {
            value["options"]
                .as_object_mut()
                .expect("options")
                .remove(name);
        }
        let old = PipelineState::from_json(&value.to_string()).expect("reads");
        assert!(old
            .resume_start(&fingerprint(&options), Shard::default(), None)
            .is_ok());
        assert!(old
            .resume_start(&fingerprint(&trained), Shard::default(), None)
            .is_err());
    }

    #[test]
    fn another_source_or_output_is_refused_naming_it() {
        let saved = state(EpochStart::beginning(1), Shard::default());
        let options = Options::default();
        let other = options
            .resize(ResizeOptions::imagenet_train(224, 9))
            .output(options.output.dtype(DType::F32))
            .batching(options.batching.shard_balance(ShardBalance::Uneven));
        let Err(ResumeError::Options(differences)) =
            saved.resume_start(&fingerprint(&other), Shard::default(), Some(0.5))
        else {
            panic!("other options must be refused");
        };
        let names: Vec<&str> = differences.iter().map(|d| d.option.as_str()).collect();
        assert_eq!(
            names,
            [
                "dtype",
                "horizontal_flip",
                "resize",
                "seed",
                "shard_balance",
                "gpu_share"
            ]
        );
        assert_eq!(
            (differences[3].here.as_str(), differences[3].saved.as_str()),
            ("9", "0")
        );
        let fewer = Fingerprint::new(Source::paths(["a.jpg"]).listing(), &options);
        let error = saved
            .resume_start(&fewer, Shard::default(), None)
            .expect_err("another listing");
        assert!(error.to_string().contains("1 images"), "{error}");
        // Options that leave the rows as they are may change.
        let cut = options.batching(options.batching.batch_size(7));
        let (start, share) = saved
            .resume_start(&fingerprint(&cut), Shard::default(), None)
            .expect("resumes");
        assert_eq!((start, share), (EpochStart::beginning(1), Some(0.25)));
    }

    #[test]
    fn ranks_and_worlds_resume_where_the_saved_state_says() {
        let saved = state(
            EpochStart {
                epoch: 2,
                from: 0,
                position: 4,
                rows: 1,
                batches: 1,
            },
            Shard::new(0, 2),
        );
        let here = fingerprint(&Options::default());
        let at = |shard| saved.resume_start(&here, shard, None).expect("resumes").0;
        assert_eq!(at(Shard::new(0, 2)), saved.start);
        // Rank 1 of the same world: as many rows into its own part.
        assert_eq!(
            at(Shard::new(1, 2)),
            EpochStart {
                position: 1,
                ..saved.start
            }
        );
        // Three ranks: the global order from 1 row x 2 ranks on.
        assert_eq!(
            at(Shard::new(2, 3)),
            EpochStart {
                epoch: 2,
                from: 2,
                position: 0,
                rows: 0,
                batches: 1
            }
        );
    }
}
