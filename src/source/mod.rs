//! Where images come from: folders, torchvision's ImageFolder, path lists and in-memory bytes,
//! each image with an id and, where the source has them, a class label. How a folder is listed
//! is in `folders`; the order images are taken in is [`crate::order`]'s business.

mod folders;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ItemErrorKind, Result};

pub use folders::IMAGE_EXTENSIONS;

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
    fn from_path(path: PathBuf, label: Option<u32>) -> SourceItem {
        SourceItem {
            id: path.display().to_string(),
            payload: Payload::Path(path),
            label,
        }
    }

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
                .map_err(|e| ItemErrorKind::read(&e, describe_io_error(path, &e))),
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
        let items = folders::image_files(root.as_ref())?
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
        let classes = folders::image_folder(root.as_ref())?;
        let mut items = Vec::new();
        let mut class_names = Vec::with_capacity(classes.len());
        for (label, class) in classes.into_iter().enumerate() {
            items.extend(
                class
                    .files
                    .into_iter()
                    .map(|path| SourceItem::from_path(path, Some(label as u32))),
            );
            class_names.push(class.name);
        }
        Ok(Source {
            items,
            class_names: Some(class_names),
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
            return Err(Error::invalid(
                "labels",
                format!("{} labels for {} images", labels.len(), self.items.len()),
            ));
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

    /// The encoded bytes of image `index`, read as the pipeline reads them (for example to make
    /// an in-memory copy of a source with [`Source::bytes`]).
    pub fn read(&self, index: usize) -> std::result::Result<Vec<u8>, crate::ItemError> {
        let item = self.items.get(index).ok_or_else(|| crate::ItemError {
            id: format!("#{index}"),
            index,
            kind: ItemErrorKind::read(
                &std::io::Error::from(std::io::ErrorKind::NotFound),
                format!("no image {index} in a source of {}", self.items.len()),
            ),
        })?;
        item.read()
            .map(|bytes| bytes.to_vec())
            .map_err(|kind| crate::ItemError {
                id: item.id.clone(),
                index,
                kind,
            })
    }

    pub(crate) fn item(&self, index: usize) -> &SourceItem {
        &self.items[index]
    }
}
