//! The AVX2 passes against the portable ones, pass by pass, on fresh random inputs and
//! coefficients: Pillow-like weights and arbitrary `i32` weights (whose sums wrap, as Pillow's
//! `int` would), every tap count from 1, odd sizes, partial strips, shifted bounds, gray spread to
//! RGB. Buffers are exactly as long as the passes need, so a read or write past them fails under
//! a memory checker, and the outputs are poisoned around what the passes write.

use super::super::{portable, HorizontalPass, SplitWeights, VerticalPass};
use super::horizontal::StripLayout;
use crate::resample::coefficients::{AxisCoefficients, ONE};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1
}

fn avx2() -> bool {
    let has = std::is_x86_feature_detected!("avx2");
    if !has {
        println!("skipped: AVX2 passes: this CPU has no AVX2");
    }
    has
}

/// `outputs` outputs over `samples` input samples (from `shift` on), with at most `taps` taps:
/// starts anywhere their taps fit (in order or not), a few outputs without taps, and weights of
/// one of four kinds: a normalised filter's, signed ones up to nearly one, ones whose upper
/// halves reach the limits of the byte multiplies (pairs of `|hi|` summing to 128, any lower
/// half), or any `i32` (which the AVX2 passes leave to the portable ones).
fn random_coefficients(
    rng: &mut Rng,
    samples: usize,
    outputs: usize,
    taps: usize,
    shift: usize,
) -> AxisCoefficients {
    let kind = rng.range(0, 3);
    let mut bounds = Vec::with_capacity(outputs);
    let mut weights = vec![0; outputs * taps];
    for row in weights.chunks_exact_mut(taps) {
        let len = if rng.range(0, 30) == 0 {
            0
        } else {
            rng.range(1, taps.min(samples))
        };
        let start = shift + rng.range(0, samples - len.max(1));
        bounds.push((start as u32, len as u32));
        let mut previous_hi = 0i32;
        for (k, w) in row[..len].iter_mut().enumerate() {
            *w = match kind {
                0 => (rng.next() % (ONE as u64 / len as u64 + 1)) as i32,
                1 => (rng.next() % (2 * 63 * 65536)) as i32 - 63 * 65536,
                2 => {
                    let room: i32 = if k % 2 == 0 {
                        128
                    } else {
                        128 - previous_hi.abs()
                    };
                    let hi = (rng.range(0, 2 * room as usize) as i32 - room).clamp(-128, 127);
                    previous_hi = hi;
                    (hi << 16).wrapping_add(i32::from(rng.next() as i16))
                }
                _ => rng.next() as i32,
            };
        }
    }
    AxisCoefficients {
        resampled: true,
        taps,
        bounds,
        weights,
        weights_on_device: None,
    }
}

#[test]
fn horizontal_pass_equals_the_portable_one() {
    if !avx2() {
        return;
    }
    let seed = seed();
    let mut rng = Rng(seed);
    let mut taken = 0;
    for case in 0..1500 {
        let channels = if case % 2 == 0 { 3 } else { 1 };
        let out_step = if channels == 1 && rng.range(0, 1) == 0 {
            3
        } else {
            channels
        };
        let width = rng.range(1, 300);
        let shift = rng.range(0, 5);
        let outputs = rng.range(1, 120);
        let taps = rng.range(1, 12).min(width);
        let rows = rng.range(1, 40);
        let coefficients = random_coefficients(&mut rng, width, outputs, taps, shift);
        let mut split = SplitWeights::default();
        split.split(&coefficients);
        let pitch = width * channels + rng.range(0, 7);
        let input = rng.bytes((rows - 1) * pitch + width * channels);
        let out_pitch = outputs * out_step + rng.range(0, 7);
        let out_len = (rows - 1) * out_pitch + outputs * out_step;
        let layout = StripLayout::of(&coefficients, channels, shift, out_step);
        let mut strips = vec![0x77; layout.map_or(0, |l| l.bytes())];
        let mut want = vec![0xA5; out_len];
        let mut got = want.clone();
        let mut pass = HorizontalPass {
            input: &input,
            pitch,
            rows,
            channels,
            coefficients: &coefficients,
            shift,
            split: &split,
            output: &mut want,
            out_pitch,
            out_step,
            strips: &mut [],
        };
        portable::horizontal(&mut pass);
        pass.output = &mut got;
        pass.strips = &mut strips;
        // SAFETY: AVX2 checked above.
        let fast = unsafe { super::horizontal::horizontal(&mut pass) };
        assert_eq!(
            fast,
            layout.is_some() && split.bytes,
            "seed {seed} case {case}"
        );
        taken += usize::from(fast);
        if !fast {
            assert!(got.iter().all(|&b| b == 0xA5), "seed {seed} case {case}");
            continue;
        }
        assert!(
            got == want,
            "seed {seed} case {case}: {width} px x {rows} rows x {channels} -> {outputs} \
             (step {out_step}), {taps} taps, shift {shift}"
        );
    }
    assert!(taken > 500, "the AVX2 pass took only {taken} cases");
}

#[test]
fn vertical_pass_equals_the_portable_one() {
    if !avx2() {
        return;
    }
    let seed = seed();
    let mut rng = Rng(seed);
    let mut taken = 0;
    for case in 0..1500 {
        let spread = case % 3 == 0;
        let step = if spread { 3 } else { 1 };
        let row_bytes = rng.range(1, 200);
        let rows = rng.range(1, 60);
        let shift = rng.range(0, 5);
        let outputs = rng.range(1, 50);
        let taps = rng.range(1, 12).min(rows);
        let coefficients = random_coefficients(&mut rng, rows, outputs, taps, shift);
        let mut split = SplitWeights::default();
        split.split(&coefficients);
        let pitch = row_bytes + rng.range(0, 7);
        let input = rng.bytes((rows - 1) * pitch + row_bytes);
        let out_pitch = row_bytes * step + rng.range(0, 7);
        let out_len = (outputs - 1) * out_pitch + row_bytes * step;
        let mut want = vec![0xA5; out_len];
        let mut got = want.clone();
        let mut pass = VerticalPass {
            input: &input,
            pitch,
            row_bytes,
            coefficients: &coefficients,
            shift,
            split: &split,
            output: &mut want,
            out_pitch,
            spread,
        };
        portable::vertical(&mut pass);
        pass.output = &mut got;
        // SAFETY: AVX2 checked above.
        let fast = unsafe { super::vertical::vertical(&mut pass) };
        assert_eq!(
            fast,
            row_bytes >= 16 && split.bytes,
            "seed {seed} case {case}"
        );
        taken += usize::from(fast);
        if !fast {
            assert!(got.iter().all(|&b| b == 0xA5), "seed {seed} case {case}");
            continue;
        }
        assert!(
            got == want,
            "seed {seed} case {case}: {row_bytes} bytes x {rows} rows -> {outputs} rows \
             (spread {spread}), {taps} taps, shift {shift}"
        );
    }
    assert!(taken > 800, "the AVX2 pass took only {taken} cases");
}
