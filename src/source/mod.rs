//! Where images come from: folders, torchvision's ImageFolder, path lists, in-memory bytes, tar
//! shards and (feature `object-store`) object storage, each image with an id and, where the
//! source has them, a class label. How a folder is listed is in `folders`, tar shards in `tar`,
//! object storage in `remote`; the order images are taken in is [`crate::order`]'s business.
//! The lanes read every image through one seam, [`SourceItem::open`], whatever holds it.

mod folders;
mod listing;
#[cfg(feature = "parquet")]
mod parquet;
#[cfg(feature = "object-store")]
mod remote;
mod report;
mod tar;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ItemErrorKind, Result};
use crate::order::{EpochOrder, ListingSummary, ShardBlocks};

#[cfg(feature = "parquet")]
pub use self::parquet::{ExtraValue, Extras, ParquetOptions, DEFAULT_PARQUET_BUDGET};
pub use folders::{DECODED_EXTENSIONS, IMAGE_EXTENSIONS};
#[cfg(feature = "object-store")]
pub use remote::{Interrupt, RemoteOptions, UrlLayout, DEFAULT_READ_BUDGET};
pub use report::ReadReport;

#[derive(Debug, Clone)]
enum Payload {
    Path(PathBuf),
    Bytes(Arc<[u8]>),
    /// A sample's image member in a tar shard.
    Member(tar::MemberPlace),
    /// A part of a tar shard that cannot be read, and why.
    Damaged(String),
    /// An object in object storage, or a member of a shard there.
    #[cfg(feature = "object-store")]
    Remote(remote::Place),
    /// A row of a Parquet file.
    #[cfg(feature = "parquet")]
    Parquet(self::parquet::RowPlace),
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
            id: path_id(&path),
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
    /// be read; opening it later reports why), or the length of in-memory bytes.
    pub(crate) fn size_hint(&self) -> u64 {
        match &self.payload {
            Payload::Path(path) => fs::metadata(path).map_or(0, |m| m.len()),
            Payload::Bytes(bytes) => bytes.len() as u64,
            Payload::Member(place) => place.len,
            Payload::Damaged(_) => 0,
            #[cfg(feature = "object-store")]
            Payload::Remote(place) => place.len(),
            #[cfg(feature = "parquet")]
            Payload::Parquet(place) => place.size_hint(),
        }
    }

    /// Opens the image for reading, refusing without reading it what cannot be an image: a
    /// FIFO, device or socket (opened without blocking, so a FIFO with no writer cannot hang
    /// the pipeline), a file over `max_bytes`, or a file whose first bytes name no format
    /// gpufeed decodes.
    pub(crate) fn open(&self, max_bytes: u64) -> std::result::Result<OpenItem, ItemErrorKind> {
        match &self.payload {
            Payload::Path(path) => OpenItem::file(path, max_bytes),
            Payload::Bytes(bytes) => {
                if bytes.len() as u64 > max_bytes {
                    return Err(ItemErrorKind::FileTooLarge {
                        bytes: bytes.len() as u64,
                        limit: max_bytes,
                    });
                }
                Ok(OpenItem::Memory(SharedBytes::Slice(bytes.clone())))
            }
            Payload::Member(place) => OpenItem::member(place, max_bytes),
            Payload::Damaged(reason) => Err(ItemErrorKind::Archive(reason.clone())),
            #[cfg(feature = "object-store")]
            Payload::Remote(place) => place.open(max_bytes),
            #[cfg(feature = "parquet")]
            Payload::Parquet(place) => place.open(max_bytes),
        }
    }

    /// The bytes of the sample's other member whose extension is the first of `exts` it has
    /// (WebDataset samples: `json`, `seg.png`), with that extension; `None` when it has none of
    /// them (or is not a shard's sample).
    pub(crate) fn part(
        &self,
        exts: &[&str],
    ) -> Option<std::result::Result<(String, Vec<u8>), ItemErrorKind>> {
        let parts: &[tar::Part] = match &self.payload {
            Payload::Member(place) => &place.parts,
            #[cfg(feature = "object-store")]
            Payload::Remote(place) => place.parts(),
            _ => &[],
        };
        let part = exts
            .iter()
            .find_map(|ext| parts.iter().find(|p| p.ext == *ext))?;
        let bytes = match &self.payload {
            Payload::Member(place) => read_file_span(&place.shard, part.offset, part.len),
            #[cfg(feature = "object-store")]
            Payload::Remote(place) => place.read_span(part.offset, part.len),
            _ => return None,
        };
        Some(bytes.map(|b| (part.ext.clone(), b)))
    }

    /// The encoded bytes, read whole (no size limit, but only from a regular file, never a FIFO
    /// or a device): for copies of a source.
    fn read_all(&self) -> std::result::Result<Vec<u8>, ItemErrorKind> {
        let item = self.open(u64::MAX)?;
        item.read(Vec::new())
            .map(ItemBytes::into_vec)
            .map_err(|(kind, _)| kind)
    }
}

/// An image opened for reading: a regular file (or a member of a tar shard) checked for size and
/// format, or bytes in memory.
pub(crate) enum OpenItem {
    /// `len` bytes at `start` of a regular file (0 for an image file, the member's offset in a
    /// shard); `head` holds the first of them.
    File {
        file: fs::File,
        path: PathBuf,
        start: u64,
        len: u64,
        head: Vec<u8>,
    },
    /// Bytes in memory: given so, or read from object storage.
    Memory(SharedBytes),
}

/// Bytes in memory shared without a copy: a whole slice, or a span of a buffer (an image member
/// of a shard read whole).
#[derive(Debug, Clone)]
pub(crate) enum SharedBytes {
    Slice(Arc<[u8]>),
    #[cfg(feature = "object-store")]
    Span {
        buffer: Arc<Vec<u8>>,
        range: std::ops::Range<usize>,
    },
    /// A slice of a Parquet page, decompressed.
    #[cfg(feature = "parquet")]
    Pages(::parquet::data_type::ByteArray),
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SharedBytes::Slice(bytes) => bytes,
            #[cfg(feature = "object-store")]
            SharedBytes::Span { buffer, range } => &buffer[range.clone()],
            #[cfg(feature = "parquet")]
            SharedBytes::Pages(bytes) => bytes.data(),
        }
    }
}

/// The formats gpufeed decodes, by their first bytes: what a source's files must start with.
pub(crate) fn sniff_format(head: &[u8]) -> Option<image::ImageFormat> {
    use image::ImageFormat;
    match image::guess_format(head).ok()? {
        f @ (ImageFormat::Jpeg
        | ImageFormat::Png
        | ImageFormat::WebP
        | ImageFormat::Bmp
        | ImageFormat::Gif
        | ImageFormat::Tiff
        | ImageFormat::Pnm) => Some(f),
        _ => None,
    }
}

/// Bytes read first: enough to sniff the format and, for nearly every file, to read its header
/// without another read (the rest follows in one more read, if any is left).
const HEAD_BYTES: usize = 64 << 10;

impl OpenItem {
    fn file(path: &Path, max_bytes: u64) -> std::result::Result<OpenItem, ItemErrorKind> {
        let (file, len) = open_regular(path)?;
        OpenItem::span(file, path, 0, len, max_bytes)
    }

    /// Bytes in memory, refused as a file with these bytes would be: over `max_bytes`, empty, or
    /// of no format this crate decodes.
    #[cfg(any(feature = "object-store", feature = "parquet"))]
    fn checked_memory(
        bytes: SharedBytes,
        max_bytes: u64,
    ) -> std::result::Result<OpenItem, ItemErrorKind> {
        if bytes.len() as u64 > max_bytes {
            return Err(ItemErrorKind::FileTooLarge {
                bytes: bytes.len() as u64,
                limit: max_bytes,
            });
        }
        if bytes.is_empty() {
            return Err(ItemErrorKind::Decode("file is empty".into()));
        }
        if sniff_format(&bytes[..bytes.len().min(HEAD_BYTES)]).is_none() {
            return Err(ItemErrorKind::UnknownFormat);
        }
        Ok(OpenItem::Memory(bytes))
    }

    /// The member of a tar shard at `place`.
    fn member(
        place: &tar::MemberPlace,
        max_bytes: u64,
    ) -> std::result::Result<OpenItem, ItemErrorKind> {
        OpenItem::file_part(place.shard.as_path(), place.offset, place.len, max_bytes)
    }

    /// `len` bytes at `offset` of the shard file at `path`.
    fn file_part(
        path: &Path,
        offset: u64,
        len: u64,
        max_bytes: u64,
    ) -> std::result::Result<OpenItem, ItemErrorKind> {
        let (file, size) = open_regular(path)?;
        if offset.saturating_add(len) > size {
            return Err(ItemErrorKind::Truncated(format!(
                "the shard ends at byte {size}, before the member's end"
            )));
        }
        OpenItem::span(file, path, offset, len, max_bytes)
    }

    /// `len` bytes at `start` of `file`, refused if over `max_bytes`, empty or of no format this
    /// crate decodes (read from the first bytes).
    fn span(
        file: fs::File,
        path: &Path,
        start: u64,
        len: u64,
        max_bytes: u64,
    ) -> std::result::Result<OpenItem, ItemErrorKind> {
        if len > max_bytes {
            return Err(ItemErrorKind::FileTooLarge {
                bytes: len,
                limit: max_bytes,
            });
        }
        let fail = |e: std::io::Error| ItemErrorKind::read(&e, describe_io_error(path, &e));
        let mut head = vec![0u8; HEAD_BYTES.min(len as usize)];
        let got = read_span(&file, start, &mut head).map_err(fail)?;
        head.truncate(got);
        if head.is_empty() {
            return Err(ItemErrorKind::Decode("file is empty".into()));
        }
        if sniff_format(&head).is_none() {
            return Err(ItemErrorKind::UnknownFormat);
        }
        Ok(OpenItem::File {
            file,
            path: path.to_path_buf(),
            start,
            len,
            head,
        })
    }

    /// Encoded size in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            OpenItem::File { len, .. } => *len,
            OpenItem::Memory(bytes) => bytes.len() as u64,
        }
    }

    /// The first bytes (all of them for bytes in memory).
    pub(crate) fn head(&self) -> &[u8] {
        match self {
            OpenItem::File { head, .. } => head,
            OpenItem::Memory(bytes) => bytes,
        }
    }

    /// A reader over the image's bytes (for decoders that read as they go), independent of any
    /// other reads of the item.
    pub(crate) fn reader(&self) -> ItemReader<'_> {
        match self {
            OpenItem::File {
                file,
                start,
                len,
                head,
                ..
            } => ItemReader::File {
                file,
                start: *start,
                len: *len,
                head,
                at: 0,
            },
            OpenItem::Memory(bytes) => ItemReader::Memory(std::io::Cursor::new(&**bytes)),
        }
    }

    /// Reads `len` bytes at `offset` (fewer at the end of the file) into `out`, without
    /// disturbing a later [`OpenItem::read`].
    pub(crate) fn read_at(
        &self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        out.clear();
        match self {
            OpenItem::File { head, .. }
                if offset.saturating_add(len as u64) <= head.len() as u64 =>
            {
                let start = offset as usize;
                out.extend_from_slice(&head[start..start + len]);
            }
            OpenItem::File {
                file,
                start,
                len: total,
                ..
            } => {
                let len = len.min(total.saturating_sub(offset) as usize);
                out.resize(len, 0);
                let filled = read_span(file, start + offset, out)?;
                out.truncate(filled);
            }
            OpenItem::Memory(bytes) => {
                let start = (offset.min(bytes.len() as u64)) as usize;
                let end = start.saturating_add(len).min(bytes.len());
                out.extend_from_slice(&bytes[start..end]);
            }
        }
        Ok(())
    }

    /// All the encoded bytes, read into `buffer` (whose old contents are dropped) for a file;
    /// the shared bytes for memory, `buffer` then coming back unused.
    pub(crate) fn read(
        self,
        mut buffer: Vec<u8>,
    ) -> std::result::Result<ItemBytes, (ItemErrorKind, Vec<u8>)> {
        match self {
            OpenItem::File {
                file,
                path,
                start,
                len,
                head,
            } => {
                let fail =
                    |e: std::io::Error| ItemErrorKind::read(&e, describe_io_error(&path, &e));
                buffer.clear();
                if buffer.try_reserve_exact(len as usize).is_err() {
                    let e = ItemErrorKind::read(
                        &std::io::Error::from(std::io::ErrorKind::OutOfMemory),
                        format!("no memory for its {len} bytes"),
                    );
                    return Err((e, buffer));
                }
                // The head is read already; the rest follows it. The file may have grown since
                // it was measured: no more than was counted is read.
                buffer.extend_from_slice(&head);
                buffer.resize(len as usize, 0);
                match read_span(&file, start + head.len() as u64, &mut buffer[head.len()..]) {
                    Ok(got) => {
                        buffer.truncate(head.len() + got);
                        Ok(ItemBytes::Owned(buffer))
                    }
                    Err(e) => Err((fail(e), buffer)),
                }
            }
            OpenItem::Memory(bytes) => Ok(ItemBytes::Shared(bytes, buffer)),
        }
    }
}

/// An image's bytes as `Read + Seek`: a span of a file read with positioned reads, or memory.
pub(crate) enum ItemReader<'a> {
    File {
        file: &'a fs::File,
        start: u64,
        len: u64,
        /// The first bytes, read when the item was opened: served without another read.
        head: &'a [u8],
        at: u64,
    },
    Memory(std::io::Cursor<&'a [u8]>),
}

impl std::io::Read for ItemReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            ItemReader::File {
                file,
                start,
                len,
                head,
                at,
            } => {
                use std::os::unix::fs::FileExt;
                let left = len.saturating_sub(*at).min(buf.len() as u64) as usize;
                if left == 0 {
                    return Ok(0);
                }
                let n = match head.get(*at as usize..) {
                    Some(rest) if !rest.is_empty() => {
                        let n = rest.len().min(left);
                        buf[..n].copy_from_slice(&rest[..n]);
                        n
                    }
                    _ => file.read_at(&mut buf[..left], *start + *at)?,
                };
                *at += n as u64;
                Ok(n)
            }
            ItemReader::Memory(cursor) => cursor.read(buf),
        }
    }
}

impl std::io::Seek for ItemReader<'_> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let (len, at) = match self {
            ItemReader::File { len, at, .. } => (*len, at),
            ItemReader::Memory(cursor) => return cursor.seek(to),
        };
        *at = match to {
            std::io::SeekFrom::Start(n) => Some(n),
            std::io::SeekFrom::End(d) => len.checked_add_signed(d),
            std::io::SeekFrom::Current(d) => at.checked_add_signed(d),
        }
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(*at)
    }
}

/// Opens `path` for reading if it is a regular file, without blocking (a FIFO with no writer
/// would hang an open that waits); returns it with its length.
fn open_regular(path: &Path) -> std::result::Result<(fs::File, u64), ItemErrorKind> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| ItemErrorKind::read(&e, describe_io_error(path, &e));
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    if !meta.is_file() {
        let reason = if meta.is_dir() {
            "is a directory".to_string()
        } else {
            format!("not a regular file ({})", file_kind(&meta.file_type()))
        };
        return Err(ItemErrorKind::Read {
            kind: std::io::ErrorKind::InvalidInput,
            reason,
        });
    }
    Ok((file, meta.len()))
}

/// Reads into `out` from `offset` of `file` with positioned reads until `out` is full or the file
/// ends; returns the bytes read.
/// `len` bytes at `offset` of the regular file at `path` (a member of a shard).
fn read_file_span(
    path: &Path,
    offset: u64,
    len: u64,
) -> std::result::Result<Vec<u8>, ItemErrorKind> {
    use std::os::unix::fs::FileExt;
    let (file, size) = open_regular(path)?;
    if offset.saturating_add(len) > size {
        return Err(ItemErrorKind::Truncated(format!(
            "the shard ends at byte {size}, before the member's end"
        )));
    }
    let mut out = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
    file.read_exact_at(&mut out, offset)
        .map_err(|e| ItemErrorKind::read(&e, describe_io_error(path, &e)))?;
    Ok(out)
}

fn read_span(file: &fs::File, offset: u64, out: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut filled = 0;
    while filled < out.len() {
        match file.read_at(&mut out[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// What a non-regular file is, in words.
fn file_kind(file_type: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// Encoded bytes of one image: read into a buffer, or shared from memory (with the buffer
/// that was not needed).
pub(crate) enum ItemBytes {
    Owned(Vec<u8>),
    Shared(SharedBytes, Vec<u8>),
}

impl ItemBytes {
    /// The bytes as an owned vector (a copy for bytes shared from memory).
    fn into_vec(self) -> Vec<u8> {
        match self {
            ItemBytes::Owned(v) => v,
            ItemBytes::Shared(a, _) => a.to_vec(),
        }
    }

    /// The buffer, for reuse.
    pub(crate) fn into_buffer(self) -> Vec<u8> {
        match self {
            ItemBytes::Owned(v) | ItemBytes::Shared(_, v) => v,
        }
    }
}

impl std::ops::Deref for ItemBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ItemBytes::Owned(v) => v,
            ItemBytes::Shared(a, _) => a,
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
#[derive(Debug)]
pub struct Source {
    items: Vec<SourceItem>,
    class_names: Option<Vec<String>>,
    unreadable_folders: Vec<(PathBuf, String)>,
    /// Files a folder listing left out, by extension.
    left_out: Vec<(String, usize)>,
    /// The listing in brief, made once it is listed (and again when labels are attached).
    listing: ListingSummary,
    /// What reads the objects of a source in object storage.
    #[cfg(feature = "object-store")]
    remote: Option<remote::Remote>,
    /// What reads the row groups of a Parquet source.
    #[cfg(feature = "parquet")]
    parquet: Option<self::parquet::ParquetReader>,
    /// A Parquet source's extra columns.
    #[cfg(feature = "parquet")]
    extras: Option<Arc<Extras>>,
}

/// A copy reads on its own: a source in object storage gets a reader of its own (sharing the
/// clients and the cache), so two pipelines over copies of one source do not share a read plan.
impl Clone for Source {
    fn clone(&self) -> Source {
        #[cfg(feature = "object-store")]
        if let Some(remote) = &self.remote {
            let (remote, items) = remote.fork(&self.items);
            return Source {
                items,
                class_names: self.class_names.clone(),
                unreadable_folders: self.unreadable_folders.clone(),
                left_out: self.left_out.clone(),
                listing: self.listing.clone(),
                remote: Some(remote),
                #[cfg(feature = "parquet")]
                parquet: None,
                #[cfg(feature = "parquet")]
                extras: None,
            };
        }
        #[cfg(feature = "parquet")]
        if let Some(parquet) = &self.parquet {
            let (parquet, items) = parquet.fork(&self.items);
            return Source {
                items,
                class_names: self.class_names.clone(),
                unreadable_folders: self.unreadable_folders.clone(),
                left_out: self.left_out.clone(),
                listing: self.listing.clone(),
                #[cfg(feature = "object-store")]
                remote: None,
                parquet: Some(parquet),
                extras: self.extras.clone(),
            };
        }
        Source {
            items: self.items.clone(),
            class_names: self.class_names.clone(),
            unreadable_folders: self.unreadable_folders.clone(),
            left_out: self.left_out.clone(),
            listing: self.listing.clone(),
            #[cfg(feature = "object-store")]
            remote: None,
            #[cfg(feature = "parquet")]
            parquet: None,
            #[cfg(feature = "parquet")]
            extras: self.extras.clone(),
        }
    }
}

/// A path as an image id: the path itself when it is valid UTF-8; otherwise its valid parts with
/// backslashes doubled and every other byte written `\xNN`, so two names that differ in one
/// byte keep different ids.
pub(crate) fn path_id(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.to_string();
    }
    let mut id = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        id.push_str(&chunk.valid().replace('\\', r"\\"));
        for byte in chunk.invalid() {
            id.push_str(&format!("\\x{byte:02x}"));
        }
    }
    id
}

impl Source {
    /// A source of these items, its listing summed up.
    fn listed(
        items: Vec<SourceItem>,
        class_names: Option<Vec<String>>,
        unreadable_folders: Vec<(PathBuf, String)>,
        left_out: Vec<(String, usize)>,
    ) -> Source {
        Source {
            listing: listing::summarize(&items),
            items,
            class_names,
            unreadable_folders,
            left_out,
            #[cfg(feature = "object-store")]
            remote: None,
            #[cfg(feature = "parquet")]
            parquet: None,
            #[cfg(feature = "parquet")]
            extras: None,
        }
    }

    /// Every image file under `root`, recursively, in sorted path order (torchvision's
    /// `ImageFolder` order), taking every format gpufeed decodes ([`DECODED_EXTENSIONS`]); no
    /// labels. A folder without any image file is an error; subfolders that cannot be read are
    /// skipped and listed by [`Source::unreadable_folders`], other files are counted by
    /// [`Source::left_out`].
    pub fn directory(root: impl AsRef<Path>) -> Result<Source> {
        let root = root.as_ref();
        let listing = folders::image_files(root)?;
        if listing.files.is_empty() {
            return Err(Error::Source {
                path: root.to_path_buf(),
                reason: format!(
                    "no image file (looked for .{})",
                    DECODED_EXTENSIONS.join(", .")
                ),
                source: None,
            });
        }
        let items = listing
            .files
            .into_iter()
            .map(|path| SourceItem::from_path(path, None))
            .collect();
        Ok(Source::listed(
            items,
            None,
            listing.unreadable,
            listing.left_out.into_iter().collect(),
        ))
    }

    /// torchvision's `ImageFolder`: each subfolder of `root` is a class, labelled by its position
    /// among the sorted subfolder names; its images (torchvision's extensions,
    /// [`IMAGE_EXTENSIONS`]) are found recursively, in sorted order. As in torchvision, a root
    /// without class folders, or a class without any image file, is an error. Other files are
    /// counted by [`Source::left_out`]; a link inside a class to a folder the listing reaches
    /// anyway (another class, the root) is not followed, so no image is listed twice.
    pub fn image_folder(root: impl AsRef<Path>) -> Result<Source> {
        let folders::Classes {
            classes,
            unreadable: unreadable_folders,
            left_out,
        } = folders::image_folder(root.as_ref())?;
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
        Ok(Source::listed(
            items,
            Some(class_names),
            unreadable_folders,
            left_out.into_iter().collect(),
        ))
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
        Source::listed(items, None, Vec::new(), Vec::new())
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
        Source::listed(items, None, Vec::new(), Vec::new())
    }

    /// The images of one request, in order: each its bytes in memory (with an id) or a file
    /// (its path as its id); no labels.
    pub(crate) fn request<I>(images: I) -> Source
    where
        I: IntoIterator<Item = std::result::Result<(String, Arc<[u8]>), PathBuf>>,
    {
        let items = images
            .into_iter()
            .map(|image| match image {
                Ok((id, bytes)) => SourceItem {
                    payload: Payload::Bytes(bytes),
                    id,
                    label: None,
                },
                Err(path) => SourceItem::from_path(path, None),
            })
            .collect();
        Source::listed(items, None, Vec::new(), Vec::new())
    }

    /// The samples of the WebDataset tar shards directly inside `dir` (its `.tar` files, in
    /// sorted order): see [`Source::tar_shards`]. A folder without any is an error.
    pub fn webdataset(dir: impl AsRef<Path>) -> Result<Source> {
        let dir = dir.as_ref();
        let shards = tar::shards_in(dir).map_err(|e| Error::Source {
            path: dir.to_path_buf(),
            reason: describe_io_error(dir, &e),
            source: Some(e),
        })?;
        if shards.is_empty() {
            return Err(Error::Source {
                path: dir.to_path_buf(),
                reason: "no .tar shard".into(),
                source: None,
            });
        }
        Source::tar_shards(shards)
    }

    /// The samples of these tar shards, in order, in WebDataset's layout: members sharing a key
    /// (the name up to the first dot of its last part: `n01440764/x_10.jpg` and
    /// `n01440764/x_10.cls` are sample `n01440764/x_10`) make a sample; its image is the member
    /// with an image extension ([`DECODED_EXTENSIONS`]), its label the integer in its `.cls`
    /// member. An index of the members is read from the headers once; images are read in place
    /// (a hard link to an earlier member, or a symbolic link to a member of the same shard, is
    /// read as that member). Ids name the shard and the member (`shard.tar:key.jpg`). A damaged
    /// part of a shard (a bad header, a member cut short, a sample without an image or with a
    /// label that is not a number, an image that is a link to nothing in the shard, a key that
    /// an earlier sample of the shard has already) is one entry that fails, naming it, when
    /// read; the good samples around it are kept. When some samples have labels, a sample
    /// without one fails the same way (its label would be missing from the batch). A shard that
    /// cannot be opened is an error.
    pub fn tar_shards<I, P>(shards: I) -> Result<Source>
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        let mut items = Vec::new();
        for shard in shards {
            let shard = Arc::new(shard.into());
            let entries = tar::index(&shard).map_err(|e| Error::Source {
                path: shard.to_path_buf(),
                reason: describe_io_error(&shard, &e),
                source: Some(e),
            })?;
            items.extend(entries.into_iter().map(|entry| match entry {
                tar::Entry::Sample {
                    id,
                    offset,
                    len,
                    label,
                    parts,
                } => SourceItem {
                    payload: Payload::Member(tar::MemberPlace {
                        shard: shard.clone(),
                        offset,
                        len,
                        parts: parts.into(),
                    }),
                    id,
                    label,
                },
                tar::Entry::Damaged { id, reason, .. } => SourceItem {
                    payload: Payload::Damaged(reason),
                    id,
                    label: None,
                },
            }));
        }
        let is_sample = |i: &SourceItem| matches!(i.payload, Payload::Member(_));
        let labelled = items
            .iter()
            .filter(|i| is_sample(i) && i.label.is_some())
            .count();
        let samples = items.iter().filter(|i| is_sample(i)).count();
        if labelled > 0 && labelled < samples {
            for item in items.iter_mut().filter(|i| i.label.is_none()) {
                if let Payload::Member(_) = item.payload {
                    item.payload = Payload::Damaged(format!(
                        "sample without a .cls label, where {labelled} of the {samples} samples \
                         have one"
                    ));
                }
            }
        }
        Ok(Source::listed(items, None, Vec::new(), Vec::new()))
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
        self.listing = listing::summarize(&self.items);
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

    /// Folders the listing could not read (a `lost+found` without permission, say), each with
    /// the reason; they were skipped, as torchvision skips them.
    pub fn unreadable_folders(&self) -> &[(PathBuf, String)] {
        &self.unreadable_folders
    }

    /// Files a folder listing left out because of their extension, counted by extension (lower
    /// case, without the dot; `""` for files without one), in sorted order.
    ///
    /// ```
    /// let source = gpufeed::Source::directory("assets")?;
    /// assert_eq!(source.left_out(), [("md".to_string(), 1)]); // assets/SOURCES.md
    /// # Ok::<(), gpufeed::Error>(())
    /// ```
    pub fn left_out(&self) -> &[(String, usize)] {
        &self.left_out
    }

    /// Whether every image has a label (damaged parts of tar shards, which yield no image,
    /// aside).
    pub fn has_labels(&self) -> bool {
        let mut images = self
            .items
            .iter()
            .filter(|i| !matches!(i.payload, Payload::Damaged(_)))
            .peekable();
        images.peek().is_some() && images.all(|i| i.label.is_some())
    }

    /// The id of image `index`: its path for a file (when the path is not valid UTF-8, its valid
    /// parts with backslashes doubled and every other byte written `\xNN`), the caller's id for
    /// bytes, `shard.tar:member` for a sample of a tar shard.
    pub fn id(&self, index: usize) -> Option<&str> {
        self.items.get(index).map(|i| i.id())
    }

    /// The file image `index` is read from, for images that are files (folders, ImageFolder,
    /// path lists): the name exactly as it is, where [`Source::id`] is text.
    pub fn path(&self, index: usize) -> Option<&Path> {
        match &self.items.get(index)?.payload {
            Payload::Path(path) => Some(path),
            _ => None,
        }
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
        item.read_all().map_err(|kind| crate::ItemError {
            id: item.id.clone(),
            index,
            kind,
        })
    }

    /// Sample `index`'s other member with the first of these extensions it has (WebDataset
    /// samples: `json`, `seg.png`): its extension and bytes; `Ok(None)` without one.
    pub(crate) fn part(
        &self,
        index: usize,
        exts: &[&str],
    ) -> std::result::Result<Option<(String, Vec<u8>)>, crate::ItemError> {
        let Some(item) = self.items.get(index) else {
            return Ok(None);
        };
        item.part(exts)
            .transpose()
            .map_err(|kind| crate::ItemError {
                id: item.id.clone(),
                index,
                kind,
            })
    }

    /// The indices of items known from the listing to hold no image: damaged parts of tar
    /// shards, keys in object storage no client can request.
    pub(crate) fn damaged_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.payload, Payload::Damaged(_)))
            .map(|(index, _)| index)
    }

    /// The listing in brief: its length, its fingerprint, its first and last ids.
    pub(crate) fn listing(&self) -> &ListingSummary {
        &self.listing
    }

    pub(crate) fn item(&self, index: usize) -> &SourceItem {
        &self.items[index]
    }

    /// The shards of a source read shard by shard (WebDataset shards in object storage), for the
    /// order's block shuffle; `None` for sources read image by image.
    pub(crate) fn shuffle_blocks(&self) -> Option<ShardBlocks> {
        #[cfg(feature = "object-store")]
        if let Some(remote) = &self.remote {
            return remote.shuffle_blocks();
        }
        #[cfg(feature = "parquet")]
        if let Some(parquet) = &self.parquet {
            return Some(parquet.shuffle_blocks());
        }
        None
    }

    /// An epoch begins in `order`: a source in object storage starts reading ahead of it, and
    /// once every object of the epoch is read or on its way, the first objects of the epoch
    /// after it, in `next()`'s order (called only for such a source).
    pub(crate) fn begin_epoch(
        &self,
        epoch: u64,
        order: &EpochOrder,
        next: impl FnOnce() -> Arc<EpochOrder>,
    ) {
        #[cfg(feature = "object-store")]
        if let Some(remote) = &self.remote {
            remote.begin_epoch(epoch, order, &next(), &self.items);
        }
        #[cfg(feature = "parquet")]
        if let Some(parquet) = &self.parquet {
            parquet.begin_epoch(order, &self.items);
        }
        #[cfg(not(feature = "object-store"))]
        let _ = (epoch, order, next);
    }

    /// Every position of the current epoch before `position` is in a batch: what only they
    /// needed can go.
    pub(crate) fn advance(&self, position: usize) {
        #[cfg(feature = "object-store")]
        if let Some(remote) = &self.remote {
            remote.advance(position);
        }
        #[cfg(feature = "parquet")]
        if let Some(parquet) = &self.parquet {
            parquet.advance(position);
        }
        #[cfg(not(feature = "object-store"))]
        let _ = position;
    }

    /// Stops a source's reads: a wait for an object in object storage ends at once, now and
    /// later (the pipeline is going away; nothing waits on a server that does not answer).
    /// Nothing for local sources.
    pub(crate) fn stop_reads(&self) {
        #[cfg(feature = "object-store")]
        if let Some(remote) = &self.remote {
            remote.stop();
        }
        #[cfg(feature = "parquet")]
        if let Some(parquet) = &self.parquet {
            parquet.stop();
        }
    }

    /// What reading `epoch` took from object storage; `None` for local sources.
    pub(crate) fn read_report(&self, epoch: u64) -> Option<ReadReport> {
        #[cfg(feature = "object-store")]
        if let Some(remote) = &self.remote {
            return Some(remote.report(epoch));
        }
        #[cfg(not(feature = "object-store"))]
        let _ = epoch;
        None
    }
}
