//! Where images come from (folders, path lists, in-memory bytes) and the order they are taken in
//! (deterministic, seeded shuffle per epoch, sharding across processes).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ItemErrorKind, Result};

/// File extensions (compared without case) that folder listings take as images. The format itself
/// is sniffed from the bytes when the file is decoded, so a PNG named `.jpg` still decodes.
pub const IMAGE_EXTENSIONS: [&str; 8] = ["jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"];

#[derive(Debug, Clone)]
enum Payload {
    Path(PathBuf),
    Bytes(Arc<[u8]>),
}

/// One image of a source: where its bytes are, its id and its class label.
#[derive(Debug, Clone)]
pub(crate) struct SourceItem {
    payload: Payload,
    id: String,
    label: Option<u32>,
}

impl SourceItem {
    /// The image's id: its path, or the caller's id for in-memory bytes.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Class label, for sources that have them.
    pub(crate) fn label(&self) -> Option<u32> {
        self.label
    }

    /// Encoded size in bytes, to schedule large images first: the file's size (0 if it cannot
    /// be read; reading it later reports why), or the length of in-memory bytes.
    pub(crate) fn size_hint(&self) -> u64 {
        match &self.payload {
            Payload::Path(path) => fs::metadata(path).map_or(0, |m| m.len()),
            Payload::Bytes(bytes) => bytes.len() as u64,
        }
    }

    /// The encoded bytes: read from disk, or shared from memory.
    pub(crate) fn read(&self) -> std::result::Result<ItemBytes, ItemErrorKind> {
        match &self.payload {
            Payload::Path(path) => fs::read(path)
                .map(ItemBytes::Owned)
                .map_err(|e| ItemErrorKind::Read(describe_io_error(path, &e))),
            Payload::Bytes(bytes) => Ok(ItemBytes::Shared(bytes.clone())),
        }
    }
}

/// Encoded bytes of one image.
pub(crate) enum ItemBytes {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl std::ops::Deref for ItemBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ItemBytes::Owned(v) => v,
            ItemBytes::Shared(a) => a,
        }
    }
}

fn describe_io_error(path: &Path, e: &std::io::Error) -> String {
    if path.is_dir() {
        return "is a directory".into();
    }
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// The images a pipeline reads, in their listing order.
///
/// ```
/// use gpufeed::Source;
/// let source = Source::directory("assets")?;
/// assert!(source.len() >= 5);
/// # Ok::<(), gpufeed::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Source {
    items: Vec<SourceItem>,
    class_names: Option<Vec<String>>,
}

impl Source {
    /// Every image file under `root`, recursively, in sorted path order; no labels.
    pub fn directory(root: impl AsRef<Path>) -> Result<Source> {
        let root = root.as_ref();
        let mut files = Vec::new();
        walk_images(root, &mut files)?;
        let items = files
            .into_iter()
            .map(|path| SourceItem::from_path(path, None))
            .collect();
        Ok(Source {
            items,
            class_names: None,
        })
    }

    /// torchvision's `ImageFolder`: each subfolder of `root` is a class, labelled by its position
    /// among the sorted subfolder names; its images are found recursively, in sorted order.
    pub fn image_folder(root: impl AsRef<Path>) -> Result<Source> {
        let root = root.as_ref();
        let mut classes: Vec<(String, PathBuf)> = read_dir_sorted(root)?
            .into_iter()
            .filter(|p| p.is_dir())
            .map(|p| (file_name(&p), p))
            .collect();
        classes.sort();
        if classes.is_empty() {
            return Err(Error::Source {
                path: root.to_path_buf(),
                reason: "no class subfolders (ImageFolder wants root/<class>/<image>)".into(),
            });
        }
        let mut items = Vec::new();
        for (label, (_, dir)) in classes.iter().enumerate() {
            let mut files = Vec::new();
            walk_images(dir, &mut files)?;
            items.extend(
                files
                    .into_iter()
                    .map(|path| SourceItem::from_path(path, Some(label as u32))),
            );
        }
        Ok(Source {
            items,
            class_names: Some(classes.into_iter().map(|(name, _)| name).collect()),
        })
    }

    /// These files, in this order, whatever their extension; no labels. A path that is missing
    /// or not a file becomes an item error when it is read.
    pub fn paths<I, P>(paths: I) -> Source
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        let items = paths
            .into_iter()
            .map(|p| SourceItem::from_path(p.into(), None))
            .collect();
        Source {
            items,
            class_names: None,
        }
    }

    /// Encoded images already in memory, each with the caller's id (used in errors and
    /// [`crate::Batch::ids`]).
    pub fn bytes<I, S, B>(images: I) -> Source
    where
        I: IntoIterator<Item = (S, B)>,
        S: Into<String>,
        B: Into<Arc<[u8]>>,
    {
        let items = images
            .into_iter()
            .map(|(id, bytes)| SourceItem {
                payload: Payload::Bytes(bytes.into()),
                id: id.into(),
                label: None,
            })
            .collect();
        Source {
            items,
            class_names: None,
        }
    }

    /// Attaches a class label to each image, in order (for path lists and bytes).
    pub fn with_labels(mut self, labels: impl IntoIterator<Item = u32>) -> Result<Source> {
        let labels: Vec<u32> = labels.into_iter().collect();
        if labels.len() != self.items.len() {
            return Err(Error::Config(format!(
                "{} labels for {} images",
                labels.len(),
                self.items.len()
            )));
        }
        for (item, label) in self.items.iter_mut().zip(labels) {
            item.label = Some(label);
        }
        Ok(self)
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the source has no images.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Class names by label, for [`Source::image_folder`].
    pub fn class_names(&self) -> Option<&[String]> {
        self.class_names.as_deref()
    }

    /// Whether every image has a label.
    pub fn has_labels(&self) -> bool {
        !self.items.is_empty() && self.items.iter().all(|i| i.label.is_some())
    }

    /// The id of image `index` (its path or caller id).
    pub fn id(&self, index: usize) -> Option<&str> {
        self.items.get(index).map(|i| i.id())
    }

    pub(crate) fn item(&self, index: usize) -> &SourceItem {
        &self.items[index]
    }
}

impl SourceItem {
    fn from_path(path: PathBuf, label: Option<u32>) -> SourceItem {
        SourceItem {
            id: path.display().to_string(),
            payload: Payload::Path(path),
            label,
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(dir).map_err(|e| Error::Source {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::Source {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        paths.push(entry.path());
    }
    paths.sort();
    Ok(paths)
}

fn has_image_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Appends the image files under `dir` in torchvision's order: folders visited in sorted order of
/// their path, files sorted by name within each folder. Symbolic links are followed, each real
/// folder is visited once (a link back to a parent does not loop).
fn walk_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut folders: Vec<(String, Vec<PathBuf>)> = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    let mut visited = HashSet::new();
    while let Some(folder) = pending.pop() {
        // A folder that cannot be canonicalized is still listed (and its error reported there).
        let real = fs::canonicalize(&folder).unwrap_or_else(|_| folder.clone());
        if !visited.insert(real) {
            continue;
        }
        let mut files = Vec::new();
        for path in read_dir_sorted(&folder)? {
            if path.is_dir() {
                pending.push(path);
            } else if has_image_extension(&path) {
                files.push(path);
            }
        }
        folders.push((folder.to_string_lossy().into_owned(), files));
    }
    folders.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, files) in folders {
        out.extend(files);
    }
    Ok(())
}

/// The order of one epoch: which source indices this process takes, in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampler {
    pub len: usize,
    pub shuffle_seed: Option<u64>,
    pub rank: usize,
    pub world: usize,
}

impl Sampler {
    /// Source indices for `epoch`: the whole source in order (or shuffled with a permutation that
    /// depends only on the seed and the epoch, so every rank agrees), then every `world`-th index
    /// starting at `rank`. The shards of all ranks are disjoint and together cover the source.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.shuffle_seed {
            let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.world)
            .collect()
    }
}

/// A small, fast, well-mixed generator; enough for shuffling and stable across platforms.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift with rejection).
    fn below(&mut self, n: u64) -> u64 {
        loop {
            let m = (self.next() as u128) * (n as u128);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_and_complete() {
        for world in 1..5 {
            let mut all = Vec::new();
            for rank in 0..world {
                let s = Sampler {
                    len: 103,
                    shuffle_seed: Some(7),
                    rank,
                    world,
                };
                all.extend(s.epoch_order(3));
            }
            all.sort();
            assert_eq!(all, (0..103).collect::<Vec<_>>());
        }
    }

    #[test]
    fn shuffle_depends_on_seed_and_epoch() {
        let s = Sampler {
            len: 50,
            shuffle_seed: Some(1),
            rank: 0,
            world: 1,
        };
        assert_eq!(s.epoch_order(0), s.epoch_order(0));
        assert_ne!(s.epoch_order(0), s.epoch_order(1));
        assert_ne!(s.epoch_order(0), (0..50).collect::<Vec<_>>());
        let unshuffled = Sampler {
            shuffle_seed: None,
            ..s
        };
        assert_eq!(unshuffled.epoch_order(5), (0..50).collect::<Vec<_>>());
    }
}
