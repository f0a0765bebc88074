//! Reading the few columns a source needs out of one row group: each column chunk's bytes read
//! in one positioned read (only the chunks of the needed columns, by the byte ranges the footer
//! gives), then its pages decoded by the `parquet` crate into one value per row (`None` for a
//! null). Image bytes stay the slices of the decompressed pages they were decoded from: no copy
//! per image.

use std::sync::Arc;

use bytes::Bytes;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{
    BoolType, ByteArray, ByteArrayType, DataType, DoubleType, FloatType, Int32Type, Int64Type,
};
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

use super::reader::Storage;

/// The bytes of one column chunk, at their offset in the file: what the page reader reads.
pub(crate) struct ChunkBytes {
    start: u64,
    bytes: Bytes,
}

impl ChunkBytes {
    /// The chunk of column `leaf` of `group`, read from `storage`.
    pub(crate) fn read(
        storage: &Storage,
        group: &RowGroupMetaData,
        leaf: usize,
    ) -> Result<ChunkBytes, String> {
        let (start, len) = group.column(leaf).byte_range();
        let bytes = storage
            .read(start, len)
            .map_err(|e| format!("column chunk at bytes {start}..{}: {e}", start + len))?;
        Ok(ChunkBytes { start, bytes })
    }

    /// Bytes of a file in memory, from its byte `start` on.
    #[cfg(feature = "object-store")]
    pub(crate) fn new(start: u64, bytes: Bytes) -> ChunkBytes {
        ChunkBytes { start, bytes }
    }

    fn part(&self, start: u64, len: Option<usize>) -> parquet::errors::Result<Bytes> {
        let outside = || {
            parquet::errors::ParquetError::EOF(format!(
                "byte {start} is outside the column chunk at {}..{}",
                self.start,
                self.start + self.bytes.len() as u64
            ))
        };
        let from = start.checked_sub(self.start).ok_or_else(outside)? as usize;
        let to = match len {
            Some(len) => from.checked_add(len).ok_or_else(outside)?,
            None => self.bytes.len(),
        };
        if from > self.bytes.len() || to > self.bytes.len() {
            return Err(outside());
        }
        Ok(self.bytes.slice(from..to))
    }
}

impl Length for ChunkBytes {
    fn len(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

impl ChunkReader for ChunkBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        Ok(self.part(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.part(start, Some(length))
    }
}

/// The values of column `leaf` of `group`, one per row, from its chunk `chunk`.
fn read_leaf<T: DataType>(
    chunk: ChunkBytes,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<Vec<Option<T::T>>, String> {
    let rows = usize::try_from(group.num_rows()).map_err(|_| "negative row count")?;
    let column = group.column(leaf);
    let descr = column.column_descr_ptr();
    let pages = SerializedPageReader::new(Arc::new(chunk), column, rows, None)
        .map_err(|e| e.to_string())?;
    let mut reader = ColumnReaderImpl::<T>::new(descr.clone(), Box::new(pages));
    let max_def = descr.max_def_level();
    let mut defs = Vec::with_capacity(rows);
    let mut values = Vec::with_capacity(rows);
    let mut read = 0;
    while read < rows {
        let (records, _, _) = reader
            .read_records(rows - read, Some(&mut defs), None, &mut values)
            .map_err(|e| e.to_string())?;
        if records == 0 {
            return Err(format!(
                "the column chunk ends after {read} of its {rows} rows"
            ));
        }
        read += records;
    }
    if max_def == 0 {
        return Ok(values.into_iter().map(Some).collect());
    }
    if defs.len() != rows {
        return Err(format!("{} levels for {rows} rows", defs.len()));
    }
    let mut values = values.into_iter();
    let mut out = Vec::with_capacity(rows);
    for def in defs {
        if def == max_def {
            out.push(Some(values.next().ok_or("fewer values than levels")?));
        } else {
            out.push(None);
        }
    }
    Ok(out)
}

/// The image bytes of each row of `group`'s column `leaf` (`None` for a null): each a slice of
/// its decompressed page, shared.
pub(crate) fn images(
    chunk: ChunkBytes,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<Vec<Option<ByteArray>>, String> {
    read_leaf::<ByteArrayType>(chunk, group, leaf)
}

/// A value of a column carried beside the image: a label or an extra column.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ExtraValue {
    /// A null.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (Parquet's INT32 and INT64).
    Int(i64),
    /// A floating-point number (FLOAT and DOUBLE).
    Float(f64),
    /// Text (BYTE_ARRAY, read as UTF-8 with invalid bytes replaced).
    Text(String),
}

impl std::fmt::Display for ExtraValue {
    /// Empty for a null; numbers as Rust writes them; text as it is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtraValue::Null => Ok(()),
            ExtraValue::Bool(b) => write!(f, "{b}"),
            ExtraValue::Int(i) => write!(f, "{i}"),
            ExtraValue::Float(x) => write!(f, "{x}"),
            ExtraValue::Text(t) => f.write_str(t),
        }
    }
}

/// The values of a plain (not nested, not repeated) column `leaf` of `group`, whatever its
/// physical type.
pub(crate) fn values(
    chunk: ChunkBytes,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<Vec<ExtraValue>, String> {
    use parquet::basic::Type;
    fn map<T>(values: Vec<Option<T>>, f: impl Fn(T) -> ExtraValue) -> Vec<ExtraValue> {
        values
            .into_iter()
            .map(|v| v.map_or(ExtraValue::Null, &f))
            .collect()
    }
    let kind = group.column(leaf).column_type();
    Ok(match kind {
        Type::BOOLEAN => map(read_leaf::<BoolType>(chunk, group, leaf)?, ExtraValue::Bool),
        Type::INT32 => map(read_leaf::<Int32Type>(chunk, group, leaf)?, |v| {
            ExtraValue::Int(i64::from(v))
        }),
        Type::INT64 => map(read_leaf::<Int64Type>(chunk, group, leaf)?, ExtraValue::Int),
        Type::FLOAT => map(read_leaf::<FloatType>(chunk, group, leaf)?, |v| {
            ExtraValue::Float(f64::from(v))
        }),
        Type::DOUBLE => map(
            read_leaf::<DoubleType>(chunk, group, leaf)?,
            ExtraValue::Float,
        ),
        Type::BYTE_ARRAY => map(read_leaf::<ByteArrayType>(chunk, group, leaf)?, |v| {
            ExtraValue::Text(String::from_utf8_lossy(v.data()).into_owned())
        }),
        other => return Err(format!("a column of type {other} is not read")),
    })
}
