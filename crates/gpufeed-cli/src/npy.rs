//! A streaming `.npy` writer: rows are appended as batches arrive, and the header, written with
//! room to spare, is rewritten with the final row count at the end.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use gpufeed::{DType, HostTensor};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Fixed header length (magic, version, length field and the padded dict), a multiple of 64.
const HEADER_LEN: usize = 128;

pub struct NpyWriter {
    file: BufWriter<File>,
    path: PathBuf,
    descr: &'static str,
    row_shape: Option<[usize; 3]>,
    rows: usize,
    /// Rows of shape [C, 1, 1] are written as a matrix [N, C].
    matrix: bool,
}

fn write_error(path: &Path, e: impl std::fmt::Display) -> Box<dyn std::error::Error> {
    format!("cannot write {}: {e}", path.display()).into()
}

/// numpy's type string; bf16 has none, so its raw bits are stored as little-endian u16.
fn descr(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F16 => Ok("<f2"),
        DType::BF16 => Ok("<u2"),
        DType::F32 => Ok("<f4"),
        DType::I32 => Ok("<i4"),
        DType::I64 => Ok("<i8"),
        other => Err(format!("no .npy type for {other}").into()),
    }
}

impl NpyWriter {
    /// A writer of rows of `dtype` at `path`.
    pub fn create(path: &Path, dtype: DType) -> Result<NpyWriter> {
        NpyWriter::open(path, dtype, false)
    }

    /// A writer of `f32` rows of shape `[C, 1, 1]` (soft labels) as a matrix `[N, C]`.
    pub fn create_matrix(path: &Path) -> Result<NpyWriter> {
        NpyWriter::open(path, DType::F32, true)
    }

    fn open(path: &Path, dtype: DType, matrix: bool) -> Result<NpyWriter> {
        let file = File::create(path).map_err(|e| write_error(path, e))?;
        let mut writer = NpyWriter {
            file: BufWriter::with_capacity(1 << 22, file),
            path: path.to_path_buf(),
            descr: descr(dtype)?,
            row_shape: None,
            rows: 0,
            matrix,
        };
        writer.write_header()?;
        Ok(writer)
    }

    fn header(&self) -> Vec<u8> {
        let shape = match self.row_shape {
            // Rows of one value a class (soft labels, [N, C, 1, 1] as the batch holds them):
            // a matrix [N, C].
            Some([a, 1, 1]) if self.descr == "<f4" && self.matrix => {
                format!("({}, {a})", self.rows)
            }
            Some([a, b, c]) => format!("({}, {a}, {b}, {c})", self.rows),
            None => "(0,)".to_string(),
        };
        let dict = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
            self.descr
        );
        let mut header = b"\x93NUMPY\x01\x00".to_vec();
        header.extend_from_slice(&((HEADER_LEN - 10) as u16).to_le_bytes());
        header.extend_from_slice(dict.as_bytes());
        header.resize(HEADER_LEN - 1, b' ');
        header.push(b'\n');
        header
    }

    fn write_header(&mut self) -> Result<()> {
        let header = self.header();
        self.file
            .write_all(&header)
            .map_err(|e| write_error(&self.path, e))
    }

    /// Appends the rows (images) of `tensor`.
    pub fn append(&mut self, tensor: &HostTensor) -> Result<()> {
        let &[n, a, b, c] = tensor.shape() else {
            return Err(write_error(
                &self.path,
                format!(
                    "a tensor of shape {:?} is not a batch of images",
                    tensor.shape()
                ),
            ));
        };
        match self.row_shape {
            None => self.row_shape = Some([a, b, c]),
            Some(shape) if shape == [a, b, c] => {}
            Some(shape) => {
                return Err(write_error(
                    &self.path,
                    format!("rows of shape {:?} after rows of {shape:?}", [a, b, c]),
                ))
            }
        }
        self.file
            .write_all(&tensor.to_le_bytes())
            .map_err(|e| write_error(&self.path, e))?;
        self.rows += n;
        Ok(())
    }

    /// Rewrites the header with the final shape and closes the file.
    pub fn finish(mut self) -> Result<()> {
        let header = self.header();
        if header.len() != HEADER_LEN {
            return Err(write_error(&self.path, "header too long"));
        }
        let path = self.path.clone();
        self.file.flush().map_err(|e| write_error(&path, e))?;
        let file = self.file.get_mut();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&header))
            .and_then(|_| file.sync_all())
            .map_err(|e| write_error(&path, e))
    }
}
