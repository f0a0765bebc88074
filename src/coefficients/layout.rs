//! What libjpeg-turbo does with a JPEG's components after the inverse DCT, decided once per image
//! from its headers: which upsampling routine each component gets (`jdsample.c`,
//! `jinit_upsampler`, with Pillow's and TurboJPEG's defaults: `do_fancy_upsampling` on, DCT
//! scaling off, so no merged upsampler), which colour conversion follows (`jdcolor.c`), and which
//! samples, blocks and iMCU rows an output window needs.
//!
//! The selection, per component with sampling factors `(h, v)` against the image's largest
//! `(H, V)`, in `jinit_upsampler`'s order:
//!
//! | factors | routine | here |
//! |---|---|---|
//! | `h == H`, `v == V` | `fullsize_upsample` | [`Upsampling::Full`] |
//! | `2h == H`, `v == V`, more than 2 samples across | `h2v1_fancy_upsample` | [`Upsampling::FancyH2V1`] |
//! | `2h == H`, `v == V`, 1 or 2 samples across | `h2v1_upsample` (replication) | [`Upsampling::Box`] 2x1 |
//! | `h == H`, `2v == V` | `h1v2_fancy_upsample` (whatever the width) | [`Upsampling::FancyH1V2`] |
//! | `2h == H`, `2v == V`, more than 2 samples across | `h2v2_fancy_upsample` | [`Upsampling::FancyH2V2`] |
//! | `2h == H`, `2v == V`, 1 or 2 samples across | `h2v2_upsample` (replication) | [`Upsampling::Box`] 2x2 |
//! | `H % h == 0`, `V % v == 0` | `int_upsample` (replication) | [`Upsampling::Box`] `H/h` x `V/v` |
//! | otherwise | error `JERR_FRACT_SAMPLE_NOTIMPL` | [`super::Error::Unsupported`] |
//!
//! 4:1:1 (Y 4x1) and other factors of 3 or 4 take `int_upsample`; the luma itself is upsampled
//! when a chroma component has larger factors than it. The fancy routines read one sample of
//! context on each side: across, the component's outermost samples are special-cased; down, the
//! main controller (`jdmainct.c`) repeats the first and the last real sample row above and below
//! the image. So sample `(i, j)` of a component's context is `(clamp(i), clamp(j))` within its
//! `samples_wide` x `samples_high`, never a padding sample of a partial block.

use turbojpeg_region::{CoefficientHeader, Colorspace};

use super::Error;

/// How one component's samples become full-resolution samples (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsampling {
    /// Already full size.
    Full,
    /// `h2v1_fancy_upsample`: triangle filter across.
    FancyH2V1,
    /// `h1v2_fancy_upsample`: triangle filter down.
    FancyH1V2,
    /// `h2v2_fancy_upsample`: triangle filter both ways.
    FancyH2V2,
    /// Replication of each sample `h` times across and `v` times down (`int_upsample`,
    /// `h2v1_upsample`, `h2v2_upsample`).
    Box {
        /// Horizontal factor.
        h: u8,
        /// Vertical factor.
        v: u8,
    },
}

impl Upsampling {
    /// The kernels' code for it (`kernels/idct.cu`, `GF_UP_*`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Upsampling::Full => 0,
            Upsampling::FancyH2V1 => 1,
            Upsampling::FancyH1V2 => 2,
            Upsampling::FancyH2V2 => 3,
            Upsampling::Box { .. } => 4,
        }
    }

    /// Output pixels per sample across and down.
    pub fn factors(self) -> (u32, u32) {
        match self {
            Upsampling::Full => (1, 1),
            Upsampling::FancyH2V1 => (2, 1),
            Upsampling::FancyH1V2 => (1, 2),
            Upsampling::FancyH2V2 => (2, 2),
            Upsampling::Box { h, v } => (u32::from(h), u32::from(v)),
        }
    }

    /// Whether the routine reads the neighbouring sample across.
    fn fancy_across(self) -> bool {
        matches!(self, Upsampling::FancyH2V1 | Upsampling::FancyH2V2)
    }

    /// Whether the routine reads the neighbouring sample row.
    fn fancy_down(self) -> bool {
        matches!(self, Upsampling::FancyH1V2 | Upsampling::FancyH2V2)
    }
}

/// The colour conversion after upsampling (`jdcolor.c`, to RGB as TurboJPEG and Pillow ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// One component, written as one gray channel.
    Gray,
    /// YCbCr to RGB (`ycc_rgb_convert`).
    YCbCr,
    /// RGB stored as is (`rgb_rgb_convert`).
    Rgb,
}

impl Conversion {
    /// Output channels: 1 for gray, 3 for RGB.
    pub fn channels(self) -> usize {
        match self {
            Conversion::Gray => 1,
            _ => 3,
        }
    }

    /// The kernels' code for it (`GF_CC_*`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Conversion::Gray => 0,
            Conversion::YCbCr => 1,
            Conversion::Rgb => 2,
        }
    }
}

/// One component as the path treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComponentLayout {
    /// Blocks per block row holding samples.
    pub blocks_wide: u32,
    /// Block rows holding samples.
    pub blocks_high: u32,
    /// Real samples per row (`downsampled_width`).
    pub samples_wide: u32,
    /// Real sample rows (`downsampled_height`).
    pub samples_high: u32,
    /// Vertical sampling factor (block rows per iMCU row).
    pub v_samp: u32,
    /// The upsampling routine.
    pub upsampling: Upsampling,
}

/// A rectangle of output pixels (the resampler's, which the decode plans share).
pub use crate::resample::Window;

/// A rectangle of one component's blocks: columns `x0..x1`, rows `y0..y1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRect {
    /// First block column.
    pub x0: u32,
    /// First block row.
    pub y0: u32,
    /// One past the last block column.
    pub x1: u32,
    /// One past the last block row.
    pub y1: u32,
}

impl BlockRect {
    /// Blocks across.
    pub fn width(&self) -> u32 {
        self.x1 - self.x0
    }

    /// Blocks down.
    pub fn height(&self) -> u32 {
        self.y1 - self.y0
    }

    /// Blocks in the rectangle.
    pub fn blocks(&self) -> u64 {
        u64::from(self.width()) * u64::from(self.height())
    }
}

/// What the path does with one JPEG: its size, its components' upsampling and the colour
/// conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Components, in the frame's order (1 for gray, 3 for colour).
    pub components: Vec<ComponentLayout>,
    /// The colour conversion.
    pub conversion: Conversion,
    /// iMCU rows of the image.
    pub imcu_rows: u32,
}

impl Layout {
    /// The layout libjpeg-turbo would use for `header`, or why this path cannot reproduce its
    /// decode: CMYK and YCCK (no conversion to RGB in libjpeg), a colour space whose component
    /// count does not fit, or sampling factors libjpeg refuses.
    pub fn new(header: &CoefficientHeader) -> Result<Layout, Error> {
        let components = header.components();
        let conversion = match (header.colorspace, components.len()) {
            (Colorspace::Gray, 1) => Conversion::Gray,
            (Colorspace::YCbCr, 3) => Conversion::YCbCr,
            (Colorspace::Rgb, 3) => Conversion::Rgb,
            (colorspace, n) => {
                return Err(Error::Unsupported(format!(
                    "{colorspace:?} with {n} components"
                )))
            }
        };
        if header.width == 0 || header.height == 0 {
            return Err(Error::Unsupported("an image without pixels".into()));
        }
        let (max_h, max_v) = (u32::from(header.max_h_samp), u32::from(header.max_v_samp));
        let components = components
            .iter()
            .map(|c| {
                let (h, v) = (u32::from(c.h_samp), u32::from(c.v_samp));
                // jinit_upsampler's selection, in its order (do_fancy is on).
                let upsampling = if h == max_h && v == max_v {
                    Upsampling::Full
                } else if h * 2 == max_h && v == max_v {
                    if c.samples_wide > 2 {
                        Upsampling::FancyH2V1
                    } else {
                        Upsampling::Box { h: 2, v: 1 }
                    }
                } else if h == max_h && v * 2 == max_v {
                    Upsampling::FancyH1V2
                } else if h * 2 == max_h && v * 2 == max_v {
                    if c.samples_wide > 2 {
                        Upsampling::FancyH2V2
                    } else {
                        Upsampling::Box { h: 2, v: 2 }
                    }
                } else if max_h.is_multiple_of(h) && max_v.is_multiple_of(v) {
                    Upsampling::Box {
                        h: (max_h / h) as u8,
                        v: (max_v / v) as u8,
                    }
                } else {
                    return Err(Error::Unsupported(format!(
                        "sampling factors {h}x{v} in a {max_h}x{max_v} MCU (fractional)"
                    )));
                };
                Ok(ComponentLayout {
                    blocks_wide: c.blocks_wide,
                    blocks_high: c.blocks_high,
                    samples_wide: c.samples_wide,
                    samples_high: c.samples_high,
                    v_samp: v,
                    upsampling,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Layout {
            width: header.width,
            height: header.height,
            components,
            conversion,
            imcu_rows: header.imcu_rows,
        })
    }

    /// Output channels (1 or 3).
    pub fn channels(&self) -> usize {
        self.conversion.channels()
    }

    /// Checks that `window` is a non-empty rectangle inside the image.
    pub fn check(&self, window: &Window) -> Result<(), Error> {
        let inside = window.width > 0
            && window.height > 0
            && window
                .x
                .checked_add(window.width)
                .is_some_and(|e| e <= self.width)
            && window
                .y
                .checked_add(window.height)
                .is_some_and(|e| e <= self.height);
        if inside {
            Ok(())
        } else {
            Err(Error::Request(format!(
                "window {window:?} is not inside the {}x{} image",
                self.width, self.height
            )))
        }
    }

    /// The samples of `component` that the pixels of `window` read, context included:
    /// `(x0, y0, x1, y1)`, ends exclusive, inside the component's real samples. `window` must
    /// pass [`Layout::check`].
    pub fn samples(&self, component: usize, window: &Window) -> (u32, u32, u32, u32) {
        let c = &self.components[component];
        let (h, v) = c.upsampling.factors();
        let span = |first: u32, last: u32, factor: u32, fancy: bool, len: u32| {
            let (a, b) = (first / factor, last / factor);
            if fancy {
                (a.saturating_sub(1), (b + 2).min(len))
            } else {
                (a, (b + 1).min(len))
            }
        };
        let (x0, x1) = span(
            window.x,
            window.x + window.width - 1,
            h,
            c.upsampling.fancy_across(),
            c.samples_wide,
        );
        let (y0, y1) = span(
            window.y,
            window.y + window.height - 1,
            v,
            c.upsampling.fancy_down(),
            c.samples_high,
        );
        (x0, y0, x1, y1)
    }

    /// The blocks of `component` whose samples the pixels of `window` read.
    pub fn blocks(&self, component: usize, window: &Window) -> BlockRect {
        let (x0, y0, x1, y1) = self.samples(component, window);
        BlockRect {
            x0: x0 / 8,
            y0: y0 / 8,
            x1: (x1 - 1) / 8 + 1,
            y1: (y1 - 1) / 8 + 1,
        }
    }

    /// iMCU rows the entropy decoder must read for `window`: those holding the last block row
    /// any component needs.
    pub fn imcu_rows_for(&self, window: &Window) -> u32 {
        (0..self.components.len())
            .map(|c| (self.blocks(c, window).y1 - 1) / self.components[c].v_samp + 1)
            .max()
            .unwrap_or(self.imcu_rows)
            .min(self.imcu_rows)
    }
}
