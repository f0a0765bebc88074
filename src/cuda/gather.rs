//! `kernels/gather.cu`: planes of bytes (masks) gathered through per-axis index maps in one
//! launch: each output byte is its source plane's byte at the row and column the maps give
//! (a nearest-neighbour resize, crop and flip at once), a pad call's fill where a map names
//! one, and the plane's `beyond` byte past its mapped rows and columns. Every byte of every
//! output plane is written.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::device::{upload_reusing, Gpu};
use super::kernel_cache::KernelSource;
use crate::error::{Error, Result};

/// The kernel source, embedded at build time.
const SOURCE: &str = include_str!("../../kernels/gather.cu");

/// Threads a block, along a row.
const THREADS_PER_BLOCK: u32 = 256;

/// The grid's most blocks along y and z (CUDA's limit); rows and planes beyond are strided.
const MAX_GRID_YZ: u32 = 65_535;

/// One output plane: where its source plane lies and which of the maps place it (`struct
/// GfGatherPlane` of the kernel source).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GatherPlane {
    /// The source plane's first byte in the sources.
    pub source: u64,
    /// The source plane's columns.
    pub source_width: u32,
    /// The source plane's rows.
    pub source_height: u32,
    /// The column map, `maps[xs .. xs + xs_len]`: each output column's source column (`>= 0`)
    /// or `-g` for pad call `g`.
    pub xs: u32,
    /// Output columns mapped (the rest are `beyond`).
    pub xs_len: u32,
    /// The row map, `maps[ys .. ys + ys_len]`, as the column map.
    pub ys: u32,
    /// Output rows mapped.
    pub ys_len: u32,
    /// Pad call `g`'s fill is `maps[fills + g - 1]` for `g <= fill_count`; 0 beyond.
    pub fills: u32,
    /// Pad calls with a fill.
    pub fill_count: u32,
    /// The byte past the mapped rows and columns.
    pub beyond: u32,
    /// Unused (the kernel's struct is 48 bytes).
    pub unused: u32,
}

// SAFETY: `repr(C)` plain old data laid out as the kernel's `GfGatherPlane` (one u64, then ten
// u32, no padding; the kernel static_asserts 48 bytes); any bit pattern is a valid value.
unsafe impl DeviceRepr for GatherPlane {}

/// The gather kernel, compiled for one device, with its table of planes and maps (reused from
/// launch to launch, grown only for a larger batch).
#[derive(Debug)]
pub(crate) struct PlaneGather {
    function: CudaFunction,
    planes: Option<CudaSlice<GatherPlane>>,
    maps: Option<CudaSlice<i32>>,
}

impl PlaneGather {
    /// The kernel for the stream's device (compiled once per device in a process).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<PlaneGather> {
        let module = Gpu::from_stream(stream).module(&KernelSource {
            name: "gather.cu",
            code: SOURCE,
            defines: Vec::new(),
        })?;
        let function = module
            .load_function("gpufeed_gather_planes")
            .map_err(|e| Error::cuda("finding the gather kernel", e))?;
        Ok(PlaneGather {
            function,
            planes: None,
            maps: None,
        })
    }

    /// Writes each output's planes, `width` x `height` bytes each, plane `p` of an output
    /// gathered from `sources` as its `planes[p]` says through `maps` (uploaded once for all
    /// outputs), on `stream`. Refuses a plane whose source lies outside `sources` or whose maps
    /// lie outside `maps`, and an output smaller than its planes.
    pub(crate) fn gather(
        &mut self,
        stream: &Arc<CudaStream>,
        sources: &CudaSlice<u8>,
        maps: &[i32],
        (width, height): (u32, u32),
        outputs: &mut [(&[GatherPlane], &mut CudaSlice<u8>)],
    ) -> Result<()> {
        let plane_len = u64::from(width) * u64::from(height);
        for (planes, out) in outputs.iter() {
            check(sources.len(), planes, maps)?;
            let needed = plane_len * planes.len() as u64;
            if (out.len() as u64) < needed {
                return Err(Error::Mismatch(format!(
                    "the mask output holds {} bytes, its {} planes {needed}",
                    out.len(),
                    planes.len()
                )));
            }
        }
        let table: Vec<GatherPlane> = outputs
            .iter()
            .flat_map(|(p, _)| p.iter().copied())
            .collect();
        if table.is_empty() || plane_len == 0 {
            return Ok(());
        }
        let fail = |e| Error::cuda("uploading the gather table", e);
        let table = upload_reusing(stream, &table, &mut self.planes).map_err(fail)?;
        // An empty map list still passes a valid buffer.
        let maps = upload_reusing(
            stream,
            if maps.is_empty() { &[0] } else { maps },
            &mut self.maps,
        )
        .map_err(fail)?;
        let mut first = 0;
        for (planes, out) in outputs.iter_mut() {
            let Ok(count) = u32::try_from(planes.len()) else {
                return Err(Error::Mismatch(format!(
                    "{} mask planes in one batch",
                    planes.len()
                )));
            };
            let rows = table.slice(first..first + planes.len());
            first += planes.len();
            if count == 0 {
                continue;
            }
            let config = LaunchConfig {
                grid_dim: (
                    width.div_ceil(THREADS_PER_BLOCK),
                    height.min(MAX_GRID_YZ),
                    count.min(MAX_GRID_YZ),
                ),
                block_dim: (THREADS_PER_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = stream.launch_builder(&self.function);
            b.arg(sources)
                .arg(&rows)
                .arg(&count)
                .arg(maps)
                .arg(&mut **out)
                .arg(&width)
                .arg(&height);
            // SAFETY: the arguments match `gpufeed_gather_planes`'s parameters in order; `rows`
            // holds this output's `count` planes, each reading only inside its source plane,
            // which `check` found inside `sources`, through maps `check` found inside `maps`
            // (fills included); the kernel writes `count` planes of `width * height` bytes,
            // inside `out` (checked above).
            unsafe { b.launch(config) }
                .map_err(|e| Error::cuda("launching the gather kernel", e))?;
        }
        Ok(())
    }
}

/// Checks that every plane's source lies inside `sources_len` bytes and its maps and fills
/// inside `maps`.
fn check(sources_len: usize, planes: &[GatherPlane], maps: &[i32]) -> Result<()> {
    let inside = |start: u32, len: u32| u64::from(start) + u64::from(len) <= maps.len() as u64;
    for (i, p) in planes.iter().enumerate() {
        let bytes = u64::from(p.source_width) * u64::from(p.source_height);
        let source_inside = p
            .source
            .checked_add(bytes)
            .is_some_and(|end| end <= sources_len as u64);
        if !source_inside
            || !inside(p.xs, p.xs_len)
            || !inside(p.ys, p.ys_len)
            || !inside(p.fills, p.fill_count)
        {
            return Err(Error::Mismatch(format!(
                "mask plane {i}: its source ({bytes} bytes at {} of {sources_len}) or maps \
                 (columns {}+{}, rows {}+{}, fills {}+{} of {}) lie outside their buffers",
                p.source,
                p.xs,
                p.xs_len,
                p.ys,
                p.ys_len,
                p.fills,
                p.fill_count,
                maps.len()
            )));
        }
    }
    Ok(())
}

/// The kernel's arithmetic on the host: what `gpufeed_gather_planes` writes.
#[cfg(test)]
pub(crate) fn gather_on_host(
    sources: &[u8],
    planes: &[GatherPlane],
    maps: &[i32],
    (width, height): (u32, u32),
) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut out = vec![0u8; planes.len() * w * h];
    for (p, d) in planes.iter().enumerate() {
        for y in 0..h {
            for x in 0..w {
                let mut v = d.beyond as u8;
                if x < d.xs_len as usize && y < d.ys_len as usize {
                    let sx = maps[d.xs as usize + x];
                    let sy = maps[d.ys as usize + y];
                    let m = sy.min(sx);
                    v = if m < 0 {
                        let g = (-m) as u32;
                        if g <= d.fill_count {
                            maps[(d.fills + g - 1) as usize] as u8
                        } else {
                            0
                        }
                    } else if (sx as u32) < d.source_width && (sy as u32) < d.source_height {
                        sources[d.source as usize
                            + sy as usize * d.source_width as usize
                            + sx as usize]
                    } else {
                        0
                    };
                }
                out[(p * h + y) * w + x] = v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Draws;

    /// A random map of `len` output indices over a source of `source` (ascending runs,
    /// mirrored runs, repeats, pads of calls 1..=`pads`).
    fn random_map(draws: &mut Draws, len: usize, source: u32, pads: u32) -> Vec<i32> {
        (0..len)
            .map(|_| {
                if pads > 0 && draws.below(5) == 0 {
                    -(1 + draws.below(pads as u64) as i32)
                } else {
                    draws.below(u64::from(source)) as i32
                }
            })
            .collect()
    }

    /// Random planes of random sizes, maps with pads, mapped areas smaller and larger than
    /// the output, into a poisoned output: the kernel writes what its host rendition writes,
    /// every byte; a plane outside its buffers is refused.
    #[test]
    fn gathered_planes_match_the_host_rendition() {
        let Some(gpu) = crate::cuda::test_gpu("gathered_planes_match_the_host_rendition") else {
            return;
        };
        let stream = gpu.stream().clone();
        let mut gather = PlaneGather::new(&stream).expect("kernel");
        for seed in 0..4u64 {
            let mut draws = Draws::new(seed);
            let (width, height) = (1 + draws.below(300) as u32, 1 + draws.below(200) as u32);
            let mut sources = Vec::new();
            let mut maps = Vec::new();
            let mut planes = Vec::new();
            for _ in 0..(1 + draws.below(6)) {
                let (sw, sh) = (1 + draws.below(120) as u32, 1 + draws.below(90) as u32);
                let source = sources.len() as u64;
                sources.extend((0..sw * sh).map(|_| draws.below(256) as u8));
                let pads = draws.below(3) as u32;
                let fills = maps.len() as u32;
                maps.extend((0..pads).map(|_| draws.below(256) as i32));
                let (xs_len, ys_len) = (
                    draws.below(u64::from(width) + 20) as u32,
                    draws.below(u64::from(height) + 20) as u32,
                );
                let xs = maps.len() as u32;
                maps.extend(random_map(&mut draws, xs_len as usize, sw, pads));
                let ys = maps.len() as u32;
                maps.extend(random_map(&mut draws, ys_len as usize, sh, pads));
                planes.push(GatherPlane {
                    source,
                    source_width: sw,
                    source_height: sh,
                    xs,
                    xs_len: xs_len.min(width),
                    ys,
                    ys_len: ys_len.min(height),
                    fills,
                    fill_count: pads,
                    beyond: draws.below(256) as u32,
                    unused: 0,
                });
            }
            // Two outputs of one launch list (the planes split where the seed says), as the
            // instance and semantic masks of a batch are.
            let split = draws.below(planes.len() as u64 + 1) as usize;
            let (first, second) = planes.split_at(split);
            let device_sources = stream.clone_htod(&sources).expect("sources");
            let mut wants = Vec::new();
            let mut outs = Vec::new();
            for group in [first, second] {
                let want = gather_on_host(&sources, group, &maps, (width, height));
                outs.push(
                    stream
                        .clone_htod(&vec![0xA5u8; want.len() + 7])
                        .expect("poisoned output"),
                );
                wants.push(want);
            }
            let [out_a, out_b] = &mut outs[..] else {
                unreachable!("two outputs")
            };
            gather
                .gather(
                    &stream,
                    &device_sources,
                    &maps,
                    (width, height),
                    &mut [(first, out_a), (second, out_b)],
                )
                .expect("gather");
            for (want, out) in wants.iter().zip(&outs) {
                let got = stream.clone_dtoh(out).expect("download");
                assert_eq!(&got[..want.len()], &want[..], "seed {seed}, split {split}");
                assert!(
                    got[want.len()..].iter().all(|&b| b == 0xA5),
                    "wrote past the planes"
                );
            }
            // One plane whose source starts past the sources, into an output that holds it.
            let mut outside = planes[..1].to_vec();
            outside[0].source = sources.len() as u64;
            let mut room = stream
                .alloc_zeros::<u8>((width * height) as usize)
                .expect("output");
            assert!(gather
                .gather(
                    &stream,
                    &device_sources,
                    &maps,
                    (width, height),
                    &mut [(&outside, &mut room)],
                )
                .is_err());
        }
    }
}
