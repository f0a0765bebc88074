//! The normalize step on the CPU: the oracle the CUDA kernel is tested against, and the last step
//! of the CPU lane on [`crate::Device::Cpu`], run on each image by the thread that prepared it.
//!
//! Each output element is `fma(x, scale[c], bias[c])` in f32 for the u8 sample `x` of source
//! channel `c`, rounded to nearest-even into the output dtype, exactly as `kernels/normalize.cu`
//! computes it. Since `x` has only 256 values, the results come from a 768-entry table.

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
        NormalizeTable {
            values,
            layout: spec.layout,
            source_channel: [0, 1, 2].map(|oc| spec.channel_order.output_channel(oc)),
        }
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

    fn write<T: Copy>(&self, table: &[[T; 256]; 3], pixels: &[u8], out: &mut [T]) {
        let hw = pixels.len() / 3;
        let [s0, s1, s2] = self.source_channel;
        match self.layout {
            Layout::Nchw => {
                // One pass over the pixels, writing the three planes side by side.
                let (p0, rest) = out.split_at_mut(hw.min(out.len()));
                let (p1, p2) = rest.split_at_mut(hw.min(rest.len()));
                let planes = p0.iter_mut().zip(p1.iter_mut()).zip(p2.iter_mut());
                for (((y0, y1), y2), px) in planes.zip(pixels.chunks_exact(3)) {
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
