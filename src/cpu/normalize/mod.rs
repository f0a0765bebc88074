//! The normalize step on the CPU: the oracle the CUDA kernel is tested against, and the last step
//! of the CPU lane on [`crate::Device::Cpu`], run on each image by the thread that prepared it.
//!
//! Each output element is `fma(x, scale[c], bias[c])` in f32 for the u8 sample `x` of source
//! channel `c`, rounded to nearest-even into the output dtype, exactly as `kernels/normalize.cu`
//! computes it. Since `x` has only 256 values, the results come from a 768-entry table; on
//! x86-64 with AVX2, FMA and F16C the planes of `f16` and `f32` (NCHW) are computed sixteen
//! pixels at a time instead, with the same arithmetic and the same bits ([`avx2`]).

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::options::{DType, Layout, NormalizeSpec};
use crate::tensor::{HostData, HostTensor, NormalizedSlot};

/// The normalized value of every u8 sample, per output channel.
#[derive(Debug, Clone)]
pub(crate) struct NormalizeTable {
    values: Values,
    layout: Layout,
    /// Source channel (RGB order) of each output channel.
    source_channel: [usize; 3],
    /// The planes' arithmetic, where this CPU computes them with vectors (NCHW, `f16` or
    /// `f32`).
    vectors: Option<PlaneAffine>,
}

/// Per output plane: its source channel's scale and bias.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PlaneAffine {
    scale: [f32; 3],
    bias: [f32; 3],
}

/// An output element type, whose planes this CPU may compute with vectors ahead of the table.
trait Planes: Copy {
    /// Writes the values of the first pixels of `pixels` into `planes` (plane `k` from source
    /// channel `source[k]`) by `affine` with this CPU's vectors: returns how many pixels (none
    /// without them).
    fn vector_planes(
        _pixels: &[u8],
        _planes: [&mut [Self]; 3],
        _source: [usize; 3],
        _affine: &PlaneAffine,
    ) -> usize {
        0
    }
}

impl Planes for bf16 {}

/// The element types the vectors write (`f16`, `f32`) take them.
#[cfg(target_arch = "x86_64")]
impl<T: avx2::Element + Copy> Planes for T {
    fn vector_planes(
        pixels: &[u8],
        planes: [&mut [T]; 3],
        source: [usize; 3],
        affine: &PlaneAffine,
    ) -> usize {
        avx2::planes(pixels, planes, source, affine)
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Planes for f16 {}

#[cfg(not(target_arch = "x86_64"))]
impl Planes for f32 {}

/// Whether this CPU computes the planes with vectors.
fn vectors_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

#[derive(Debug, Clone)]
enum Values {
    F16(Box<[[f16; 256]; 3]>),
    BF16(Box<[[bf16; 256]; 3]>),
    F32(Box<[[f32; 256]; 3]>),
}

/// `table[output channel][x]` of one dtype.
fn table<T: Copy + Default>(
    spec: &NormalizeSpec,
    convert: impl Fn(f32) -> T,
) -> Box<[[T; 256]; 3]> {
    let mut table = Box::new([[T::default(); 256]; 3]);
    for c in 0..3 {
        let oc = spec.channel_order.output_channel(c);
        for (x, entry) in table[oc].iter_mut().enumerate() {
            *entry = convert(spec.affine.apply(c, x as u8));
        }
    }
    table
}

impl NormalizeTable {
    pub fn new(spec: &NormalizeSpec) -> NormalizeTable {
        let values = match spec.dtype {
            DType::F16 => Values::F16(table(spec, f16::from_f32)),
            DType::BF16 => Values::BF16(table(spec, bf16::from_f32)),
            // An integer output is refused by the options; its table is never used.
            _ => Values::F32(table(spec, |x| x)),
        };
        let source_channel = [0, 1, 2].map(|oc| spec.channel_order.output_channel(oc));
        let planes = spec.layout == Layout::Nchw && matches!(spec.dtype, DType::F16 | DType::F32);
        let vectors = (planes && vectors_available()).then(|| PlaneAffine {
            scale: source_channel.map(|c| spec.affine.scale[c]),
            bias: source_channel.map(|c| spec.affine.bias[c]),
        });
        NormalizeTable {
            values,
            layout: spec.layout,
            source_channel,
            vectors,
        }
    }

    /// The same table computing every value from the table alone (the vectors' oracle).
    #[cfg(test)]
    fn without_vectors(mut self) -> NormalizeTable {
        self.vectors = None;
        self
    }

    /// Normalizes one image of packed RGB8 `pixels` into `out` (as many elements as samples).
    pub fn write_image(&self, pixels: &[u8], out: NormalizedSlot<'_>) {
        match (&self.values, out) {
            (Values::F16(t), NormalizedSlot::F16(o)) => self.write(t, pixels, o),
            (Values::BF16(t), NormalizedSlot::BF16(o)) => self.write(t, pixels, o),
            (Values::F32(t), NormalizedSlot::F32(o)) => self.write(t, pixels, o),
            // The pipeline makes the table and the output from the same spec.
            _ => debug_assert!(false, "normalize table and output differ in dtype"),
        }
    }

    fn write<T: Planes>(&self, table: &[[T; 256]; 3], pixels: &[u8], out: &mut [T]) {
        let hw = pixels.len() / 3;
        let [s0, s1, s2] = self.source_channel;
        match self.layout {
            Layout::Nchw => {
                // One pass over the pixels, writing the three planes side by side: the vectors'
                // steps first where this CPU has them, the table for the rest.
                let (p0, rest) = out.split_at_mut(hw.min(out.len()));
                let (p1, p2) = rest.split_at_mut(hw.min(rest.len()));
                let done = self.vectors.as_ref().map_or(0, |affine| {
                    let planes = [&mut *p0, &mut *p1, &mut *p2];
                    T::vector_planes(pixels, planes, self.source_channel, affine)
                });
                let planes = p0[done..]
                    .iter_mut()
                    .zip(p1[done..].iter_mut())
                    .zip(p2[done..].iter_mut());
                for (((y0, y1), y2), px) in planes.zip(pixels[3 * done..].chunks_exact(3)) {
                    *y0 = table[0][px[s0] as usize];
                    *y1 = table[1][px[s1] as usize];
                    *y2 = table[2][px[s2] as usize];
                }
            }
            Layout::Nhwc => {
                for (y, px) in out.chunks_exact_mut(3).zip(pixels.chunks_exact(3)) {
                    y[0] = table[0][px[s0] as usize];
                    y[1] = table[1][px[s1] as usize];
                    y[2] = table[2][px[s2] as usize];
                }
            }
        }
    }
}

/// Normalizes `n` images of `height` x `width` packed RGB8 from `pixels` on the current rayon
/// pool: the CPU rendition of `kernels/normalize.cu`, bit for bit.
///
/// # Panics
/// If `pixels` holds fewer than `n * height * width * 3` bytes, or `spec` asks for an integer
/// element type.
pub fn normalize(
    pixels: &[u8],
    n: usize,
    height: usize,
    width: usize,
    spec: &NormalizeSpec,
) -> HostTensor {
    let image = height * width * 3;
    let pixels = &pixels[..n * image];
    let table = NormalizeTable::new(spec);
    let mut data = match spec.dtype {
        DType::F16 => HostData::F16(vec![f16::ZERO; n * image]),
        DType::BF16 => HostData::BF16(vec![bf16::ZERO; n * image]),
        DType::F32 => HostData::F32(vec![0.0; n * image]),
        other => panic!("{}", other.not_an_output()),
    };
    if image > 0 {
        data.image_slots(image)
            .into_par_iter()
            .zip(pixels.par_chunks(image))
            .for_each(|(slot, px)| table.write_image(px, slot));
    }
    HostTensor::from_parts(data, spec.layout.shape(n, height, width), spec.layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{Affine, ChannelOrder, OutputOptions};

    /// The NaN an output of `dtype` is poisoned with, as bits.
    fn poison_bits(dtype: DType) -> u32 {
        match dtype {
            DType::F16 => u32::from(f16::NAN.to_bits()),
            _ => f32::NAN.to_bits(),
        }
    }

    /// The bits `table` writes for `pixels` into an output of `dtype` (`f16` or `f32`) poisoned
    /// with NaN.
    fn written_bits(table: &NormalizeTable, pixels: &[u8], dtype: DType) -> Vec<u32> {
        match dtype {
            DType::F16 => {
                let mut out = vec![f16::NAN; pixels.len()];
                table.write_image(pixels, NormalizedSlot::F16(&mut out));
                out.iter().map(|v| u32::from(v.to_bits())).collect()
            }
            _ => {
                let mut out = vec![f32::NAN; pixels.len()];
                table.write_image(pixels, NormalizedSlot::F32(&mut out));
                out.iter().map(|v| v.to_bits()).collect()
            }
        }
    }

    /// Every value the vectors write against the table alone, on pixels that hold every sample
    /// value, for each length of a step's tail, both float types, both channel orders and other
    /// means and deviations, into outputs poisoned with NaN.
    #[test]
    fn vector_planes_equal_the_table() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let options = [
            OutputOptions::default(),
            OutputOptions::default().channel_order(ChannelOrder::Bgr),
            OutputOptions::default().mean_std([0.5, 0.25, 0.0], [0.5, 0.125, 1.0 / 3.0]),
            OutputOptions::default().mean_std([-3.0, 100.0, 0.48], [1e-3, 7.0, 0.27]),
        ];
        for pixel_count in [0usize, 1, 15, 16, 17, 31, 48, 257, 224 * 224 + 5] {
            let mut pixels: Vec<u8> = (0..pixel_count * 3).map(|_| next() as u8).collect();
            // Every sample value in every channel.
            for (i, sample) in pixels.iter_mut().take(768).enumerate() {
                *sample = (i / 3) as u8;
            }
            for base in &options {
                for dtype in [DType::F16, DType::F32] {
                    let spec = base.dtype(dtype).spec();
                    let table = NormalizeTable::new(&spec);
                    if vectors_available() {
                        assert!(table.vectors.is_some(), "{dtype:?} planes take the vectors");
                    }
                    let oracle = table.clone().without_vectors();
                    let got = written_bits(&table, &pixels, dtype);
                    let want = written_bits(&oracle, &pixels, dtype);
                    assert_eq!(got, want, "{dtype:?}, {pixel_count} pixels");
                    let poison = poison_bits(dtype);
                    assert!(!got.contains(&poison), "every value written");
                }
            }
        }
        // Neither NHWC nor bf16 take the vectors.
        let nhwc = OutputOptions::default().layout(Layout::Nhwc).spec();
        assert!(NormalizeTable::new(&nhwc).vectors.is_none());
        let bf16 = OutputOptions::default().dtype(DType::BF16).spec();
        assert!(NormalizeTable::new(&bf16).vectors.is_none());
    }

    #[test]
    fn matches_torchvision_formula() {
        let pixels: Vec<u8> = (0..2 * 2 * 3 * 3).map(|i| (i * 21 % 256) as u8).collect();
        let spec = OutputOptions::default().dtype(DType::F32).spec();
        let t = normalize(&pixels, 2, 2, 3, &spec);
        assert_eq!(t.shape(), [2, 3, 2, 3]);
        let v = t.to_f32_vec();
        let mean = crate::IMAGENET_MEAN;
        let std = crate::IMAGENET_STD;
        for n in 0..2 {
            for c in 0..3 {
                for p in 0..6 {
                    let x = pixels[(n * 6 + p) * 3 + c] as f32;
                    let want = (x / 255.0 - mean[c]) / std[c];
                    let got = v[((n * 3 + c) * 6) + p];
                    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn bgr_nhwc_swaps_channels() {
        let affine = Affine {
            scale: [1.0; 3],
            bias: [0.0; 3],
        };
        let spec = NormalizeSpec {
            affine,
            dtype: DType::F32,
            layout: Layout::Nhwc,
            channel_order: ChannelOrder::Bgr,
        };
        let t = normalize(&[10, 20, 30, 40, 50, 60], 1, 1, 2, &spec);
        assert_eq!(t.to_f32_vec(), vec![30.0, 20.0, 10.0, 60.0, 50.0, 40.0]);
        let spec = NormalizeSpec {
            layout: Layout::Nchw,
            ..spec
        };
        let t = normalize(&[10, 20, 30, 40, 50, 60], 1, 1, 2, &spec);
        assert_eq!(t.to_f32_vec(), vec![30.0, 60.0, 20.0, 50.0, 10.0, 40.0]);
    }
}
