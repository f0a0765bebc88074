//! The normalize step on the CPU: the oracle the CUDA kernel is tested against, and the last stage
//! of [`crate::Device::Cpu`] pipelines.
//!
//! Each output element is `fma(x, scale[c], bias[c])` in f32 for the u8 sample `x` of source
//! channel `c`, rounded to nearest-even into the output dtype, exactly as `kernels/normalize.cu`
//! computes it. Since `x` has only 256 values, the f32 results come from a 768-entry table.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::config::{Affine, ChannelOrder, DType, Layout};
use crate::tensor::{HostData, HostTensor};

/// What to produce from a u8 HWC batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormalizeSpec {
    /// Per-channel multiply-add, RGB order.
    pub affine: Affine,
    /// Output element type.
    pub dtype: DType,
    /// Output layout.
    pub layout: Layout,
    /// Output channel order.
    pub channel_order: ChannelOrder,
}

/// Output channel of source channel `c`.
pub(crate) fn output_channel(order: ChannelOrder, c: usize) -> usize {
    match order {
        ChannelOrder::Rgb => c,
        ChannelOrder::Bgr => 2 - c,
    }
}

trait Element: Copy + Send + Sync + Default {
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Element for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// Normalizes `n` images of `height` x `width` RGB8 (HWC, packed) from `pixels`.
///
/// # Panics
/// If `pixels` holds fewer than `n * height * width * 3` bytes.
pub fn normalize(
    pixels: &[u8],
    n: usize,
    height: usize,
    width: usize,
    spec: &NormalizeSpec,
) -> HostTensor {
    let hw = height * width;
    let pixels = &pixels[..n * hw * 3];
    let data = match spec.dtype {
        DType::F16 => HostData::F16(normalize_as(pixels, hw, spec)),
        DType::BF16 => HostData::BF16(normalize_as(pixels, hw, spec)),
        DType::F32 => HostData::F32(normalize_as(pixels, hw, spec)),
    };
    HostTensor {
        data,
        shape: spec.layout.shape(n, height, width),
        layout: spec.layout,
    }
}

fn normalize_as<T: Element>(pixels: &[u8], hw: usize, spec: &NormalizeSpec) -> Vec<T> {
    // table[out_channel][x]
    let mut table = [[T::default(); 256]; 3];
    for c in 0..3 {
        let oc = output_channel(spec.channel_order, c);
        for (x, entry) in table[oc].iter_mut().enumerate() {
            *entry = T::from_f32(spec.affine.apply(c, x as u8));
        }
    }
    let mut out = vec![T::default(); pixels.len()];
    if hw == 0 {
        return out;
    }
    let src_of = |oc: usize| output_channel(spec.channel_order, oc);
    out.par_chunks_mut(hw * 3)
        .zip(pixels.par_chunks(hw * 3))
        .for_each(|(dst, src)| match spec.layout {
            Layout::Nchw => {
                for (oc, plane) in dst.chunks_mut(hw).enumerate() {
                    let sc = src_of(oc);
                    for (y, px) in plane.iter_mut().zip(src.chunks_exact(3)) {
                        *y = table[oc][px[sc] as usize];
                    }
                }
            }
            Layout::Nhwc => {
                for (out_px, px) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                    for (oc, y) in out_px.iter_mut().enumerate() {
                        *y = table[oc][px[src_of(oc)] as usize];
                    }
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn matches_torchvision_formula() {
        let affine = Config::default().affine();
        let pixels: Vec<u8> = (0..2 * 2 * 3 * 3).map(|i| (i * 21 % 256) as u8).collect();
        let spec = NormalizeSpec {
            affine,
            dtype: DType::F32,
            layout: Layout::Nchw,
            channel_order: ChannelOrder::Rgb,
        };
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
