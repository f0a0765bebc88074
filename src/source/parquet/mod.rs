//! Parquet files (feature `parquet`), local, one row an image: Hugging Face datasets
//! (`data/<split>-*.parquet`, an `image` column of `{bytes, path}` structs, a `ClassLabel`
//! label), or any files with a binary image column. Opening a source reads each file's footer
//! and only the label and extra columns' chunks; the image column is read a row group at a
//! time, ahead of the order ([`reader`]). Row groups are the order's shards: shuffled as
//! blocks, split between ranks as runs, resumed exactly.

mod columns;
mod hub;
mod reader;
mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::file::metadata::ParquetMetaDataReader;

use super::{OpenItem, Payload, SharedBytes, Source, SourceItem};
use crate::error::{Error, ItemErrorKind, Result};
use crate::order::{EpochOrder, ShardBlocks};
pub use columns::ExtraValue;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use reader::{Group, Groups, ParquetFile, ReadAhead, Storage};
use schema::LabelKind;

/// Default [`ParquetOptions::read_budget`]: 1 GiB of decoded images held.
pub const DEFAULT_PARQUET_BUDGET: u64 = 1 << 30;

/// How Parquet files make a source: which columns, which split, how much is read ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParquetOptions {
    /// The image column: binary, or a struct with a binary `bytes` field (default `image`).
    pub image_column: String,
    /// The label column: integers (class numbers) or text (class names, numbered in sorted
    /// order). `None` (the default): the column `label` if the files have one.
    pub label_column: Option<String>,
    /// Columns carried beside each image as [`ExtraValue`]s ([`Source::extras`]): plain
    /// numbers, booleans or text (captions, ids).
    pub extra_columns: Vec<String>,
    /// For a Hugging Face dataset folder: the split whose files are read (default `train`).
    pub split: String,
    /// Consecutive row groups whose rows are shuffled together (default 4).
    pub shuffle_window: usize,
    /// Row groups read ahead of the one the pipeline is in, side by side, one thread each (at
    /// most 8; default 8; 0: none).
    pub read_ahead: usize,
    /// The most bytes of decoded images held (default [`DEFAULT_PARQUET_BUDGET`]).
    pub read_budget: u64,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            image_column: "image".into(),
            label_column: None,
            extra_columns: Vec::new(),
            split: "train".into(),
            shuffle_window: 4,
            read_ahead: 8,
            read_budget: DEFAULT_PARQUET_BUDGET,
        }
    }
}

impl ParquetOptions {
    /// With this image column.
    pub fn image_column(mut self, name: impl Into<String>) -> Self {
        self.image_column = name.into();
        self
    }

    /// With this label column (it must be in every file), or `None` for `label` if present.
    pub fn label_column(mut self, name: Option<String>) -> Self {
        self.label_column = name;
        self
    }

    /// With these extra columns.
    pub fn extra_columns<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra_columns = names.into_iter().map(Into::into).collect();
        self
    }

    /// With this split.
    pub fn split(mut self, split: impl Into<String>) -> Self {
        self.split = split.into();
        self
    }

    /// With this shuffle window, in row groups (at least 1).
    pub fn shuffle_window(mut self, groups: usize) -> Self {
        self.shuffle_window = groups.max(1);
        self
    }

    /// With this many row groups read ahead.
    pub fn read_ahead(mut self, groups: usize) -> Self {
        self.read_ahead = groups;
        self
    }

    /// With this budget of decoded bytes held.
    pub fn read_budget(mut self, bytes: u64) -> Self {
        self.read_budget = bytes;
        self
    }
}

/// The extra columns of a source, a row per item.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Extras {
    /// The columns' names, as asked.
    pub names: Vec<String>,
    /// Each item's values, in the columns' order.
    pub rows: Vec<Vec<ExtraValue>>,
}

/// A Parquet source's reading: its row groups, read ahead.
#[derive(Debug)]
pub(crate) struct ParquetReader {
    read_ahead: ReadAhead,
    window: usize,
}

/// Where a row's image is: its group (in the source's groups) and its row there.
#[derive(Debug, Clone)]
pub(crate) struct RowPlace {
    groups: Arc<Groups>,
    group: u32,
    row: u32,
}

impl RowPlace {
    /// The row's image bytes, as a file would be opened: refused when null, over `max_bytes`
    /// or of no format gpufeed decodes.
    pub(crate) fn open(&self, max_bytes: u64) -> std::result::Result<OpenItem, ItemErrorKind> {
        let bytes = self
            .groups
            .image(self.group as usize, self.row as usize)
            .map_err(ItemErrorKind::Archive)?
            .ok_or_else(|| ItemErrorKind::Archive("the image is null".into()))?;
        OpenItem::checked_memory(SharedBytes::Pages(bytes), max_bytes)
    }

    pub(crate) fn size_hint(&self) -> u64 {
        self.groups.size_hint(self.group as usize)
    }
}

impl ParquetReader {
    /// The row groups as the order's shards.
    pub(crate) fn shuffle_blocks(&self) -> ShardBlocks {
        ShardBlocks {
            lens: self
                .read_ahead
                .groups()
                .groups()
                .iter()
                .map(|g| g.rows)
                .collect(),
            window: self.window,
        }
    }

    /// An epoch begins in `order`: its groups are read ahead in the order it needs them.
    pub(crate) fn begin_epoch(&self, order: &EpochOrder, items: &[SourceItem]) {
        let group = |&i: &usize| match items.get(i).map(|i| &i.payload) {
            Some(Payload::Parquet(place)) => place.group as usize,
            _ => usize::MAX,
        };
        self.read_ahead
            .groups()
            .begin_epoch(order.indices().iter().map(group));
    }

    /// Every position before `position` is in a batch.
    pub(crate) fn advance(&self, position: usize) {
        self.read_ahead.groups().advance(position);
    }

    /// Stops reading ahead.
    pub(crate) fn stop(&self) {
        self.read_ahead.groups().stop();
    }

    /// A reader of its own for a copy of the source, with the copy's items.
    pub(crate) fn fork(&self, items: &[SourceItem]) -> (ParquetReader, Vec<SourceItem>) {
        let groups = self.read_ahead.groups().fork();
        let items = items
            .iter()
            .map(|item| match &item.payload {
                Payload::Parquet(place) => SourceItem {
                    payload: Payload::Parquet(RowPlace {
                        groups: groups.clone(),
                        ..place.clone()
                    }),
                    ..item.clone()
                },
                _ => item.clone(),
            })
            .collect();
        let reader = ParquetReader {
            read_ahead: ReadAhead::start(groups),
            window: self.window,
        };
        (reader, items)
    }
}

/// The error for `path`.
fn source_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Source {
        path: path.to_path_buf(),
        reason: reason.into(),
        source: None,
    }
}

/// Whether `text` holds a glob pattern.
fn is_pattern(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// `name` matched against `pattern` (`*`, `?`, and `[...]` sets with ranges).
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|k| glob_match(rest, &name[k..])),
        Some((b'?', rest)) => !name.is_empty() && glob_match(rest, &name[1..]),
        Some((b'[', rest)) => {
            let Some(end) = rest.iter().skip(1).position(|&b| b == b']').map(|e| e + 1) else {
                return name.first() == Some(&b'[') && glob_match(rest, &name[1..]);
            };
            let (set, rest) = (&rest[..end], &rest[end + 1..]);
            let Some(&c) = name.first() else { return false };
            let (negate, set) = match set.split_first() {
                Some((b'!' | b'^', s)) => (true, s),
                _ => (false, set),
            };
            let mut hit = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == b'-' {
                    hit |= set[i] <= c && c <= set[i + 2];
                    i += 3;
                } else {
                    hit |= set[i] == c;
                    i += 1;
                }
            }
            hit != negate && glob_match(rest, &name[1..])
        }
        Some((&p, rest)) => name.first() == Some(&p) && glob_match(rest, &name[1..]),
    }
}

/// The files one argument names, in sorted order, and the dataset folder it is (for its card).
fn expand(arg: &Path, split: &str) -> Result<(Vec<PathBuf>, Option<PathBuf>)> {
    use std::os::unix::ffi::OsStrExt;
    let text = arg.to_string_lossy();
    if is_pattern(&text) {
        let folder = arg.parent().unwrap_or(Path::new(""));
        let folder = if folder.as_os_str().is_empty() {
            Path::new(".")
        } else {
            folder
        };
        if is_pattern(&folder.to_string_lossy()) {
            return Err(source_error(
                arg,
                "only the file name may hold a pattern (*, ?, [...])",
            ));
        }
        let pattern = arg.file_name().map_or(&[][..], |n| n.as_bytes());
        let files = super::folders::read_dir_sorted(folder)
            .map_err(|e| source_error(folder, super::describe_io_error(folder, &e)))?;
        let files: Vec<PathBuf> = files
            .into_iter()
            .filter(|p| {
                p.is_file()
                    && p.file_name()
                        .is_some_and(|n| glob_match(pattern, n.as_bytes()))
            })
            .collect();
        if files.is_empty() {
            return Err(source_error(arg, "no file matches the pattern"));
        }
        return Ok((files, None));
    }
    if arg.is_dir() {
        if let Some(found) = hub::split_files(arg, split) {
            return match found {
                Ok(files) => Ok((files, Some(arg.to_path_buf()))),
                Err(splits) => Err(source_error(
                    arg,
                    format!(
                        "no .parquet file of split {split:?} under data/ (splits found: {})",
                        if splits.is_empty() {
                            "none".to_string()
                        } else {
                            splits.join(", ")
                        }
                    ),
                )),
            };
        }
        let files = super::folders::read_dir_sorted(arg)
            .map_err(|e| source_error(arg, super::describe_io_error(arg, &e)))?;
        let files: Vec<PathBuf> = files
            .into_iter()
            .filter(|p| {
                p.is_file()
                    && p.extension()
                        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
            })
            .collect();
        if files.is_empty() {
            return Err(source_error(arg, "no .parquet file (nor a data/ folder)"));
        }
        return Ok((files, Some(arg.to_path_buf())));
    }
    Ok((vec![arg.to_path_buf()], None))
}

/// One file, opened: its footer and where its columns are.
struct Opened {
    file: Arc<ParquetFile>,
    columns: schema::Columns,
}

/// The error for a file of a source, naming it: its path, or its URL.
fn file_error(storage: &Storage, reason: impl Into<String>) -> Error {
    match storage {
        Storage::Local(path) => source_error(path, reason),
        #[cfg(feature = "object-store")]
        Storage::Remote(_, object) => Error::Remote {
            url: object.url.clone(),
            reason: reason.into(),
            kind: std::io::ErrorKind::InvalidData,
        },
    }
}

/// A file's footer: read with the file's reader (a local file), or its last 8 bytes and then
/// the metadata they give the length of (an object, two range requests).
fn read_metadata(storage: &Storage) -> Result<ParquetMetaData> {
    let unreadable =
        |e: ParquetError| file_error(storage, format!("not a readable Parquet file: {e}"));
    match storage {
        Storage::Local(path) => {
            let file = std::fs::File::open(path)
                .map_err(|e| source_error(path, super::describe_io_error(path, &e)))?;
            ParquetMetaDataReader::new()
                .parse_and_finish(&file)
                .map_err(unreadable)
        }
        #[cfg(feature = "object-store")]
        Storage::Remote(_, object) => {
            let size = object.size;
            if size < 12 {
                return Err(file_error(
                    storage,
                    format!("{size} bytes: too short for Parquet"),
                ));
            }
            let tail = storage
                .read(size - 8, 8)
                .map_err(|reason| file_error(storage, reason))?;
            if tail.len() != 8 || &tail[4..] != b"PAR1" {
                return Err(file_error(
                    storage,
                    "not a Parquet file (no PAR1 at its end)",
                ));
            }
            let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
            if len + 8 > size {
                return Err(file_error(
                    storage,
                    format!("a footer of {len} bytes in {size}"),
                ));
            }
            let start = size - 8 - len;
            let bytes = storage
                .read(start, len + 8)
                .map_err(|reason| file_error(storage, reason))?;
            ParquetMetaDataReader::new()
                .parse_and_finish(&columns::ChunkBytes::new(start, bytes))
                .map_err(unreadable)
        }
    }
}

fn open_file(storage: Storage, id: String, options: &ParquetOptions) -> Result<Opened> {
    let metadata = read_metadata(&storage)?;
    let (label, required) = match &options.label_column {
        Some(name) => (name.as_str(), true),
        None => ("label", false),
    };
    let columns = schema::find(
        metadata.file_metadata().schema_descr(),
        &options.image_column,
        label,
        required,
        &options.extra_columns,
    )
    .map_err(|reason| file_error(&storage, reason))?;
    Ok(Opened {
        file: Arc::new(ParquetFile {
            storage,
            id,
            metadata: Arc::new(metadata),
            image: columns.image,
        }),
        columns,
    })
}

/// A row's label before text labels are numbered.
enum RawLabel {
    None,
    Int(i64),
    Text(String),
    Bad(String),
}

/// What the listing keeps of one row group's label and extra columns.
struct GroupColumns {
    labels: Vec<RawLabel>,
    extras: Vec<Vec<ExtraValue>>,
    /// Why the group's columns could not be read: every row of it fails with this.
    failure: Option<String>,
}

fn read_group_columns(opened: &Opened, index: usize, rows: usize) -> GroupColumns {
    let meta = opened.file.metadata.row_group(index);
    let storage = &opened.file.storage;
    let read = |leaf: usize| {
        columns::ChunkBytes::read(storage, meta, leaf).and_then(|c| columns::values(c, meta, leaf))
    };
    let mut failure = None;
    let labels = match opened.columns.label {
        None => (0..rows).map(|_| RawLabel::None).collect(),
        Some((leaf, kind)) => match read(leaf) {
            Ok(values) => values
                .into_iter()
                .map(|v| match (v, kind) {
                    (ExtraValue::Int(i), LabelKind::Int) => RawLabel::Int(i),
                    (ExtraValue::Text(t), LabelKind::Text) => RawLabel::Text(t),
                    (ExtraValue::Null, _) => RawLabel::Bad("the label is null".into()),
                    (other, _) => RawLabel::Bad(format!("label {other} is not a class")),
                })
                .collect(),
            Err(reason) => {
                failure = Some(reason);
                Vec::new()
            }
        },
    };
    let mut extras = vec![Vec::with_capacity(opened.columns.extras.len()); rows];
    for &leaf in &opened.columns.extras {
        match read(leaf) {
            Ok(values) if values.len() == rows => {
                for (row, value) in extras.iter_mut().zip(values) {
                    row.push(value);
                }
            }
            Ok(values) => failure = Some(format!("{} values for {rows} rows", values.len())),
            Err(reason) => failure = Some(reason),
        }
    }
    if failure.is_some() {
        extras = vec![vec![ExtraValue::Null; opened.columns.extras.len()]; rows];
    }
    GroupColumns {
        labels,
        extras,
        failure,
    }
}

/// Every file opened, each laying out its columns as the first does.
fn open_all(files: Vec<(Storage, String)>, options: &ParquetOptions) -> Result<Vec<Opened>> {
    let mut opened: Vec<Opened> = Vec::with_capacity(files.len());
    for (storage, id) in files {
        let file = open_file(storage, id, options)?;
        if let Some(first) = opened.first() {
            if first.columns.layout != file.columns.layout {
                return Err(file_error(
                    &file.file.storage,
                    format!(
                        "its columns ({}) differ from those of {} ({})",
                        file.columns.layout, first.file.id, first.columns.layout
                    ),
                ));
            }
        }
        opened.push(file);
    }
    Ok(opened)
}

/// One row as listed: its file (among the opened ones), its group (among the source's), its
/// index in the group, its label, and why its group's columns could not be read.
struct Row {
    file: usize,
    group: u32,
    row: u64,
    label: RawLabel,
    failure: Option<String>,
}

/// The row groups of the opened files (empty ones left out), their rows and extra values.
struct Listed {
    groups: Vec<Group>,
    rows: Vec<Row>,
    extras: Vec<Vec<ExtraValue>>,
}

fn list_rows(opened: &[Opened]) -> Result<Listed> {
    let mut listed = Listed {
        groups: Vec::new(),
        rows: Vec::new(),
        extras: Vec::new(),
    };
    for (f, file) in opened.iter().enumerate() {
        let mut first_row = 0u64;
        for index in 0..file.file.metadata.num_row_groups() {
            let count = file.file.metadata.row_group(index).num_rows();
            let count = usize::try_from(count).map_err(|_| {
                file_error(
                    &file.file.storage,
                    format!("row group {index}: bad row count"),
                )
            })?;
            if count == 0 {
                continue;
            }
            let columns = read_group_columns(file, index, count);
            let group = listed.groups.len() as u32;
            let failure = columns.failure.as_ref().map(|reason| {
                format!(
                    "row group {index} (rows {first_row}..{}) cannot be read: {reason}",
                    first_row + count as u64
                )
            });
            let mut labels = columns.labels.into_iter();
            for row in 0..count {
                listed.rows.push(Row {
                    file: f,
                    group,
                    row: row as u64,
                    label: labels.next().unwrap_or(RawLabel::None),
                    failure: failure.clone(),
                });
            }
            listed.extras.extend(columns.extras);
            listed.groups.push(Group {
                file: file.file.clone(),
                index,
                first_row,
                rows: count,
            });
            first_row += count as u64;
        }
    }
    Ok(listed)
}

impl Source {
    /// The rows of Parquet files, an image each (feature `parquet`): `paths` are files, globs
    /// over file names (`data/train-*.parquet`), folders of `.parquet` files, or Hugging Face
    /// dataset folders (`data/<split>-*.parquet`, split [`ParquetOptions::split`]). Files are
    /// read in the order given, each argument's in sorted order; rows in file order. Ids are
    /// `file:row` (the row's index in its file).
    ///
    /// Only the footer and the label and extra columns are read here. Labels are the label
    /// column's integers, or its text numbered in sorted order ([`Source::class_names`] then
    /// gives the names); for integers, class names come from `datasets`' metadata in the files
    /// or the dataset card's `dataset_info` (README.md). A file that cannot be read, lacks a
    /// column, or lays the columns out differently from the first file is an error here,
    /// before any run. A row with a null or negative label, or of a row group whose columns
    /// fail to decode (a checksum, say), is an entry that fails when read, naming the file and
    /// row; a null image or a row group whose image column fails fails the same way.
    pub fn parquet<I, P>(paths: I, options: &ParquetOptions) -> Result<Source>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let mut files = Vec::new();
        let mut card_folder = None;
        for arg in paths {
            let (found, folder) = expand(arg.as_ref(), &options.split)?;
            files.extend(found);
            card_folder = card_folder.or(folder);
        }
        if files.is_empty() {
            return Err(Error::invalid("parquet", "no Parquet file given"));
        }
        let files = files
            .into_iter()
            .map(|path| {
                let id = super::path_id(&path);
                (Storage::Local(path), id)
            })
            .collect();
        Source::parquet_files(files, card_folder.as_deref(), options)
    }

    /// The Parquet files at `url` in object storage (features `parquet` and `object-store`):
    /// one object, or every `.parquet` object under a prefix, in key order; under a Hugging
    /// Face dataset's prefix (keys with a `data/` folder), those of [`ParquetOptions::split`].
    /// Each file's footer is read with two range requests, each row group's needed column
    /// chunks with one each: the rest of the files is never read. Ids are `url:row`;
    /// otherwise as [`Source::parquet`] (class names come from the files' metadata only).
    /// Call it from a thread that is not running an async runtime.
    #[cfg(feature = "object-store")]
    pub fn parquet_url(
        url: &str,
        options: &ParquetOptions,
        remote: &super::RemoteOptions,
    ) -> Result<Source> {
        let (reader, objects) = super::remote::ranges::objects(url, ".parquet", remote)?;
        let hub = objects
            .iter()
            .any(|o| super::remote::ranges::under_data(&o.url).is_some());
        let files: Vec<(Storage, String)> = objects
            .into_iter()
            .filter(|o| {
                !hub || super::remote::ranges::under_data(&o.url)
                    .and_then(hub::split_of)
                    .is_some_and(|split| split == options.split)
            })
            .map(|o| (Storage::Remote(reader.clone(), o.clone()), o.url))
            .collect();
        if files.is_empty() {
            return Err(Error::Remote {
                url: url.to_string(),
                reason: format!(
                    "no .parquet object of split {:?} under data/",
                    options.split
                ),
                kind: std::io::ErrorKind::NotFound,
            });
        }
        Source::parquet_files(files, None, options)
    }

    /// A Parquet source of these files, opened.
    fn parquet_files(
        files: Vec<(Storage, String)>,
        card_folder: Option<&Path>,
        options: &ParquetOptions,
    ) -> Result<Source> {
        let opened = open_all(files, options)?;
        let Listed {
            groups,
            rows,
            extras,
        } = list_rows(&opened)?;
        let class_names = class_names(&opened, &rows, card_folder);
        let text_classes: BTreeMap<&str, u32> = match &class_names {
            Some(names)
                if opened[0]
                    .columns
                    .label
                    .is_some_and(|(_, k)| k == LabelKind::Text) =>
            {
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.as_str(), i as u32))
                    .collect()
            }
            _ => BTreeMap::new(),
        };
        let groups = Groups::new(groups, options.read_budget, options.read_ahead);
        let mut items = Vec::with_capacity(rows.len());
        for Row {
            file,
            group,
            row,
            label,
            failure,
        } in &rows
        {
            let g = &groups.groups()[*group as usize];
            let file_row = g.first_row + row;
            let id = format!("{}:{file_row}", opened[*file].file.id);
            let label = match label {
                RawLabel::None => Ok(None),
                RawLabel::Int(i) => u32::try_from(*i)
                    .map(Some)
                    .map_err(|_| format!("label {i} is not a class number")),
                RawLabel::Text(t) => Ok(text_classes.get(t.as_str()).copied()),
                RawLabel::Bad(reason) => Err(reason.clone()),
            };
            let payload = match (failure, label.as_ref()) {
                (Some(reason), _) | (None, Err(reason)) => Payload::Damaged(format!(
                    "{}: row {file_row}: {reason}",
                    opened[*file].file.id
                )),
                _ => Payload::Parquet(RowPlace {
                    groups: groups.clone(),
                    group: *group,
                    row: *row as u32,
                }),
            };
            items.push(SourceItem {
                payload,
                id,
                label: label.ok().flatten(),
            });
        }
        let mut source = Source::listed(items, class_names, Vec::new(), Vec::new());
        if !options.extra_columns.is_empty() {
            source.extras = Some(Arc::new(Extras {
                names: options.extra_columns.clone(),
                rows: extras,
            }));
        }
        source.parquet = Some(ParquetReader {
            read_ahead: ReadAhead::start(groups),
            window: options.shuffle_window.max(1),
        });
        Ok(source)
    }

    /// The extra columns a Parquet source carries ([`ParquetOptions::extra_columns`]), a row
    /// per item; `None` for other sources.
    pub fn extras(&self) -> Option<&Arc<Extras>> {
        self.extras.as_ref()
    }
}

/// The class names: text labels in sorted order; for integer labels, the names `datasets`
/// wrote in the first file's metadata, or the dataset card's.
fn class_names(opened: &[Opened], rows: &[Row], card_folder: Option<&Path>) -> Option<Vec<String>> {
    let first = opened.first()?;
    let (leaf, kind) = first.columns.label?;
    if kind == LabelKind::Text {
        let mut names: Vec<String> = rows
            .iter()
            .filter_map(|r| match &r.label {
                RawLabel::Text(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        names.sort();
        names.dedup();
        return Some(names);
    }
    let column = first
        .file
        .metadata
        .file_metadata()
        .schema_descr()
        .column(leaf);
    let name = column.path().string();
    hub::names_in_metadata(
        first.file.metadata.file_metadata().key_value_metadata(),
        &name,
    )
    .or_else(|| {
        let card = std::fs::read_to_string(card_folder?.join("README.md")).ok()?;
        hub::names_in_card(&card, &name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_file_names() {
        assert!(glob_match(
            b"train-*.parquet",
            b"train-00000-of-00002.parquet"
        ));
        assert!(!glob_match(b"train-*.parquet", b"test-00000.parquet"));
        assert!(glob_match(b"part-[0-1]?.parquet", b"part-1a.parquet"));
        assert!(!glob_match(b"part-[!0-1]?.parquet", b"part-1a.parquet"));
        assert!(glob_match(b"*", b""));
    }
}
