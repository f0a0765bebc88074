//! What an epoch's files cost the CPU lane, from what the listing knows before any is read:
//! each file's format (by its name's extension) and size. The CPU lane starts the dearest of the
//! images it looks at first ([`expected_cost`]); the policy gives the CPU lane the cores it has
//! alone when most of an epoch's work is of files the GPU lane cannot take ([`WorkMix`]).

/// A file's format as its name gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// `.jpg`, `.jpeg`, `.jpe`, `.jfif`, and names with no known extension: what the GPU lane
    /// can take (unless progressive or CMYK, which only reading tells).
    Jpeg,
    /// `.png`.
    Png,
    /// `.webp`.
    WebP,
    /// `.bmp`, `.ppm`, `.pgm`, `.pbm`, `.pnm`: stored pixels, cheap to decode.
    Raw,
    /// `.gif`, `.tif`, `.tiff`.
    Other,
}

impl FileKind {
    /// The kind of a file named `name` (a path or an id: only its extension counts).
    pub fn of(name: &str) -> FileKind {
        let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
        let Some((_, ext)) = base.rsplit_once('.') else {
            return FileKind::Jpeg;
        };
        match ext.to_ascii_lowercase().as_str() {
            "png" => FileKind::Png,
            "webp" => FileKind::WebP,
            "bmp" | "ppm" | "pgm" | "pbm" | "pnm" => FileKind::Raw,
            "gif" | "tif" | "tiff" => FileKind::Other,
            _ => FileKind::Jpeg,
        }
    }

    /// Whether the GPU lane may take files of this kind.
    pub fn gpu_may_take(self) -> bool {
        self == FileKind::Jpeg
    }

    /// The CPU lane's time for a byte of a file of this kind, in eighths of a JPEG's byte: one
    /// core of the build machine (docs/figures.md, 2026-12-02, per CPU second) took about 18 ns
    /// a byte of JPEG, 15 of 1-2 Mpx PNG and, as WebP compresses best, 26 (lossless) to 125
    /// (lossy) of WebP (on the GPU machine, wallpapers under 1 MB: 12 ms a PNG, 110 ms a WebP);
    /// stored pixels cost far less than a JPEG's.
    fn weight_per_byte(self) -> u64 {
        match self {
            FileKind::Jpeg | FileKind::Other => 8,
            FileKind::Png => 8,
            FileKind::WebP => 64,
            FileKind::Raw => 1,
        }
    }
}

/// The CPU lane's expected work for a file named `name` of `bytes` bytes, in units comparable
/// between files (only their order and ratios mean anything).
pub(crate) fn expected_cost(name: &str, bytes: u64) -> u64 {
    bytes.saturating_mul(FileKind::of(name).weight_per_byte())
}

/// Of an epoch's expected work (a sample of its files), the part the GPU lane cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct WorkMix {
    /// Expected work of the files sampled.
    pub total: u64,
    /// Of it, that of the files the GPU lane cannot take.
    pub cpu_only: u64,
}

impl WorkMix {
    /// The mix of `files` (name and size in bytes).
    pub fn of<'a>(files: impl IntoIterator<Item = (&'a str, u64)>) -> WorkMix {
        let mut mix = WorkMix::default();
        for (name, bytes) in files {
            let cost = expected_cost(name, bytes);
            mix.total = mix.total.saturating_add(cost);
            if !FileKind::of(name).gpu_may_take() {
                mix.cpu_only = mix.cpu_only.saturating_add(cost);
            }
        }
        mix
    }

    /// The mix of the files `names` gives, whose sizes `size` gives (by their place among
    /// them): an epoch of names the GPU lane may all take has no part of its own, and no size
    /// is asked for (a size may be a file system call).
    pub fn of_names(names: &[&str], size: impl Fn(usize) -> u64) -> WorkMix {
        if names.iter().all(|name| FileKind::of(name).gpu_may_take()) {
            return WorkMix::default();
        }
        WorkMix::of(names.iter().enumerate().map(|(k, name)| (*name, size(k))))
    }

    /// The share of the work the GPU lane cannot take, 0 to 1 (0 for no work).
    pub fn cpu_only_share(&self) -> f64 {
        match self.total {
            0 => 0.0,
            total => self.cpu_only as f64 / total as f64,
        }
    }

    /// Whether most of the work is of files the GPU lane cannot take: the CPU lane then keeps
    /// every thread at normal priority beside the GPU lane, as it has them alone.
    pub fn mostly_cpu_only(&self) -> bool {
        self.cpu_only_share() >= CPU_BOUND_SHARE
    }
}

/// What the pipeline samples of an epoch for the plan: its encoded bytes (estimated) and the mix
/// of its work. A plain byte count is an epoch whose mix is unknown (taken as JPEGs).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct EpochSample {
    /// An epoch's encoded bytes, estimated.
    pub bytes: u64,
    /// The mix of the files sampled.
    pub mix: WorkMix,
}

impl From<u64> for EpochSample {
    fn from(bytes: u64) -> EpochSample {
        EpochSample {
            bytes,
            mix: WorkMix::default(),
        }
    }
}

/// The share of an epoch's work, of files the GPU lane cannot take, from which the CPU lane
/// keeps all its threads at normal priority beside the GPU lane.
pub(crate) const CPU_BOUND_SHARE: f64 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_extension_and_unknown_names_count_as_jpeg() {
        assert_eq!(FileKind::of("a/b/c.JPG"), FileKind::Jpeg);
        assert_eq!(FileKind::of("wall.png"), FileKind::Png);
        assert_eq!(FileKind::of("x.tar/0001.webp"), FileKind::WebP);
        assert_eq!(FileKind::of("dir.png/noext"), FileKind::Jpeg);
        assert_eq!(FileKind::of("scan.BMP"), FileKind::Raw);
        assert_eq!(FileKind::of("anim.gif"), FileKind::Other);
        assert!(FileKind::Jpeg.gpu_may_take() && !FileKind::Png.gpu_may_take());
    }

    #[test]
    fn a_webp_costs_more_than_a_jpeg_of_its_size_and_a_large_jpeg_more_than_a_small_png() {
        assert!(expected_cost("a.webp", 100_000) > expected_cost("a.jpg", 400_000));
        assert_eq!(
            expected_cost("a.png", 500_000),
            expected_cost("a.jpg", 500_000)
        );
        assert!(expected_cost("a.jpg", 900_000) > expected_cost("a.png", 100_000));
        assert!(expected_cost("a.jpg", 100_000) > expected_cost("a.bmp", 500_000));
    }

    #[test]
    fn the_share_of_work_the_gpu_lane_cannot_take() {
        let jpegs = WorkMix::of([("a.jpg", 100_000), ("b.jpeg", 200_000)]);
        assert_eq!(jpegs.cpu_only_share(), 0.0);
        assert!(!jpegs.mostly_cpu_only());
        assert!(!WorkMix::default().mostly_cpu_only());
        // 60 PNGs of 500 kB beside 40 JPEGs of 500 kB: 60% of the work.
        let files: Vec<(String, u64)> = (0..100)
            .map(|i| {
                (
                    format!("{i}.{}", if i < 60 { "png" } else { "jpg" }),
                    500_000,
                )
            })
            .collect();
        let mix = WorkMix::of(files.iter().map(|(n, b)| (n.as_str(), *b)));
        assert!((mix.cpu_only_share() - 0.6).abs() < 1e-9);
        assert!(mix.mostly_cpu_only());
        // A few WebPs among many JPEGs: less than half.
        let mut files: Vec<(String, u64)> =
            (0..100).map(|i| (format!("{i}.jpg"), 300_000)).collect();
        files.extend((0..5).map(|i| (format!("{i}.webp"), 100_000)));
        let mix = WorkMix::of(files.iter().map(|(n, b)| (n.as_str(), *b)));
        assert!(!mix.mostly_cpu_only(), "{}", mix.cpu_only_share());
        // Names alone: JPEGs ask for no size.
        let names = ["a.jpg", "b.JPEG", "c"];
        let asked = std::cell::Cell::new(0);
        let size = |_| {
            asked.set(asked.get() + 1);
            1000
        };
        assert_eq!(WorkMix::of_names(&names, size), WorkMix::default());
        assert_eq!(asked.get(), 0);
        let mix = WorkMix::of_names(&["a.jpg", "b.png"], size);
        assert_eq!((mix.total, mix.cpu_only, asked.get()), (16_000, 8_000, 2));
    }
}
