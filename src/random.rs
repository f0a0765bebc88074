//! Random draws that depend on nothing but their seed: the epoch's shuffle, and each image's
//! random crop and flip, which are drawn from (seed, epoch, source index) alone, so no thread
//! count, batch size or decode lane changes them.

/// SplitMix64: small, fast, well mixed, and the same on every platform.
#[derive(Debug, Clone)]
pub(crate) struct Draws(u64);

impl Draws {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Draws {
        Draws(seed)
    }

    /// The stream of image `index` in `epoch` under `seed`: the three mixed so that neighbouring
    /// indices and epochs give unrelated streams.
    pub fn for_image(seed: u64, epoch: u64, index: usize) -> Draws {
        let mut mix = Draws::new(seed ^ 0xD1B5_4A32_D192_ED03);
        let a = mix.next();
        let mut mix = Draws::new(a ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let b = mix.next();
        let mut mix = Draws::new(b ^ (index as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9));
        Draws::new(mix.next())
    }

    /// The stream of view `view` of image `index` in `epoch` under `seed`: the image's stream
    /// mixed once more with the view's number.
    pub fn for_view(seed: u64, epoch: u64, index: usize, view: usize) -> Draws {
        let mut mix = Draws::for_image(seed, epoch, index);
        let a = mix.next();
        let mut mix = Draws::new(a ^ (view as u64).wrapping_mul(0x94D0_49BB_1331_11EB));
        Draws::new(mix.next())
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift with rejection); `n` must be at least 1.
    pub fn below(&mut self, n: u64) -> u64 {
        loop {
            let m = (self.next() as u128) * (n as u128);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform in `[from, to)` in single precision, as PyTorch's `uniform_` draws a float32
    /// tensor: 24 random bits scaled, then `x * (to - from) + from`.
    pub fn uniform_f32(&mut self, from: f32, to: f32) -> f32 {
        let x = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        x * (to - from) + from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_draw_from_their_own_streams() {
        let first = |seed, epoch, index| Draws::for_image(seed, epoch, index).next();
        assert_eq!(first(1, 2, 3), first(1, 2, 3));
        assert_ne!(first(1, 2, 3), first(1, 2, 4));
        assert_ne!(first(1, 2, 3), first(1, 3, 3));
        assert_ne!(first(1, 2, 3), first(2, 2, 3));
        // Swapping epoch and index does not give the same stream.
        assert_ne!(first(0, 5, 7), first(0, 7, 5));
        let view = |view| Draws::for_view(1, 2, 3, view).next();
        assert_eq!(view(4), view(4));
        assert_ne!(view(4), view(5));
        assert_ne!(view(0), first(1, 2, 3));
    }

    #[test]
    fn uniform_stays_in_its_range_and_fills_it() {
        let mut d = Draws::new(9);
        let (mut lo, mut hi) = (f32::MAX, f32::MIN);
        for _ in 0..100_000 {
            let v = d.uniform_f32(0.08, 1.0);
            assert!((0.08..1.0).contains(&v), "{v}");
            lo = lo.min(v);
            hi = hi.max(v);
        }
        assert!(lo < 0.081 && hi > 0.999, "{lo} {hi}");
        let counts = (0..60_000).fold([0u32; 6], |mut c, _| {
            c[d.below(6) as usize] += 1;
            c
        });
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
    }
}
