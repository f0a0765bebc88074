//! LOCAL PROBE, NOT FOR COMMIT.
use super::cpu::{HostImage, Kernels, Slot};
use super::filter::{Filter, Resampling};
use super::image::ImagePlan;
use super::passes::PassOrder;

#[inline(never)]
fn probe_run(
    plans: &[(ImagePlan, Vec<u8>, u32, u32, u32)],
    kernels: Kernels,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) {
    for (plan, px, w, h, c) in plans {
        let src = HostImage {
            pixels: px,
            width: *w,
            height: *h,
            channels: *c,
        };
        let mut slot = Slot {
            bytes: out,
            width: 224,
            height: 224,
        };
        plan.resample_into(&src, 0, &mut slot, kernels, scratch)
            .unwrap();
    }
}

#[test]
fn probe_resample() {
    let Ok(sizes) = std::fs::read_to_string("/tmp/rs-sizes.txt") else {
        return;
    };
    let want: u32 = std::env::var("PROBE_CHANNELS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let filter = match std::env::var("PROBE_FILTER").as_deref() {
        Ok("bicubic") => Filter::Bicubic,
        Ok("lanczos") => Filter::Lanczos,
        _ => Filter::Bilinear,
    };
    let mut plans = Vec::new();
    let mut seed = 1u64;
    for line in sizes.lines() {
        let v: Vec<u32> = line
            .split_whitespace()
            .map(|s| s.parse().unwrap())
            .collect();
        let (w, h, c) = (v[0], v[1], v[2]);
        if want != 0 && c != want {
            continue;
        }
        let (x, y) = super::plan::torchvision_center_crop(w, h, 256, 224, 224);
        let plan =
            ImagePlan::new(&x, &y, Resampling::Filter(filter), PassOrder::default()).unwrap();
        let px: Vec<u8> = (0..w * h * c)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        plans.push((plan, px, w, h, c));
    }
    let mut out = vec![0u8; 224 * 224 * 3];
    let mut scratch = Vec::new();
    let kernels = if std::env::var("PROBE_PORTABLE").is_ok() {
        Kernels::Portable
    } else {
        Kernels::detect()
    };
    let t = std::time::Instant::now();
    for _ in 0..std::env::var("PROBE_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
    {
        probe_run(&plans, kernels, &mut out, &mut scratch);
    }
    println!("probe: {} images {:?}", plans.len(), t.elapsed());
}
