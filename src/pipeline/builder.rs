//! [`PipelineBuilder`]: one setter per option, each touching exactly its option, so setters
//! cannot undo each other whatever their order.

use super::Pipeline;
use crate::error::{Error, Result};
use crate::options::{
    ChannelOrder, DType, Decode, Device, Gray16, Interpolation, LastBatch, Layout, OnError,
    Options, ResizeMode, Shard, ShardBalance,
};
use crate::order::PipelineState;
use crate::source::Source;

/// Builds a [`Pipeline`]; every option has torchvision's default (see [`Options`]).
#[derive(Debug, Clone, Default)]
pub struct PipelineBuilder {
    source: Option<Source>,
    options: Options,
    /// The device was chosen with [`PipelineBuilder::device`].
    device_chosen: bool,
    /// Shard (and GPU) from the launcher's environment, read at build.
    shard_from_env: bool,
    /// Where to begin, from a saved state.
    resume: Option<PipelineState>,
    /// Views of each image instead of one image each.
    views: Option<std::sync::Arc<crate::views::Views>>,
}

impl PipelineBuilder {
    /// The images to read (required).
    pub fn source(mut self, source: Source) -> Self {
        self.source = Some(source);
        self
    }

    /// Images per batch (default 256).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.options.batching.batch_size = n;
        self
    }

    /// How images reach the output size, which the mode carries (default
    /// `ResizeMode::center_crop(256, 224)`: torchvision's `Resize(256)` + `CenterCrop(224)`).
    pub fn resize(mut self, mode: ResizeMode) -> Self {
        self.options.resize.mode = mode;
        self
    }

    /// The Pillow version whose rounding to reproduce, `major.minor` (default 13.0, the current
    /// one): Pillow changed the order of its two resampling passes in 12.2 and again in 13.0,
    /// which moves a level here and there ([`crate::ResizeOptions::pillow_version`]). Give the
    /// version torchvision runs on to get its bytes exactly.
    pub fn pillow_version(mut self, major: u32, minor: u32) -> Self {
        self.options.resize.pillow_version = (major, minor);
        self
    }

    /// torchvision's `RandomHorizontalFlip(p)`: each image mirrored left to right with chance
    /// `chance` (default 0).
    pub fn horizontal_flip(mut self, chance: f64) -> Self {
        self.options.resize.horizontal_flip = chance;
        self
    }

    /// Seed of the random transforms: each image's crop and flip are drawn from it, the epoch
    /// and the image's index alone (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.options.resize.seed = seed;
        self
    }

    /// torchvision's ImageNet training recipe in one call: `RandomResizedCrop(size)` +
    /// `RandomHorizontalFlip()`, drawn from `seed`, and a new shuffle of the source every epoch
    /// from the same seed.
    pub fn imagenet_train(mut self, size: u32, seed: u64) -> Self {
        let interpolation = self.options.resize.interpolation;
        self.options.resize =
            crate::ResizeOptions::imagenet_train(size, seed).interpolation(interpolation);
        self.options.batching.shuffle_seed = Some(seed);
        self
    }

    /// torchvision's automatic augmentation policy on every image (default none); see
    /// [`crate::Augment`].
    pub fn augment(mut self, policy: crate::Augment) -> Self {
        self.options.augment.policy = policy;
        self
    }

    /// torchvision's `ColorJitter(brightness, contrast, saturation, hue)` (default none).
    pub fn color_jitter(
        mut self,
        brightness: f64,
        contrast: f64,
        saturation: f64,
        hue: f64,
    ) -> Self {
        self.options.augment.color_jitter = crate::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        };
        self
    }

    /// torchvision's `RandomErasing(p)` with its defaults (default none); see
    /// [`crate::RandomErasing`] for the other parameters, set with
    /// [`PipelineBuilder::augment_options`].
    pub fn random_erasing(mut self, p: f64) -> Self {
        self.options.augment.random_erasing = Some(crate::RandomErasing::new(p));
        self
    }

    /// torchvision's `MixUp(alpha)` across each batch (default none); needs labels.
    pub fn mixup(mut self, alpha: f64) -> Self {
        self.options.augment.mixup = Some(alpha);
        self
    }

    /// torchvision's `CutMix(alpha)` across each batch (default none); needs labels. With
    /// [`PipelineBuilder::mixup`] too, each batch takes one of the two.
    pub fn cutmix(mut self, alpha: f64) -> Self {
        self.options.augment.cutmix = Some(alpha);
        self
    }

    /// Classes of the soft labels of mixed batches (default: the image folder's class count).
    pub fn num_classes(mut self, classes: usize) -> Self {
        self.options.augment.num_classes = Some(classes);
        self
    }

    /// Every augmentation option at once.
    pub fn augment_options(mut self, augment: crate::AugmentOptions) -> Self {
        self.options.augment = augment;
        self
    }

    /// A training recipe: `.imagenet_train(size, seed)` (RandomResizedCrop + flip, shuffled)
    /// and the recipe's augmentations ([`crate::Recipe::augment_options`]), keeping a
    /// `num_classes` given before.
    pub fn recipe(self, recipe: crate::Recipe, size: u32, seed: u64) -> Self {
        let classes = self.options.augment.num_classes;
        let mut b = self.imagenet_train(size, seed);
        b.options.augment = recipe.augment_options().num_classes(classes);
        b
    }

    /// Patch sequences instead of fixed-size images, for vision transformers and
    /// vision-language models: each image resized by `patches`' rule near its own size and
    /// aspect ratio, cut into patches in the model's order and normalized with the reference's
    /// own arithmetic, the batch's tokens packed (`cu_seqlens`) or padded (a mask and patch
    /// coordinates). [`crate::Batch::tokens`] and [`crate::Batch::patches`] give them.
    ///
    /// ```no_run
    /// use gpufeed::patches::Patches;
    /// use gpufeed::{DType, Pipeline, Source};
    /// let mut pipeline = Pipeline::builder()
    ///     .source(Source::directory("photos")?)
    ///     .patches(Patches::qwen2_vl().max_pixels(28 * 28 * 256))
    ///     .batch_size(32)
    ///     .dtype(DType::BF16)
    ///     .build()?;
    /// while let Some(batch) = pipeline.next_batch()? {
    ///     let pixel_values = batch.tokens().expect("tokens"); // [rows, 1176] on the GPU
    ///     let image_grid_thw = batch.patches().expect("patches").grids_tensor()?;
    /// #   let _ = (pixel_values, image_grid_thw);
    /// }
    /// # Ok::<(), gpufeed::Error>(())
    /// ```
    ///
    /// The preset brings its own sizes, filter, mean and std: the resize mode, flip,
    /// interpolation, mean and std, layout and augmentations of fixed-size images are refused
    /// beside it (`build` names the option). With [`Patches::timm_naflex`] the batches are
    /// planned ahead of each epoch from the seed ([`PipelineBuilder::seed`]): a sequence
    /// length each and as many images as the token budget holds, so the batch size option is
    /// not used; a state resumes with as many ranks as saved it.
    ///
    /// [`Patches::timm_naflex`]: crate::patches::Patches::timm_naflex
    pub fn patches(mut self, patches: crate::patches::Patches) -> Self {
        self.options.patches = Some(patches);
        self
    }

    /// Several views of each image instead of one image each, for self-supervised training
    /// (DINOv2's 2 global and 8 local crops, SimCLR's two): each image decoded once (on a CUDA
    /// device by the GPU decode lane or the CPU lane, as `decode` says; on the CPU by the CPU
    /// lane), every view cut, resized, flipped and coloured from it as `views` draws from (seed,
    /// epoch, index, view), with the views' own seed ([`crate::views::Views::seed`]). Each batch
    /// then carries one tensor per view group ([`crate::Batch::views`]): `[count, N, 3, size,
    /// size]` (NCHW) or `[count, N, size, size, 3]` (NHWC), of the dtype, normalized with the
    /// mean and std, on the device; [`crate::Batch::view_draws`] says what each view drew.
    ///
    /// ```no_run
    /// use gpufeed::views::Views;
    /// use gpufeed::{Pipeline, Source};
    /// let mut pipeline = Pipeline::builder()
    ///     .source(Source::directory("photos")?)
    ///     .views(Views::dinov2().seed(7))
    ///     .shuffle(7)
    ///     .batch_size(64)
    ///     .build()?;
    /// while let Some(batch) = pipeline.next_batch()? {
    ///     let views = batch.views().expect("views");
    ///     let (global, local) = (&views[0], &views[2]); // [1, 64, 3, 224, 224], [8, 64, 3, 96, 96]
    /// #   let _ = (global, local);
    /// }
    /// # Ok::<(), gpufeed::Error>(())
    /// ```
    ///
    /// The resize mode, flip, augmentations and patch sequences are for one image each: the
    /// augmentations and patch sequences are refused beside views, the resize mode and flip not
    /// used.
    pub fn views(mut self, views: crate::views::Views) -> Self {
        self.views = Some(std::sync::Arc::new(views));
        self
    }

    /// The views set so far ([`PipelineBuilder::views`]), if any.
    pub fn views_set(&self) -> Option<&crate::views::Views> {
        self.views.as_deref()
    }

    /// A fixed-size evaluation transform by name (CLIP, SigLIP at 384 or 224, DINOv2): its
    /// resize and crop, filter, mean and std ([`crate::patches::EvalPreset`]); the dtype and
    /// layout stay as set.
    pub fn eval_preset(mut self, preset: crate::patches::EvalPreset) -> Self {
        self.options.resize.mode = preset.resize().mode;
        self.options.resize.interpolation = preset.resize().interpolation;
        self.options.output = preset.output(self.options.output);
        self
    }

    /// Resampling filter (default: antialiased bilinear).
    pub fn interpolation(mut self, interpolation: Interpolation) -> Self {
        self.options.resize.interpolation = interpolation;
        self
    }

    /// Per-channel mean and standard deviation in 0..1 units, RGB order (default ImageNet's).
    /// They apply to the colour they name whatever the output channel order.
    pub fn mean_std(mut self, mean: [f32; 3], std: [f32; 3]) -> Self {
        self.options.output.mean = mean;
        self.options.output.std = std;
        self
    }

    /// Output element type (default f16).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.options.output.dtype = dtype;
        self
    }

    /// Output layout (default NCHW).
    pub fn layout(mut self, layout: Layout) -> Self {
        self.options.output.layout = layout;
        self
    }

    /// Output channel order (default RGB).
    pub fn channel_order(mut self, order: ChannelOrder) -> Self {
        self.options.output.channel_order = order;
        self
    }

    /// Batches prepared ahead of the consumer (default 2).
    pub fn prefetch(mut self, depth: usize) -> Self {
        self.options.runtime.prefetch = depth;
        self
    }

    /// Threads of the CPU stage (default 0: one per core).
    pub fn threads(mut self, threads: usize) -> Self {
        self.options.runtime.threads = threads;
        self
    }

    /// Where the output lives (default `Device::Cuda(0)`, or the launcher's GPU with
    /// [`PipelineBuilder::shard_from_env`]).
    pub fn device(mut self, device: Device) -> Self {
        self.options.runtime.device = device;
        self.device_chosen = true;
        self
    }

    /// On a CUDA device that cannot be used (no driver, no NVRTC, no such device), runs on the
    /// CPU instead of failing, and [`Pipeline::cpu_fallback`] says why (default off: `build()`
    /// fails). See [`crate::RuntimeOptions::cpu_fallback`].
    pub fn cpu_fallback(mut self, fall_back: bool) -> Self {
        self.options.runtime.cpu_fallback = fall_back;
        self
    }

    /// What a bad image does (default: skip it and list it on the batch).
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.options.batching.on_error = policy;
        self
    }

    /// Keep or drop a last partial batch (default keep).
    pub fn last_batch(mut self, policy: LastBatch) -> Self {
        self.options.batching.last_batch = policy;
        self
    }

    /// Shuffle each epoch with a permutation drawn from `seed` and the epoch number.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.options.batching.shuffle_seed = Some(seed);
        self
    }

    /// Take only this process's part: every `world`-th image of the (shuffled) order starting at
    /// `rank`. The parts of ranks `0..world` are disjoint and cover the source.
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.options.batching.shard = Shard::new(rank, world);
        self
    }

    /// How the ranks' shards are evened out (default [`ShardBalance::Pad`]: every rank yields
    /// the same number of batches).
    pub fn shard_balance(mut self, balance: ShardBalance) -> Self {
        self.options.batching.shard_balance = balance;
        self
    }

    /// Take the shard from the launcher's environment at build ([`crate::Launch::from_env`]:
    /// torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK` or Slurm's), and, unless
    /// [`PipelineBuilder::device`] chose one, the GPU `cuda:LOCAL_RANK`. With
    /// [`crate::SHARED_MACHINE_MIN_RANKS`] ranks or more on this machine (`LOCAL_WORLD_SIZE` or
    /// `SLURM_NTASKS_PER_NODE`) the GPU lane's share stays at
    /// [`crate::SHARED_MACHINE_MIN_GPU_SHARE`] or more, unless [`PipelineBuilder::min_gpu_share`]
    /// set a floor. `build` fails, naming the variables, when they are missing or inconsistent.
    pub fn shard_from_env(mut self) -> Self {
        self.shard_from_env = true;
        self
    }

    /// Refuse images that claim more pixels than this (default [`crate::DEFAULT_MAX_PIXELS`]).
    pub fn max_pixels(mut self, max_pixels: u64) -> Self {
        self.options.decode.max_pixels = max_pixels;
        self
    }

    /// Rotate and flip images as their EXIF orientation tag says (default off, like torchvision,
    /// whose PIL loader ignores the tag).
    pub fn exif_orientation(mut self, apply: bool) -> Self {
        self.options.decode.exif_orientation = apply;
        self
    }

    /// Decode large JPEGs reduced in the DCT domain (default off); see
    /// [`crate::DecodeOptions::dct_scaling`].
    pub fn dct_scaling(mut self, on: bool) -> Self {
        self.options.decode.dct_scaling = on;
        self
    }

    /// Refuse files larger than this many bytes, before reading them (default
    /// [`crate::DEFAULT_MAX_FILE_BYTES`]).
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.options.decode.max_file_bytes = bytes;
        self
    }

    /// The most memory the decode threads hold together for images in flight (default
    /// [`crate::DEFAULT_DECODE_MEMORY`]); see [`crate::DecodeOptions::memory_limit`].
    pub fn decode_memory(mut self, bytes: u64) -> Self {
        self.options.decode.memory_limit = bytes;
        self
    }

    /// Which decoders fill the batches (default: the CPU threads alone); see [`Decode`].
    pub fn decode(mut self, lanes: Decode) -> Self {
        self.options.decode.lanes = lanes;
        self
    }

    /// With hybrid or automatic decoding, the share of the GPU lane's images it is given
    /// (default: following the lanes); see [`crate::DecodeOptions::gpu_share`].
    pub fn gpu_share(mut self, share: f32) -> Self {
        self.options.decode.gpu_share = Some(share);
        self
    }

    /// With the share following the lanes' rates, the least it falls to (default: no floor,
    /// unless four ranks or more share the machine); see [`crate::DecodeOptions::min_gpu_share`].
    pub fn min_gpu_share(mut self, share: f32) -> Self {
        self.options.decode.min_gpu_share = Some(share);
        self
    }

    /// Of the GPU lane's baseline JPEGs of 1 Mpx or more, the share its assisted path decodes
    /// beside the JPEG engines (of smaller ones, three in four at most); see
    /// [`crate::DecodeOptions::assisted_share`].
    pub fn assisted_share(mut self, share: f32) -> Self {
        self.options.decode.assisted_share = share;
        self
    }

    /// How many epochs the run will take: automatic decoding leaves a run shorter than the GPU
    /// lane's opening to the CPU threads; see [`crate::DecodeOptions::planned_epochs`].
    pub fn planned_epochs(mut self, epochs: u64) -> Self {
        self.options.decode.planned_epochs = Some(epochs);
        self
    }

    /// How 16-bit gray images become 8-bit (default: clipped, like torchvision).
    pub fn gray16(mut self, conversion: Gray16) -> Self {
        self.options.decode.gray16 = conversion;
        self
    }

    /// Begin where `state` says (a pipeline's [`Pipeline::state`], saved with the model's
    /// checkpoint) instead of at the first epoch: the batches are those the saving pipeline would
    /// have handed out next. `build` refuses, naming what differs, a state of another source
    /// listing or of other options that decide the output; see [`PipelineState`] for several
    /// ranks and another world.
    pub fn resume(mut self, state: PipelineState) -> Self {
        self.resume = Some(state);
        self
    }

    /// Every option at once, replacing those set so far (the source, views and resume state
    /// stay as set).
    pub fn all_options(mut self, options: Options) -> Self {
        self.options = options;
        self.device_chosen = true;
        self
    }

    /// The options set so far.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Checks the options, opens the device, compiles the kernel, allocates the staging ring and
    /// starts the first epoch in the background. On a CUDA device the CPU threads start on the
    /// first epoch before the device opens (unless a GPU share is given), so that images are
    /// decoded while the context, the staging and the kernels come up.
    pub fn build(self) -> Result<Pipeline> {
        let source = self
            .source
            .ok_or_else(|| Error::invalid("source", "no source: call .source(...)"))?;
        let mut options = self.options;
        if self.shard_from_env {
            let launch = crate::Launch::from_env()?;
            options.batching.shard = launch.shard();
            options.decode = launch.decode_options(options.decode);
            if !self.device_chosen {
                options.runtime.device = launch.device();
            }
        }
        Pipeline::open(source, options, self.views, self.resume.as_ref())
    }
}
