//! Bytes to pixels: the decoders' limits and choices, and the lanes that decode.

use std::fmt;
use std::str::FromStr;

use super::ParseOptionError;
use crate::error::{Error, Result};

/// Default pixel limit: Pillow's decompression-bomb error threshold (2 x 89,478,485), so every
/// image Pillow opens opens here too, and a forged header cannot make us allocate gigabytes.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

/// Which decoders fill the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Decode {
    /// The fastest the machine offers: [`Decode::Hybrid`] on a CUDA device whose JPEG engines
    /// nvJPEG can drive, [`Decode::Cpu`] otherwise. The pipeline says which it runs and why
    /// ([`crate::Pipeline::decode_description`]).
    #[default]
    Auto,
    /// The CPU threads decode every image (libjpeg-turbo for JPEG): torchvision's decoder.
    Cpu,
    /// The GPU's hardware JPEG engines (nvJPEG) beside the CPU threads: baseline colour JPEGs
    /// can go to the GPU lane, resized there exactly as Pillow resizes; everything else, and any
    /// image the GPU lane cannot take, goes to the CPU threads. Needs a CUDA device; where the
    /// engines or nvJPEG are missing, the CPU threads decode everything and the pipeline's
    /// device description says why.
    Hybrid,
}

named_choices!(
    Decode,
    "decode lanes",
    [
        (Decode::Auto, ["auto"]),
        (Decode::Cpu, ["cpu"]),
        (Decode::Hybrid, ["hybrid"]),
    ]
);

/// How 16-bit gray images (Pillow's `I;16`) become 8-bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Gray16 {
    /// Values over 255 become 255, as Pillow's `convert("RGB")` (and so torchvision) does.
    #[default]
    Clip,
    /// `v * 255 / 65535`, rounded: the whole 16-bit range kept, unlike torchvision.
    Scale,
}

named_choices!(
    Gray16,
    "16-bit gray conversion",
    [(Gray16::Clip, ["clip"]), (Gray16::Scale, ["scale"]),]
);

/// The most scans a progressive JPEG may have, on either lane (libjpeg-turbo's scan limit on the
/// CPU lane, the assisted path's progressive decoder on the GPU lane): real files have about
/// ten; a crafted file with thousands would take seconds.
pub(crate) const MAX_PROGRESSIVE_SCANS: u32 = 500;

/// Default [`DecodeOptions::max_file_bytes`]: 1 GiB, twice the largest uncompressed 8-bit RGB
/// file at [`DEFAULT_MAX_PIXELS`].
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

/// Default [`DecodeOptions::memory_limit`]: 4 GiB.
pub const DEFAULT_DECODE_MEMORY: u64 = 4 << 30;

/// Bytes to pixels: limits and decoder choices.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct DecodeOptions {
    /// Images that claim more pixels than this are refused from their header, before decoding
    /// (default [`DEFAULT_MAX_PIXELS`]).
    pub max_pixels: u64,
    /// Apply the EXIF orientation tag of JPEG, PNG, WebP and TIFF files (default off, like
    /// torchvision, whose PIL loader ignores the tag).
    pub exif_orientation: bool,
    /// Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the part the output
    /// uses keeps at least twice the output's pixels along each axis: faster on photos much
    /// larger than the output, at a small cost in fidelity to torchvision (which decodes at full
    /// size). Default off.
    pub dct_scaling: bool,
    /// Decode only the part of a JPEG the resize reads (default on). The output is the same bit
    /// for bit; turning it off only serves to measure what it saves.
    pub partial_decode: bool,
    /// Files larger than this are refused before they are read (default
    /// [`DEFAULT_MAX_FILE_BYTES`]).
    pub max_file_bytes: u64,
    /// The most memory the decode threads of a pipeline hold together for images in flight
    /// (their encoded bytes and decoded pixels), whatever the number of threads: an image
    /// reserves its share from its header before it is read, and waits while others hold too
    /// much; one larger than the whole limit is decoded alone (default
    /// [`DEFAULT_DECODE_MEMORY`]). While a CUDA device opens at build, the CPU threads also keep
    /// up to an eighth of it of finished images ahead of the first batch.
    pub memory_limit: u64,
    /// 16-bit gray to 8 bits: clipped like torchvision (default) or scaled.
    pub gray16: Gray16,
    /// Which decoders fill the batches (default: [`Decode::Auto`]).
    pub lanes: Decode,
    /// With hybrid or automatic decoding, the share of the images the GPU lane can take that it
    /// is offered, 0 to 1. `None` (default): it starts at 1 (every image) once the GPU lane has
    /// opened and follows the lanes' measured rates; the pipeline reports it
    /// ([`crate::Pipeline::gpu_share`]). Giving a share makes every run offer every image to the
    /// same lane (an image the lane fails or refuses at run time still goes to the CPU lane,
    /// whose inverse DCT may differ from the JPEG engines'); [`Decode::Cpu`] gives the same bytes
    /// on every run.
    pub gpu_share: Option<f32>,
    /// With the share following the rates, the least it may fall to, 0 to 1. Default `None` (no
    /// floor), and [`SHARED_MACHINE_MIN_GPU_SHARE`] for a process that shares its machine with
    /// [`SHARED_MACHINE_MIN_RANKS`] ranks of its job or more
    /// ([`DecodeOptions::ranks_on_machine`]): each rank's CPU lane slows the others' decodes and
    /// calls to their engines (what the cores share), which its own lanes' rates do not show.
    pub min_gpu_share: Option<f32>,
    /// Of the GPU lane's baseline JPEGs of 1 Mpx or more, the share its assisted path decodes
    /// (entropy decoding, inverse DCT, upsampling and colour on the GPU's cores, exactly as
    /// libjpeg-turbo does) beside the JPEG engines, 0 to 1 (default
    /// [`DEFAULT_ASSISTED_SHARE`]). Of the smaller ones it decodes three in four beside the
    /// engines, at most this share, unless a [`DecodeOptions::gpu_share`] below 1 is given (the
    /// engines then take them all); with the share following the rates, no floor and this share
    /// at 1, the engines stay closed on small files and it decodes them all. Which images take
    /// it depends on the files alone (and, before the engines join, on timing). The path also
    /// takes every progressive JPEG the GPU lane is offered, unless this is 0 (which turns it
    /// off: the CPU threads then decode those).
    pub assisted_share: f32,
    /// How many epochs the run will take, when known (default `None`: unknown, as many as the
    /// caller asks for): the run ends before epoch `planned_epochs` (counting from 0, epochs
    /// before a resumed state included). With [`Decode::Auto`], a run the CPU threads would
    /// decode in less time than the GPU lane takes to open (about 0.3 s) is left to the CPU
    /// threads, and one they would decode in under four seconds (the JPEG engines' opening and
    /// as long again to repay their joining) opens the lane's assisted path alone; so does
    /// [`Decode::Hybrid`] for such a run, unless [`DecodeOptions::gpu_share`] is given (the
    /// lane then opens whole before the first batch) or the assisted path is off. The lanes do
    /// not start on the epoch after the last one ahead of its asking. The command line gives
    /// its `--epochs`.
    pub planned_epochs: Option<u64>,
}

/// [`DecodeOptions::min_gpu_share`] of a rank sharing its machine with others: the GPU lane
/// takes every image it can (its assisted path until the JPEG engines join, then the engines),
/// and its CPU threads only the files it refuses. On the 4-H200 machine (64 epochs of 8,192
/// ImageNet-sized files a rank, in turn) four ranks ran 1.31-1.34x faster once the engines had
/// joined (109,561 and 105,854 images/s together against 83,867 and 79,037 with the share
/// following each rank's rates) and ended 1.20-1.31x sooner; holding it from the start, before
/// the engines join too, made four ranks 1.10-1.14x faster from the first batch on two later
/// starts (106,700 and 103,281 images/s against 93,581 and 94,268 over 32 epochs). A floor of
/// 0.9, which leaves the CPU threads a tenth of the images, was measured no faster on another
/// start.
pub const SHARED_MACHINE_MIN_GPU_SHARE: f32 = 1.0;

/// The fewest ranks on one machine that put [`SHARED_MACHINE_MIN_GPU_SHARE`] under each one's
/// share. Two ranks on the 2-H200 machine (16 cores each, 16 epochs of 16,384 files a rank,
/// in turn, four rounds on two starts) kept 0.85-0.89 of twice one alone with the floor and
/// 0.92-0.97 without it (on the second start 55,401-55,665 images/s together against
/// 60,289-63,470): with half as many cores busy, a rank's CPU threads add more than they cost
/// the other.
pub const SHARED_MACHINE_MIN_RANKS: usize = 4;

/// Default [`DecodeOptions::assisted_share`]: all of them. On camera-size baseline photos the
/// assisted path alone was faster than any split with the engines (H200 machine: 1,790-1,910
/// images/s, against 1,720 with three quarters and 1,100 with the engines alone). On small
/// files too, with the share following the rates, the engines then stay closed: the assisted
/// path alone decoded them 1.18-1.40x faster than beside them (an H200, 2026-12-06).
pub const DEFAULT_ASSISTED_SHARE: f32 = 1.0;

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_pixels: DEFAULT_MAX_PIXELS,
            exif_orientation: false,
            dct_scaling: false,
            partial_decode: true,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            memory_limit: DEFAULT_DECODE_MEMORY,
            gray16: Gray16::Clip,
            lanes: Decode::Auto,
            gpu_share: None,
            min_gpu_share: None,
            assisted_share: DEFAULT_ASSISTED_SHARE,
            planned_epochs: None,
        }
    }
}

impl DecodeOptions {
    /// Sets [`DecodeOptions::max_pixels`].
    pub fn max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    /// Sets [`DecodeOptions::exif_orientation`].
    pub fn exif_orientation(mut self, apply: bool) -> Self {
        self.exif_orientation = apply;
        self
    }

    /// Sets [`DecodeOptions::dct_scaling`].
    pub fn dct_scaling(mut self, on: bool) -> Self {
        self.dct_scaling = on;
        self
    }

    /// Sets [`DecodeOptions::partial_decode`].
    pub fn partial_decode(mut self, on: bool) -> Self {
        self.partial_decode = on;
        self
    }

    /// Sets [`DecodeOptions::max_file_bytes`].
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Sets [`DecodeOptions::memory_limit`].
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Sets [`DecodeOptions::lanes`].
    pub fn lanes(mut self, lanes: Decode) -> Self {
        self.lanes = lanes;
        self
    }

    /// Sets [`DecodeOptions::gpu_share`].
    pub fn gpu_share(mut self, share: Option<f32>) -> Self {
        self.gpu_share = share;
        self
    }

    /// Sets [`DecodeOptions::min_gpu_share`].
    pub fn min_gpu_share(mut self, share: Option<f32>) -> Self {
        self.min_gpu_share = share;
        self
    }

    /// For a process one of `ranks` of its job on this machine (its launcher's
    /// `LOCAL_WORLD_SIZE`): with [`SHARED_MACHINE_MIN_RANKS`] or more,
    /// [`DecodeOptions::min_gpu_share`] becomes [`SHARED_MACHINE_MIN_GPU_SHARE`] unless it was
    /// set.
    pub fn ranks_on_machine(mut self, ranks: usize) -> Self {
        if ranks >= SHARED_MACHINE_MIN_RANKS && self.min_gpu_share.is_none() {
            self.min_gpu_share = Some(SHARED_MACHINE_MIN_GPU_SHARE);
        }
        self
    }

    /// Sets [`DecodeOptions::assisted_share`].
    pub fn assisted_share(mut self, share: f32) -> Self {
        self.assisted_share = share;
        self
    }

    /// Sets [`DecodeOptions::gray16`].
    pub fn gray16(mut self, conversion: Gray16) -> Self {
        self.gray16 = conversion;
        self
    }

    /// Sets [`DecodeOptions::planned_epochs`].
    pub fn planned_epochs(mut self, epochs: Option<u64>) -> Self {
        self.planned_epochs = epochs;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.max_pixels == 0 {
            return Err(Error::invalid("max_pixels", "must be at least 1"));
        }
        if self.max_file_bytes == 0 {
            return Err(Error::invalid("max_file_bytes", "must be at least 1"));
        }
        if self.memory_limit == 0 {
            // Named as the builder, the command line and Python name it.
            return Err(Error::invalid("decode_memory", "must be at least 1"));
        }
        for (name, share) in [
            ("gpu_share", self.gpu_share),
            ("min_gpu_share", self.min_gpu_share),
        ] {
            if let Some(share) = share {
                if !(0.0..=1.0).contains(&share) {
                    return Err(Error::invalid(
                        name,
                        format!("{share} is not a share from 0 to 1"),
                    ));
                }
            }
        }
        if !(0.0..=1.0).contains(&self.assisted_share) {
            return Err(Error::invalid(
                "assisted_share",
                format!("{} is not a share from 0 to 1", self.assisted_share),
            ));
        }
        Ok(())
    }
}
